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
    status: Literal["done", "dead", "already_finished"]
    first_pass: Literal["processed", "raw_saved"]
    attempts: int


class ReembedInput(BaseModel):
    job_id: UUID
    target: str
    batch_size: int = 64
    batches_per_run: int = 200


class ReembedResult(BaseModel):
    job_id: UUID
    target: str
    total: int
