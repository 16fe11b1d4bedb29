"""Filling the lexical index, the sparse BM25 vectors that give search its candidates
(engram.recall.candidates.Bm25), from Postgres, which stays the record: the postings and the
statistics are Postgres's; a point holds what its weights were computed from, so search
recovers exact scores from it (engram.domain.text.bm25_score).

`index_pending` writes the points of memories not yet held (the `lexical_indexed` outbox) and
marks them; `settle` finds a new, empty index beside memories marked as held and marks them all
to do again, so the same loop rebuilds it, and marks every point to reweigh when the BM25
parameters it was weighed with are no longer the settings'. Both are idempotent; worker/index_sync.py runs them in
the process that owns the index.
"""

from __future__ import annotations

import logging

import asyncpg

from engram.domain.text import bm25_document_vector
from engram.inference.embedding_spaces import index_point
from engram.inference.vector_index import VectorIndex
from engram.store import bm25, lexical_index

log = logging.getLogger(__name__)


REWEIGH_DRIFT = 0.05  # how far a scope's average length may move before its points are reweighed


async def index_pending(pool: asyncpg.Pool, index: VectorIndex, *, k1: float, b: float, limit: int) -> int:
    """Write the points of up to `limit` memories the index does not hold yet (or must reweigh);
    returns how many were marked done (a memory changed meanwhile stays to do)."""
    todo = await lexical_index.to_index(pool, limit, REWEIGH_DRIFT)
    points = [
        index_point(t.row, bm25_document_vector(t.tf, t.row["token_count"], t.avgdl, k1=k1, b=b))
        for t in todo if t.tf  # a memory without a term is no BM25 candidate: nothing to hold
    ]
    if points:
        await lexical_index.register_terms(pool, {term for t in todo for term in t.tf})
        await index.upsert(points)
    return await lexical_index.mark_indexed(pool, [(t.row["id"], t.row["version"]) for t in todo])


async def settle(pool: asyncpg.Pool, index: VectorIndex, *, k1: float, b: float) -> None:
    """An empty index while memories are marked held (a new shard or collection, a wiped one):
    mark every memory to do, so `index_pending` rebuilds it from the postings. Points weighed
    with other BM25 parameters than `k1` and `b` (the settings changed): mark every held one
    to reweigh. Search scores exactly under the new parameters meanwhile, since a point keeps
    what its weights were computed from; only its candidates' order is the old one's."""
    if await index.count() == 0 and await lexical_index.any_indexed(pool):
        reset = await lexical_index.reset_indexed(pool)
        log.warning("the lexical index is empty: rebuilding it from Postgres", extra={"memories": reset})
    weights = f"k1={k1!r} b={b!r}"
    recorded = await bm25.point_weights(pool)
    if recorded == weights:
        return
    if recorded is not None:  # None: recorded first by this release, so weighed with these
        marked = await lexical_index.reweigh_all(pool)
        log.warning("BM25 parameters changed: reweighing the lexical index",
                    extra={"from": recorded, "to": weights, "memories": marked})
    await bm25.record_point_weights(pool, weights)
