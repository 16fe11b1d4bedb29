"""SQL for memories, their BM25 postings and statistics, and their history."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

import asyncpg
import numpy as np

from engram.domain import chain
from engram.domain.changes import NO_MODEL, ModelAttribution
from engram.domain.filters import Filters
from engram.domain.models import Memory, MemoryDraft, Scope
from engram.domain.text import content_hash, normalize, term_frequencies
from engram.store import history, lexical_index
from engram.store.sql import Where

# A memory's access count and its last access live in `memory_access` (migration 0022), read
# by memory `m`; a memory that was never a search result has no row there.
ACCESS_COUNT = "coalesce((SELECT ma.access_count FROM memory_access ma WHERE ma.memory_id = m.id), 0)"
LAST_ACCESSED = "(SELECT ma.last_accessed FROM memory_access ma WHERE ma.memory_id = m.id)"
# The fields of `Memory`, in the order MEMORY_COLUMNS reads them.
MEMORY_FIELDS = (
    "id", "content", "user_id", "agent_id", "run_id", "type", "category", "tags", "who",
    "source_type", "source_id", "session_id", "metadata", "pinned", "is_deleted", "deleted_at",
    "confidence", "importance", "extraction_status", "extracted", "access_count", "last_accessed",
    "embedding_model", "extraction_model", "content_hash", "created_at", "updated_at",
    "updated_by", "version", "status", "manual_override_until", "kind", "derived_from", "sensitive",
    "entities", "trust", "memory_type", "expires_at", "created_by", "agent_chain", "origin", "approval",
)
_READ_AS = {"access_count": ACCESS_COUNT, "last_accessed": LAST_ACCESSED}
MEMORY_COLUMNS = ", ".join(f"{_READ_AS[f]} AS {f}" if f in _READ_AS else f"m.{f}" for f in MEMORY_FIELDS)


def row_to_memory(row: asyncpg.Record) -> Memory:
    return Memory.model_validate(dict(row))


async def insert_raw(conn: asyncpg.Connection, draft: MemoryDraft, *, memory_id: UUID, actor: str,
                     stemmer: str, extraction_status: str, request_id: str | None = None,
                     stats: StatsDelta | None = None, actor_type: str = "writer", path: str | None = "http",
                     model: ModelAttribution = NO_MODEL) -> bool:
    """Write a memory as it arrives, in the caller's transaction: the row, its BM25 postings and
    scope statistics (terms by `stemmer`), and its ADD history event, the first of its chain.
    Returns False, writing nothing, when a live memory of exactly its scope holds the same
    content: the unique partial index decides, so concurrent identical writes leave one row.

    With `stats`, the statistics are added to it instead, for the caller to write once for many
    memories (`add_stats`) before its transaction commits."""
    normalized = normalize(draft.content)
    tf, length = term_frequencies(draft.content, stemmer)
    scope = draft.scope
    parts = (scope.user_id, scope.agent_id, scope.run_id)
    event = history.Event(
        event="ADD", version=1, actor_type=actor_type, actor_id=actor, path=path, request_id=request_id,
        session_id=draft.session_id, new_content=draft.content, new_metadata=draft.metadata,
        provider=model.provider, model=model.model, prompt_version=model.prompt_version,
        state={"content": draft.content, "type": draft.type, "tags": list(draft.tags),
               "importance": chain.real(draft.importance), "pinned": draft.pinned, "metadata": draft.metadata,
               "is_deleted": False})
    event_args, digest = history.insert_args(memory_id, parts, event, None)
    # One statement, one round trip: the row, then (only if it was inserted) its postings and
    # its ADD event, which the foreign keys check at the statement's end.
    inserted = await conn.fetchval(
        f"""
        WITH m AS (
            INSERT INTO memories (id, user_id, agent_id, run_id, content, normalized_content,
                content_hash, type, tags, who, source_type, source_id, session_id, metadata, pinned,
                importance, extraction_status, token_count, updated_by, chain_hash, kind, derived_from, confidence,
                trust, memory_type, expires_at, created_by, agent_chain, origin, approval, status)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $22,
                    $23, $24, $25, $26, $27, $28, $19, $29, $30, $31, $32)
            ON CONFLICT (scope_key, kind, content_hash) WHERE NOT is_deleted DO NOTHING
            RETURNING id),
        postings AS (
            INSERT INTO memory_terms (memory_id, term, tf, user_id, agent_id, run_id)
            SELECT m.id, t.term, t.tf, $2, $3, $4 FROM m, unnest($20::text[], $21::int[]) AS t(term, tf)),
        history AS ({_shifted(history.INSERT_SELECT, 32)} FROM m)
        SELECT count(*) > 0 FROM m
        """,
        memory_id, scope.user_id, scope.agent_id, scope.run_id, draft.content, normalized, content_hash(normalized),
        draft.type, draft.tags, draft.who, draft.source_type, draft.source_id, draft.session_id, draft.metadata,
        draft.pinned, draft.importance, extraction_status, length, actor, list(tf), list(tf.values()), digest,
        draft.kind, draft.derived_from, draft.confidence, draft.trust, draft.memory_type, draft.expires_at,
        draft.agent_chain, draft.origin, draft.approval, "pending" if draft.approval == "pending" else "active",
        *event_args,
    )
    if not inserted:
        return False
    if stats is None:
        await add_to_bm25_stats(conn, scope, tf, length)
    else:
        stats.add(scope, tf, length)
    return True


def _shifted(sql: str, by: int) -> str:
    """`sql` with each placeholder $n renumbered $(n + by), to follow other parameters."""
    return re.sub(r"\$(\d+)", lambda m: f"${int(m.group(1)) + by}", sql)


async def find_live_by_hash(conn: asyncpg.Connection, scope: Scope, content_hash: str, kind: str = "raw"
                            ) -> UUID | None:
    """The live memory of `kind` of exactly `scope` (not of a scope inside it) holding this content."""
    return await conn.fetchval(
        "SELECT id FROM memories WHERE scope_key = engram_scope_key($1, $2, $3) AND content_hash = $4"
        " AND kind = $5 AND NOT is_deleted",
        scope.user_id, scope.agent_id, scope.run_id, content_hash, kind,
    )


async def get(conn: asyncpg.Connection | asyncpg.Pool, memory_id: UUID) -> Memory | None:
    row = await conn.fetchrow(f"SELECT {MEMORY_COLUMNS} FROM memories m WHERE m.id = $1", memory_id)
    return row_to_memory(row) if row else None


async def list_page(
    pool: asyncpg.Pool, scope: Scope, filters: Filters, *, after: tuple[datetime, UUID] | None, limit: int,
) -> list[Memory]:
    """Memories in `scope`, newest first, keyset-paginated on (created_at, id)."""
    where = Where()
    where.scope(scope, "m")
    where.filters(filters)
    if after is not None:
        where.add("(m.created_at, m.id) < ({}, {})", *after)
    where.params.append(limit)
    rows = await pool.fetch(
        f"SELECT {MEMORY_COLUMNS} FROM memories m WHERE {where.sql()}"
        f" ORDER BY m.created_at DESC, m.id DESC LIMIT ${len(where.params)}",
        *where.params,
    )
    return [row_to_memory(r) for r in rows]


@dataclass
class StatsDelta:
    """BM25 statistics of new memories not yet written: per exact scope, (memories, total
    length) and each term's document count."""

    docs: dict[tuple, list[int]] = field(default_factory=dict)
    df: dict[tuple, Counter] = field(default_factory=dict)

    def add(self, scope: Scope, tf: dict[str, int], length: int) -> None:
        key = (scope.user_id, scope.agent_id, scope.run_id)
        docs = self.docs.setdefault(key, [0, 0])
        docs[0] += 1
        docs[1] += length
        self.df.setdefault(key, Counter()).update(tf.keys())

    def remove(self, scope: Scope, tf: dict[str, int], length: int) -> None:
        """Uncount a memory that leaves the live ones (a delete, or its old content)."""
        key = (scope.user_id, scope.agent_id, scope.run_id)
        docs = self.docs.setdefault(key, [0, 0])
        docs[0] -= 1
        docs[1] -= length
        self.df.setdefault(key, Counter()).update({term: -1 for term in tf})

    def merge(self, other: StatsDelta) -> None:
        for key, (count, length) in other.docs.items():
            docs = self.docs.setdefault(key, [0, 0])
            docs[0] += count
            docs[1] += length
        for key, df in other.df.items():
            self.df.setdefault(key, Counter()).update(df)


def scope_order(parts: tuple[str | None, str | None, str | None]) -> tuple[str, str, str]:
    """The order writers take scopes in, (user_id, agent_id, run_id) with no part first, so
    two transactions that lock several scopes' rows never wait on each other in a cycle."""
    return tuple("" if part is None else part for part in parts)


async def add_stats(conn: asyncpg.Connection, delta: StatsDelta) -> None:
    """Write `delta`: one update per scope and one per term, however many memories it counts.
    Scopes are taken in sorted order, then each scope's terms in sorted order, the order
    add_to_bm25_stats locks them in, so writers never deadlock on these rows. (A term updated
    once per memory in one transaction leaves a row version per update, which every later
    update in it walks past: 500 memories cost quadratic time.)"""
    for key in sorted(delta.docs, key=scope_order):
        count, length = delta.docs[key]
        terms = sorted(t for t, n in delta.df[key].items() if n)
        if not count and not length and not terms:
            continue
        await conn.execute(
            """
            INSERT INTO bm25_scope_stats (user_id, agent_id, run_id, doc_count, total_len)
            VALUES ($1, $2, $3, $4, $5)
            ON CONFLICT (scope_key) DO UPDATE SET doc_count = bm25_scope_stats.doc_count + EXCLUDED.doc_count,
                total_len = bm25_scope_stats.total_len + EXCLUDED.total_len
            """,
            *key, count, length,
        )
        if terms:
            await conn.execute(
                """
                INSERT INTO bm25_term_stats (scope_key, term, df)
                SELECT engram_scope_key($1, $2, $3), t.term, t.df FROM unnest($4::text[], $5::int[]) AS t(term, df)
                ON CONFLICT (scope_key, term) DO UPDATE SET df = bm25_term_stats.df + EXCLUDED.df
                """,
                *key, terms, [delta.df[key][t] for t in terms],
            )


async def add_to_bm25_stats(conn: asyncpg.Connection, scope: Scope, tf: dict[str, int], length: int) -> None:
    """Count a new live memory in its exact scope's BM25 statistics (same transaction as the insert).

    The scope row is updated first and terms in sorted order, so concurrent writers to one
    scope queue on that row instead of deadlocking on term rows.
    """
    delta = StatsDelta()
    delta.add(scope, tf, length)
    await add_stats(conn, delta)


async def bm25_scores(
    conn: asyncpg.Connection | asyncpg.Pool, scope: Scope, filters: Filters, terms: list[str], *,
    k1: float, b: float, limit: int,
) -> dict[UUID, float]:
    """Okapi BM25 of the memories in `scope` that hold a query term: the top `limit`, by an
    aggregation of every posting of the query's terms in the scope (engram.recall.candidates.Bm25
    finds the same top through the lexical index, and scores given memories by id).

    N, the average length and each term's df come from the statistics of the exact scopes
    inside `scope` (live memories). Each distinct query term counts once;
    IDF = ln(1 + (N - df + 0.5) / (df + 0.5)).
    """
    if not terms:
        return {}
    where_t = Where([sorted(set(terms)), k1, b])
    where_t.add_raw("t.term = ANY($1::text[])")
    where_t.scope(scope, "t")
    where_s = Where(where_t.params)
    where_s.scope(scope, "s")
    where_s.visible(filters.visible, "s")  # no statistics from memories the caller may not see
    where_f = Where(where_s.params)
    where_f.filters(filters)
    where_f.params.append(limit)
    rows = await conn.fetch(
        f"""
        WITH scopes AS (
            SELECT s.scope_key, s.doc_count, s.total_len FROM bm25_scope_stats s WHERE {where_s.sql()}
        ), stats AS (
            SELECT coalesce(sum(doc_count), 0)::float8 AS n,
                   coalesce(sum(total_len), 0)::float8 / greatest(coalesce(sum(doc_count), 0), 1) AS avgdl
            FROM scopes
        ), df AS (
            SELECT ts.term, sum(ts.df)::float8 AS df
            FROM bm25_term_stats ts JOIN scopes USING (scope_key)
            WHERE ts.term = ANY($1::text[]) GROUP BY ts.term
        )
        SELECT t.memory_id,
               sum(ln(1 + greatest(stats.n - df.df + 0.5, 0) / (df.df + 0.5))
                   * t.tf * ($2::float8 + 1)
                   / (t.tf + $2::float8 * (1 - $3::float8 + $3::float8 * m.token_count / greatest(stats.avgdl, 1))))
                   AS score
        FROM memory_terms t
        JOIN df ON df.term = t.term
        JOIN memories m ON m.id = t.memory_id
        CROSS JOIN stats
        WHERE {where_t.sql()} AND {where_f.sql()}
        GROUP BY t.memory_id
        ORDER BY score DESC LIMIT ${len(where_f.params)}
        """,
        *where_f.params,
    )
    return {r["memory_id"]: float(r["score"]) for r in rows}


@dataclass(frozen=True)
class CandidateRow:
    """What ranking needs of a candidate; the full row is read only for the results."""

    id: UUID
    created_at: datetime
    access_count: int
    similarity: float | None  # None where the memory has no embedding from the query's model yet
    has_facts: bool = False  # a raw memory the write pipeline took facts from
    # The live memories written just before and after it in its scope and session (`_session_neighbour`),
    # if asked for; None: there is none (or it has no session)
    before: UUID | None = None
    after: UUID | None = None
    bm25: float | None = None  # its exact BM25, if asked for and it holds a query term


def _live(alias: str) -> str:
    """What a session neighbour must be: not deleted, and active (not quarantined, pending or superseded)."""
    return f"NOT {alias}.is_deleted AND {alias}.status = 'active'"


def _session_neighbour(column: str, before: bool) -> str:
    """A correlated subquery over `memories m`: `column` of the live memory written just before
    (or after) m in m's scope and session. Never another scope, never a deleted, quarantined or
    pending memory."""
    cmp, order = ("<", "DESC") if before else (">", "ASC")
    return f"""(SELECT p.{column} FROM memories p
             WHERE p.scope_key = m.scope_key AND p.session_id = m.session_id AND {_live("p")}
               AND (p.created_at, p.id) {cmp} (m.created_at, m.id)
             ORDER BY p.created_at {order}, p.id {order} LIMIT 1)"""


async def candidate_rows(
    conn: asyncpg.Connection | asyncpg.Pool, ids: list[UUID], scope: Scope, filters: Filters,
    query_vector: np.ndarray, model: str, *, neighbours: bool = False,
    bm25: lexical_index.ExactScoring | None = None,
) -> list[CandidateRow]:
    """Those of `ids` that are in `scope` and pass `filters`, each with the cosine similarity of
    its canonical embedding to the query; with `neighbours`, the live memories written just
    before and after it in its scope and session (whatever they are: recall keeps those among
    its candidates); and with `bm25`, the exact BM25 of those of `bm25.ids`
    (lexical_index.score_column).

    Each row's neighbours are two probes of memories_session_order_idx, each read up to its
    first live memory, so candidates read in several statements (recall reads each leg's on its
    own connection, side by side) get the same neighbours as read in one. The candidates come
    from indexes that may lag; this re-check against the rows is what guarantees scope and
    deletion (and `sealed_rows_in_scope` checks again for the results)."""
    where = Where.ids_in_scope(ids, scope, filters, query_vector, model)
    score = lexical_index.score_column(where.params, bm25) if bm25 is not None else "NULL::float8"
    around = (f", {_session_neighbour('id', before=True)} AS before, {_session_neighbour('id', before=False)} AS after"
              if neighbours else "")
    rows = await conn.fetch(
        f"""
        SELECT m.id, m.created_at, {ACCESS_COUNT} AS access_count, m.has_facts,
               CASE WHEN m.embedding_model = $3 THEN 1 - (m.embedding <=> $2) END AS similarity,
               {score} AS bm25{around}
        FROM memories m WHERE {where.sql()}""",
        *where.params,
    )
    return [CandidateRow(r["id"], r["created_at"], r["access_count"], r["similarity"], r["has_facts"],
                         r["before"] if neighbours else None, r["after"] if neighbours else None, r["bm25"])
            for r in rows]


async def stale_dense(conn: asyncpg.Connection | asyncpg.Pool, scope: Scope, filters: Filters, model: str,
                      limit: int) -> dict[UUID, np.ndarray | None]:
    """Up to `limit` memories of `scope` whose vector points a change left stale (`dense_stale`),
    the most recently changed first, whatever the filters: each with its canonical `model`
    embedding, or None if it no longer passes `filters` or has no `model` vector.

    The partial indexes on `dense_stale` by scope column find them: none in the steady state
    (0.05 ms at 100k memories in the scope). 3,000 after a mass change cost 6-7 ms until the
    index owner has rewritten them (ids sorted first, then the rows read by id: whole rows
    sorted took 9-12 ms)."""
    stale = Where([model, limit])
    stale.add_raw("s.dense_stale")
    stale.scope(scope, "s")
    passes = Where(stale.params)  # the same parameter list: its values follow the scope's
    passes.filters(filters)
    rows = await conn.fetch(
        f"""
        SELECT m.id, CASE WHEN {passes.sql()} AND m.embedding_model = $1 THEN m.embedding END AS embedding
        FROM memories m
        WHERE m.id = ANY(ARRAY(SELECT s.id FROM memories s WHERE {stale.sql()}
                               ORDER BY s.updated_at DESC, s.id DESC LIMIT $2))
        """,
        *stale.params,
    )
    return {r["id"]: None if r["embedding"] is None else r["embedding"].to_numpy() for r in rows}


async def sealed_rows_in_scope(conn: asyncpg.Connection | asyncpg.Pool, ids: list[UUID], scope: Scope,
                              filters: Filters) -> list[asyncpg.Record]:
    """The full rows of those of `ids` that are in `scope` and pass `filters` now, each with
    what judging it against its hash chain needs (history.SEAL_COLUMNS), read in one snapshot:
    a search's results and their check in one statement. `row_to_memory` reads the memory."""
    where = Where.ids_in_scope(ids, scope, filters)
    return await conn.fetch(
        f"SELECT {MEMORY_COLUMNS}, {history.SEAL_COLUMNS} FROM memories m {history.NEWEST_EVENT_JOIN}"
        f" WHERE {where.sql()}",
        *where.params,
    )


async def session_predecessors(conn: asyncpg.Connection | asyncpg.Pool, ids: list[UUID]) -> dict[UUID, str]:
    """For each of `ids` that has a session: the content of the live memory written just before it
    in the same scope and session (what a conversational turn answers)."""
    rows = await conn.fetch(
        f"""
        SELECT m.id, {_session_neighbour('content', before=True)} AS prev
        FROM memories m WHERE m.id = ANY($1::uuid[]) AND m.session_id IS NOT NULL
        """,
        ids,
    )
    return {r["id"]: r["prev"] for r in rows if r["prev"] is not None}


async def store_embeddings(conn: asyncpg.Connection, rows: list[tuple[UUID, np.ndarray]], model: str) -> None:
    await conn.executemany(
        "UPDATE memories SET embedding = $2, embedding_model = $3 WHERE id = $1",
        [(memory_id, vector, model) for memory_id, vector in rows],
    )


async def set_extraction_status_many(conn: asyncpg.Connection, memory_ids: list[UUID], status: str) -> None:
    await conn.execute("UPDATE memories SET extraction_status = $2 WHERE id = ANY($1::uuid[])", memory_ids, status)


async def get_many(conn: asyncpg.Connection | asyncpg.Pool, memory_ids: list[UUID]) -> list[Memory]:
    rows = await conn.fetch(f"SELECT {MEMORY_COLUMNS} FROM memories m WHERE m.id = ANY($1::uuid[])", memory_ids)
    return [row_to_memory(r) for r in rows]


STATE_COLUMNS = "user_id, agent_id, run_id, version, chain_hash, " + ", ".join(chain.STATE_FIELDS)


async def record_extraction(
    conn: asyncpg.Connection, memory_id: UUID, *, status: str, extracted: dict | None, model: str | None,
    category: str | None, actor: str, provider: str | None, prompt_version: str | None, request_id: str | None,
) -> int:
    """Set the extraction outcome, bump the version and append its UPDATE event, in the caller's
    transaction. Returns the new version."""
    row = await conn.fetchrow(
        f"""
        UPDATE memories SET extraction_status = $2, extracted = $3, extraction_model = $4,
            category = coalesce($5, category), updated_at = now(), updated_by = $6, version = version + 1
        WHERE id = $1 RETURNING {STATE_COLUMNS}
        """,
        memory_id, status, extracted, model, category, actor,
    )
    prev = row["chain_hash"] or await history.seal_memory(conn, memory_id)
    await history.append(conn, memory_id, (row["user_id"], row["agent_id"], row["run_id"]), history.Event(
        event="UPDATE", version=row["version"], state=chain.state_of(row), actor_type="system", actor_id=actor,
        path=actor, reason="extraction", new_metadata={"extracted": extracted}, provider=provider, model=model,
        prompt_version=prompt_version, request_id=request_id), prev)
    return row["version"]


async def set_extraction_status(conn: asyncpg.Connection | asyncpg.Pool, memory_id: UUID, status: str) -> None:
    await conn.execute("UPDATE memories SET extraction_status = $2 WHERE id = $1", memory_id, status)


async def add_accesses(pool: asyncpg.Pool, tally: dict[UUID, tuple[int, datetime]]) -> None:
    """Add each memory's accesses (id -> (how many, the last one's time)) to its `memory_access`
    row, which the first access creates; a memory gone since is skipped. The memories' own rows
    are not written: each one a new row is made for is only key-share locked (what its foreign
    key takes), in id order, as every statement here that changes several memories locks them,
    so this never deadlocks with one and waits for no change that keeps the memory's id."""
    ids = sorted(tally)
    await pool.execute(
        """
        INSERT INTO memory_access AS a (memory_id, access_count, last_accessed)
        SELECT t.id, t.n, t.at FROM unnest($1::uuid[], $2::bigint[], $3::timestamptz[]) AS t(id, n, at)
        WHERE EXISTS (SELECT 1 FROM memories m WHERE m.id = t.id)
        ORDER BY t.id
        ON CONFLICT (memory_id) DO UPDATE SET access_count = a.access_count + excluded.access_count,
            last_accessed = greatest(a.last_accessed, excluded.last_accessed)
        """,
        ids, [tally[i][0] for i in ids], [tally[i][1] for i in ids],
    )


async def end_other_sessions(conn: asyncpg.Connection | asyncpg.Pool, scope: Scope, session_id: str,
                             now: datetime) -> None:
    """A new session of `scope` ends its earlier ones: their STATE memories expire `now` (their
    index points are rewritten with it). Rows are locked in id order."""
    await conn.execute(
        """
        UPDATE memories SET expires_at = $5, dense_stale = true, lexical_indexed = false
        WHERE id IN (SELECT id FROM memories
                     WHERE scope_key = engram_scope_key($1, $2, $3) AND memory_type = 'STATE'
                       AND session_id IS DISTINCT FROM $4 AND (expires_at IS NULL OR expires_at > $5)
                     ORDER BY id FOR UPDATE)
        """,
        scope.user_id, scope.agent_id, scope.run_id, session_id, now,
    )


async def renew(conn: asyncpg.Connection, memory_id: UUID, expires_at: datetime | None, now: datetime) -> None:
    """A memory said again after it expired lives again until `expires_at` (None: for good);
    its index points are rewritten with it. One not expired is left as it is."""
    await conn.execute(
        "UPDATE memories SET expires_at = $2, dense_stale = true, lexical_indexed = false"
        " WHERE id = $1 AND expires_at <= $3",
        memory_id, expires_at, now,
    )
