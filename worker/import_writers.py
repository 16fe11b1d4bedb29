"""The import writers: write the bulk remembers the API staged (engram.store.import_batches), up
to `import_writers` at once, in the worker's process and at its niceness, so that the API
process keeps its event loop and its CPU for searches while an import goes in.

Woken by every staged batch (import_batches.STAGED; not by every new job: a stream of single
remembers would wake four empty takes per remember) and every `dispatcher_interval_s`. A
write that fails rolls back and is counted; the batch stays staged for the next wake, and after
import_batches.MAX_FAILURES it is left to the API that waits for it, which then writes it
itself and answers with what goes wrong. Safe in several processes: a batch is taken under its
row lock.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from engram.service import MemoryService
from engram.settings import Settings
from engram.store import import_batches
from engram.store.pool import UNREACHABLE
from worker.woken import run_woken

log = logging.getLogger(__name__)
PURGE_AFTER_S = 3600.0  # answers nobody collected, and batches nobody could write, are kept this long
PURGE_EVERY_S = 300.0


class ImportWriters:
    def __init__(self, service: MemoryService, pool: asyncpg.Pool, settings: Settings) -> None:
        self._service = service
        self._pool = pool
        self._settings = settings
        self._purged_at = float("-inf")

    async def run_forever(self) -> None:
        await run_woken("import writers", self.write_all, self._settings.postgres_dsn,
                        poll_s=self._settings.dispatcher_interval_s, channel=import_batches.STAGED)

    async def write_all(self) -> None:
        """Write every staged batch, `import_writers` at a time, until none is left to take."""
        await asyncio.gather(*(self._writer() for _ in range(self._settings.import_writers)))
        now = asyncio.get_running_loop().time()
        if now - self._purged_at > PURGE_EVERY_S:
            if purged := await import_batches.purge(self._pool, PURGE_AFTER_S):
                log.info("purged staged imports", extra={"rows": purged})
            self._purged_at = now

    async def _writer(self) -> None:
        while True:
            try:
                if await self._service.write_staged() is None:
                    return
            except (*UNREACHABLE, asyncpg.PostgresError) as err:
                log.warning("an import write failed; it stays staged", extra={"error": f"{type(err).__name__}: {err}"})
                return
            except Exception:
                log.exception("an import write failed unexpectedly; it stays staged")
                return
