"""SQL for review items (memory_reviews): a contradiction waiting for a person."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

import asyncpg

from engram.domain.auth import Visibility
from engram.domain.models import Scope
from engram.domain.reviews import Review, ReviewedMemory
from engram.store.sql import Where

_SELECT = """
    SELECT r.id, r.status, r.user_id, r.agent_id, r.run_id, r.reason, r.resolution, r.merged_content,
           r.resolved_by, r.resolved_reason, r.detail, r.created_at, r.expires_at, r.resolved_at,
           n.id AS new_id, n.content AS new_content, n.is_deleted AS new_deleted,
           e.id AS existing_id, e.content AS existing_content, e.is_deleted AS existing_deleted
    FROM memory_reviews r JOIN memories n ON n.id = r.new_memory_id JOIN memories e ON e.id = r.existing_memory_id
"""


def _review(row: asyncpg.Record) -> Review:
    return Review(
        id=row["id"], status=row["status"], user_id=row["user_id"], agent_id=row["agent_id"], run_id=row["run_id"],
        new=ReviewedMemory(id=row["new_id"], content=row["new_content"], is_deleted=row["new_deleted"]),
        existing=ReviewedMemory(id=row["existing_id"], content=row["existing_content"],
                                is_deleted=row["existing_deleted"]),
        reason=row["reason"], resolution=row["resolution"], merged_content=row["merged_content"],
        resolved_by=row["resolved_by"], resolved_reason=row["resolved_reason"], detail=row["detail"],
        created_at=row["created_at"], expires_at=row["expires_at"], resolved_at=row["resolved_at"])


async def insert(conn: asyncpg.Connection, review_id: UUID, *, scope: Scope, decision_id: int | None,
                 new_memory_id: UUID, existing_memory_id: UUID, reason: str | None, expires_at: datetime) -> None:
    await conn.execute(
        """
        INSERT INTO memory_reviews (id, decision_id, user_id, agent_id, run_id, new_memory_id, existing_memory_id,
            reason, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
        """,
        review_id, decision_id, scope.user_id, scope.agent_id, scope.run_id, new_memory_id, existing_memory_id,
        reason, expires_at,
    )


async def get(conn: asyncpg.Connection | asyncpg.Pool, review_id: UUID, *, lock: bool = False) -> Review | None:
    row = await conn.fetchrow(f"{_SELECT} WHERE r.id = $1{' FOR UPDATE OF r' if lock else ''}", review_id)
    return _review(row) if row else None


async def page(pool: asyncpg.Pool, visible: Visibility, *, statuses: list[str], limit: int) -> list[Review]:
    """Reviews in `statuses` whose scope the caller sees, oldest first."""
    where = Where()
    where.visible(visible, "r")
    where.add("r.status = ANY({}::text[])", statuses)
    where.params.append(limit)
    rows = await pool.fetch(f"{_SELECT} WHERE {where.sql()} ORDER BY r.created_at, r.id LIMIT ${len(where.params)}",
                            *where.params)
    return [_review(r) for r in rows]


async def escalate(conn: asyncpg.Connection | asyncpg.Pool, review_id: UUID, *, actor: str, reason: str) -> None:
    await conn.execute(
        "UPDATE memory_reviews SET status = 'escalated', resolved_by = $2, resolved_reason = $3"
        " WHERE id = $1 AND status = 'open'", review_id, actor, reason)


async def close(conn: asyncpg.Connection, review_id: UUID, *, status: str, resolution: str, actor: str, reason: str,
                merged_content: str | None, detail: str | None) -> None:
    await conn.execute(
        """
        UPDATE memory_reviews SET status = $2, resolution = $3, resolved_by = $4, resolved_reason = $5,
            merged_content = $6, detail = $7, resolved_at = now()
        WHERE id = $1
        """,
        review_id, status, resolution, actor, reason, merged_content, detail)
