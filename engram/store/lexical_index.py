"""The BM25 index as a whole: its postings and statistics must come from the analyzer that
tokenises queries (`engram.domain.text.bm25_analyzer`). Writes keep them one memory at a time
(`engram.store.memories`); this rebuilds all of them when the configured analyzer changes.

It also feeds the lexical index, the sparse vectors that give search its BM25 candidates
(engram.lexical_steps): which memories it does not hold yet (`lexical_indexed`, the outbox),
their postings and their scopes' average lengths, the term ids it holds (`lexical_terms`), and
the query-side statistics.
"""

from __future__ import annotations

import logging
import time

from collections import defaultdict
from dataclasses import dataclass
from uuid import UUID

import asyncpg

from engram.domain.filters import Filters
from engram.domain.models import Scope
from engram.domain.text import term_frequencies, term_id
from engram.store import bm25
from engram.store.sql import Where

log = logging.getLogger(__name__)


async def settle_analyzer(conn: asyncpg.Connection, analyzer: str, stemmer: str, batch: int = 2_000) -> None:
    """Make the stored BM25 postings, document lengths and statistics those of `analyzer`
    (`bm25_analyzer(stemmer)`), which tokenises the queries.

    The state row is held FOR UPDATE, so of several processes starting at once one rebuilds
    and the others then find the analyzer recorded. The rebuild is one transaction: searches
    read the old postings until it commits; writes wait for it.
    """
    async with conn.transaction():
        state = await bm25.state(conn, lock="FOR UPDATE")
        if state.analyzer == analyzer:
            return
        if not await bm25.holds_memories(conn):
            await bm25.record(conn, analyzer, rebuilt=False)
            log.info("BM25 analyzer recorded", extra={"analyzer": analyzer})
            return
        log.warning("rebuilding BM25 postings", extra={"from": state.analyzer, "to": analyzer})
        started = time.perf_counter()
        await bm25.clear(conn)
        memories = postings = relengthed = 0
        cursor = await bm25.open_documents(conn)
        while rows := await cursor.fetch(batch):
            new_postings, lengths = [], []
            for row in rows:
                tf, length = term_frequencies(row["content"], stemmer)
                new_postings += [(row["id"], term, count, row["user_id"], row["agent_id"], row["run_id"])
                                 for term, count in tf.items()]
                if length != row["token_count"]:
                    lengths.append((row["id"], length))
            await bm25.copy_postings(conn, new_postings)
            await bm25.set_lengths(conn, lengths)
            memories += len(rows)
            postings += len(new_postings)
            relengthed += len(lengths)
        scopes, terms = await bm25.recount_stats(conn)
        await conn.execute("UPDATE memories SET lexical_indexed = false")  # its points hold the old terms
        await bm25.record(conn, analyzer, rebuilt=True)
    log.info("BM25 postings rebuilt", extra={
        "from": state.analyzer, "to": analyzer, "memories": memories, "postings": postings,
        "lengths_changed": relengthed, "scopes": scopes, "terms": terms,
        "latency_ms": round((time.perf_counter() - started) * 1000, 1)})


# -- the lexical index's outbox ----------------------------------------------------------------

@dataclass(frozen=True)
class ToIndex:
    """A memory whose point the lexical index must write: `row` holds its labels (as
    embedding_spaces.index_point reads them), `version`, `token_count` and `scope_key`; `tf` its
    postings; `avgdl` the average length its weights are computed with (its scope's
    `lexical_avgdl`)."""

    row: asyncpg.Record
    tf: dict[str, int]
    avgdl: float


_TO_INDEX = """
    SELECT m.id, m.version, m.user_id, m.agent_id, m.run_id, m.type, m.tags, m.who, m.source_type,
           m.created_at, m.is_deleted, m.kind, m.token_count, m.scope_key, m.trust, m.confidence,
           m.expires_at, m.memory_type
    FROM memories m WHERE {which} ORDER BY m.created_at, m.id LIMIT $1
"""


async def to_index(pool: asyncpg.Pool, limit: int, drift: float) -> list[ToIndex]:
    """Up to `limit` memories whose points to write, oldest first: those the index does not hold
    yet, then those to reweigh. First rebases their scopes (`rebase`), so every point of a scope
    is weighed with one average length within `drift` of the scope's own."""
    rows = await pool.fetch(_TO_INDEX.format(which="NOT m.lexical_indexed"), limit)
    if len(rows) < limit:
        rows += await pool.fetch(_TO_INDEX.format(which="m.lexical_reweigh AND m.lexical_indexed"), limit - len(rows))
    if not rows:
        return []
    avgdl = await rebase(pool, {r["scope_key"] for r in rows}, drift)
    tf: dict[UUID, dict[str, int]] = defaultdict(dict)
    for p in await pool.fetch("SELECT memory_id, term, tf FROM memory_terms WHERE memory_id = ANY($1::uuid[])",
                              [r["id"] for r in rows]):
        tf[p["memory_id"]][p["term"]] = p["tf"]
    return [ToIndex(r, tf[r["id"]], avgdl.get(r["scope_key"]) or float(max(r["token_count"], 1))) for r in rows]


async def rebase(pool: asyncpg.Pool, scope_keys: set[str], drift: float) -> dict[str, float]:
    """The average length each of these scopes' points are weighed with (`lexical_avgdl`).

    A scope without one takes its current average. One whose average has moved more than
    `drift` (a fraction) away takes the current one, and its points written with the old one are
    marked to reweigh (`lexical_reweigh`): stored weights then rank a scope's memories as exact
    BM25 does, up to that drift. Searches still score reweighed memories exactly from their old
    points meanwhile, since each point keeps what it was weighed with."""
    rows = await pool.fetch(
        """
        WITH moved AS (
            SELECT s.scope_key, s.lexical_avgdl IS NOT NULL AS had, s.total_len::float8 / s.doc_count AS now
            FROM bm25_scope_stats s
            WHERE s.scope_key = ANY($1::text[]) AND s.doc_count > 0
              AND (s.lexical_avgdl IS NULL OR abs(s.total_len::float8 / s.doc_count / s.lexical_avgdl - 1) > $2)
            FOR UPDATE
        ), rebased AS (
            UPDATE bm25_scope_stats s SET lexical_avgdl = moved.now FROM moved WHERE s.scope_key = moved.scope_key
        ), reweigh AS (
            -- A memory whose row a change holds is skipped, not waited for: the change takes the
            -- statistics after the row (engram.store.changes), and its point is rewritten anyway.
            UPDATE memories m SET lexical_reweigh = true
            WHERE m.id IN (SELECT r.id FROM memories r JOIN moved ON moved.had AND r.scope_key = moved.scope_key
                           WHERE r.lexical_indexed AND NOT r.lexical_reweigh FOR UPDATE OF r SKIP LOCKED)
        )
        SELECT s.scope_key, coalesce(moved.now, s.lexical_avgdl) AS avgdl
        FROM bm25_scope_stats s LEFT JOIN moved USING (scope_key) WHERE s.scope_key = ANY($1::text[])
        """,
        list(scope_keys), drift,
    )
    return {r["scope_key"]: r["avgdl"] for r in rows if r["avgdl"] is not None}


async def register_terms(pool: asyncpg.Pool, terms: set[str]) -> None:
    """Record the ids of `terms`, which points are about to hold, marking an id `shared` when it
    stands for two terms (`lexical_terms`). Idempotent."""
    by_id: dict[int, set[str]] = defaultdict(set)
    for term in terms:
        by_id[term_id(term)].add(term)
    if not by_id:
        return
    ids = list(by_id)
    await pool.execute(
        """
        INSERT INTO lexical_terms AS t (term_id, term, shared)
        SELECT * FROM unnest($1::bigint[], $2::text[], $3::bool[])
        ON CONFLICT (term_id) DO UPDATE SET shared = true
        WHERE NOT t.shared AND (t.term <> excluded.term OR excluded.shared)
        """,
        ids, [min(by_id[i]) for i in ids], [len(by_id[i]) > 1 for i in ids],
    )


async def mark_indexed(pool: asyncpg.Pool, written: list[tuple[UUID, int]]) -> int:
    """Record (memory, version) pairs as held (and weighed) by the lexical index. A memory
    changed since it was read (another version) stays to do. Returns how many were marked."""
    if not written:
        return 0
    result = await pool.execute(
        """
        UPDATE memories m SET lexical_indexed = true, lexical_reweigh = false
        FROM unnest($1::uuid[], $2::int[]) AS w(id, version)
        WHERE m.id = w.id AND m.version = w.version AND (NOT m.lexical_indexed OR m.lexical_reweigh)
        """,
        [w[0] for w in written], [w[1] for w in written],
    )
    return int(result.split()[-1])


async def reset_indexed(pool: asyncpg.Pool) -> int:
    """Every memory to index again (a new, empty lexical index). Returns how many."""
    result = await pool.execute("UPDATE memories SET lexical_indexed = false WHERE lexical_indexed")
    return int(result.split()[-1])


async def reweigh_all(pool: asyncpg.Pool) -> int:
    """Every held memory's point to reweigh (other BM25 parameters). Returns how many."""
    result = await pool.execute(
        "UPDATE memories SET lexical_reweigh = true WHERE lexical_indexed AND NOT lexical_reweigh")
    return int(result.split()[-1])


async def to_index_counts(pool: asyncpg.Pool) -> tuple[int, int]:
    """(memories the index does not hold yet, points to reweigh)."""
    row = await pool.fetchrow("SELECT (SELECT count(*) FROM memories WHERE NOT lexical_indexed) AS to_index, "
                              "(SELECT count(*) FROM memories WHERE lexical_reweigh) AS to_reweigh")
    return row["to_index"], row["to_reweigh"]


async def any_indexed(pool: asyncpg.Pool) -> bool:
    return await pool.fetchval("SELECT EXISTS (SELECT 1 FROM memories WHERE lexical_indexed)")


# -- the query side ----------------------------------------------------------------------------

@dataclass(frozen=True)
class QueryStats:
    """What one query's lexical search reads before it asks the index, over the exact scopes
    inside a search scope that the caller may see: each query term's IDF (terms no memory there
    holds are absent), the average document length, and the memories passing the filters that
    hold a query term and that the index does not hold yet (the newest writes, or all of them
    while it is rebuilt). Read before the index is searched, so a memory indexed meanwhile is
    in one or the other."""

    idf: dict[str, float]
    avgdl: float
    unindexed: list[UUID]
    shared_term_id: bool = False  # a query term's id stands for another term too (lexical_terms)
    # Every memory of the scopes the index does not hold as it is now, whatever the filters and
    # terms: a point of one is of an older version (changed content, tags, expiry) and says
    # nothing. None when there are more than STALE_LISTED (a rebuild): then none is trusted.
    stale: frozenset[UUID] | None = frozenset()

    def trusts(self, memory_id: UUID) -> bool:
        """Whether the index's point of `memory_id`, if it has one, is of the version read."""
        return self.stale is not None and memory_id not in self.stale


STALE_LISTED = 1_000


async def query_stats(conn: asyncpg.Connection, scope: Scope, filters: Filters, terms: list[str]) -> QueryStats:
    """IDF = ln(1 + (N - df + 0.5) / (df + 0.5)) and avgdl as memories.bm25_scores computes
    them, the memories not indexed yet (those to score, and every one whose point is stale),
    and whether a term's id is shared, in one statement."""
    distinct = sorted(set(terms))
    stats = Where([distinct, [term_id(t) for t in distinct]])
    stats.scope(scope, "s")
    stats.visible(filters.visible, "s")
    fresh = Where(stats.params)
    fresh.add_raw("NOT m.lexical_indexed")
    fresh.scope(scope, "m")
    fresh.filters(filters)
    stale = Where(fresh.params)
    stale.add_raw("NOT m.lexical_indexed")
    stale.scope(scope, "m")
    rows = await conn.fetch(
        f"""
        WITH scopes AS (SELECT s.scope_key, s.doc_count, s.total_len FROM bm25_scope_stats s WHERE {stats.sql()}),
        n AS (SELECT coalesce(sum(doc_count), 0)::float8 AS n,
                     coalesce(sum(total_len), 0)::float8 / greatest(coalesce(sum(doc_count), 0), 1) AS avgdl
              FROM scopes),
        df AS (SELECT ts.term, sum(ts.df)::float8 AS df FROM bm25_term_stats ts JOIN scopes USING (scope_key)
               WHERE ts.term = ANY($1::text[]) GROUP BY ts.term HAVING sum(ts.df) > 0)
        SELECT df.term, ln(1 + greatest(n.n - df.df + 0.5, 0) / (df.df + 0.5)) AS idf, n.avgdl,
               (SELECT array_agg(m.id) FROM memories m WHERE {fresh.sql()} AND EXISTS (
                    SELECT 1 FROM memory_terms t WHERE t.memory_id = m.id AND t.term = ANY($1::text[]))) AS unindexed,
               EXISTS (SELECT 1 FROM lexical_terms l WHERE l.term_id = ANY($2::bigint[]) AND l.shared) AS shared,
               (SELECT array_agg(m.id) FROM (SELECT m.id FROM memories m WHERE {stale.sql()}
                                             LIMIT {STALE_LISTED + 1}) m) AS stale
        FROM n LEFT JOIN df ON true
        """,
        *stale.params,
    )
    first = rows[0]
    stale_ids = first["stale"] or []
    return QueryStats(idf={r["term"]: float(r["idf"]) for r in rows if r["term"] is not None},
                      avgdl=float(first["avgdl"]), unindexed=first["unindexed"] or [],
                      shared_term_id=first["shared"],
                      stale=frozenset(stale_ids) if len(stale_ids) <= STALE_LISTED else None)


@dataclass(frozen=True)
class ExactScoring:
    """Okapi BM25 under a query's statistics, for memories read by id (`score_column`)."""

    stats: QueryStats
    ids: list[UUID]  # the memories to score; any other reads NULL
    k1: float
    b: float


def score_column(params: list, scoring: ExactScoring) -> str:
    """A column over `memories m`: m's Okapi BM25 under `scoring.stats` if m is one of
    `scoring.ids` and holds a query term, else NULL; memories.bm25_scores's arithmetic, from m's
    postings, reading no statistics. Its values are appended to `params`."""
    terms = sorted(scoring.stats.idf)
    first = len(params) + 1
    params += [terms, [scoring.stats.idf[t] for t in terms], scoring.k1, scoring.b, scoring.stats.avgdl, scoring.ids]
    terms_p, idf_p, k1, b, avgdl, ids_p = (f"${first + i}" for i in range(6))
    # One range of the postings' primary key per memory, each term's IDF read by its place in
    # the (distinct) terms: a join with the terms probed the index once per term (25 terms:
    # 925 probes for 37 memories, against 37; 1.3-2 ms a search at 1M memories).
    return f"""CASE WHEN m.id = ANY({ids_p}::uuid[]) THEN (
        SELECT sum(({idf_p}::float8[])[array_position({terms_p}::text[], t.term)] * t.tf * ({k1}::float8 + 1)
                   / (t.tf + {k1}::float8
                      * (1 - {b}::float8 + {b}::float8 * m.token_count / greatest({avgdl}::float8, 1))))
        FROM memory_terms t
        WHERE t.memory_id = m.id AND t.term = ANY({terms_p}::text[])) END"""


async def exact_scores(conn: asyncpg.Connection, scope: Scope, filters: Filters, scoring: ExactScoring
                       ) -> dict[UUID, float]:
    """The scores (`score_column`) of the memories `scoring.ids` in `scope` that pass `filters`
    and hold a query term."""
    if not scoring.stats.idf or not scoring.ids:
        return {}
    where = Where.ids_in_scope(scoring.ids, scope, filters)
    score = score_column(where.params, scoring)
    rows = await conn.fetch(f"SELECT m.id, {score} AS score FROM memories m WHERE {where.sql()}", *where.params)
    return {r["id"]: float(r["score"]) for r in rows if r["score"] is not None}
