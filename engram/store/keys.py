"""SQL for API keys. Only SHA-256 hashes of keys are stored."""

from __future__ import annotations

import uuid
from uuid import UUID

import asyncpg

from engram.domain import auth
from engram.domain.models import ApiKey

_COLUMNS = "id, name, role, scopes, created_at, revoked_at"
REVOKED = "engram_key_revoked"  # NOTIFY channel: a key was revoked


async def insert(pool: asyncpg.Pool, *, key_id: UUID, name: str, key_hash: str, role: str,
                 scopes: list[str]) -> ApiKey | None:
    """Store a key. None, writing nothing, when an active key already has `name`; a key whose
    hash is already stored is left as it is and returned (installing the same key twice is one key)."""
    try:
        row = await pool.fetchrow(
            f"INSERT INTO api_keys (id, name, key_hash, role, scopes) VALUES ($1, $2, $3, $4, $5)"
            f" ON CONFLICT (key_hash) DO UPDATE SET key_hash = EXCLUDED.key_hash RETURNING {_COLUMNS}",
            key_id, name, key_hash, role, scopes,
        )
    except asyncpg.UniqueViolationError:  # api_keys_active_name_uq
        return None
    return ApiKey.model_validate(dict(row))


async def find_active(pool: asyncpg.Pool, key_hash: str) -> asyncpg.Record | None:
    return await pool.fetchrow(
        "SELECT id, name, role, scopes FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL", key_hash,
    )


async def list_all(pool: asyncpg.Pool) -> list[ApiKey]:
    rows = await pool.fetch(f"SELECT {_COLUMNS} FROM api_keys ORDER BY created_at, id")
    return [ApiKey.model_validate(dict(r)) for r in rows]


async def revoke(conn: asyncpg.Connection, key_id: UUID) -> ApiKey | None:
    """Revoke the key now unless it already is; its record, or None for an unknown id. The row
    stays locked until the caller's transaction ends."""
    row = await conn.fetchrow(
        f"UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1 RETURNING {_COLUMNS}", key_id,
    )
    if row is None:
        return None
    await conn.execute(f"NOTIFY {REVOKED}")  # at commit: every API process drops its cached lookups
    return ApiKey.model_validate(dict(row))


async def lock_active_superadmins(conn: asyncpg.Connection) -> list[UUID]:
    """The active admin keys granted every scope, locked (in id order, so concurrent callers
    queue rather than deadlock) until the caller's transaction ends."""
    rows = await conn.fetch(
        "SELECT id FROM api_keys WHERE role = 'admin' AND '*' = ANY(scopes) AND revoked_at IS NULL"
        " ORDER BY id FOR UPDATE",
    )
    return [r["id"] for r in rows]


async def install_admin(conn: asyncpg.Connection | asyncpg.Pool, key: str, name: str) -> None:
    """Make `key` a valid admin key for every scope (idempotent): the first key of a deployment.
    If another active key already has `name`, this one is named `<name>-<its id's start>`."""
    key_id = uuid.uuid4()
    for candidate in (name, f"{name}-{str(key_id)[:8]}"):
        if await insert(conn, key_id=key_id, name=candidate, key_hash=auth.hash_key(key), role="admin",
                        scopes=["*"]):
            return
    raise RuntimeError(f"could not install the admin key: the names {name!r} and its variant are taken")
