"""SQL for batch forgets: operations, their items, and the service's signing secrets."""

from __future__ import annotations

import secrets
from uuid import UUID

import asyncpg

from engram.domain.filters import Filters
from engram.domain.models import Scope
from engram.store.sql import Where


async def secret(conn: asyncpg.Connection | asyncpg.Pool, name: str) -> bytes:
    """The named secret, made (32 random bytes) at its first use; every process reads the same."""
    await conn.execute("INSERT INTO service_secrets (name, value) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                       name, secrets.token_bytes(32))
    return await conn.fetchval("SELECT value FROM service_secrets WHERE name = $1", name)


async def matching(conn: asyncpg.Connection | asyncpg.Pool, scope: Scope, filters: Filters, ids: list[UUID] | None,
                   limit: int) -> tuple[list[asyncpg.Record], int]:
    """Live memories in `scope` passing `filters` (and among `ids`), oldest first: up to `limit`
    of them, and how many match in all."""
    where = Where()
    where.scope(scope, "m")
    where.filters(filters)
    if ids is not None:
        where.add("m.id = ANY({}::uuid[])", ids)
    total = await conn.fetchval(f"SELECT count(*) FROM memories m WHERE {where.sql()}", *where.params)
    where.params.append(limit)
    rows = await conn.fetch(
        f"SELECT m.id, m.content, m.pinned, m.version, m.content_hash FROM memories m WHERE {where.sql()}"
        f" ORDER BY m.created_at, m.id LIMIT ${len(where.params)}",
        *where.params,
    )
    return rows, total


async def rows_of(conn: asyncpg.Connection | asyncpg.Pool, ids: list[UUID]) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT m.id, m.content, m.pinned, m.version, m.content_hash FROM memories m"
                            " WHERE m.id = ANY($1::uuid[]) AND NOT m.is_deleted", ids)


async def create(conn: asyncpg.Connection, *, operation_id: str, requester: str, role: str, scope: dict,
                 reason: str, force: bool, status: str, items: list[tuple[UUID, int, str]], expires_at,
                 needs_approval: bool) -> None:
    """The operation and its items, `pending`: written before anything is deleted."""
    await conn.execute(
        "INSERT INTO forget_operations (id, requester, role, scope, reason, force, status, total, expires_at,"
        " needs_approval) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        operation_id, requester, role, scope, reason, force, status, len(items), expires_at, needs_approval,
    )
    await conn.execute(
        "INSERT INTO forget_items (operation_id, memory_id, version, content_hash)"
        " SELECT $1, i.id, i.version, i.hash FROM unnest($2::uuid[], $3::int[], $4::text[]) AS i(id, version, hash)",
        operation_id, [i[0] for i in items], [i[1] for i in items], [i[2] for i in items],
    )
    await conn.execute("INSERT INTO forget_events (operation_id, event, actor, reason)"
                       " VALUES ($1, 'previewed', $2, $3)", operation_id, requester, reason)


async def get(conn: asyncpg.Connection | asyncpg.Pool, operation_id: str) -> asyncpg.Record | None:
    return await conn.fetchrow(
        """
        SELECT o.*, (SELECT count(*) FROM forget_items i WHERE i.operation_id = o.id AND i.state <> 'pending') AS done
        FROM forget_operations o WHERE o.id = $1
        """,
        operation_id,
    )


async def awaiting(conn: asyncpg.Connection | asyncpg.Pool, status: str) -> list[str]:
    rows = await conn.fetch("SELECT id FROM forget_operations WHERE status = $1 ORDER BY created_at", status)
    return [r["id"] for r in rows]


async def items(conn: asyncpg.Connection | asyncpg.Pool, operation_id: str) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT * FROM forget_items WHERE operation_id = $1 ORDER BY memory_id", operation_id)


async def changed_items(conn: asyncpg.Connection | asyncpg.Pool, operation_id: str) -> list[UUID]:
    """Items whose memory is no longer as previewed: another version, or deleted."""
    rows = await conn.fetch(
        "SELECT i.memory_id FROM forget_items i JOIN memories m ON m.id = i.memory_id"
        " WHERE i.operation_id = $1 AND (m.version <> i.version OR m.is_deleted)",
        operation_id,
    )
    return [r["memory_id"] for r in rows]


TERMINAL = ("done", "expired", "rejected", "stale", "dry_run")
WORKFLOW_ACTOR = "system:batch-forget"


async def set_status(conn: asyncpg.Connection | asyncpg.Pool, operation_id: str, status: str, *,
                     approver: str | None = None, receipt: dict | None = None, event: str | None = None,
                     actor: str = WORKFLOW_ACTOR, reason: str | None = None) -> bool:
    """Move the operation to `status` unless it has ended, recording the move as `event`
    (default: the status) by `actor`, in the same statement; False if it had ended or is there
    already (a retried step records its move once)."""
    moved = await conn.fetchval(
        """
        WITH moved AS (
            UPDATE forget_operations SET status = $2, approver = coalesce($3, approver),
                finished_at = CASE WHEN $2 = ANY($5::text[]) THEN now() ELSE finished_at END,
                receipt = coalesce($4, receipt)
            WHERE id = $1 AND NOT status = ANY($5::text[]) AND status <> $2 RETURNING id)
        INSERT INTO forget_events (operation_id, event, actor, reason) SELECT id, $6, $7, $8 FROM moved RETURNING id
        """,
        operation_id, status, approver, receipt, list(TERMINAL), event or status, actor, reason,
    )
    return moved is not None


async def events(conn: asyncpg.Connection | asyncpg.Pool, operation_id: str) -> list[asyncpg.Record]:
    """The operation's moves, oldest first."""
    return await conn.fetch("SELECT event, actor, reason, at FROM forget_events WHERE operation_id = $1 ORDER BY id",
                            operation_id)


async def pending_items(conn: asyncpg.Connection | asyncpg.Pool, operation_id: str, limit: int) -> list[UUID]:
    rows = await conn.fetch("SELECT memory_id FROM forget_items WHERE operation_id = $1 AND state = 'pending'"
                            " ORDER BY memory_id LIMIT $2", operation_id, limit)
    return [r["memory_id"] for r in rows]


async def lock_item(conn: asyncpg.Connection, operation_id: str, memory_id: UUID) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT * FROM forget_items WHERE operation_id = $1 AND memory_id = $2 FOR UPDATE",
                               operation_id, memory_id)


async def settle_item(conn: asyncpg.Connection, operation_id: str, memory_id: UUID, state: str, *,
                      deleted_version: int | None = None, event_hash: str | None = None,
                      refusal: str | None = None) -> None:
    await conn.execute(
        "UPDATE forget_items SET state = $3, deleted_version = $4, event_hash = $5, refusal = $6"
        " WHERE operation_id = $1 AND memory_id = $2",
        operation_id, memory_id, state, deleted_version, event_hash, refusal,
    )


async def scope_heads(conn: asyncpg.Connection | asyncpg.Pool, memory_ids: list[UUID]) -> dict[str, str]:
    """The head of each scope chain these memories are in."""
    rows = await conn.fetch(
        "SELECT c.scope_key, c.head FROM scope_chains c WHERE c.scope_key IN"
        " (SELECT m.scope_key FROM memories m WHERE m.id = ANY($1::uuid[]))",
        memory_ids,
    )
    return {r["scope_key"]: r["head"] for r in rows}


async def unsealed_deletes(conn: asyncpg.Connection | asyncpg.Pool, operation_id: str) -> int:
    """The operation's DELETE events not yet in their scope's chain."""
    # `hash IS NOT NULL` (every DELETE event has one) lets the small unsealed-events index serve.
    return await conn.fetchval("SELECT count(*) FROM memory_history WHERE scope_seq IS NULL AND hash IS NOT NULL"
                               " AND request_id = $1 AND event = 'DELETE'", operation_id)


async def delete_event(conn: asyncpg.Connection | asyncpg.Pool, memory_id: UUID, operation_id: str
                       ) -> asyncpg.Record | None:
    """The DELETE event an operation wrote on a memory."""
    return await conn.fetchrow("SELECT version, hash FROM memory_history WHERE memory_id = $1 AND event = 'DELETE'"
                               " AND request_id = $2 ORDER BY id DESC LIMIT 1", memory_id, operation_id)

