"""Bulk remembers handed from the API to a worker.

The API stages a request's items in one statement (`stage`, which wakes the import writers
on STAGED) and waits. Whoever takes the row first writes it: `take` locks it for the
taker's transaction, which writes the memories and the answer (`answer`, which notifies
WRITTEN when it commits). A taker that dies rolls back, the row unlocked and unwritten, and
the next one takes it; the items are never lost and never written twice.
"""

from __future__ import annotations

from uuid import UUID

import asyncpg

STAGED = "engram_import_staged"  # a batch waits to be written (not NEW_JOBS: every remember sends that)
WRITTEN = "engram_import_written"  # payload: the batch id, once its answer is committed
MAX_FAILURES = 3  # a batch whose write failed this often is left to the API that waits for it


async def stage(pool: asyncpg.Pool, batch_id: UUID, *, principal: dict, items: list, request_id: str | None,
                path: str, model: dict) -> None:
    await pool.execute(
        f"""
        WITH staged AS (
            INSERT INTO import_batches (id, principal, items, request_id, path, model)
            VALUES ($1, $2, $3, $4, $5, $6) RETURNING id)
        SELECT pg_notify('{STAGED}', '') FROM staged
        """,
        batch_id, principal, items, request_id, path, model,
    )


async def take(conn: asyncpg.Connection, batch_id: UUID | None = None) -> asyncpg.Record | None:
    """Lock an unwritten batch for the caller's transaction: `batch_id`, or the oldest whose
    write has failed fewer than MAX_FAILURES times. None if it is written, or another
    transaction holds it."""
    return await conn.fetchrow(
        f"""
        SELECT id, principal, items, request_id, path, model FROM import_batches
        WHERE response IS NULL AND (id = $1 OR ($1::uuid IS NULL AND failures < {MAX_FAILURES}))
        ORDER BY created_at FOR UPDATE SKIP LOCKED LIMIT 1
        """,
        batch_id,
    )


async def failed(pool: asyncpg.Pool, batch_id: UUID) -> None:
    """Count a write of the batch that failed (its transaction rolled back)."""
    await pool.execute("UPDATE import_batches SET failures = failures + 1 WHERE id = $1", batch_id)


async def answer(conn: asyncpg.Connection, batch_id: UUID, response: dict) -> None:
    """Record the answer in the taker's transaction; WRITTEN goes out when it commits."""
    await conn.execute(
        f"""
        WITH written AS (
            UPDATE import_batches SET response = $2, written_at = now() WHERE id = $1 RETURNING id)
        SELECT pg_notify('{WRITTEN}', id::text) FROM written
        """,
        batch_id, response,
    )


async def collect(pool: asyncpg.Pool, batch_id: UUID) -> dict | None:
    """The answer, if written, and the row gone with it: the API has what it waited for."""
    return await pool.fetchval(
        "DELETE FROM import_batches WHERE id = $1 AND response IS NOT NULL RETURNING response", batch_id)


async def purge(pool: asyncpg.Pool, after_s: float) -> int:
    """Drop, `after_s` on, answers nobody collected (the API that waited is gone; their memories
    are stored) and batches no worker could write (the API that waited answered with the
    error). Returns how many."""
    status = await pool.execute(
        f"""
        DELETE FROM import_batches
        WHERE (response IS NOT NULL AND written_at < now() - make_interval(secs => $1))
           OR (response IS NULL AND failures >= {MAX_FAILURES} AND created_at < now() - make_interval(secs => $1))
        """,
        after_s)
    return int(status.split()[-1])
