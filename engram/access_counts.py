"""Access counts: how often each memory was a search result, which ranking reads back as a small
boost (recall.pipeline: c·log(1 + access_count)).

Every search used to update its results' rows in a statement of its own: a commit per search,
and about 0.9 ms of Postgres CPU per search at 10,000 memories in one scope (a third of what
the search itself costs Postgres), each row update also inserting into every index of
`memories`. Here a search only adds its results to a tally in memory; one statement writes the
tally at most every `flush_s`, so a memory found by many searches in that time is updated once.
The counts live in `memory_access`, not in the memories' rows (migration 0022): at 100,000
memories in one scope a flush that rewrote ~370 of those ~2.5 kB rows and their index entries took
31-56 ms of Postgres, and their dead versions brought autovacuum over the whole table; into
`memory_access`, 4.8-9.2 ms.

A count reaches ranking up to `flush_s` late, which only a hint can afford. The tally is written
when the service closes; a crash loses at most the last `flush_s` of counts, never a memory. A
write that fails (Postgres out of reach) is logged and the tally kept for the next one, up to
MAX_PENDING memories: a count is dropped before the process's memory grows without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime, timezone
from uuid import UUID

import asyncpg

from engram.store import memories as repo

log = logging.getLogger(__name__)

FLUSH_S = 1.0
MAX_PENDING = 100_000  # memories with a count not written yet
CLOSE_S = 5.0


class AccessCounts:
    def __init__(self, pool: asyncpg.Pool, *, flush_s: float = FLUSH_S) -> None:
        self._pool = pool
        self._flush_s = flush_s
        self._pending: dict[UUID, tuple[int, datetime]] = {}  # id -> (accesses, the last one's time)
        self._writer: asyncio.Task | None = None
        self._closing = asyncio.Event()  # set by aclose: write at once, and once
        self.dropped = 0  # accesses not counted because the tally was full

    def add(self, ids: list[UUID]) -> None:
        """Count one access of each of `ids` now; written within `flush_s`."""
        now = datetime.now(timezone.utc)
        for memory_id in ids:
            self._count(memory_id, 1, now)
        if self._pending and self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write_soon())

    async def _write_soon(self) -> None:
        try:
            while self._pending:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), self._flush_s)
                await self._write()
                if self._closing.is_set():
                    return
        finally:
            self._writer = None

    async def _write(self) -> None:
        tally, self._pending = self._pending, {}
        try:
            await repo.add_accesses(self._pool, tally)
        except Exception:
            log.warning("writing access counts failed; they are kept for the next write", exc_info=True,
                        extra={"memories": len(tally)})
            for memory_id, (n, at) in tally.items():  # merged under what arrived meanwhile
                self._count(memory_id, n, at)

    def _count(self, memory_id: UUID, n: int, at: datetime) -> None:
        """Add `n` accesses, the last at `at`; dropped, and counted in `dropped`, if the tally is
        full and holds none of this memory's yet."""
        had, last = self._pending.get(memory_id, (0, at))
        if had == 0 and len(self._pending) >= MAX_PENDING:
            if self.dropped == 0:
                log.warning("the access tally is full: counts are dropped while Postgres cannot be written"
                            " (logged once)", extra={"memories": MAX_PENDING})
            self.dropped += n
            return
        self._pending[memory_id] = (had + n, max(at, last))

    async def aclose(self) -> None:
        """Write the tally now: one try of at most CLOSE_S, so a Postgres out of reach does not
        hold up shutdown; a failure is logged and the tally dropped."""
        self._closing.set()
        if self._writer is None:
            return
        try:
            async with asyncio.timeout(CLOSE_S):
                await self._writer
        except TimeoutError:
            log.warning("access counts not written at close: Postgres did not answer within %s s", CLOSE_S)
