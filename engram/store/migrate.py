"""The migration runner.

Migrations are the numbered plain-SQL files in `engram/store/migrations/`. Each run of each file is
recorded in `schema_migrations_log` with its start, end and outcome; applied versions live in
`schema_migrations`. Before a non-empty database is migrated, a `pg_dump` backup is written.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import asyncpg

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).parent / "migrations"

_BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS schema_migrations_log (
    id          bigserial PRIMARY KEY,
    version     integer NOT NULL,
    name        text NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    outcome     text NOT NULL,
    error       text
);
"""


def migration_files() -> list[tuple[int, str, Path]]:
    """The migrations in order: (version, name, path). Names are `NNNN_description.sql`."""
    found = []
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        version = int(path.name.split("_", 1)[0])
        found.append((version, path.stem, path))
    return found


async def migrate(dsn: str, *, backup_dir: Path | None = None, pg_dump: Path | None = None) -> list[int]:
    """Apply every pending migration; return the versions applied.

    Each file runs in its own transaction under an advisory lock, so concurrent starters
    apply it once. If the database holds memories and something is pending, a backup is
    written to `backup_dir` first (when a `pg_dump` binary is known); a failed migration is
    logged with its error and re-raised, leaving earlier versions applied.
    """
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_advisory_lock(727274)")
        try:
            await conn.execute(_BOOKKEEPING)
            applied = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
            pending = [m for m in migration_files() if m[0] not in applied]
            if pending and backup_dir is not None and await _holds_memories(conn):
                await _backup(dsn, backup_dir, pg_dump)
            for version, name, path in pending:
                await _apply(conn, version, name, path.read_text())
            return [m[0] for m in pending]
        finally:
            await conn.execute("SELECT pg_advisory_unlock(727274)")
    finally:
        await conn.close()


async def pending(conn: asyncpg.Connection) -> list[int]:
    """The shipped versions not applied yet (every one, on a database never migrated)."""
    if not await conn.fetchval("SELECT to_regclass('public.schema_migrations') IS NOT NULL"):
        return [version for version, _, _ in migration_files()]
    applied = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
    return [version for version, _, _ in migration_files() if version not in applied]


async def _apply(conn: asyncpg.Connection, version: int, name: str, sql: str) -> None:
    # Both times from the database's clock; clock_timestamp(), not now(), which is frozen at
    # the start of the transaction.
    started = await conn.fetchval("SELECT clock_timestamp()")
    try:
        async with conn.transaction():
            await conn.execute(sql)
            await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name)
            await conn.execute(
                "INSERT INTO schema_migrations_log (version, name, started_at, finished_at, outcome)"
                " VALUES ($1, $2, $3, clock_timestamp(), 'applied')",
                version, name, started,
            )
        log.info("migration applied", extra={"version": version, "migration": name})
    except Exception as exc:
        await conn.execute(
            "INSERT INTO schema_migrations_log (version, name, started_at, finished_at, outcome, error)"
            " VALUES ($1, $2, $3, clock_timestamp(), 'failed', $4)",
            version, name, started, repr(exc),
        )
        raise


async def _holds_memories(conn: asyncpg.Connection) -> bool:
    exists = await conn.fetchval("SELECT to_regclass('public.memories') IS NOT NULL")
    return bool(exists) and bool(await conn.fetchval("SELECT EXISTS (SELECT 1 FROM memories)"))


async def _backup(dsn: str, backup_dir: Path, pg_dump: Path | None) -> Path | None:
    binary = pg_dump or (Path(found) if (found := shutil.which("pg_dump")) else None)
    if binary is None:
        log.warning("no pg_dump binary: migrating without a backup")
        return None
    backup_dir.mkdir(parents=True, exist_ok=True)
    target = backup_dir / f"pre-migrate-{datetime.now(timezone.utc):%Y%m%dT%H%M%S%f}.dump"
    # The password goes through the environment, not the command line that `ps` shows.
    parts = urlsplit(dsn)
    env = {**os.environ}
    if parts.password:
        env["PGPASSWORD"] = unquote(parts.password)
        netloc = parts.netloc.replace(f":{parts.password}@", "@", 1)
        dsn = urlunsplit(parts._replace(netloc=netloc))
    proc = await asyncio.create_subprocess_exec(
        str(binary), "--format=custom", f"--file={target}", dsn,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env,
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"pre-migration backup failed: {err.decode(errors='replace')}")
    log.info("pre-migration backup written", extra={"path": str(target)})
    return target
