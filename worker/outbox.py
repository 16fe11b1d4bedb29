"""The outbox dispatcher: starts the workflow of every job whose workflow nobody started (the
request that wrote it could not reach Temporal, or the process died first)."""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from engram.store import jobs
from worker.temporal_pipeline import TemporalPipeline

log = logging.getLogger(__name__)


async def dispatch_forever(pipeline: TemporalPipeline, pool: asyncpg.Pool, interval_s: float) -> None:
    """Every `interval_s`, start the oldest unstarted jobs' workflows, stopping at the first that
    Temporal does not take. Safe in several processes: a workflow id is derived from its job, so a
    job's workflow starts once, whoever gets there first."""
    while True:
        try:
            for job in await jobs.unstarted(pool, limit=100):
                if not await pipeline.start_job(job):
                    break
        except (OSError, asyncpg.PostgresError) as err:
            log.warning("dispatcher pass failed", extra={"error": str(err)})
        await asyncio.sleep(interval_s)
