"""The connection pool: every connection speaks pgvector and reads and writes JSONB as Python
values, so no repository encodes or decodes JSON by hand."""

from __future__ import annotations

import json

import asyncpg
from pgvector.asyncpg import register_vector


async def _init_connection(conn: asyncpg.Connection) -> None:
    await register_vector(conn)
    await conn.set_type_codec("jsonb", schema="pg_catalog", encoder=json.dumps, decoder=json.loads)


async def create_pool(dsn: str, *, min_size: int, max_size: int) -> asyncpg.Pool:
    """A pool for a migrated database (engram.store.migrate runs first)."""
    return await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, init=_init_connection)


async def connect(dsn: str) -> asyncpg.Connection:
    """One connection set up like the pool's, for start-up work that needs no pool."""
    conn = await asyncpg.connect(dsn)
    await _init_connection(conn)
    return conn
