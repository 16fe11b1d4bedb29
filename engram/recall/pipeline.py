"""Recall: the stages of `engram.recall` run in order, with each stage's scores kept on every
hit and, when asked, each stage's timing.

final = fused + expansion + c·log(1 + access_count), where
fused = a·minmax(vector) + b·minmax(BM25); with rerank, as many of the top N as the reranker
expects to score in what the search left of its budget are ordered by it first, and the rest
follow in their fused order.

Stage 1's two legs overlap: Postgres and the lexical index find BM25's top while the query is
embedded (in a thread) and the vector index searched, so `explain`'s `embed_query` + `dense` and
`bm25` run side by side. Beside the embedding, Postgres first reads the scope's memories whose
points a change left stale, scored by their rows instead (candidates.fresh_dense): none in the
steady state. Each leg then reads a few columns of its own candidates' rows, with their session
neighbours, on a connection of its own (`fetch`): BM25's top once the query is embedded (its
similarities need the vector), the dense hits outside that top once BM25's top is known, with
their BM25 scores. So the two reads run side by side, and the first mostly while the vector
index is searched. The full rows are read for the results only (`rows`), with their chain
heads, so verifying them (`verify`) takes no statement of its own. No connection is held while
the query is embedded (unless the BM25 leg is still at work) or reranked.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from time import monotonic  # tests replace this module's clock alone
from uuid import UUID

import asyncpg
import numpy as np

from engram.domain.filters import Filters
from engram.domain.models import Scope, ScoreComponents, SearchHit, ranked_score
from engram.inference.embedding_spaces import EmbeddingSpaces, Space
from engram.inference.vector_index import VectorIndex
from engram.recall import candidates, expansion, fusion
from engram.recall.rerank import Reranker, RerankFailed, with_context
from engram.settings import Settings
from engram.store import memories as repo


SPARE_ROWS = 5
Verify = Callable[[list[asyncpg.Record]], Awaitable[set[UUID]]]  # rows read with their chain heads -> quarantined


@dataclass
class Explain:
    """What each stage did, in order, with its wall time in ms."""

    stages: dict[str, dict] = field(default_factory=dict)

    def stage(self, name: str, started: float, **facts) -> float:
        now = time.perf_counter()
        self.stages[name] = {"ms": round((now - started) * 1e3, 3), **facts}
        return now


@dataclass(frozen=True)
class Ranked:
    id: UUID
    created_at: datetime
    score: float
    components: dict[str, float]  # ScoreComponents' fields: the model is built for the results only


@dataclass(frozen=True)
class RecallOptions:
    limit: int
    rerank: bool
    rerank_top_n: int
    # Leave out hits whose relevance before any rerank is below this, before the rerank (as
    # mem0's `threshold`): the rerank then orders only those kept.
    min_score: float | None = None


async def _verified(hits: list[SearchHit], sealed: list[asyncpg.Record], wanted: int, verify: Verify
                    ) -> tuple[list[SearchHit], int]:
    """The first `wanted` of `hits` that `verify` passes, and how many it judged: a spare is
    judged only when one before it was quarantined."""
    rows = {r["id"]: r for r in sealed}
    kept: list[SearchHit] = []
    checked = 0
    while hits and len(kept) < wanted:
        batch, hits = hits[:wanted - len(kept)], hits[wanted - len(kept):]
        quarantined = await verify([rows[h.memory.id] for h in batch])
        checked += len(batch)
        kept += [h for h in batch if h.memory.id not in quarantined]
    return kept, checked


async def _side_by_side(*steps: Awaitable) -> list:
    """The results of `steps`, run side by side. The first failure is raised as it is, once the
    others are cancelled: not in an ExceptionGroup (as a TaskGroup would), so Postgres out of
    reach still answers 503 (service._speaks_domain_errors)."""
    tasks = [asyncio.ensure_future(step) for step in steps]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class Recall:
    """Stateless apart from its clients; safe to share across requests."""

    def __init__(self, settings: Settings, pool: asyncpg.Pool, spaces: EmbeddingSpaces,
                 reranker: Reranker | None, lexical: VectorIndex | None = None) -> None:
        self._settings = settings
        self._pool = pool
        self._spaces = spaces
        self._reranker = reranker
        self._lexical = lexical  # the sparse BM25 index; None: BM25 aggregates the postings

    @property
    def can_rerank(self) -> bool:
        return self._reranker is not None

    async def search(self, query: str, scope: Scope, filters: Filters, opts: RecallOptions,
                     verify: Verify | None = None) -> tuple[list[SearchHit], list[str], Explain]:
        """The best `opts.limit` memories in `scope` passing `filters`, best first; warnings; explain.

        Every stage works on stage 1's candidates, which are inside `scope`, pass `filters` and
        are live unless `filters.include_deleted`. With `verify`, the rows read for the results
        are judged against their hash chains (Integrity.judge) and those it quarantines are
        left out, a spare moving up in their place.
        """
        s = self._settings
        started = monotonic()  # the rerank budget runs from here
        explain = Explain()
        depth = max(s.search_candidates, opts.limit)
        if opts.rerank:
            depth = max(depth, s.rerank_candidates, opts.rerank_top_n)
        wanted = max(opts.limit, opts.rerank_top_n if opts.rerank else 0)
        async with contextlib.AsyncExitStack() as held:
            # The results are read on the dense rows' connection, if it read any and kept it
            # (_candidates): that read usually ends stage 1, and each release is a round trip
            # (pool.create_pool).
            found, conn = await self._candidates(query, scope, filters, depth, explain, held)
            ranked = self._first_order(found, wanted + SPARE_ROWS, explain)
            conn = conn or await held.enter_async_context(self._pool.acquire())
            hits, sealed, context = await self._results(conn, ranked, wanted, scope, filters, opts, explain)
        if verify is not None:  # after the connection is back: a quarantine takes one of its own
            t = time.perf_counter()
            hits, checked = await _verified(hits, sealed, wanted, verify)
            explain.stage("verify", t, checked=checked)
        hits = hits[:wanted]
        if opts.min_score is not None:  # relevance before any rerank: `hits` are in its order
            hits = [h for h in hits if h.score >= opts.min_score]
        warnings: list[str] = []
        if opts.rerank:
            t = time.perf_counter()
            # What the search left of the budget: it bounds the whole search, not the rerank alone.
            budget_s = max(s.rerank_budget_ms / 1000 - (monotonic() - started), 0.0) if s.rerank_budget_ms else None
            hits, warning = await self._rerank(query, hits, opts.rerank_top_n, context, budget_s)
            explain.stage("rerank", t, model=self._reranker.name, top_n=opts.rerank_top_n,
                          budget_left_ms=None if budget_s is None else round(budget_s * 1e3, 1),
                          reranked=sum(1 for h in hits[:opts.rerank_top_n] if h.components.rerank is not None),
                          with_context=sum(1 for h in hits[:opts.rerank_top_n]
                                           if h.components.rerank is not None and h.memory.id in context),
                          timed_out=bool(warning and warning.startswith("rerank_timeout")),
                          failed=bool(warning and warning.startswith("rerank_failed")))
            if warning:
                warnings.append(warning)
        return hits[:opts.limit], warnings, explain

    async def _candidates(self, query: str, scope: Scope, filters: Filters, depth: int, explain: Explain,
                          held: contextlib.AsyncExitStack
                          ) -> tuple[list[candidates.Candidate], asyncpg.Connection | None]:
        """Stage 1: each leg's candidates, their rows re-checked against scope and filters, every
        one with its similarity and its BM25 score; and the connection that read the dense hits'
        rows, left in `held` for the results (None if there were none to read, or if the BM25
        leg was still at work when they were read: then it was given back at once).

        The legs run side by side, each on its own connection: the stale points' read, then
        BM25's top in Postgres and the lexical index, then (the query embedded) its rows; the
        query embedded and the vector index searched, then (BM25's top known) the rows of the
        dense hits outside it, scored as they are read. The serving model's state is read
        before any connection is taken (its refresh takes one), and neither leg holds one while
        the query is embedded: an embedder that is slow to answer keeps no connection from
        others."""
        s = self._settings
        model, space = await self._spaces.active()
        bm25 = candidates.Bm25(s, query, scope, filters, self._lexical)
        neighbours = s.expansion_weight != 0
        loop = asyncio.get_running_loop()
        stale: asyncio.Future[dict[UUID, np.ndarray | None]] = loop.create_future()
        embedded: asyncio.Future[np.ndarray] = loop.create_future()
        top: asyncio.Future[dict[UUID, float]] = loop.create_future()
        ended: dict[str, float] = {}  # when each step ended, for `fetch`'s time

        async def lexical_leg() -> tuple[dict[UUID, float], list[repo.CandidateRow], float]:
            t = time.perf_counter()
            rows: list[repo.CandidateRow] | None = None

            async def read_rows(conn: asyncpg.Connection) -> list[repo.CandidateRow]:
                return await repo.candidate_rows(conn, list(top.result()), scope, filters, embedded.result(), model,
                                                 neighbours=neighbours)

            async with self._pool.acquire() as conn:
                # The connection's first statement, as the vector leg waits for it.
                stale.set_result(await repo.stale_dense(conn, scope, filters, model, candidates.STALE_DENSE_LISTED))
                top.set_result(await bm25.top(conn, depth))
                ended["bm25"] = time.perf_counter()
                if not top.result():
                    rows = []
                elif embedded.done():
                    rows = await read_rows(conn)
            if rows is None:  # given back meanwhile: no connection waits on the embedder
                await embedded
                async with self._pool.acquire() as conn:
                    rows = await read_rows(conn)
            ended["lexical_rows"] = time.perf_counter()
            return top.result(), rows, (ended["bm25"] - t) * 1e3

        async def vector_leg() -> tuple[dict[UUID, float], dict[UUID, float], list[repo.CandidateRow], int,
                                        asyncpg.Connection | None]:
            query_vector, dense, stale_count, (embed_ms, dense_ms) = await self._vector_leg(
                space, query, scope, filters, depth, stale, embedded)
            ended["dense"] = time.perf_counter()
            explain.stages["embed_query"] = {"ms": round(embed_ms, 3), "model": model}
            explain.stages["dense"] = {"ms": round(dense_ms, 3), "index": space.index.name, "hits": len(dense),
                                       "stale_points": stale_count}
            # A dense hit outside BM25's top `depth` still gets its BM25 score; if the top held
            # fewer than `depth`, it holds every memory with a query term and the rest score 0.
            rest = [i for i in dense if i not in await top]
            known, exact, rows, conn = {}, None, [], None
            if rest:
                conn = await self._pool.acquire()
                try:
                    known, exact = await bm25.exact(conn, rest if len(top.result()) >= depth else [])
                    rows = await repo.candidate_rows(conn, rest, scope, filters, query_vector, model,
                                                     neighbours=neighbours, bm25=exact)
                finally:
                    # Kept for the results only if the other leg is done: one that still waits
                    # for a connection must not wait on this one (a full pool would deadlock).
                    if lexical_task.done():
                        held.push_async_callback(self._pool.release, conn)
                    else:
                        await self._pool.release(conn)
                        conn = None
            ended["dense_rows"] = time.perf_counter()
            return dense, known, rows, len(exact.ids) if exact is not None else 0, conn

        # The vector leg first: its embedding, in a thread, is the longest step.
        vector_task = asyncio.ensure_future(vector_leg())
        lexical_task = asyncio.ensure_future(lexical_leg())
        (dense, known, dense_rows, with_rows, conn), (lexical, lexical_rows, bm25_ms) = await _side_by_side(
            vector_task, lexical_task)
        scores = lexical | known | {r.id: r.bm25 for r in dense_rows if r.bm25 is not None}
        explain.stages["bm25"] = {"ms": round(bm25_ms, 3), "hits": sum(1 for v in scores.values() if v > 0),
                                  "scored_with_rows": with_rows,
                                  **bm25.timings_ms}
        found = candidates.from_rows(lexical_rows + dense_rows, scores)
        # Only the part of the rows' reads that the legs did not hide.
        fetch_ms = (max(ended["lexical_rows"], ended["dense_rows"]) - max(ended["bm25"], ended["dense"])) * 1e3
        explain.stages["fetch"] = {"ms": round(max(fetch_ms, 0.0), 3), "candidates": len(found),
                                   "dense_hits": len(dense), "lexical_hits": len(lexical)}
        return found, conn

    async def _results(self, conn: asyncpg.Connection, ranked: list[Ranked], wanted: int, scope: Scope,
                       filters: Filters, opts: RecallOptions, explain: Explain
                       ) -> tuple[list[SearchHit], list[asyncpg.Record], dict[UUID, str]]:
        """The best `wanted` (the results, or the rerank's top N) and a few spares, from their
        full rows re-checked against scope and filters; those rows as read, for `verify`; and,
        for the rerank, what each of its top N follows in its session."""
        t = time.perf_counter()
        # A few spares: a memory deleted since `fetch`, or quarantined, is dropped and the next
        # one moves up.
        shown = ranked[:wanted + SPARE_ROWS]
        sealed = await repo.sealed_rows_in_scope(conn, [r.id for r in shown], scope, filters)
        rows = {r["id"]: repo.row_to_memory(r) for r in sealed}
        hits = [SearchHit(memory=rows[r.id], score=r.score, components=ScoreComponents(**r.components))
                for r in shown if r.id in rows]
        context = {}
        if opts.rerank and self._settings.rerank_session_context:
            context = await repo.session_predecessors(conn, [h.memory.id for h in hits[:opts.rerank_top_n]])
        explain.stage("rows", t, read=len(rows))
        return hits, sealed, context

    async def _vector_leg(self, space: Space, query: str, scope: Scope, filters: Filters, depth: int,
                          stale: Awaitable[dict[UUID, np.ndarray | None]], embedded: asyncio.Future[np.ndarray]
                          ) -> tuple[np.ndarray, dict[UUID, float], int, tuple[float, float]]:
        """(query vector, dense hits, how many of the scope's points were stale, (embedding ms,
        index ms)): candidates.fresh_dense. The vector is handed to `embedded` as soon as it is
        made. `stale` is the scope's stale points, read beside the embedding; its wait counts in
        the embedding's time."""
        t = time.perf_counter()
        query_vector = await space.embedder.embed_query(query)
        embedded.set_result(query_vector)
        # Read before the index is searched: a point the owner rewrites in between is then
        # either listed (and skipped) or fresh.
        stale_points = await stale
        t1 = time.perf_counter()
        hits = await candidates.dense(space.index, query_vector, scope, filters, depth)
        dense = await candidates.fresh_dense(space.index, query_vector, scope, filters, depth, hits, stale_points)
        return query_vector, dense, len(stale_points), ((t1 - t) * 1e3, (time.perf_counter() - t1) * 1e3)

    def _first_order(self, found: list[candidates.Candidate], places: int, explain: Explain) -> list[Ranked]:
        """Fusion, context expansion and the access boost: every candidate, best first; the
        first `places` in their final order (a lift is computed wherever it could change them)."""
        s = self._settings
        t = time.perf_counter()
        fused, vector_norm, bm25_norm = fusion.fuse(found, s.rank_vector_weight, s.rank_bm25_weight)
        # What is current first: a raw memory ranks below the facts the write pipeline took from it.
        for c in found:
            if c.has_facts:
                fused[c.id] *= s.rank_raw_with_facts
        t = explain.stage("fusion", t, vector_weight=s.rank_vector_weight, bm25_weight=s.rank_bm25_weight,
                          raw_with_facts=s.rank_raw_with_facts)
        access = {c.id: math.log1p(c.access_count) for c in found}
        base = {c.id: ranked_score(fused[c.id], 0.0, access[c.id], s.rank_access_weight) for c in found}  # no lift yet
        rising = expansion.could_rise(base, fused, s.expansion_weight, places)
        around = {c.id: c.around for c in found}  # read with the candidates' rows
        neighbours = {i: around[i] for i in rising}
        lift = expansion.lifts(fused, neighbours, s.expansion_weight)
        explain.stage("expansion", t, weight=s.expansion_weight, looked_up=len(rising),
                      lifted=sum(1 for v in lift.values() if v > 0))
        ranked = [Ranked(c.id, c.created_at, ranked_score(fused[c.id], lift[c.id], access[c.id], s.rank_access_weight),
                         dict(vector=c.similarity or 0.0, bm25=c.bm25, vector_norm=vector_norm[c.id],
                              bm25_norm=bm25_norm[c.id], fused=fused[c.id], expansion=lift[c.id],
                              access=access[c.id]))
                  for c in found]
        # Equal scores: earlier memories first (a conversation's order), then by id (a UUID orders
        # as its text does, without making the text).
        ranked.sort(key=lambda r: (-r.score, r.created_at, r.id))
        return ranked

    async def _rerank(self, query: str, hits: list[SearchHit], top_n: int, context: dict[UUID, str],
                      budget_s: float | None) -> tuple[list[SearchHit], str | None]:
        """The top `top_n` ordered by the reranker: as many of them as it expects to score in
        `budget_s` (None: all of them; at least one), the rest following in their fused order.
        A memory with an entry in `context` (the turn it follows in its session) is judged with
        it: a reply often makes sense only next to what it answers."""
        s = self._settings
        head = hits[:top_n]
        texts = [with_context(h.memory.content, context.get(h.memory.id)) for h in head]
        try:
            known = tuple(sorted({secret for h in head for secret in h.memory.sensitive}))
            scores = await self._reranker.scores(query, texts, s.rerank_timeout_ms / 1000, known, budget_s)
        except RerankFailed as exc:
            return hits, f"rerank_failed: {exc.reason}; kept the fused order"
        if scores is None:
            return hits, f"rerank_timeout: kept the fused order after {s.rerank_timeout_ms} ms"
        head, tail = hits[:len(scores)], hits[len(scores):]
        for hit, score in zip(head, scores):
            hit.components.rerank = score
            hit.score = score + s.rank_access_weight * hit.components.access
        head.sort(key=lambda h: (-h.score, h.memory.created_at, str(h.memory.id)))
        # Cross-encoder logits and fused scores are on different scales: the reranked head
        # stays above the tail, whose order is unchanged.
        if len(scores) < len(texts):
            return head + tail, (f"rerank_partial: reranked the fused top {len(scores)} of {len(texts)}, "
                                 "as many as this server expected to score within ENGRAM_RERANK_BUDGET_MS "
                                 f"({s.rerank_budget_ms} ms) of the search's start")
        return head + tail, None
