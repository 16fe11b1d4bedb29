"""SQL for the operational switches' mirror and audit (the ControlWorkflow writes them)."""

from __future__ import annotations

from datetime import datetime

import asyncpg


async def read(conn: asyncpg.Connection | asyncpg.Pool) -> tuple[asyncpg.Record, list[asyncpg.Record]]:
    """(the global switches, the frozen scopes)."""
    state = await conn.fetchrow("SELECT frozen, kill_switch, updated_at FROM control_state")
    scopes = await conn.fetch("SELECT scope_key, user_id, agent_id, run_id, reason, frozen_by, frozen_at"
                              " FROM frozen_scopes ORDER BY scope_key")
    return state, scopes


async def record(conn: asyncpg.Connection, *, switch: str, scope: dict | None, value: bool, actor: str, role: str,
                 reason: str) -> None:
    """Set one switch and write its audit event, in the caller's transaction."""
    if switch == "freeze" and scope is None:
        await conn.execute("UPDATE control_state SET frozen = $1, updated_at = now()", value)
    elif switch == "kill_switch":
        await conn.execute("UPDATE control_state SET kill_switch = $1, updated_at = now()", value)
    elif switch == "freeze" and value:
        await conn.execute(
            "INSERT INTO frozen_scopes (scope_key, user_id, agent_id, run_id, reason, frozen_by)"
            " VALUES (engram_scope_key($1, $2, $3), $1, $2, $3, $4, $5) ON CONFLICT (scope_key) DO UPDATE"
            " SET reason = EXCLUDED.reason, frozen_by = EXCLUDED.frozen_by, frozen_at = now()",
            scope.get("user_id"), scope.get("agent_id"), scope.get("run_id"), reason, actor)
    else:
        await conn.execute("DELETE FROM frozen_scopes WHERE scope_key = engram_scope_key($1, $2, $3)",
                           scope.get("user_id"), scope.get("agent_id"), scope.get("run_id"))
    await conn.execute("INSERT INTO control_events (switch, scope, value, actor, role, reason) VALUES"
                       " ($1, $2, $3, $4, $5, $6)", switch, scope, value, actor, role, reason)


async def recent_deletes(conn: asyncpg.Connection | asyncpg.Pool, scope_key_of: object, since: datetime) -> int:
    """Deletes by id in the memory's exact scope since `since` (a batch forget's are its own)."""
    return await conn.fetchval(
        "SELECT count(*) FROM memory_history h WHERE h.event = 'DELETE' AND h.created_at >= $2"
        " AND h.scope_key = (SELECT scope_key FROM memories WHERE id = $1)"
        " AND h.path IS DISTINCT FROM 'system:batch-forget'",
        scope_key_of, since)


async def events(conn: asyncpg.Connection | asyncpg.Pool, limit: int) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT * FROM control_events ORDER BY id DESC LIMIT $1", limit)
