"""Inputs and results of the workflows: one model each, so fields can be added without breaking
running histories. Whoever starts a workflow (worker/temporal_pipeline.py) builds these; the
activities' contracts are in activities/models.py."""

from __future__ import annotations

from typing import Literal
from uuid import UUID

from pydantic import BaseModel


class RememberInput(BaseModel):
    job_id: UUID
    max_attempts: int
    backoff_initial_s: float
    backoff_max_s: float
    extract_timeout_s: float
    # False: the caller asked for a raw save (`raw: true`); the extract step is skipped.
    # Histories from before this field replay with the default.
    extract: bool = True


class RememberResult(BaseModel):
    job_id: UUID
    # "handed_off": a run from before batches gave its job to the dispatcher (IngestWorkflow).
    status: Literal["done", "dead", "already_finished", "handed_off"]
    first_pass: Literal["processed", "raw_saved"]
    attempts: int


class ReembedInput(BaseModel):
    job_id: UUID
    target: str
    batch_size: int = 64
    batches_per_run: int = 200
    # Where the activities run: the process that owns the vector index. None (runs from before
    # this field): the workflow's own queue.
    task_queue: str | None = None
    # A batch heartbeats as it starts, so this bounds a batch, and how long one whose worker died
    # waits before it is retried. Runs from before this field: 10 s.
    heartbeat_timeout_s: float = 10.0


class ReembedResult(BaseModel):
    job_id: UUID
    target: str
    total: int


class IngestInput(BaseModel):
    job_ids: list[UUID]
    # The task queue of the process that owns the vector index (the API under `engram up`).
    index_queue: str
    # How long one extraction may take: the extract step's timeout scales with the batch.
    extract_timeout_s: float
    extract_concurrency: int
    # How long a step whose worker died goes unnoticed (the steps heartbeat every 5 s) before it
    # is retried. Runs from before this field: 15 s.
    heartbeat_timeout_s: float = 15.0


class IngestResult(BaseModel):
    done: int
    parked: int
    dead: int


class DrainInput(BaseModel):
    batch_size: int
    # Parked jobs taken per second at most, so a drain leaves search its CPU.
    rate_per_s: float
    probe_initial_s: float
    probe_max_s: float
    # How often an idle drain looks for due work.
    idle_s: float
    extract_timeout_s: float
    extract_concurrency: int
    iterations_per_run: int = 200
    # How long a drain step whose worker died goes unnoticed (it heartbeats every 5 s), and its
    # jobs wait, before it is retried. Runs from before this field: 15 s.
    heartbeat_timeout_s: float = 15.0


class DrainState(BaseModel):
    state: Literal["starting", "idle", "draining", "probing"]
    down: list[str]
    drained: int  # jobs this run has taken
    next_probe_in_s: float | None


class ForgetRunInput(BaseModel):
    operation_id: str
    requester: str
    needs_approval: bool
    dry_run: bool
    confirm_ttl_s: float
    approval_ttl_s: float
    chunk: int = 100
    total: int = 0  # items in the set, for the progress query
    token_sha256: str | None = None  # the confirm token's digest (runs started before it was kept: unchecked)
    # How long a chunk whose worker died goes unnoticed (it heartbeats every 5 s) before it is
    # retried. Runs from before this field: 20 s.
    heartbeat_timeout_s: float = 20.0


class ForgetConfirmation(BaseModel):
    actor: str
    reason: str
    stale: bool = False  # the set changed since the preview: end the operation, delete nothing
    token: str | None = None  # the preview's confirm token: the workflow checks it against its digest


class ForgetDecision(BaseModel):
    """An operator's `approve` or `reject` signal (the Temporal Web UI sends it as JSON)."""

    actor: str
    role: str
    reason: str


class ForgetState(BaseModel):
    status: str
    done: int
    total: int = 0
    approver: str | None = None
    refused: list[str] = []  # signals the workflow did not accept, and why


class ForgetRunResult(BaseModel):
    status: str
    receipt: dict | None = None


class ControlInput(BaseModel):
    changes_per_run: int = 500  # continue-as-new after this many changes


class ControlChange(BaseModel):
    """A switch change (the `change` update): by whom, with which role, and why."""

    switch: Literal["freeze", "kill_switch"]
    on: bool
    scope: dict[str, str] | None = None
    actor: str
    role: str
    reason: str


class ControlSnapshot(BaseModel):
    frozen: bool = False
    kill_switch: bool = False
    frozen_scopes: list[dict[str, str]] = []
    changes: int = 0


class ReviewInput(BaseModel):
    review_id: UUID
    ttl_s: float  # how long the review waits for a person before `default` applies
    default: str  # keep_both, keep_existing or replace


class ReviewResolution(BaseModel):
    """The `resolve` signal (the Temporal Web UI sends it as JSON): how the review ends, or
    `escalate` (to an operator, with no time limit), by whom and why; `content` with `merge`."""

    resolution: str
    actor: str
    role: str
    reason: str
    content: str | None = None
    path: str = "http"


class ReviewResult(BaseModel):
    status: str  # resolved or expired
    resolution: str
    detail: str | None = None


class ApprovalInput(BaseModel):
    approval_id: UUID
    requested_by: str  # who wrote the memory: never its approver
    ttl_s: float  # then `timeout_decision` applies
    timeout_decision: Literal["reject", "quarantine"] = "reject"


class ApprovalDecision(BaseModel):
    """The `decide` signal: an operator's decision on a write that waits for one."""

    decision: Literal["approve", "reject", "quarantine"]
    actor: str  # "key:<uuid>"
    role: str
    reason: str
    path: str = "temporal-ui"


class ApprovalResult(BaseModel):
    status: str  # approved, rejected, quarantined or withdrawn
    decision: str
    timed_out: bool
    detail: str | None = None
