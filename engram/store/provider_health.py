"""SQL for provider_health: what the service last learned of each LLM provider."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg


@dataclass(frozen=True)
class ProviderState:
    provider: str
    state: str  # "up" or "down"
    detail: str | None
    changed_at: datetime
    checked_at: datetime


async def all_states(conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, ProviderState]:
    rows = await conn.fetch("SELECT provider, state, detail, changed_at, checked_at FROM provider_health")
    return {r["provider"]: ProviderState(**dict(r)) for r in rows}


async def record(conn: asyncpg.Connection | asyncpg.Pool, provider: str, state: str, detail: str | None) -> bool:
    """Record what a call or a probe found. True when this changed the provider's state (a
    provider never seen before counts as up), so exactly one caller reports each change."""
    changed = await conn.fetchval(
        """
        WITH before AS (SELECT state FROM provider_health WHERE provider = $1 FOR UPDATE)
        INSERT INTO provider_health AS h (provider, state, detail) VALUES ($1, $2, $3)
        ON CONFLICT (provider) DO UPDATE SET state = excluded.state, detail = excluded.detail,
            checked_at = now(), changed_at = CASE WHEN h.state = excluded.state THEN h.changed_at ELSE now() END
        RETURNING coalesce((SELECT state FROM before), 'up') <> $2
        """,
        provider, state, detail,
    )
    return bool(changed)
