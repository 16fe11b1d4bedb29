"""SQL for API keys. Only SHA-256 hashes of keys are stored."""

from __future__ import annotations

from uuid import UUID

import asyncpg


async def insert(pool: asyncpg.Pool, *, key_id: UUID, name: str, key_hash: str, role: str, scopes: list[str]) -> None:
    await pool.execute(
        "INSERT INTO api_keys (id, name, key_hash, role, scopes) VALUES ($1, $2, $3, $4, $5)"
        " ON CONFLICT (key_hash) DO NOTHING",
        key_id, name, key_hash, role, scopes,
    )


async def find_active(pool: asyncpg.Pool, key_hash: str) -> asyncpg.Record | None:
    return await pool.fetchrow(
        "SELECT id, name, role, scopes FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL", key_hash,
    )
