"""Inputs and results of the remember workflow and its activities: one model each, so fields
can be added without breaking running histories."""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from uuid import UUID

from pydantic import BaseModel


class RememberInput(BaseModel):
    job_id: UUID
    max_attempts: int
    backoff_initial_s: float
    backoff_max_s: float
    extract_timeout_s: float


class RememberResult(BaseModel):
    job_id: UUID
    status: Literal["done", "dead", "already_finished"]
    first_pass: Literal["processed", "raw_saved"]
    attempts: int


class LeaseInput(BaseModel):
    job_id: UUID
    lease_s: float


class LeaseResult(BaseModel):
    finished: bool
    memory_id: UUID | None = None
    attempt: int = 0
    extract: bool = True
    outcome: str | None = None


class MemoryRef(BaseModel):
    memory_id: UUID


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


class ReembedInput(BaseModel):
    job_id: UUID
    target: str
    batch_size: int = 64
    batches_per_run: int = 200


class ReembedBatchInput(BaseModel):
    job_id: UUID
    target: str
    batch_size: int


class ReembedStep(BaseModel):
    embedded: int
    done: int
    total: int


class ReembedResult(BaseModel):
    job_id: UUID
    target: str
    total: int


class NoteInput(BaseModel):
    job_id: UUID
    error: str
    code: str
