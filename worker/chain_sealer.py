"""The chain sealer: chains every new history event into its scope's hash chain
(engram.store.history.seal_scopes), and gives memories written before history was chained
their per-memory chains. Safe in several processes at once.

Woken by every new job and every change (NEW_JOBS at commit), then GATHER_S more so a stream of
writes is sealed many events a pass, and every `poll_s`; a failed pass is logged and retried on
the next wake (an unsealed event is still in its memory's chain, and is sealed later in order).
"""

from __future__ import annotations

import asyncpg

from engram.settings import Settings
from engram.store import history
from worker.woken import run_woken

# Woken by every remember's commit, a pass sealed 1.7 events on average under 32 clients of
# single remembers: 10 statements and 2 pool round trips for each. A quarter second's gather
# seals a stream of them a few dozen at a time; sealing was never on a writer's path.
GATHER_S = 0.25


class ChainSealer:
    def __init__(self, pool: asyncpg.Pool, settings: Settings, *, poll_s: float = 1.0) -> None:
        self._pool = pool
        self._batch = settings.seal_batch
        self._poll_s = poll_s
        self._dsn = settings.postgres_dsn

    async def run_forever(self) -> None:
        await run_woken("chain sealer", self.seal_once, self._dsn, poll_s=self._poll_s, gather_s=GATHER_S)

    async def seal_once(self) -> int:
        """Seal until nothing is left; returns how many events were sealed into scope chains."""
        while await history.seal_unsealed_memories(self._pool, self._batch) >= self._batch:
            pass
        sealed = 0
        while (n := await history.seal_scopes(self._pool, self._batch)) > 0:
            sealed += n
            if n < self._batch:
                break
        return sealed
