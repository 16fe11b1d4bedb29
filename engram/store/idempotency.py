"""SQL for idempotency keys: one answer per (principal, key)."""

from __future__ import annotations

from uuid import UUID

import asyncpg


async def claim(conn: asyncpg.Connection, *, principal: str, key: str, request_hash: str,
                memory_id: UUID, job_id: UUID | None) -> bool:
    """Bind `key` to this request inside the caller's transaction. False if already bound."""
    return bool(await conn.fetchval(
        """
        INSERT INTO idempotency_keys (principal, key, request_hash, memory_id, job_id)
        VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING true
        """,
        principal, key, request_hash, memory_id, job_id,
    ))


async def rebind(conn: asyncpg.Connection, principal: str, key: str, memory_id: UUID) -> None:
    """Point a freshly claimed key at the memory that already held this content."""
    await conn.execute(
        "UPDATE idempotency_keys SET memory_id = $3, job_id = NULL WHERE principal = $1 AND key = $2",
        principal, key, memory_id,
    )


async def find(conn: asyncpg.Connection | asyncpg.Pool, principal: str, key: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT request_hash, memory_id, job_id, response FROM idempotency_keys WHERE principal = $1 AND key = $2",
        principal, key,
    )


async def store_response(conn: asyncpg.Connection | asyncpg.Pool, principal: str, key: str, response: dict
                         ) -> None:
    await conn.execute(
        "UPDATE idempotency_keys SET response = $3 WHERE principal = $1 AND key = $2 AND response IS NULL",
        principal, key, response,
    )
