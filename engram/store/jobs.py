"""SQL for memory_jobs: the outbox and the mirror of each workflow's state."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg

from engram.domain.models import Job

_COLUMNS = """id, memory_id, job_type, status, attempt_count, max_attempts, next_attempt_at, last_error,
    last_error_code, workflow_id, workflow_started_at, outcome, created_at, updated_at,
    CASE WHEN payload ? 'total' THEN jsonb_build_object('done', payload->'done', 'total', payload->'total')
    END AS progress"""


_WORKFLOW_PREFIX = {"extract": "remember", "reembed": "reembed"}


def workflow_id_for(job_id: UUID, job_type: str = "extract") -> str:
    """The job's workflow id: derived from the job, so a job can start at most one run."""
    return f"{_WORKFLOW_PREFIX[job_type]}-{job_id}"


async def insert(conn: asyncpg.Connection, *, job_id: UUID, memory_id: UUID | None, job_type: str,
                 max_attempts: int, payload: dict) -> None:
    await conn.execute(
        "INSERT INTO memory_jobs (id, memory_id, job_type, max_attempts, workflow_id, payload)"
        " VALUES ($1, $2, $3, $4, $5, $6)",
        job_id, memory_id, job_type, max_attempts, workflow_id_for(job_id, job_type), payload,
    )


async def set_progress(pool: asyncpg.Pool, job_id: UUID, *, done: int, total: int) -> None:
    await pool.execute(
        """
        UPDATE memory_jobs SET payload = payload || jsonb_build_object('done', $2::bigint, 'total', $3::bigint),
            status = CASE WHEN status = 'pending' THEN 'leased' ELSE status END, updated_at = now()
        WHERE id = $1
        """,
        job_id, done, total,
    )


def _job(row: asyncpg.Record) -> Job:
    return Job.model_validate(dict(row))


async def get(conn: asyncpg.Connection | asyncpg.Pool, job_id: UUID) -> Job | None:
    row = await conn.fetchrow(f"SELECT {_COLUMNS} FROM memory_jobs WHERE id = $1", job_id)
    return _job(row) if row else None


async def latest_for_memory(conn: asyncpg.Connection | asyncpg.Pool, memory_id: UUID) -> Job | None:
    row = await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM memory_jobs WHERE memory_id = $1 ORDER BY created_at DESC LIMIT 1", memory_id,
    )
    return _job(row) if row else None


@dataclass(frozen=True)
class Unstarted:
    id: UUID
    job_type: str
    payload: dict


async def unstarted(pool: asyncpg.Pool, limit: int) -> list[Unstarted]:
    """Jobs whose workflow nobody has started yet, oldest first (the outbox)."""
    rows = await pool.fetch(
        "SELECT id, job_type, payload FROM memory_jobs WHERE workflow_started_at IS NULL"
        " ORDER BY created_at LIMIT $1",
        limit,
    )
    return [Unstarted(r["id"], r["job_type"], r["payload"]) for r in rows]


async def mark_started(pool: asyncpg.Pool, job_id: UUID) -> None:
    await pool.execute(
        "UPDATE memory_jobs SET workflow_started_at = coalesce(workflow_started_at, now()), updated_at = now()"
        " WHERE id = $1",
        job_id,
    )


async def lease(conn: asyncpg.Connection | asyncpg.Pool, job_id: UUID, owner: str,
                until: datetime) -> asyncpg.Record | None:
    """Count an attempt and lease the job to `owner`; None if the job is already finished."""
    return await conn.fetchrow(
        f"""
        UPDATE memory_jobs SET status = 'leased', attempt_count = attempt_count + 1, lease_owner = $2,
            lease_expires_at = $3, workflow_started_at = coalesce(workflow_started_at, now()), updated_at = now()
        WHERE id = $1 AND status NOT IN ('done', 'dead')
        RETURNING memory_id, attempt_count, payload
        """,
        job_id, owner, until,
    )


async def set_outcome(conn: asyncpg.Connection, job_id: UUID, outcome: str) -> None:
    """Record the first pass's conclusion once; later passes do not overwrite it."""
    await conn.execute(
        "UPDATE memory_jobs SET outcome = coalesce(outcome, $2), updated_at = now() WHERE id = $1", job_id, outcome,
    )


async def schedule_retry(
    conn: asyncpg.Connection, job_id: UUID, *, next_attempt_at: datetime, error: str, code: str,
) -> None:
    await conn.execute(
        """
        UPDATE memory_jobs SET status = 'retry_scheduled', next_attempt_at = $2, last_error = $3,
            last_error_code = $4, lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
        WHERE id = $1 AND status NOT IN ('done', 'dead')
        """,
        job_id, next_attempt_at, error, code,
    )


async def note_error(conn: asyncpg.Connection, job_id: UUID, *, error: str, code: str) -> None:
    """Record a failure the job carries on past (its status does not change)."""
    await conn.execute(
        "UPDATE memory_jobs SET last_error = $2, last_error_code = $3, updated_at = now() WHERE id = $1",
        job_id, error, code,
    )


async def finish(conn: asyncpg.Connection, job_id: UUID, *, status: str, error: str | None = None,
                 code: str | None = None) -> bool:
    """Move the job to done or dead. Returns False if it had already finished (nothing changed)."""
    result = await conn.fetchval(
        """
        UPDATE memory_jobs SET status = $2, last_error = coalesce($3, last_error),
            last_error_code = coalesce($4, last_error_code), next_attempt_at = NULL, lease_owner = NULL,
            lease_expires_at = NULL, updated_at = now()
        WHERE id = $1 AND status NOT IN ('done', 'dead') RETURNING true
        """,
        job_id, status, error, code,
    )
    return bool(result)
