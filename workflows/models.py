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


class DrainState(BaseModel):
    state: Literal["starting", "idle", "draining", "probing"]
    down: list[str]
    drained: int  # jobs this run has taken
    next_probe_in_s: float | None
