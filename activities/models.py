"""Inputs and results of the activities: one model each, so fields can be added without
breaking running histories. Workflows import these; nothing here imports a workflow."""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from uuid import UUID

from pydantic import BaseModel


class JobRef(BaseModel):
    job_id: UUID


class LeaseInput(BaseModel):
    job_id: UUID
    lease_s: float


class LeaseResult(BaseModel):
    finished: bool
    memory_id: UUID | None = None
    attempt: int = 0
    outcome: str | None = None


class MemoryRef(BaseModel):
    memory_id: UUID
    # The extract step reads it: False skips extraction (a raw save). Other steps ignore it.
    extract: bool = True


class ExtractOutput(BaseModel):
    skipped: bool
    extraction: dict | None = None
    provider: str | None = None
    model: str | None = None
    prompt_version: str | None = None
    category: str | None = None


class OutcomeInput(BaseModel):
    job_id: UUID
    memory_id: UUID
    outcome: Literal["processed", "raw_saved"]


class RetryInput(BaseModel):
    job_id: UUID
    next_attempt_at: datetime
    error: str
    code: str


class CompleteInput(BaseModel):
    job_id: UUID
    memory_id: UUID
    workflow_id: str
    result: ExtractOutput


class GiveUpInput(BaseModel):
    job_id: UUID
    memory_id: UUID
    error: str
    code: str


class NoteInput(BaseModel):
    job_id: UUID
    error: str
    code: str


class ReembedBatchInput(BaseModel):
    job_id: UUID
    target: str
    batch_size: int


class ReembedStep(BaseModel):
    embedded: int
    done: int
    total: int


class SwitchInput(BaseModel):
    job_id: UUID
    target: str


class BatchInput(BaseModel):
    job_ids: list[UUID]


class EmbedOutput(BaseModel):
    memory_ids: list[UUID]
    refused: int = 0


class IndexInput(BaseModel):
    memory_ids: list[UUID]


class ExtractBatchInput(BaseModel):
    job_ids: list[UUID]
    workflow_id: str  # recorded as the request id of each extraction's history event


class Settled(BaseModel):
    done: int = 0
    parked: int = 0
    dead: int = 0
    taken: int = 0
    chain_down: str | None = None


class DrainStepInput(BaseModel):
    owner: str
    limit: int


class ProviderStates(BaseModel):
    down: list[str]  # "<provider>: why", one per provider known to be down
    chain_down: bool  # every provider of the chain is down
    parked_due: int  # parked extractions the drain could take now


class OperationStatusInput(BaseModel):
    operation_id: str
    status: str
    approver: str | None = None
    event: str | None = None  # what the move records (default: the status), by whom and why
    actor: str | None = None
    reason: str | None = None


class ForgetChunkInput(BaseModel):
    operation_id: str
    limit: int


class ForgetChunkResult(BaseModel):
    settled: int
    remaining: int


class FinishForgetInput(BaseModel):
    operation_id: str
    approver: str | None = None


class ControlRecordInput(BaseModel):
    switch: str
    on: bool
    scope: dict[str, str] | None = None
    actor: str
    role: str
    reason: str


class EscalateInput(BaseModel):
    review_id: UUID
    actor: str
    reason: str


class ResolveReviewInput(BaseModel):
    review_id: UUID
    resolution: str
    actor: str
    role: str
    reason: str
    content: str | None = None
    path: str = "http"
    expired: bool = False


class ResolveReviewOutput(BaseModel):
    status: str
    detail: str | None = None


class DecideApprovalInput(BaseModel):
    approval_id: UUID
    decision: str
    actor: str
    role: str
    reason: str
    path: str = "http"
    timed_out: bool = False


class DecideApprovalOutput(BaseModel):
    status: str
    detail: str | None = None
