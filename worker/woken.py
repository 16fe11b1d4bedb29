"""The loop every background pass runs in: woken by a Postgres notification (jobs.NEW_JOBS: a
remember's or a change's commit sends it) and at least every `poll_s`, a pass at a time."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import asyncpg

from engram.store import jobs
from engram.store.notifications import NewJobs
from engram.store.pool import UNREACHABLE

log = logging.getLogger(__name__)


async def run_woken(name: str, one_pass: Callable[[], Awaitable[object]], dsn: str, *, poll_s: float,
                    gather_s: float = 0.0, channel: str = jobs.NEW_JOBS) -> None:
    """Run `one_pass` now, then on every wake (a notification, or `poll_s` without one; after a
    notification on `channel`, `gather_s` more for a burst to gather), until cancelled. A failed pass (Postgres
    out of reach, a bug) is logged and the next wake tries again: the loop never stops on one."""
    new_jobs = NewJobs(dsn, channel)
    listener = new_jobs.listen()
    try:
        while True:
            try:
                await one_pass()
            except (*UNREACHABLE, asyncpg.PostgresError) as err:
                log.warning(f"{name} pass failed", extra={"error": f"{type(err).__name__}: {err}"})
            except Exception:
                log.exception(f"{name} pass failed unexpectedly")
            await new_jobs.wait(poll_s, gather_s=gather_s)
    finally:
        listener.cancel()
