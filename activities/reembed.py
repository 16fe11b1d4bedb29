"""The re-embed workflow's activities: Temporal adapters over engram.reembed_steps."""

from __future__ import annotations

import asyncpg
from temporalio import activity

from activities.models import ReembedBatchInput, ReembedStep, SwitchInput
from engram import reembed_steps as steps
from engram.inference.embedding_spaces import EmbeddingSpaces


class ReembedActivities:
    def __init__(self, pool: asyncpg.Pool, spaces: EmbeddingSpaces) -> None:
        self._pool = pool
        self._spaces = spaces

    @activity.defn
    async def batch(self, inp: ReembedBatchInput) -> ReembedStep:
        activity.heartbeat()
        progress = await steps.next_batch(self._pool, self._spaces, inp.job_id, inp.target, inp.batch_size)
        return ReembedStep(embedded=progress.embedded, done=progress.done, total=progress.total)

    @activity.defn
    async def switch(self, inp: SwitchInput) -> bool:
        return await steps.switch(self._pool, inp.job_id, inp.target)

    def all(self) -> list:
        return [self.batch, self.switch]
