"""The index sync: keeps the indexes this process owns up with Postgres, which stays the
record. It writes the lexical index's points of memories not yet held (engram.lexical_steps;
the process runs lexical_steps.settle before it serves, so an empty index is never taken for a
complete one), and rewrites the vector points of memories a change left stale (a delete, a
recover, new content or labels: engram.changes).

Woken by every new job and every change (both send NEW_JOBS at commit) and, as a fallback,
every `poll_s`, it works a batch at a time until nothing is left. A failed pass (Postgres or
an index out of reach) is logged and retried on the next wake: nothing is lost, since a
memory stays to do until its points are written, and search re-reads every candidate's row
meanwhile (and scores not yet held memories' BM25 in Postgres).
"""

from __future__ import annotations

import asyncpg

from engram import lexical_steps
from engram.inference.embedding_spaces import EmbeddingSpaces
from engram.inference.vector_index import VectorIndex
from engram.settings import Settings
from engram.store import changes
from worker.woken import run_woken


async def sync_stale_points(pool: asyncpg.Pool, spaces: EmbeddingSpaces, limit: int) -> int:
    """Rewrite the vector points of up to `limit` memories a change left stale (dropping the
    point of one left without a vector); returns how many were marked fresh."""
    stale = await changes.stale_points(pool, limit)
    if not stale:
        return 0
    await spaces.index([r["id"] for r in stale], drop_missing=True)
    return await changes.mark_points_fresh(pool, [(r["id"], r["version"]) for r in stale])


class IndexSync:
    def __init__(self, pool: asyncpg.Pool, lexical: VectorIndex | None, spaces: EmbeddingSpaces, settings: Settings,
                 *, batch: int = 500, poll_s: float = 1.0) -> None:
        self._pool = pool
        self._lexical = lexical
        self._spaces = spaces
        self._settings = settings
        self._batch = batch
        self._poll_s = poll_s

    async def run_forever(self) -> None:
        await run_woken("index sync", self.sync_once, self._settings.postgres_dsn, poll_s=self._poll_s)

    async def sync_once(self) -> None:
        """Until nothing is left: stale vector points first (a delete should leave the index
        soon), then the lexical index's to-do."""
        s = self._settings
        while await sync_stale_points(self._pool, self._spaces, self._batch) >= self._batch:
            pass
        if self._lexical is not None:
            while await lexical_steps.index_pending(self._pool, self._lexical, k1=s.bm25_k1, b=s.bm25_b,
                                                    limit=self._batch) >= self._batch:
                pass
