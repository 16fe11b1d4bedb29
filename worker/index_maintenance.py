"""Keeps the in-process vector indexes fast: the edge shards this process serves search new
points by brute force until they are optimised, so once enough have piled up since the last
optimisation, this optimises the shard (EdgeIndex.optimize: on a copy, in a child process,
never on the serving loop). A Qdrant server optimises by itself; its indexes report nothing
waiting.

One shard at a time, checked every `check_s`; a failed optimisation is logged and tried again
at the next check (the shard served is untouched by a failure).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from engram.inference.vector_index import VectorIndex

log = logging.getLogger(__name__)


class IndexOptimizer:
    def __init__(self, indexes: Callable[[], dict[str, VectorIndex]], *, after: int, check_s: float) -> None:
        self._indexes = indexes  # read at every check: a re-embed adds a model's index
        self._after = after
        self._check_s = check_s
        self._left_waiting: dict[str, int] = {}  # what optimising left unindexed (too small to index)
        self.optimising: str | None = None  # the index being optimised now, for readiness

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self._check_s)
            try:
                await self.check_once()
            except Exception:  # a bug must not stop the loop; the next check tries again
                log.exception("checking the vector indexes failed")

    async def check_once(self) -> list[str]:
        """Optimise each index with `after` more points waiting than its last optimisation
        left; returns the names of those optimised."""
        done = []
        for name, index in self._indexes().items():
            try:
                waiting = await index.unoptimized()
                if waiting - self._left_waiting.get(name, 0) < self._after:
                    continue
                log.info("optimising a vector index", extra={"index": name, "unoptimized_points": waiting})
                self.optimising = name
                await index.optimize()
                self._left_waiting[name] = await index.unoptimized()
                done.append(name)
            except Exception:  # the next check tries again; the shard served is unchanged
                log.exception("optimising a vector index failed", extra={"index": name})
            finally:
                self.optimising = None
        return done
