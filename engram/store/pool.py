"""The connection pool: every connection speaks pgvector and reads and writes JSONB as Python
values, so no repository encodes or decodes JSON by hand."""

from __future__ import annotations

import json
import socket

import asyncpg
from pgvector.asyncpg import register_vector


async def _init_connection(conn: asyncpg.Connection) -> None:
    await register_vector(conn)
    await conn.set_type_codec("jsonb", schema="pg_catalog", encoder=json.dumps, decoder=json.loads)


# What a call raises when Postgres cannot be reached, as opposed to refusing the statement.
UNREACHABLE: tuple[type[BaseException], ...] = (
    ConnectionError, TimeoutError, socket.gaierror,  # refused, reset, timed out, unknown host
    asyncpg.PostgresConnectionError,  # SQLSTATE class 08, a connection lost mid-call included
    asyncpg.exceptions.OperatorInterventionError,  # shutting down, starting up (57P01, 57P03)
    asyncpg.TooManyConnectionsError,
)


async def create_pool(dsn: str, *, min_size: int, max_size: int) -> asyncpg.Pool:
    """A pool for a migrated database (engram.store.migrate runs first)."""
    # asyncpg's default reset query runs on every release (~30 µs). It must: a connection
    # whose server went away mid-statement can come back in a half-finished protocol state,
    # and only a round trip on release finds that and discards it; without one, it fails
    # every later call (found by tests/test_database_outage.py under CPU contention).
    return await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, init=_init_connection)


async def connect(dsn: str) -> asyncpg.Connection:
    """One connection set up like the pool's, for start-up work that needs no pool."""
    conn = await asyncpg.connect(dsn)
    await _init_connection(conn)
    return conn
