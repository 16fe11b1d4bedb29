"""Stage 1: candidates. Dense hits from the vector index and BM25 hits from the lexical index,
each with its exact BM25 score, then the candidates' rows re-read with every filter, so nothing
outside the scope or deleted survives. Ranking reads a few columns of each candidate; only the results'
full rows are read."""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg
import numpy as np

from engram.domain.filters import Filters
from engram.domain.models import Scope
from engram.domain.text import bm25_query_vector, bm25_score, bm25_terms
from engram.inference.vector_index import VectorIndex
from engram.settings import Settings
from engram.store import lexical_index
from engram.store import memories as repo


@dataclass(frozen=True)
class Candidate:
    id: UUID
    created_at: datetime
    access_count: int
    similarity: float | None  # cosine of the canonical embedding to the query; None if not embedded yet
    bm25: float
    has_facts: bool = False  # a raw memory the write pipeline took facts from
    around: tuple[UUID, ...] = ()  # the turns just before and after it in its session, of the candidates


async def dense(index: VectorIndex, query_vector: np.ndarray, scope: Scope, filters: Filters,
                depth: int) -> dict[UUID, float]:
    """The `depth` nearest memories in the serving index, inside `scope` and `filters`."""
    hits = await index.search(query_vector.tolist(), scope, filters, depth)
    return {hit.id: hit.score for hit in hits}


STALE_DENSE_LISTED = 1_000  # memories of a scope with stale points scored by their rows, at most


async def fresh_dense(index: VectorIndex, query_vector: np.ndarray, scope: Scope, filters: Filters, depth: int,
                      hits: dict[UUID, float], stale: dict[UUID, np.ndarray | None]) -> dict[UUID, float]:
    """The dense top `depth`, from the index's `hits` (its first `depth`) and the scope's memories
    whose points a change left stale, read before the index was searched (memories.stale_dense):
    the hits except those memories, and those of them that pass the filters scored by their
    canonical embeddings; best first.

    The index owner rewrites a memory's points after its change commits, and only then marks
    them fresh; until then its point holds the old vector and labels. So a changed memory is
    found by its new meaning and labels at once, and its old point takes no other memory's
    place: when stale points were among the hits, the index is asked again for more until
    `depth` others are held or it runs out. Past STALE_DENSE_LISTED stale memories in a scope
    (a mass change the owner is still writing), the rest keep their points' places, and their
    rows still decide their scores (memories.candidate_rows)."""
    asked = depth
    while (dropped := sum(1 for i in hits if i in stale)) and len(hits) == asked and asked - dropped < depth:
        asked = depth + dropped
        hits = await dense(index, query_vector, scope, filters, asked)
    found = {i: v for i, v in hits.items() if i not in stale}
    found |= {i: cosine(v, query_vector) for i, v in stale.items() if v is not None}
    return dict(heapq.nlargest(depth, found.items(), key=lambda kv: kv[1]))


def cosine(a, b) -> float:
    """Their cosine similarity in double precision, as pgvector's `1 - (a <=> b)` computes it."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / math.sqrt(float(a @ a) * float(b @ b)))


OVERFETCH = 1.25  # index hits scored exactly per BM25 candidate kept


class Bm25:
    """Okapi BM25 of one query over a scope: its top (`top`), then the scores of other memories
    (`exact`, the dense hits outside that top, read with their rows), every score exact under the
    same statistics, which are read once.

    With the lexical `index`, the top is found without reading every posting of the scope: the
    index's best depth·OVERFETCH by its stored weights, plus the scope's memories it does not hold
    yet, are scored exactly and the best `depth` kept. Stored weights use their scope's
    `lexical_avgdl`, within 5% of its average length, so they only reorder the margin; the extra
    quarter covers it. An indexed memory is scored from the vector the index returns
    (engram.domain.text.bm25_score); one the index does not hold as it is now, by Postgres from
    its postings. A memory changed since the statistics were read is scored as one of its
    versions, never a mix. Without the index, every posting of the query's terms in the scope
    is aggregated."""

    def __init__(self, settings: Settings, query: str, scope: Scope, filters: Filters,
                 index: VectorIndex | None = None) -> None:
        self._terms = bm25_terms(query, settings.bm25_stemmer)
        self._k1, self._b = settings.bm25_k1, settings.bm25_b
        self._scope, self._filters, self._index = scope, filters, index
        self._stats: lexical_index.QueryStats | None = None
        self._query: dict[int, float] = {}  # the sparse query vector, from the statistics
        self._unindexed: set[UUID] = set()
        self._scores: dict[UUID, float] = {}  # every exact score so far, including those outside the top
        self.timings_ms: dict[str, float] = {}  # statistics, index queries, Postgres's scores: for explain

    async def top(self, conn: asyncpg.Connection, depth: int) -> dict[UUID, float]:
        """The best `depth` memories holding a query term, by score."""
        if not self._terms:
            return {}
        if self._index is None:
            return await repo.bm25_scores(conn, self._scope, self._filters, self._terms, k1=self._k1, b=self._b,
                                          limit=depth)
        stats = await self._read_stats(conn)
        if not stats.idf:
            return {}
        await self._score_from_index(conn, math.ceil(depth * OVERFETCH))
        await self._score_in_postgres(conn, stats.unindexed)
        return dict(sorted(self._scores.items(), key=lambda item: -item[1])[:depth])

    async def exact(self, conn: asyncpg.Connection, ids: list[UUID]
                    ) -> tuple[dict[UUID, float], lexical_index.ExactScoring | None]:
        """The scores of `ids` known already (the index's overfetch past the top), and how the
        others are to be scored as their rows are read (memories.candidate_rows; None: no other
        holds a query term): by id, never an aggregation over the scope."""
        if not ids or not self._terms:
            return {}, None
        stats = await self._read_stats(conn)  # read already, unless the postings gave the top
        known = {i: self._scores[i] for i in ids if i in self._scores}
        todo = [i for i in ids if i not in known]
        return known, lexical_index.ExactScoring(stats, todo, self._k1, self._b) if todo and stats.idf else None

    async def _score_from_index(self, conn: asyncpg.Connection, limit: int) -> None:
        """The index's best `limit` hits, scored from their vectors. A memory the index does not
        hold as it is now is scored by Postgres if it holds a query term (`stats.unindexed`),
        whatever an old point of it says, and is no hit otherwise: the index is asked for more
        until `limit` hits are left or it has no more. Postgres also scores a hit whose vector
        cannot give its exact score, and every hit of a query holding a term id that stands for
        two terms."""
        stats = self._stats
        asked = limit
        while True:
            started = time.perf_counter()
            hits = await self._index.search(self._query, self._scope, self._filters, asked, with_vectors=True)
            held, in_postgres = 0, []
            for hit in hits:
                if hit.id in self._unindexed:
                    held += 1  # scored in Postgres, from its postings (top)
                    continue
                if not stats.trusts(hit.id):
                    # An older version's point. Unless every point is in doubt (a rebuild), this
                    # version holds no query term or fails the filters: else it would be unindexed.
                    if stats.stale is None:
                        in_postgres.append(hit.id)
                    continue
                score = None if stats.shared_term_id else bm25_score(hit.vector, self._query, stats.avgdl,
                                                                      k1=self._k1, b=self._b)
                if score is None:
                    in_postgres.append(hit.id)
                else:
                    self._scores[hit.id] = score
                    held += 1
            self._time("index", started)
            await self._score_in_postgres(conn, in_postgres)
            held += sum(1 for i in in_postgres if i in self._scores)
            if held >= limit or len(hits) < asked:
                return
            asked += 2 * (limit - held)  # stale points took hits' places

    async def _score_in_postgres(self, conn: asyncpg.Connection, ids: list[UUID]) -> None:
        """Postgres's scores, from the postings, of those of `ids` not scored yet."""
        todo = [i for i in ids if i not in self._scores]
        if todo:
            started = time.perf_counter()
            self._scores |= await lexical_index.exact_scores(
                conn, self._scope, self._filters, lexical_index.ExactScoring(self._stats, todo, self._k1, self._b))
            self._time("postgres", started)

    async def _read_stats(self, conn: asyncpg.Connection) -> lexical_index.QueryStats:
        if self._stats is None:
            started = time.perf_counter()
            self._stats = await lexical_index.query_stats(conn, self._scope, self._filters, self._terms)
            self._query, self._unindexed = bm25_query_vector(self._stats.idf), set(self._stats.unindexed)
            self._time("stats", started)
        return self._stats

    def _time(self, step: str, started: float) -> None:
        key = f"{step}_ms"
        self.timings_ms[key] = round(self.timings_ms.get(key, 0.0) + (time.perf_counter() - started) * 1e3, 3)


def from_rows(found: list[repo.CandidateRow], bm25: dict[UUID, float]) -> list[Candidate]:
    """The candidates whose rows passed scope and filters (memories.candidate_rows), with both raw
    scores, and of each one's session neighbours those that are candidates too."""
    read = {r.id for r in found}
    return [Candidate(id=r.id, created_at=r.created_at, access_count=r.access_count, similarity=r.similarity,
                      bm25=bm25.get(r.id, 0.0), has_facts=r.has_facts,
                      around=tuple(n for n in (r.before, r.after) if n is not None and n in read)) for r in found]
