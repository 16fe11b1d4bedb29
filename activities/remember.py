"""Activities of the remember pipeline: every side effect (SQL, embeddings, Qdrant, LLM) lives here.

Each activity is idempotent: Temporal may run it again after a crash or a timeout.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta, timezone

import asyncpg
from temporalio import activity
from temporalio.exceptions import ApplicationError

from engram.embedding_spaces import EmbeddingSpaces
from engram.errors import EmbeddingUnavailable
from engram.providers import LLMProvider, ProviderChainError, extract_with_chain
from engram.repositories import jobs
from engram.repositories import memories as repo
from workflows.models import (
    CompleteInput, ExtractOutput, GiveUpInput, LeaseInput, LeaseResult, MemoryRef, NoteInput, OutcomeInput,
    RetryInput,
)

log = logging.getLogger(__name__)
PIPELINE_ACTOR = "system:pipeline"


class RememberActivities:
    def __init__(self, pool: asyncpg.Pool, spaces: EmbeddingSpaces, providers: list[LLMProvider],
                 identity: str) -> None:
        self._pool = pool
        self._spaces = spaces
        self._providers = providers
        self._identity = identity

    @activity.defn
    async def lease_attempt(self, inp: LeaseInput) -> LeaseResult:
        until = datetime.now(timezone.utc) + timedelta(seconds=inp.lease_s)
        row = await jobs.lease(self._pool, inp.job_id, self._identity, until)
        if row is None:
            job = await jobs.get(self._pool, inp.job_id)
            if job is None:
                raise ApplicationError(f"no job {inp.job_id}", type="JobNotFound", non_retryable=True)
            return LeaseResult(finished=True, memory_id=job.memory_id, outcome=job.outcome)
        payload = json.loads(row["payload"]) if isinstance(row["payload"], str) else row["payload"]
        return LeaseResult(finished=False, memory_id=row["memory_id"], attempt=row["attempt_count"],
                           extract=payload.get("extract", True))

    @activity.defn
    async def embed_and_index(self, inp: MemoryRef) -> None:
        """Store the canonical embedding(s) in Postgres, then upsert the index point(s): the
        active model's, and during a re-embed the target model's too."""
        memory = await repo.get(self._pool, inp.memory_id)
        if memory is None:
            raise ApplicationError(f"no memory {inp.memory_id}", type="MemoryNotFound", non_retryable=True)
        try:
            await self._spaces.embed_memory(memory)
        except EmbeddingUnavailable as err:
            if err.permanent:  # e.g. a remote embedder's 400 for a text too long for it
                raise ApplicationError(err.detail, type="EmbeddingRejected", non_retryable=True) from err
            raise

    @activity.defn
    async def note_error(self, inp: NoteInput) -> None:
        """A failure the job carries on past, for `engram jobs` and the job's API to show."""
        log.warning("remember job continues past a failure",
                    extra={"job_id": str(inp.job_id), "code": inp.code, "detail": inp.error})
        async with self._pool.acquire() as conn:
            await jobs.note_error(conn, inp.job_id, error=inp.error, code=inp.code)

    @activity.defn
    async def extract(self, inp: MemoryRef) -> ExtractOutput:
        """Run the provider chain. With no provider configured, extraction is skipped."""
        job_payload = await self._job_payload_for(inp.memory_id)
        if not self._providers or not job_payload.get("extract", True):
            return ExtractOutput(skipped=True)
        memory = await repo.get(self._pool, inp.memory_id)
        try:
            result = await extract_with_chain(self._providers, memory.content)
        except ProviderChainError as err:
            codes = sorted({e.code for e in err.errors})
            raise ApplicationError(str(err), type="ProviderUnavailable" if codes != ["malformed_output"]
                                   else "ProviderMalformedOutput") from err
        return ExtractOutput(
            skipped=False, extraction=result.model_dump(mode="json"), provider=result.provider,
            model=result.model, prompt_version=result.prompt_version, category=result.category,
        )

    async def _job_payload_for(self, memory_id) -> dict:
        job = await self._pool.fetchval(
            "SELECT payload FROM memory_jobs WHERE memory_id = $1 ORDER BY created_at DESC LIMIT 1", memory_id,
        )
        return json.loads(job) if isinstance(job, str) else (job or {})

    @activity.defn
    async def record_first_pass(self, inp: OutcomeInput) -> None:
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                await jobs.set_outcome(conn, inp.job_id, inp.outcome)
                if inp.outcome == "raw_saved":
                    await repo.set_extraction_status(conn, inp.memory_id, "unprocessed")

    @activity.defn
    async def schedule_retry(self, inp: RetryInput) -> None:
        async with self._pool.acquire() as conn:
            await jobs.schedule_retry(conn, inp.job_id, next_attempt_at=inp.next_attempt_at, error=inp.error,
                                      code=inp.code)

    @activity.defn
    async def complete(self, inp: CompleteInput) -> None:
        """Record the extraction, its history event and the job's end in one transaction, once."""
        r = inp.result
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                if not await jobs.finish(conn, inp.job_id, status="done"):
                    return  # A previous run of this activity already committed.
                await jobs.set_outcome(conn, inp.job_id, "processed")
                if r.skipped:
                    await repo.set_extraction_status(conn, inp.memory_id, "skipped")
                    return
                version = await repo.record_extraction(
                    conn, inp.memory_id, status="done", extracted=r.extraction, model=r.model,
                    category=r.category, actor=PIPELINE_ACTOR,
                )
                await repo.insert_history(
                    conn, memory_id=inp.memory_id, event="UPDATE", version=version, actor_type="system",
                    actor_id=PIPELINE_ACTOR, new_metadata={"extracted": r.extraction}, provider=r.provider,
                    model=r.model, prompt_version=r.prompt_version, reason="extraction",
                    request_id=inp.workflow_id,
                )

    @activity.defn
    async def give_up(self, inp: GiveUpInput) -> None:
        """Out of attempts: the job is dead, the memory stays raw but embedded and searchable."""
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                await jobs.finish(conn, inp.job_id, status="dead", error=inp.error, code=inp.code)
                await repo.set_extraction_status(conn, inp.memory_id, "failed")

    def all(self) -> list:
        return [self.lease_attempt, self.embed_and_index, self.note_error, self.extract, self.record_first_pass,
                self.schedule_retry, self.complete, self.give_up]
