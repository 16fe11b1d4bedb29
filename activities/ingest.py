"""The batch pipeline's activities: Temporal adapters over engram.ingest_steps.

`IngestActivities` run in the worker (embedding, extraction, the drain); `IndexActivities` run
in the process that owns the vector index, on its own task queue.
"""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import (
    BatchInput, DrainStepInput, EmbedOutput, ExtractBatchInput, IndexInput, ProviderStates, Settled,
)
from engram import ingest_steps as steps
from engram.control import Control
from engram.fact_steps import FactWriter
from engram.inference.availability import Availability
from engram.inference.embedding_spaces import EmbeddingSpaces

HEARTBEAT_S = 5.0


@contextlib.asynccontextmanager
async def heartbeating():
    """Heartbeat while a long step runs, so a worker that dies is noticed within the
    heartbeat timeout rather than the step's whole timeout."""

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(HEARTBEAT_S)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()


class IngestActivities:
    def __init__(self, pool: asyncpg.Pool, spaces: EmbeddingSpaces, availability: Availability, control: Control,
                 facts: FactWriter, *, retry: steps.Retry, lease_s: float, concurrency: int) -> None:
        self._pool = pool
        self._facts = facts
        self._spaces = spaces
        self._availability = availability
        self._control = control
        self._retry = retry
        self._lease_s = lease_s
        self._concurrency = concurrency

    @activity.defn(name="ingest_embed")
    async def embed(self, inp: BatchInput) -> EmbedOutput:
        async with heartbeating():
            embedded = await steps.embed_batch(self._pool, self._spaces, inp.job_ids)
        return EmbedOutput(memory_ids=embedded.memory_ids, refused=embedded.refused)

    @activity.defn(name="ingest_extract")
    async def extract(self, inp: ExtractBatchInput) -> Settled:
        async with heartbeating():
            settled = await steps.extract_batch(self._pool, self._availability, self._control, self._facts,
                                                inp.job_ids,
                                                concurrency=self._concurrency, retry=self._retry,
                                                request_id=inp.workflow_id)
        return Settled(**vars(settled))

    @activity.defn(name="drain_states")
    async def states(self) -> ProviderStates:
        down = await self._availability.down()
        backlog = await steps.backlog(self._pool)
        return ProviderStates(down=[f"{p.name}/{p.model}" for p in down],
                              chain_down=await self._availability.chain_down() is not None
                              or not await self._control.autonomous_allowed(),
                              parked_due=backlog.parked_due)

    @activity.defn(name="drain_probe")
    async def probe(self) -> list[str]:
        return await steps.probe(self._availability)

    @activity.defn(name="drain_step")
    async def drain(self, inp: DrainStepInput) -> Settled:
        async with heartbeating():
            settled = await steps.drain(self._pool, self._availability, self._control, self._facts, inp.owner,
                                        limit=inp.limit,
                                        lease_s=self._lease_s, concurrency=self._concurrency, retry=self._retry,
                                        request_id=inp.owner)
        return Settled(**vars(settled))

    def all(self) -> list:
        return [self.embed, self.extract, self.states, self.probe, self.drain]


class IndexActivities:
    def __init__(self, spaces: EmbeddingSpaces) -> None:
        self._spaces = spaces

    @activity.defn(name="index_memories")
    async def index(self, inp: IndexInput) -> int:
        if not any(self._spaces.space(m).index is not None for m in self._spaces.models):
            raise ApplicationError("this process owns no vector index", type="NoIndexHere")
        return await steps.index_batch(self._spaces, inp.memory_ids)

    def all(self) -> list:
        return [self.index]
