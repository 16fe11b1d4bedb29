"""The lexical indexer: keeps the lexical index up with Postgres in the process that owns it
(which runs engram.lexical_steps.settle before it serves, so an empty index is never taken for
a complete one).

Woken by every new job (a remember's commit sends NEW_JOBS) and, as a fallback, every
`poll_s`, it writes the points of memories not yet held, a batch at a time, until none is
left. A failed pass (Postgres or the index out of reach) is logged and retried on the next
wake: nothing is lost, since a memory stays to do until its point is written, and search
scores not yet held memories in Postgres meanwhile.
"""

from __future__ import annotations

import logging

import asyncpg

from engram import lexical_steps
from engram.inference.vector_index import VectorIndex
from engram.settings import Settings
from engram.store.notifications import NewJobs
from engram.store.pool import UNREACHABLE

log = logging.getLogger(__name__)


class LexicalIndexer:
    def __init__(self, pool: asyncpg.Pool, index: VectorIndex, settings: Settings, *, batch: int = 500,
                 poll_s: float = 1.0) -> None:
        self._pool = pool
        self._index = index
        self._settings = settings
        self._batch = batch
        self._poll_s = poll_s
        self._new_jobs = NewJobs(settings.postgres_dsn)

    async def run_forever(self) -> None:
        s = self._settings
        listener = self._new_jobs.listen()
        try:
            while True:
                try:
                    while await lexical_steps.index_pending(self._pool, self._index, k1=s.bm25_k1, b=s.bm25_b,
                                                            limit=self._batch) >= self._batch:
                        pass
                except (*UNREACHABLE, asyncpg.PostgresError) as err:
                    log.warning("lexical indexer pass failed", extra={"error": f"{type(err).__name__}: {err}"})
                except Exception:  # a bug or a surprise must not stop the loop: the next wake retries
                    log.exception("lexical indexer pass failed unexpectedly")
                await self._new_jobs.wait(self._poll_s)
        finally:
            listener.cancel()
