"""Activities of the re-embed: a batch of new vectors, and the switch. Both idempotent."""

from __future__ import annotations

import asyncpg
from temporalio import activity

from engram.embedding_spaces import EmbeddingSpaces, reembed_batch, try_switch
from engram.repositories import embeddings, jobs
from workflows.models import ReembedBatchInput, ReembedInput, ReembedStep


class ReembedActivities:
    def __init__(self, pool: asyncpg.Pool, spaces: EmbeddingSpaces) -> None:
        self._pool = pool
        self._spaces = spaces

    @activity.defn
    async def batch(self, inp: ReembedBatchInput) -> ReembedStep:
        """Embed the next batch into the target model; record progress on the job."""
        activity.heartbeat()
        embedded = await reembed_batch(self._pool, self._spaces.space(inp.target), inp.target, inp.batch_size)
        activity.heartbeat()
        done, total = await embeddings.progress(self._pool, inp.target)
        await jobs.set_progress(self._pool, inp.job_id, done=done, total=total)
        return ReembedStep(embedded=embedded, done=done, total=total)

    @activity.defn
    async def switch(self, inp: ReembedInput) -> bool:
        """Make the target active if every memory has its vector, and end the job."""
        if not await try_switch(self._pool, inp.target):
            return False
        async with self._pool.acquire() as conn:
            await jobs.finish(conn, inp.job_id, status="done")
        return True

    def all(self) -> list:
        return [self.batch, self.switch]
