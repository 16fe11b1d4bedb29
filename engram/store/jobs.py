"""SQL for memory_jobs: the outbox, the batches the dispatcher forms from it, parked extractions,
and the mirror of each workflow's state.

A remember job's life: `pending` (written with its memory; `workflow_id` NULL until the
dispatcher puts it in a batch) -> `done` (embedded, extracted or skipped), or -> `parked` (its
extraction waits for a provider; no timer runs for it) -> `leased` by the drain -> `done`, or
`dead` after `max_attempts` failures that were the model's fault rather than an outage. Every
transition is conditional on the state it leaves, so a step that runs twice changes nothing
the second time. When a job's first pass concludes, its outcome is published on the
FIRST_PASS channel, and a new job wakes the dispatcher on the NEW_JOBS channel.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg

from engram.domain.models import Job
from engram.domain.usage import Usage, merge_usage

_COLUMNS = """j.id, j.memory_id, j.job_type, j.status, j.attempt_count, j.max_attempts, j.next_attempt_at,
    j.last_error, j.last_error_code, j.workflow_id, j.workflow_started_at, j.outcome, j.parent_id, j.created_at,
    j.updated_at, j.usage,
    CASE WHEN j.payload ? 'total' THEN jsonb_build_object('done', j.payload->'done', 'total', j.payload->'total')
    END AS progress"""

NEW_JOBS = "engram_new_jobs"
FIRST_PASS = "engram_first_pass"
FINISHED = ("done", "dead")

_WORKFLOW_PREFIX = {"extract": "remember", "reembed": "reembed", "review": "review", "approval": "approval"}


def workflow_id_for(job_id: UUID, job_type: str = "extract") -> str:
    """The workflow id of a job that has a run of its own (a re-embed; a remember job written
    before batches): derived from the job, so it can start at most one run."""
    return f"{_WORKFLOW_PREFIX[job_type]}-{job_id}"


_BATCH_PREFIX = "ingest-"
_IS_BATCH = f"{_BATCH_PREFIX}%"  # LIKE pattern: a batch's workflow id, not a one-memory run's


def batch_workflow_id(batch_id: UUID) -> str:
    return f"{_BATCH_PREFIX}{batch_id}"


async def insert(conn: asyncpg.Connection, *, job_id: UUID, memory_id: UUID | None, job_type: str,
                 max_attempts: int, payload: dict, parent_id: UUID | None = None, outcome: str | None = None,
                 status: str = "pending") -> None:
    """Write a job in the caller's transaction. A remember job ("extract") waits for the
    dispatcher to batch it, and wakes it at commit; an "import" job has no workflow (its items
    have); any other job has a run of its own."""
    own_run = job_type not in ("extract", "import")
    await conn.execute(
        f"""
        WITH job AS (
            INSERT INTO memory_jobs (id, memory_id, job_type, max_attempts, workflow_id, payload, parent_id,
                outcome, status) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING job_type)
        SELECT pg_notify('{NEW_JOBS}', '') FROM job WHERE job_type = 'extract'
        """,
        job_id, memory_id, job_type, max_attempts, workflow_id_for(job_id, job_type) if own_run else None, payload,
        parent_id, outcome, status,
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


async def add_usage(pool: asyncpg.Pool, job_id: UUID, usage: Usage) -> None:
    """Count `usage` (a model call's tokens) on the job, beside what its earlier calls took, in
    this attempt or one that parked or failed."""
    if not usage:
        return
    async with pool.acquire() as conn:
        async with conn.transaction():
            spent = await conn.fetchval("SELECT usage FROM memory_jobs WHERE id = $1 FOR UPDATE", job_id)
            await conn.execute("UPDATE memory_jobs SET usage = $2 WHERE id = $1", job_id,
                               merge_usage(spent or {}, usage))


async def get(conn: asyncpg.Connection | asyncpg.Pool, job_id: UUID) -> Job | None:
    """A job; an import job's progress and status are counted from its items' jobs."""
    row = await conn.fetchrow(f"SELECT {_COLUMNS} FROM memory_jobs j WHERE j.id = $1", job_id)
    if row is None:
        return None
    if row["job_type"] != "import":
        return _job(row)
    counts = await conn.fetchrow(
        """
        SELECT count(*) AS total, count(*) FILTER (WHERE status IN ('done', 'dead')) AS done,
            count(*) FILTER (WHERE status = 'parked') AS parked
        FROM memory_jobs WHERE parent_id = $1
        """,
        job_id,
    )
    done, total = counts["done"], counts["total"]
    status = "done" if done == total else ("parked" if done + counts["parked"] == total else "pending")
    return _job({**dict(row), "status": status, "progress": {"done": done, "total": total,
                                                             "parked": counts["parked"]}})


async def latest_for_memory(conn: asyncpg.Connection | asyncpg.Pool, memory_id: UUID) -> Job | None:
    row = await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM memory_jobs j WHERE j.memory_id = $1 ORDER BY j.created_at DESC LIMIT 1", memory_id,
    )
    return _job(row) if row else None


@dataclass(frozen=True)
class Unstarted:
    id: UUID
    job_type: str
    payload: dict


async def unstarted(pool: asyncpg.Pool, limit: int) -> list[Unstarted]:
    """Jobs with a run of their own that nobody has started yet, oldest first (the outbox)."""
    rows = await pool.fetch(
        "SELECT id, job_type, payload FROM memory_jobs WHERE workflow_started_at IS NULL"
        " AND job_type NOT IN ('extract', 'import') ORDER BY created_at LIMIT $1",
        limit,
    )
    return [Unstarted(r["id"], r["job_type"], r["payload"]) for r in rows]


async def mark_started(pool: asyncpg.Pool, job_id: UUID) -> None:
    await pool.execute(
        "UPDATE memory_jobs SET workflow_started_at = coalesce(workflow_started_at, now()), updated_at = now()"
        " WHERE id = $1",
        job_id,
    )


async def form_batch(pool: asyncpg.Pool, workflow_id: str, limit: int) -> list[UUID]:
    """Put up to `limit` of the oldest unbatched remember jobs in the batch `workflow_id`.
    Safe in several dispatchers at once: a job joins one batch."""
    rows = await pool.fetch(
        """
        UPDATE memory_jobs SET workflow_id = $1, updated_at = now()
        WHERE id IN (SELECT id FROM memory_jobs WHERE workflow_id IS NULL AND status = 'pending'
                     AND job_type = 'extract' ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED)
        RETURNING id, created_at
        """,
        workflow_id, limit,
    )
    return [r["id"] for r in sorted(rows, key=lambda r: r["created_at"])]


async def unstarted_batches(pool: asyncpg.Pool, limit: int) -> list[tuple[str, list[UUID]]]:
    """Batches formed but not started (the dispatcher stopped in between): (workflow id, job ids)."""
    rows = await pool.fetch(
        """
        SELECT workflow_id, array_agg(id ORDER BY created_at) AS ids FROM memory_jobs
        WHERE workflow_started_at IS NULL AND workflow_id LIKE $2 AND job_type = 'extract'
        GROUP BY workflow_id ORDER BY min(created_at) LIMIT $1
        """,
        limit, _IS_BATCH,
    )
    return [(r["workflow_id"], list(r["ids"])) for r in rows]


async def mark_batch_started(pool: asyncpg.Pool, workflow_id: str) -> None:
    await pool.execute(
        "UPDATE memory_jobs SET workflow_started_at = coalesce(workflow_started_at, now()), updated_at = now()"
        " WHERE workflow_id = $1",
        workflow_id,
    )


async def requeue(conn: asyncpg.Connection, job_id: UUID) -> None:
    """Hand a job whose own (pre-batch) run stops here to the dispatcher, as if newly written."""
    await conn.execute(
        """
        UPDATE memory_jobs SET workflow_id = NULL, workflow_started_at = NULL, status = 'pending',
            next_attempt_at = NULL, lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
        WHERE id = $1 AND status NOT IN ('done', 'dead')
        """,
        job_id,
    )
    await conn.execute(f"NOTIFY {NEW_JOBS}")


@dataclass(frozen=True)
class Pending:
    """A job in a batch, as its steps need it."""

    id: UUID
    memory_id: UUID
    extract: bool
    attempt_count: int
    max_attempts: int
    extraction: dict | None = None  # an earlier attempt's, kept while its facts were decided (save_extraction)
    awaits_approval: bool = False  # its memory waits for a person's approval: no model sees it before


def _pending(row: asyncpg.Record) -> Pending:
    return Pending(row["id"], row["memory_id"], row["payload"].get("extract", True), row["attempt_count"],
                   row["max_attempts"], row["payload"].get("extraction"), "approval" in row["payload"])


# A parked extraction the drain may take now: its backoff is over and no approval holds it.
_DUE = "(next_attempt_at IS NULL OR next_attempt_at <= now()) AND NOT payload ? 'approval'"


async def lock_extraction(conn: asyncpg.Connection, memory_id: UUID) -> None:
    """Lock the memory's remember job(s) before its row: the order the pipeline's steps take them
    in (a job, then its memory), so a decision on the memory never deadlocks with them."""
    await conn.execute("SELECT 1 FROM memory_jobs WHERE memory_id = $1 AND job_type = 'extract' FOR UPDATE",
                       memory_id)


async def release_approved(conn: asyncpg.Connection, memory_id: UUID) -> None:
    """The memory was approved: its extraction may go on (at once if parked for it; in its
    batch if not reached yet)."""
    await conn.execute(
        "UPDATE memory_jobs SET payload = payload - 'approval', updated_at = now()"
        " WHERE memory_id = $1 AND job_type = 'extract' AND payload ? 'approval'",
        memory_id,
    )


async def end_unapproved(conn: asyncpg.Connection, memory_id: UUID, code: str) -> None:
    """The memory was rejected, quarantined or withdrawn: its extraction never runs. Its job
    ends `done` with `code`, if it has not ended."""
    await conn.execute(
        """
        UPDATE memory_jobs SET status = 'done', payload = payload - 'approval', last_error_code = $2,
            last_error = 'its memory was not approved: no LLM saw it', lease_owner = NULL,
            lease_expires_at = NULL, updated_at = now()
        WHERE memory_id = $1 AND job_type = 'extract' AND status IN ('pending', 'parked')
        """,
        memory_id, code,
    )


async def save_extraction(pool: asyncpg.Pool, job_id: UUID, extraction: dict) -> None:
    """Keep the job's extraction before its facts are decided, so an attempt that parks midway
    resumes on the same facts instead of asking the model again for ones worded otherwise."""
    await pool.execute("UPDATE memory_jobs SET payload = payload || jsonb_build_object('extraction', $2::jsonb)"
                       " WHERE id = $1", job_id, extraction)


async def of_batch(conn: asyncpg.Connection | asyncpg.Pool, job_ids: list[UUID], *, status: str = "pending"
                   ) -> list[Pending]:
    """The jobs among `job_ids` still in `status`, oldest first."""
    rows = await conn.fetch(
        "SELECT id, memory_id, payload, attempt_count, max_attempts FROM memory_jobs"
        " WHERE id = ANY($1::uuid[]) AND status = $2 ORDER BY created_at",
        job_ids, status,
    )
    return [_pending(r) for r in rows]


async def publish_first_pass(conn: asyncpg.Connection, job_ids: list[UUID], outcome: str) -> None:
    """Record the first pass's conclusion of each job that has none yet, and publish it on
    FIRST_PASS (delivered when the caller's transaction commits)."""
    await conn.execute(
        f"""
        WITH concluded AS (
            UPDATE memory_jobs SET outcome = $2, updated_at = now()
            WHERE id = ANY($1::uuid[]) AND outcome IS NULL RETURNING id
        )
        SELECT pg_notify('{FIRST_PASS}', id::text || ':' || $2) FROM concluded
        """,
        job_ids, outcome,
    )


async def finish_many(conn: asyncpg.Connection, job_ids: list[UUID], *, status: str, from_status: str,
                      owner: str | None = None, error: str | None = None, code: str | None = None) -> list[UUID]:
    """Move the jobs still in `from_status` (and leased to `owner`, if given) to done or dead,
    counting the attempt that ended them. Returns the ids moved."""
    rows = await conn.fetch(
        """
        UPDATE memory_jobs SET status = $2, attempt_count = attempt_count + 1, next_attempt_at = NULL,
            lease_owner = NULL, lease_expires_at = NULL, last_error = coalesce($5, last_error),
            last_error_code = coalesce($6, last_error_code), updated_at = now()
        WHERE id = ANY($1::uuid[]) AND status = $3 AND ($4::text IS NULL OR lease_owner = $4) RETURNING id
        """,
        job_ids, status, from_status, owner, error, code,
    )
    return [r["id"] for r in rows]


async def park(conn: asyncpg.Connection, job_ids: list[UUID], *, from_status: str, error: str, code: str,
               counts: bool, next_attempt_at: datetime | None = None, owner: str | None = None) -> list[UUID]:
    """Park the jobs still in `from_status` (and leased to `owner`, if given): their extraction
    waits, with no timer, until the drain takes them (`next_attempt_at`: not before then).
    `counts`: the failure was this memory's (a malformed answer), so it uses up an attempt; an
    outage does not. Returns the ids parked."""
    rows = await conn.fetch(
        """
        UPDATE memory_jobs SET status = 'parked', last_error = $3, last_error_code = $4,
            attempt_count = attempt_count + CASE WHEN $5 THEN 1 ELSE 0 END, next_attempt_at = $6,
            lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
        WHERE id = ANY($1::uuid[]) AND status = $2 AND ($7::text IS NULL OR lease_owner = $7) RETURNING id
        """,
        job_ids, from_status, error, code, counts, next_attempt_at, owner,
    )
    return [r["id"] for r in rows]


async def lease_parked(pool: asyncpg.Pool, owner: str, *, limit: int, lease_s: float) -> list[Pending]:
    """Lease up to `limit` parked jobs that are due (oldest first) to `owner` (a "drain:..." name)
    for `lease_s` seconds, and any drain lease that ran out (its holder died) or that `owner`
    already holds (a retry of a drain step that died: only one drain runs per task queue)."""
    rows = await pool.fetch(
        f"""
        UPDATE memory_jobs SET status = 'leased', lease_owner = $1,
            lease_expires_at = now() + make_interval(secs => $3), updated_at = now()
        WHERE id IN (
            SELECT id FROM memory_jobs
            WHERE job_type = 'extract'
              AND ((status = 'parked' AND {_DUE})
                   OR (status = 'leased' AND lease_owner LIKE 'drain:%'
                       AND (lease_expires_at < now() OR lease_owner = $1)))
            ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED)
        RETURNING id, memory_id, payload, attempt_count, max_attempts
        """,
        owner, limit, lease_s,
    )
    return [_pending(r) for r in rows]


@dataclass(frozen=True)
class Backlog:
    """What the remember pipeline holds: jobs waiting for a batch or in one (`pending`), parked
    extractions due now (`parked_due`) and later (`parked`), and why they are parked."""

    pending: int
    parked: int
    parked_due: int
    leased: int
    reasons: dict[str, int]


async def backlog(conn: asyncpg.Connection | asyncpg.Pool) -> Backlog:
    row = await conn.fetchrow(
        f"""
        SELECT count(*) FILTER (WHERE status = 'pending') AS pending,
            count(*) FILTER (WHERE status = 'parked') AS parked,
            count(*) FILTER (WHERE status = 'parked' AND {_DUE}) AS parked_due,
            count(*) FILTER (WHERE status = 'leased') AS leased
        FROM memory_jobs WHERE job_type = 'extract' AND status IN ('pending', 'parked', 'leased')
        """
    )
    reasons = await conn.fetch(
        "SELECT last_error_code, count(*) AS n FROM memory_jobs WHERE status = 'parked' AND job_type = 'extract'"
        " GROUP BY last_error_code"
    )
    return Backlog(row["pending"], row["parked"], row["parked_due"], row["leased"],
                   {r["last_error_code"] or "unknown": r["n"] for r in reasons})


async def write_queue(conn: asyncpg.Connection | asyncpg.Pool) -> tuple[int, float]:
    """(remember jobs not yet through their batch, seconds the oldest of them has waited)."""
    row = await conn.fetchrow(
        "SELECT count(*) AS depth, coalesce(extract(epoch FROM now() - min(created_at)), 0) AS oldest_s"
        " FROM memory_jobs WHERE status = 'pending' AND job_type = 'extract'"
    )
    return row["depth"], float(row["oldest_s"])


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


async def batches_in_flight(conn: asyncpg.Connection | asyncpg.Pool) -> int:
    """Batches formed and not yet finished (a batch is in flight while any of its remember jobs
    is still pending). A job still held by a one-memory RememberWorkflow of before the batches
    (it hands its job back when it next wakes) is not a batch and takes no room."""
    return await conn.fetchval(
        "SELECT count(DISTINCT workflow_id) FROM memory_jobs WHERE status = 'pending' AND job_type = 'extract'"
        " AND workflow_id LIKE $1",
        _IS_BATCH,
    )


async def wake_dispatcher(conn: asyncpg.Connection | asyncpg.Pool) -> None:
    """A batch finished: its room in flight is free for the next."""
    await conn.execute(f"NOTIFY {NEW_JOBS}")


async def owner_of(conn: asyncpg.Connection | asyncpg.Pool, job_id: UUID) -> str | None:
    """The principal that started a job with no memory of its own (an import), if recorded."""
    return await conn.fetchval("SELECT payload->>'principal' FROM memory_jobs WHERE id = $1", job_id)
