"""SQL for approvals (memory_approvals): a write waiting for a person's decision."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

import asyncpg

from engram.domain.approvals import Approval
from engram.domain.auth import Visibility
from engram.domain.models import Scope
from engram.store import memories as repo
from engram.store.sql import Where

_SELECT = f"""
    SELECT a.id AS a_id, a.status AS a_status, a.reason AS a_reason, a.requested_by, a.decided_by, a.decided_reason,
           a.timed_out, a.expires_at AS a_expires_at, a.created_at AS a_created_at, a.decided_at, {repo.MEMORY_COLUMNS}
    FROM memory_approvals a JOIN memories m ON m.id = a.memory_id
"""


def _approval(row: asyncpg.Record) -> Approval:
    return Approval(
        id=row["a_id"], status=row["a_status"], reason=row["a_reason"], requested_by=row["requested_by"],
        decided_by=row["decided_by"], decided_reason=row["decided_reason"], timed_out=row["timed_out"],
        expires_at=row["a_expires_at"], created_at=row["a_created_at"], decided_at=row["decided_at"],
        memory=repo.row_to_memory({name: row[name] for name in repo.MEMORY_FIELDS}))


async def insert(conn: asyncpg.Connection, approval_id: UUID, *, memory_id: UUID, scope: Scope, reason: str,
                 requested_by: str, expires_at: datetime) -> None:
    await conn.execute(
        """
        INSERT INTO memory_approvals (id, memory_id, user_id, agent_id, run_id, reason, requested_by, expires_at)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
        """,
        approval_id, memory_id, scope.user_id, scope.agent_id, scope.run_id, reason, requested_by, expires_at,
    )


async def get(conn: asyncpg.Connection | asyncpg.Pool, approval_id: UUID, *, lock: bool = False) -> Approval | None:
    row = await conn.fetchrow(f"{_SELECT} WHERE a.id = $1{' FOR UPDATE OF a' if lock else ''}", approval_id)
    return _approval(row) if row else None


async def page(pool: asyncpg.Pool, visible: Visibility, *, statuses: list[str], limit: int) -> list[Approval]:
    """Approvals in `statuses` whose scope the caller sees, oldest first."""
    where = Where()
    where.visible(visible, "a")
    where.add("a.status = ANY({}::text[])", statuses)
    where.params.append(limit)
    rows = await pool.fetch(f"{_SELECT} WHERE {where.sql()} ORDER BY a.created_at, a.id LIMIT ${len(where.params)}",
                            *where.params)
    return [_approval(r) for r in rows]


async def decide(conn: asyncpg.Connection, approval_id: UUID, *, status: str, by: str, reason: str,
                 timed_out: bool) -> None:
    await conn.execute(
        """
        UPDATE memory_approvals SET status = $2, decided_by = $3, decided_reason = $4, timed_out = $5,
            decided_at = now()
        WHERE id = $1 AND status = 'pending'
        """,
        approval_id, status, by, reason, timed_out,
    )


async def pending_count(conn: asyncpg.Connection | asyncpg.Pool) -> int:
    return await conn.fetchval("SELECT count(*) FROM memory_approvals WHERE status = 'pending'")


async def waiting_for(conn: asyncpg.Connection | asyncpg.Pool, memory_id: UUID) -> UUID | None:
    """The pending approval the memory waits for, if any."""
    return await conn.fetchval("SELECT id FROM memory_approvals WHERE memory_id = $1 AND status = 'pending'",
                               memory_id)
