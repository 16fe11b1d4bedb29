"""Recall: the stages of `engram.recall` run in order, with each stage's scores kept on every
hit and, when asked, each stage's timing.

final = fused + expansion + c·log(1 + access_count), where
fused = a·minmax(vector) + b·minmax(BM25); with rerank, the top N are ordered by the
cross-encoder first and the rest follow in that order.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import asyncpg

from engram.embedding_spaces import EmbeddingSpaces
from engram.models import Scope, ScoreComponents, SearchHit
from engram.recall import candidates, expansion, fusion
from engram.recall.rerank import Reranker, RerankFailed
from engram.repositories import memories as repo
from engram.settings import Settings


@dataclass
class Explain:
    """What each stage did, in order, with its wall time in ms."""

    stages: dict[str, dict] = field(default_factory=dict)

    def stage(self, name: str, started: float, **facts) -> float:
        now = time.perf_counter()
        self.stages[name] = {"ms": round((now - started) * 1e3, 3), **facts}
        return now


@dataclass(frozen=True)
class RecallOptions:
    limit: int
    rerank: bool
    rerank_top_n: int


class Recall:
    """Stateless apart from its clients; safe to share across requests."""

    def __init__(self, settings: Settings, pool: asyncpg.Pool, spaces: EmbeddingSpaces,
                 reranker: Reranker | None) -> None:
        self._settings = settings
        self._pool = pool
        self._spaces = spaces
        self._reranker = reranker

    @property
    def can_rerank(self) -> bool:
        return self._reranker is not None

    async def search(self, query: str, scope: Scope, filters: repo.Filters, opts: RecallOptions
                     ) -> tuple[list[SearchHit], list[str], Explain]:
        """The best `opts.limit` memories in `scope` passing `filters`, best first; warnings; explain.

        Every stage works on stage 1's candidates, which are inside `scope`, pass `filters` and
        are live unless `filters.include_deleted`.
        """
        s = self._settings
        explain = Explain()
        depth = max(s.search_candidates, opts.limit, opts.rerank_top_n if opts.rerank else 0)
        t = time.perf_counter()
        model, space = await self._spaces.active()
        query_vector = await space.embedder.embed_query(query)
        t = explain.stage("embed_query", t, model=model)
        dense = await candidates.dense(space.index, query_vector, scope, filters, depth)
        t = explain.stage("dense", t, index=space.index.name, hits=len(dense))
        lexical = await candidates.lexical(self._pool, s, query, scope, filters, depth, list(dense))
        t = explain.stage("bm25", t, hits=sum(1 for v in lexical.values() if v > 0))
        ids = list(dict.fromkeys([*dense, *lexical]))
        found = await candidates.rows(self._pool, ids, scope, filters, query_vector, model, lexical)
        t = explain.stage("fetch", t, candidates=len(found))

        fused, vector_norm, bm25_norm = fusion.fuse(found, s.rank_vector_weight, s.rank_bm25_weight)
        t = explain.stage("fusion", t, vector_weight=s.rank_vector_weight, bm25_weight=s.rank_bm25_weight)
        lift = await expansion.lifts(self._pool, fused, s.expansion_weight)
        t = explain.stage("expansion", t, weight=s.expansion_weight, lifted=sum(1 for v in lift.values() if v > 0))

        hits = []
        for c in found:
            mid = c.memory.id
            access = math.log1p(c.memory.access_count)
            hits.append(SearchHit(memory=c.memory, score=fused[mid] + lift[mid] + s.rank_access_weight * access,
                                  components=ScoreComponents(
                                      vector=c.similarity or 0.0, bm25=c.bm25, vector_norm=vector_norm[mid],
                                      bm25_norm=bm25_norm[mid], fused=fused[mid], expansion=lift[mid],
                                      access=access)))
        # Equal scores: earlier memories first (a conversation's order).
        hits.sort(key=lambda h: (-h.score, h.memory.created_at, str(h.memory.id)))

        warnings: list[str] = []
        if opts.rerank:
            hits, warning = await self._rerank(query, hits, opts.rerank_top_n)
            t = explain.stage("rerank", t, model=self._reranker.name, top_n=opts.rerank_top_n,
                              timed_out=bool(warning and warning.startswith("rerank_timeout")),
                              failed=bool(warning and warning.startswith("rerank_failed")))
            if warning:
                warnings.append(warning)
        return hits[:opts.limit], warnings, explain

    async def _rerank(self, query: str, hits: list[SearchHit], top_n: int) -> tuple[list[SearchHit], str | None]:
        head, tail = hits[:top_n], hits[top_n:]
        timeout_s = self._settings.rerank_timeout_ms / 1000
        try:
            scores = await self._reranker.scores(query, [h.memory.content for h in head], timeout_s)
        except RerankFailed as exc:
            return hits, f"rerank_failed: {exc.reason}; kept the fused order"
        if scores is None:
            return hits, f"rerank_timeout: kept the fused order after {self._settings.rerank_timeout_ms} ms"
        access_weight = self._settings.rank_access_weight
        for hit, score in zip(head, scores):
            hit.components.rerank = score
            hit.score = score + access_weight * hit.components.access
        head.sort(key=lambda h: (-h.score, h.memory.created_at, str(h.memory.id)))
        # Cross-encoder logits and fused scores are on different scales: the reranked head
        # stays above the tail, whose order is unchanged.
        return head + tail, None
