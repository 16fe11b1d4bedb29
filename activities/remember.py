"""The activities of runs of RememberWorkflow started before batches: Temporal adapters over
engram.remember_steps. Each turns
its input model into a call and a domain error into the ApplicationError type the workflow
reads; the steps themselves (and their idempotency) live in the core.
"""

from __future__ import annotations

import asyncpg
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import (
    CompleteInput, ExtractOutput, GiveUpInput, JobRef, LeaseInput, LeaseResult, MemoryRef, NoteInput, OutcomeInput,
    RetryInput,
)
from engram import remember_steps as steps
from engram.domain.errors import EmbeddingUnavailable, NotFound
from engram.inference.embedding_spaces import EmbeddingSpaces
from engram.inference.providers import LLMProvider, ProviderChainError


class RememberActivities:
    def __init__(self, pool: asyncpg.Pool, spaces: EmbeddingSpaces, providers: list[LLMProvider],
                 identity: str) -> None:
        self._pool = pool
        self._spaces = spaces
        self._providers = providers
        self._identity = identity

    @activity.defn
    async def lease_attempt(self, inp: LeaseInput) -> LeaseResult:
        try:
            lease = await steps.lease(self._pool, inp.job_id, self._identity, inp.lease_s)
        except NotFound as err:
            raise ApplicationError(err.detail, type="JobNotFound", non_retryable=True) from err
        return LeaseResult(finished=lease.finished, memory_id=lease.memory_id, attempt=lease.attempt,
                           outcome=lease.outcome)

    @activity.defn
    async def embed_and_index(self, inp: MemoryRef) -> None:
        try:
            await steps.embed_and_index(self._pool, self._spaces, inp.memory_id)
        except NotFound as err:
            raise ApplicationError(err.detail, type="MemoryNotFound", non_retryable=True) from err
        except EmbeddingUnavailable as err:
            if err.permanent:  # e.g. a remote embedder's 400 for a text too long for it
                raise ApplicationError(err.detail, type="EmbeddingRejected", non_retryable=True) from err
            raise

    @activity.defn
    async def note_error(self, inp: NoteInput) -> None:
        await steps.note_error(self._pool, inp.job_id, error=inp.error, code=inp.code)

    @activity.defn
    async def extract(self, inp: MemoryRef) -> ExtractOutput:
        try:
            found = await steps.extract(self._pool, self._providers, inp.memory_id, wanted=inp.extract)
        except ProviderChainError as err:
            codes = sorted({e.code for e in err.errors})
            raise ApplicationError(str(err), type="ProviderUnavailable" if codes != ["malformed_output"]
                                   else "ProviderMalformedOutput") from err
        if found is None:
            return ExtractOutput(skipped=True)
        return ExtractOutput(skipped=False, extraction=found.extraction, provider=found.provider, model=found.model,
                             prompt_version=found.prompt_version, category=found.category)

    @activity.defn
    async def record_first_pass(self, inp: OutcomeInput) -> None:
        await steps.record_first_pass(self._pool, inp.job_id, inp.memory_id, inp.outcome)

    @activity.defn
    async def schedule_retry(self, inp: RetryInput) -> None:
        await steps.schedule_retry(self._pool, inp.job_id, at=inp.next_attempt_at, error=inp.error, code=inp.code)

    @activity.defn
    async def complete(self, inp: CompleteInput) -> None:
        r = inp.result
        found = None if r.skipped else steps.Extracted(
            extraction=r.extraction, provider=r.provider, model=r.model, prompt_version=r.prompt_version,
            category=r.category)
        await steps.complete(self._pool, inp.job_id, inp.memory_id, found, request_id=inp.workflow_id)

    @activity.defn
    async def give_up(self, inp: GiveUpInput) -> None:
        await steps.give_up(self._pool, inp.job_id, inp.memory_id, error=inp.error, code=inp.code)

    @activity.defn
    async def requeue(self, inp: JobRef) -> None:
        await steps.requeue(self._pool, inp.job_id)

    def all(self) -> list:
        return [self.requeue, self.lease_attempt, self.embed_and_index, self.note_error, self.extract, self.record_first_pass,
                self.schedule_retry, self.complete, self.give_up]
