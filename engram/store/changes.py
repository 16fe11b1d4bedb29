"""SQL for changing a memory by id: locking its row, writing its new state with its postings and
statistics in step, and telling the index owner which points to rewrite.

A change takes its locks in one order: the memory's row, then its scope's BM25 statistics
(scope row, then terms in sorted order, as every writer of statistics does). The lexical
indexer's rebase takes statistics before memory rows, and skips memory rows that are locked.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import asyncpg
import numpy as np

from engram.domain.models import Scope
from engram.store import memories as repo
from engram.store.jobs import NEW_JOBS

ROW_COLUMNS = repo.MEMORY_COLUMNS + ", m.chain_hash, m.token_count, m.manual_override"
# What a change may set; the names are code's, never a request's.
SETTABLE = frozenset({
    "content", "normalized_content", "content_hash", "token_count", "type", "tags", "importance", "pinned",
    "metadata", "is_deleted", "deleted_at", "status", "manual_override", "manual_override_until", "approval",
})


async def lock(conn: asyncpg.Connection, memory_id: UUID) -> asyncpg.Record | None:
    """The memory's row, locked until the caller's transaction ends."""
    return await conn.fetchrow(f"SELECT {ROW_COLUMNS} FROM memories m WHERE m.id = $1 FOR UPDATE", memory_id)


async def postings(conn: asyncpg.Connection, memory_id: UUID) -> dict[str, int]:
    rows = await conn.fetch("SELECT term, tf FROM memory_terms WHERE memory_id = $1", memory_id)
    return {r["term"]: r["tf"] for r in rows}


async def replace_postings(conn: asyncpg.Connection, memory_id: UUID, scope: Scope, tf: dict[str, int]) -> None:
    await conn.execute("DELETE FROM memory_terms WHERE memory_id = $1", memory_id)
    await conn.execute(
        """
        INSERT INTO memory_terms (memory_id, term, tf, user_id, agent_id, run_id)
        SELECT $1, t.term, t.tf, $2, $3, $4 FROM unnest($5::text[], $6::int[]) AS t(term, tf)
        """,
        memory_id, scope.user_id, scope.agent_id, scope.run_id, list(tf), list(tf.values()),
    )


async def write(conn: asyncpg.Connection, memory_id: UUID, sets: dict[str, Any], *, actor: str) -> asyncpg.Record:
    """Set `sets` (column: value, columns from SETTABLE) and the next version; mark the memory's
    lexical point and vector points to rewrite. Returns the row as it is now. Raises
    asyncpg.UniqueViolationError when it would make a second live memory of one content in
    the scope."""
    unknown = set(sets) - SETTABLE
    if unknown:
        raise ValueError(f"not settable: {sorted(unknown)}")
    names = sorted(sets)
    assignments = ", ".join(f"{name} = ${i}" for i, name in enumerate(names, start=3))
    return await conn.fetchrow(
        f"""
        UPDATE memories m SET {assignments}, version = version + 1, updated_at = now(), updated_by = $2,
            lexical_indexed = false, dense_stale = true
        WHERE m.id = $1 RETURNING {ROW_COLUMNS}
        """,
        memory_id, actor, *(sets[name] for name in names),
    )


async def mark(conn: asyncpg.Connection, memory_id: UUID, *, status: str) -> asyncpg.Record:
    """Set the status alone: no new version (quarantine and confirm are about the row, not changes to it)."""
    return await conn.fetchrow(
        f"UPDATE memories m SET status = $2, updated_at = now() WHERE m.id = $1 RETURNING {ROW_COLUMNS}",
        memory_id, status,
    )


async def live_twin(conn: asyncpg.Connection, memory_id: UUID, content_hash: str) -> UUID | None:
    """Another live memory of the same exact scope with this content."""
    return await conn.fetchval(
        """
        SELECT o.id FROM memories o JOIN memories m ON m.id = $1
        WHERE o.scope_key = m.scope_key AND o.kind = m.kind AND o.content_hash = $2 AND NOT o.is_deleted
          AND o.id <> $1
        """,
        memory_id, content_hash,
    )


async def store_vector(conn: asyncpg.Connection, memory_id: UUID, vector: np.ndarray | None, model: str | None
                       ) -> None:
    """The memory's canonical embedding (None: none until one is made)."""
    await conn.execute("UPDATE memories SET embedding = $2, embedding_model = $3 WHERE id = $1",
                       memory_id, vector, model)


async def drop_target_vector(conn: asyncpg.Connection, memory_id: UUID, model: str) -> None:
    """Forget a re-embed's vector of old content, so the re-embed makes it again."""
    await conn.execute("DELETE FROM memory_embeddings WHERE memory_id = $1 AND model = $2", memory_id, model)


async def wake_index_sync(conn: asyncpg.Connection | asyncpg.Pool) -> None:
    """Wake the index owner's sync loop (when the caller's transaction, if any, commits)."""
    await conn.execute("SELECT pg_notify($1, '')", NEW_JOBS)


async def stale_points(pool: asyncpg.Pool, limit: int) -> list[asyncpg.Record]:
    """Up to `limit` memories whose vector points a change left stale: (id, version)."""
    return await pool.fetch(
        "SELECT id, version FROM memories WHERE dense_stale ORDER BY updated_at, id LIMIT $1", limit)


async def mark_points_fresh(pool: asyncpg.Pool, written: list[tuple[UUID, int]]) -> int:
    """Record (memory, version) pairs whose points were rewritten; a memory changed since stays stale."""
    if not written:
        return 0
    result = await pool.execute(
        """
        UPDATE memories m SET dense_stale = false FROM unnest($1::uuid[], $2::int[]) AS w(id, version)
        WHERE m.id = w.id AND m.version = w.version AND m.dense_stale
        """,
        [w[0] for w in written], [w[1] for w in written],
    )
    return int(result.split()[-1])
