"""The steps of RememberWorkflow, the one-memory pipeline that ran before batches
(engram/ingest_steps.py): lease an attempt, embed and index, extract, then record the first
pass, a retry, the completion or the end of the job; and `requeue`, by which a run of it hands
its job to the batch pipeline.

Each step is idempotent (Temporal may run it again after a crash or a timeout) and raises
domain errors; activities/remember.py adapts them to Temporal and owns nothing else.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from uuid import UUID

import asyncpg

from engram.domain.errors import NotFound
from engram.domain.extraction import Extraction
from engram.inference.embedding_spaces import EmbeddingSpaces
from engram.inference.providers import LLMProvider, extract_with_chain
from engram.store import jobs
from engram.store import memories as repo

log = logging.getLogger(__name__)
PIPELINE_ACTOR = "system:pipeline"


@dataclass(frozen=True)
class Lease:
    """An attempt at a job: `finished` when the job already ended (its `outcome` then says how)."""

    finished: bool
    memory_id: UUID | None
    attempt: int = 0
    outcome: str | None = None


@dataclass(frozen=True)
class Extracted:
    """What the extract step found, as the completion records it."""

    extraction: dict
    provider: str
    model: str
    prompt_version: str
    category: str | None


async def lease(pool: asyncpg.Pool, job_id: UUID, owner: str, lease_s: float) -> Lease:
    """Lease the job's next attempt for `lease_s`. Raises NotFound for an unknown job."""
    row = await jobs.lease(pool, job_id, owner, datetime.now(timezone.utc) + timedelta(seconds=lease_s))
    if row is not None:
        return Lease(finished=False, memory_id=row["memory_id"], attempt=row["attempt_count"])
    job = await jobs.get(pool, job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    return Lease(finished=True, memory_id=job.memory_id, outcome=job.outcome)


async def embed_and_index(pool: asyncpg.Pool, spaces: EmbeddingSpaces, memory_id: UUID) -> None:
    """Store the canonical embedding(s) in Postgres, then upsert the index point(s): the active
    model's and, during a re-embed, the target model's. Raises NotFound for an unknown memory,
    EmbeddingUnavailable when an embedder fails (`permanent` when it refuses this very text)."""
    memory = await repo.get(pool, memory_id)
    if memory is None:
        raise NotFound(f"no memory {memory_id}")
    await spaces.embed_memory(memory)


async def requeue(pool: asyncpg.Pool, job_id: UUID) -> None:
    """Give an unfinished job to the dispatcher, which puts it in a batch."""
    async with pool.acquire() as conn:
        await jobs.requeue(conn, job_id)


async def note_error(pool: asyncpg.Pool, job_id: UUID, *, error: str, code: str) -> None:
    """A failure the job carries on past, for `engram jobs` and the job's API to show."""
    log.warning("remember job continues past a failure", extra={"job_id": str(job_id), "code": code, "detail": error})
    async with pool.acquire() as conn:
        await jobs.note_error(conn, job_id, error=error, code=code)


async def extract(pool: asyncpg.Pool, providers: list[LLMProvider], memory_id: UUID, *, wanted: bool
                  ) -> Extracted | None:
    """Run the provider chain over the memory; None (skipped) when it was saved raw or no
    provider is configured. Raises ProviderChainError when every provider fails."""
    if not wanted or not providers:
        return None
    memory = await repo.get(pool, memory_id)
    if memory is None:
        raise NotFound(f"no memory {memory_id}")
    found: Extraction = await extract_with_chain(providers, memory.content)
    return Extracted(extraction=found.model_dump(mode="json"), provider=found.provider, model=found.model,
                     prompt_version=found.prompt_version, category=found.category)


async def record_first_pass(pool: asyncpg.Pool, job_id: UUID, memory_id: UUID, outcome: str) -> None:
    """What the first attempt concluded: "processed", or "raw_saved" (the memory is then
    `unprocessed` until a retry extracts it)."""
    async with pool.acquire() as conn:
        async with conn.transaction():
            await jobs.set_outcome(conn, job_id, outcome)
            if outcome == "raw_saved":
                await repo.set_extraction_status(conn, memory_id, "unprocessed")


async def schedule_retry(pool: asyncpg.Pool, job_id: UUID, *, at: datetime, error: str, code: str) -> None:
    async with pool.acquire() as conn:
        await jobs.schedule_retry(conn, job_id, next_attempt_at=at, error=error, code=code)


async def complete(pool: asyncpg.Pool, job_id: UUID, memory_id: UUID, found: Extracted | None, *,
                   request_id: str) -> None:
    """Record the extraction (or that it was skipped), its history event and the job's end in
    one transaction, once: a second run finds the job finished and changes nothing."""
    async with pool.acquire() as conn:
        async with conn.transaction():
            if not await jobs.finish(conn, job_id, status="done"):
                return
            await jobs.set_outcome(conn, job_id, "processed")
            if found is None:
                await repo.set_extraction_status(conn, memory_id, "skipped")
                return
            await repo.record_extraction(
                conn, memory_id, status="done", extracted=found.extraction, model=found.model,
                category=found.category, actor=PIPELINE_ACTOR, provider=found.provider,
                prompt_version=found.prompt_version, request_id=request_id,
            )


async def give_up(pool: asyncpg.Pool, job_id: UUID, memory_id: UUID, *, error: str, code: str) -> None:
    """Out of attempts: the job is dead; the memory stays raw, embedded and searchable."""
    async with pool.acquire() as conn:
        async with conn.transaction():
            await jobs.finish(conn, job_id, status="dead", error=error, code=code)
            await repo.set_extraction_status(conn, memory_id, "failed")
