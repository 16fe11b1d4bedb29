"""Hybrid recall: dense candidates from the vector index, BM25 candidates from Postgres,
min-max fusion, and a small boost for memories that are recalled often.

score = a * minmax(vector) + b * minmax(BM25) + c * log(1 + access_count)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import asyncpg

from engram.embedder import Embedder
from engram.models import Scope, ScoreComponents, SearchHit
from engram.repositories import memories as repo
from engram.settings import Settings
from engram.text import bm25_terms
from engram.vector_index import IndexFilter, VectorIndex


@dataclass(frozen=True)
class SearchTimings:
    embed_ms: float
    vector_ms: float
    bm25_ms: float
    fetch_ms: float


def _minmax(values: dict, keys) -> dict:
    present = [values[k] for k in keys if values.get(k) is not None]
    if not present:
        return {k: 0.0 for k in keys}
    low, high = min(present), max(present)
    span = high - low
    return {k: ((values[k] - low) / span if span > 0 and values.get(k) is not None else 0.0) for k in keys}


class HybridSearch:
    """Stateless apart from its clients; safe to share across requests."""

    def __init__(self, settings: Settings, pool: asyncpg.Pool, index: VectorIndex, embedder: Embedder) -> None:
        self._settings = settings
        self._pool = pool
        self._index = index
        self._embedder = embedder

    async def search(
        self, query: str, scope: Scope, filters: repo.Filters, limit: int,
    ) -> tuple[list[SearchHit], SearchTimings]:
        """The best `limit` memories in `scope` that pass `filters`, best first.

        Never returns a memory outside `scope`: both candidate legs filter on it, and so does
        the fetch of the candidates' rows.
        """
        s = self._settings
        depth = max(s.search_candidates, limit)
        t0 = time.perf_counter()
        query_vector = (await self._embedder.embed([query]))[0]
        t1 = time.perf_counter()
        flt = IndexFilter(
            scope=scope, include_deleted=filters.include_deleted, type=filters.type, tags=filters.tags,
            who=filters.who, source_type=filters.source_type, created_from=filters.created_from,
            created_to=filters.created_to,
        )
        dense = {hit.id: hit.score for hit in await self._index.search(query_vector.tolist(), flt, depth)}
        t2 = time.perf_counter()
        lexical = await repo.bm25_scores(
            self._pool, scope, filters, bm25_terms(query, s.bm25_stemmer),
            k1=s.bm25_k1, b=s.bm25_b, limit=depth, also_ids=list(dense),
        )
        t3 = time.perf_counter()
        ids = list(dict.fromkeys([*dense, *lexical]))
        rows = await repo.fetch_with_similarity(self._pool, ids, scope, filters, query_vector, self._embedder.name)
        t4 = time.perf_counter()
        similarity = {m.id: sim for m, sim in rows}
        keys = list(similarity)
        vec_norm = _minmax(similarity, keys)
        bm25 = {k: lexical.get(k, 0.0) for k in keys}
        bm25_norm = _minmax(bm25, keys)
        hits = []
        for memory, sim in rows:
            access = math.log1p(memory.access_count)
            score = (s.rank_vector_weight * vec_norm[memory.id] + s.rank_bm25_weight * bm25_norm[memory.id]
                     + s.rank_access_weight * access)
            hits.append(SearchHit(memory=memory, score=score, components=ScoreComponents(
                vector=sim or 0.0, bm25=bm25[memory.id], vector_norm=vec_norm[memory.id],
                bm25_norm=bm25_norm[memory.id], access=access,
            )))
        hits.sort(key=lambda h: (-h.score, h.memory.created_at, str(h.memory.id)))
        timings = SearchTimings(
            embed_ms=(t1 - t0) * 1e3, vector_ms=(t2 - t1) * 1e3, bm25_ms=(t3 - t2) * 1e3, fetch_ms=(t4 - t3) * 1e3,
        )
        return hits[:limit], timings

