"""SQL for the embedding state and the canonical vectors of a re-embed's target model."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

import asyncpg
import numpy as np


@dataclass(frozen=True)
class EmbeddingState:
    active: str | None
    target: str | None
    reembed_job: UUID | None


async def state(conn: asyncpg.Connection | asyncpg.Pool, *, lock: str = "") -> EmbeddingState:
    """The state row; `lock` is "" or "FOR SHARE" (writers) or "FOR UPDATE" (the switch)."""
    row = await conn.fetchrow(f"SELECT active_model, target_model, reembed_job FROM embedding_state WHERE id = 1 {lock}")
    return EmbeddingState(row["active_model"], row["target_model"], row["reembed_job"])


async def claim_active(conn: asyncpg.Connection, model: str) -> None:
    """A database that never embedded anything takes the configured model as its active one."""
    await conn.execute(
        "UPDATE embedding_state SET active_model = $1, updated_at = now() WHERE id = 1 AND active_model IS NULL", model,
    )


async def begin_reembed(conn: asyncpg.Connection, target: str, job_id: UUID) -> None:
    await conn.execute(
        "UPDATE embedding_state SET target_model = $1, reembed_job = $2, updated_at = now() WHERE id = 1",
        target, job_id,
    )


async def store_target(conn: asyncpg.Connection, rows: list[tuple[UUID, np.ndarray]], model: str) -> None:
    await conn.executemany(
        "INSERT INTO memory_embeddings (memory_id, model, embedding) VALUES ($1, $2, $3)"
        " ON CONFLICT (memory_id, model) DO UPDATE SET embedding = EXCLUDED.embedding",
        [(memory_id, model, vector) for memory_id, vector in rows],
    )


async def next_to_reembed(pool: asyncpg.Pool, model: str, limit: int) -> list[asyncpg.Record]:
    """Memories (deleted ones too: include_deleted searches them) with no `model` vector yet."""
    return await pool.fetch(
        """
        SELECT m.id, m.content, m.user_id, m.agent_id, m.run_id, m.type, m.tags, m.who, m.source_type,
               m.created_at, m.is_deleted, m.kind, m.trust, m.confidence, m.expires_at, m.memory_type
        FROM memories m
        WHERE NOT EXISTS (SELECT 1 FROM memory_embeddings e WHERE e.memory_id = m.id AND e.model = $1)
        ORDER BY m.id LIMIT $2
        """,
        model, limit,
    )


async def progress(conn: asyncpg.Connection | asyncpg.Pool, model: str) -> tuple[int, int]:
    """(memories with a `model` vector, all memories)."""
    row = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM memory_embeddings WHERE model = $1) AS done,"
        " (SELECT count(*) FROM memories) AS total",
        model,
    )
    return row["done"], row["total"]


async def switch(conn: asyncpg.Connection, target: str) -> int:
    """Make `target` the active model in the caller's transaction (which holds the state row
    FOR UPDATE and has checked that every memory has a `target` vector): copy the vectors into
    memories, clear the side table. Returns how many memories moved."""
    moved = await conn.execute(
        """
        UPDATE memories m SET embedding = e.embedding, embedding_model = e.model
        FROM memory_embeddings e WHERE e.memory_id = m.id AND e.model = $1
        """,
        target,
    )
    await conn.execute("DELETE FROM memory_embeddings WHERE model = $1", target)
    await conn.execute(
        "UPDATE embedding_state SET active_model = $1, target_model = NULL, reembed_job = NULL, updated_at = now()"
        " WHERE id = 1",
        target,
    )
    return int(moved.split()[-1])


async def canonical(conn: asyncpg.Connection | asyncpg.Pool, memory_ids: list[UUID], model: str, *, active: bool
                    ) -> list[asyncpg.Record]:
    """The `model` vectors of `memory_ids` that Postgres holds, with what an index point carries."""
    columns = """m.id, m.user_id, m.agent_id, m.run_id, m.type, m.tags, m.who, m.source_type, m.created_at,
        m.is_deleted, m.kind, m.trust, m.confidence, m.expires_at, m.memory_type"""
    if active:
        return await conn.fetch(
            f"SELECT {columns}, m.embedding FROM memories m WHERE m.id = ANY($1::uuid[]) AND m.embedding_model = $2"
            " AND m.embedding IS NOT NULL",
            memory_ids, model,
        )
    return await conn.fetch(
        f"SELECT {columns}, e.embedding FROM memories m JOIN memory_embeddings e ON e.memory_id = m.id"
        " WHERE m.id = ANY($1::uuid[]) AND e.model = $2",
        memory_ids, model,
    )
