"""Group commit for single remembers: the writes of remembers that arrive while others are being
written share one transaction.

Each single remember used to be a transaction of its own: BEGIN, the memory, its job, its
scope's and its terms' BM25 statistics, COMMIT and a connection reset, about eight round trips.
Under 32 clients that cost 2.6 ms of Postgres CPU and 2.5 ms of API CPU per memory more than a
bulk import's items (bench/reports/ingest-burst.md), and every remember to one scope queued on
that scope's statistics row until the one before it had committed.

Here a write joins a queue, and up to LANES transactions at a time each take up to MAX_GROUP
writes from it, in the order bulk imports write theirs (scope, then content: no lock cycles
with them), write them one after another and the statistics once at the end. A lone remember
finds a lane free and is written at once, as before; under load the next group gathers while
the lanes are busy, so groups size themselves to the load and nothing waits on a timer.

A group is all or nothing: if a write in it raises (a Postgres error, or a refusal such as an
idempotency key reused for another request), the transaction rolls back, that write runs
alone, in a transaction of its own, exactly as it would have without the group (and fails
there), and the others go again together. Only the write that fails fails; the others are
stored. When Postgres cannot be reached, every write in the group fails with that at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from engram.domain.errors import DatabaseUnavailable
from engram.store import memories as repo
from engram.store.pool import UNREACHABLE

LANES = 4  # transactions writing groups at once: one slow lock wait holds up only its own group
MAX_GROUP = 64  # writes per transaction
OFFENDERS = 2  # writes a group takes out, one at a time, before it writes every one alone

Write = Callable[[asyncpg.Connection, repo.StatsDelta], Awaitable[Any]]


@dataclass
class _Queued:
    write: Write
    order: tuple
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class GroupCommit:
    """Writes callables that write in the transaction they are given (adding BM25 statistics to
    the delta they are given instead of writing them), many to a transaction."""

    def __init__(self, pool: asyncpg.Pool, *, lanes: int = LANES) -> None:
        self._pool = pool
        self._lanes_max = lanes
        self._queue: list[_Queued] = []
        self._writing = 0  # lanes running; a lane counts itself out in the step it sees the queue empty
        self._lanes: set[asyncio.Task] = set()
        self.in_flight = 0  # writes the lanes have taken and not answered yet
        self.groups = 0  # transactions committed with more than one write
        self.retried_alone = 0  # writes run alone after their group rolled back because of them

    @property
    def waiting(self) -> int:
        """Writes queued for a lane."""
        return len(self._queue)

    async def write(self, write: Write, order: tuple) -> Any:
        """What `write` returned, once its transaction has committed; or what it raised, when
        it ran alone. `order` places it in its group."""
        queued = _Queued(write, order)
        # Read even when its caller has gone away, so no exception is left unretrieved.
        queued.done.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._queue.append(queued)
        if self._writing < self._lanes_max:
            self._writing += 1
            lane = asyncio.create_task(self._lane())
            self._lanes.add(lane)
            lane.add_done_callback(self._lanes.discard)
        return await asyncio.shield(queued.done)  # a caller that goes away leaves its write to finish

    async def _lane(self) -> None:
        try:
            while self._queue:
                group, self._queue = self._queue[:MAX_GROUP], self._queue[MAX_GROUP:]
                self.in_flight += len(group)
                try:
                    if len(group) == 1:
                        await self._alone(group[0])
                    else:
                        await self._together(group)
                except BaseException:  # cancelled: a shutdown that did not wait for the writes
                    for queued in group:
                        if not queued.done.done():
                            queued.done.set_exception(DatabaseUnavailable(
                                "the service stopped before this memory was written; send it again"))
                    raise
                finally:
                    self.in_flight -= len(group)
        finally:
            self._writing -= 1

    async def _together(self, group: list[_Queued]) -> None:
        """One transaction for `group`. A write that raises is taken out and written alone,
        and the rest go again together; after OFFENDERS of them, every write goes alone."""
        group = sorted(group, key=lambda q: q.order)
        for _ in range(OFFENDERS + 1):
            at = None
            try:
                async with self._pool.acquire() as conn:
                    async with conn.transaction():
                        stats = repo.StatsDelta()
                        results = []
                        for at, queued in enumerate(group):
                            results.append(await queued.write(conn, stats))
                        at = None
                        await repo.add_stats(conn, stats)
            except Exception as exc:
                if isinstance(exc, UNREACHABLE) and not isinstance(exc, asyncpg.QueryCanceledError):
                    for queued in group:  # no database: each write alone would only wait for it again
                        queued.done.set_exception(exc)
                    return
                if at is None:  # not one write's doing (the statistics, the commit): each alone
                    break
                self.retried_alone += 1
                await self._alone(group.pop(at))  # its own error, from its own transaction
                if len(group) < 2:
                    break
                continue
            if len(group) > 1:
                self.groups += 1
            for queued, result in zip(group, results):
                queued.done.set_result(result)
            return
        for queued in group:
            self.retried_alone += 1
            await self._alone(queued)

    async def _alone(self, queued: _Queued) -> None:
        try:
            async with self._pool.acquire() as conn:
                async with conn.transaction():
                    stats = repo.StatsDelta()
                    result = await queued.write(conn, stats)
                    await repo.add_stats(conn, stats)
        except Exception as exc:
            queued.done.set_exception(exc)
        else:
            queued.done.set_result(result)

    async def aclose(self) -> None:
        """Let the writes already queued finish."""
        while self._lanes:
            await asyncio.shield(asyncio.gather(*self._lanes, return_exceptions=True))
