"""The steps of a re-embed, as ReembedWorkflow runs them: embed the next batch into the target
model (recording the job's progress), and switch to it once every memory has its vector.
Both idempotent; activities/reembed.py adapts them to Temporal."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

import asyncpg

from engram.inference.embedding_spaces import EmbeddingSpaces, reembed_batch, try_switch
from engram.store import embeddings, jobs


@dataclass(frozen=True)
class Progress:
    embedded: int  # by this step; 0: none was left
    done: int
    total: int


async def next_batch(pool: asyncpg.Pool, spaces: EmbeddingSpaces, job_id: UUID, target: str,
                     batch_size: int) -> Progress:
    """Embed up to `batch_size` memories still without a `target` vector; record the progress."""
    embedded = await reembed_batch(pool, spaces.space(target), target, batch_size)
    done, total = await embeddings.progress(pool, target)
    await jobs.set_progress(pool, job_id, done=done, total=total)
    return Progress(embedded=embedded, done=done, total=total)


async def switch(pool: asyncpg.Pool, job_id: UUID, target: str) -> bool:
    """Make `target` the active model and end the job, if every memory has its vector; False
    (nothing changed) while some still lack one."""
    if not await try_switch(pool, target):
        return False
    async with pool.acquire() as conn:
        await jobs.finish(conn, job_id, status="done")
    return True
