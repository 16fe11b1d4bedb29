"""SQL for the BM25 analyzer state and the start-up rebuild of the postings and statistics.

The write path keeps postings and statistics one memory at a time (memories.insert_raw,
memories.add_stats); this module replaces all of them at once when the analyzer that
built them is not the configured one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg


@dataclass(frozen=True)
class Bm25State:
    analyzer: str
    rebuilt_at: datetime | None


async def state(conn: asyncpg.Connection | asyncpg.Pool, *, lock: str = "") -> Bm25State:
    """The state row; `lock` is "" or "FOR UPDATE" (whoever may rebuild)."""
    row = await conn.fetchrow(f"SELECT analyzer, rebuilt_at FROM bm25_state WHERE id {lock}")
    return Bm25State(row["analyzer"], row["rebuilt_at"])


async def record(conn: asyncpg.Connection, analyzer: str, *, rebuilt: bool) -> None:
    """Name `analyzer` as the one that built the postings; `rebuilt` stamps rebuilt_at."""
    await conn.execute(
        "UPDATE bm25_state SET analyzer = $1, updated_at = now(),"
        " rebuilt_at = CASE WHEN $2 THEN now() ELSE rebuilt_at END WHERE id",
        analyzer, rebuilt,
    )


async def point_weights(conn: asyncpg.Connection | asyncpg.Pool) -> str | None:
    """The BM25 parameters the lexical index's points are weighed with (None: not recorded yet)."""
    return await conn.fetchval("SELECT point_weights FROM bm25_state WHERE id")


async def record_point_weights(conn: asyncpg.Connection | asyncpg.Pool, weights: str) -> None:
    await conn.execute("UPDATE bm25_state SET point_weights = $1, updated_at = now() WHERE id", weights)


async def holds_memories(conn: asyncpg.Connection) -> bool:
    return await conn.fetchval("SELECT EXISTS (SELECT 1 FROM memories)")


async def clear(conn: asyncpg.Connection) -> None:
    """Empty the postings and statistics in the caller's transaction, which then refills them.

    EXCLUSIVE locks let searches go on reading the committed rows (DELETE, not TRUNCATE, whose
    lock would stop them) while writers, which insert into all three tables, wait for the commit.
    """
    await conn.execute("LOCK TABLE memory_terms, bm25_scope_stats, bm25_term_stats IN EXCLUSIVE MODE")
    await conn.execute("DELETE FROM memory_terms")
    await conn.execute("DELETE FROM bm25_scope_stats")
    await conn.execute("DELETE FROM bm25_term_stats")


async def open_documents(conn: asyncpg.Connection) -> asyncpg.cursor.Cursor:
    """A cursor over every memory, deleted ones too (include_deleted searches score them):
    id, user_id, agent_id, run_id, content, token_count. Needs a transaction."""
    return await conn.cursor("SELECT id, user_id, agent_id, run_id, content, token_count FROM memories")


async def copy_postings(
    conn: asyncpg.Connection, postings: list[tuple[UUID, str, int, str | None, str | None, str | None]],
) -> None:
    """Bulk postings, as memories.insert_raw writes them: rows of (memory_id, term, tf, user_id, agent_id, run_id)."""
    if postings:
        await conn.copy_records_to_table(
            "memory_terms", records=postings, columns=["memory_id", "term", "tf", "user_id", "agent_id", "run_id"],
        )


async def set_lengths(conn: asyncpg.Connection, lengths: list[tuple[UUID, int]]) -> None:
    """Set memories.token_count, the BM25 document length, of each (memory_id, length)."""
    if lengths:
        await conn.execute(
            "UPDATE memories m SET token_count = v.len"
            " FROM unnest($1::uuid[], $2::integer[]) AS v(id, len) WHERE m.id = v.id",
            [memory_id for memory_id, _ in lengths], [length for _, length in lengths],
        )


async def recount_stats(conn: asyncpg.Connection) -> tuple[int, int]:
    """Fill the emptied statistics from the live memories and their postings, the same
    numbers memories.add_to_bm25_stats keeps one write at a time. Returns (scope rows, term rows)."""
    scopes = await conn.execute(
        """
        INSERT INTO bm25_scope_stats (user_id, agent_id, run_id, doc_count, total_len)
        SELECT user_id, agent_id, run_id, count(*), sum(token_count)
        FROM memories WHERE NOT is_deleted GROUP BY user_id, agent_id, run_id
        """
    )
    terms = await conn.execute(
        """
        INSERT INTO bm25_term_stats (scope_key, term, df)
        SELECT m.scope_key, t.term, count(*)
        FROM memory_terms t JOIN memories m ON m.id = t.memory_id
        WHERE NOT m.is_deleted GROUP BY m.scope_key, t.term
        """
    )
    return int(scopes.split()[-1]), int(terms.split()[-1])
