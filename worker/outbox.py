"""The outbox dispatcher: turns the remember jobs that requests wrote into batches, one
IngestWorkflow each, and starts every other job whose run nobody started (a re-embed).

It wakes when a job is written (Postgres NOTIFY on jobs.NEW_JOBS) and every `interval_s`
anyway, lets a burst gather for `window_s`, and keeps at most `inflight` batches running: the
rest wait, durably, in the outbox. That is the write path's backpressure: a burst of 10,000
memories is 157 batches taken a few at a time, not 10,000 workflows at once. Bounding batches,
not memories, also sizes them to the load (group commit): while the batches in flight run,
the next one gathers every remember that arrives, so a steady stream of single remembers is
embedded and orchestrated dozens at a time rather than one or two. Safe in several
processes: a job joins one batch (FOR UPDATE SKIP LOCKED), and a batch's workflow id is fixed
when it is formed, so it starts once.
"""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from engram.settings import Settings
from engram.store import jobs
from worker.temporal_pipeline import TemporalPipeline
from worker.woken import run_woken

_DRAIN_CHECK_S = 30.0


class Dispatcher:
    def __init__(self, pipeline: TemporalPipeline, pool: asyncpg.Pool, settings: Settings) -> None:
        self._pipeline = pipeline
        self._pool = pool
        self._settings = settings

    async def run_forever(self) -> None:
        """Dispatch until cancelled (and make sure the drain runs, every _DRAIN_CHECK_S)."""
        s = self._settings
        loop = asyncio.get_running_loop()
        drain_checked = float("-inf")

        async def one_pass() -> None:
            nonlocal drain_checked
            if loop.time() - drain_checked > _DRAIN_CHECK_S and await self._pipeline.ensure_drain():
                drain_checked = loop.time()
            await self.dispatch_once()

        await run_woken("dispatcher", one_pass, s.postgres_dsn, poll_s=s.dispatcher_interval_s,
                        gather_s=s.ingest_batch_window_ms / 1000)

    async def dispatch_once(self) -> None:
        """Start formed-but-unstarted batches, form and start new ones up to the in-flight
        bound, then start any other unstarted job. Stops at the first start Temporal refuses."""
        s = self._settings
        for workflow_id, job_ids in await jobs.unstarted_batches(self._pool, limit=100):
            if not await self._pipeline.start_batch(workflow_id, job_ids):
                return
        room = s.ingest_inflight_batches - await jobs.batches_in_flight(self._pool)
        while room > 0:
            workflow_id = jobs.batch_workflow_id(uuid.uuid4())
            job_ids = await jobs.form_batch(self._pool, workflow_id, s.ingest_batch_size)
            if not job_ids:
                break
            if not await self._pipeline.start_batch(workflow_id, job_ids):
                return
            room -= 1
        for job in await jobs.unstarted(self._pool, limit=100):
            if not await self._pipeline.start_job(job):
                return
