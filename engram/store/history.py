"""SQL for history: appending events to a memory's hash chain, reading them, sealing the
per-scope chains, and verifying both (engram.domain.chain says what is hashed).

Every event is appended in the transaction of the change it records, with the memory's row
locked (or just inserted), so a memory's chain has one writer at a time. Scope chains are
sealed after commit by `seal_scopes`, in the order the sealer takes events: writers never wait
on a scope-wide lock, and a sealed event can no longer be removed or edited unseen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from uuid import UUID

import asyncpg

from engram.domain import chain

SYSTEM_CHAIN = "system:chain"


@dataclass(frozen=True)
class Event:
    """One history event to append. `state` is the memory's state after it (chain.state_of)."""

    event: str
    version: int
    state: dict[str, Any]
    actor_type: str
    actor_id: str
    path: str | None = None
    reason: str | None = None
    request_id: str | None = None
    session_id: str | None = None
    old_content: str | None = None
    new_content: str | None = None
    old_metadata: dict | None = None
    new_metadata: dict | None = None
    provider: str | None = None
    model: str | None = None
    prompt_version: str | None = None
    decision_reason: str | None = None
    at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    def hash(self, memory_id: UUID, scope: tuple[str | None, str | None, str | None], prev_hash: str | None) -> str:
        return chain.event_hash(memory_id=memory_id, scope=scope, event=self.event, version=self.version,
                                state=self.state, actor_id=self.actor_id, path=self.path, reason=self.reason,
                                created_at=self.at, prev_hash=prev_hash)


# An event's row, as a SELECT so that a statement can make it conditional (`... FROM m`).
INSERT_SELECT = """
    INSERT INTO memory_history (memory_id, event, version, old_content, new_content, old_metadata, new_metadata,
        actor_type, actor_id, provider, model, prompt_version, decision_reason, request_id, session_id, path,
        reason, state, hash, prev_hash, scope_key, created_at)
    SELECT $1::uuid, $2::text, $3::int, $4::text, $5::text, $6::jsonb, $7::jsonb, $8::text, $9::text, $10::text,
        $11::text, $12::text, $13::text, $14::text, $15::text, $16::text, $17::text, $18::jsonb, $19::text, $20::text,
        engram_scope_key($21::text, $22::text, $23::text), $24::timestamptz
"""


def insert_args(memory_id: UUID, scope: tuple[str | None, str | None, str | None], e: Event,
                prev_hash: str | None) -> tuple[list, str]:
    """The parameters of `INSERT_SELECT` for `e`, and its hash."""
    digest = e.hash(memory_id, scope, prev_hash)
    return [memory_id, e.event, e.version, e.old_content, e.new_content, e.old_metadata, e.new_metadata,
            e.actor_type, e.actor_id, e.provider, e.model, e.prompt_version, e.decision_reason, e.request_id,
            e.session_id, e.path, e.reason, e.state, digest, prev_hash, *scope, e.at], digest


async def append(conn: asyncpg.Connection, memory_id: UUID, scope: tuple[str | None, str | None, str | None],
                 e: Event, prev_hash: str | None) -> str:
    """Append `e` after `prev_hash` (the memory's chain_hash, read under its row lock) and make
    it the memory's chain head, in the caller's transaction. Returns its hash."""
    args, digest = insert_args(memory_id, scope, e, prev_hash)
    await conn.execute(INSERT_SELECT, *args)
    await conn.execute("UPDATE memories SET chain_hash = $2 WHERE id = $1", memory_id, digest)
    return digest


async def events(conn: asyncpg.Connection | asyncpg.Pool, memory_id: UUID) -> list[asyncpg.Record]:
    """A memory's events, oldest first."""
    return await conn.fetch("SELECT * FROM memory_history WHERE memory_id = $1 ORDER BY id", memory_id)


async def newest(conn: asyncpg.Connection | asyncpg.Pool, memory_ids: list[UUID]) -> dict[UUID, asyncpg.Record]:
    """Each memory's newest event, which its row must match."""
    rows = await conn.fetch(
        """
        SELECT DISTINCT ON (memory_id) * FROM memory_history WHERE memory_id = ANY($1::uuid[])
        ORDER BY memory_id, id DESC
        """,
        memory_ids,
    )
    return {r["memory_id"]: r for r in rows}


_EVENT_FIELDS = ("memory_id", "event", "version", "state", "actor_id", "path", "reason", "created_at", "hash",
                 "prev_hash")


# What judging a row of `memories m` against its chain needs beside its state: its chain head and
# its newest event's fields as `h_<field>` (NEWEST_EVENT_JOIN brings the event in as `h`).
SEAL_COLUMNS = "m.chain_hash, " + ", ".join(f"h.{f} AS h_{f}" for f in _EVENT_FIELDS)
NEWEST_EVENT_JOIN = """LEFT JOIN LATERAL (
    SELECT * FROM memory_history e WHERE e.memory_id = m.id ORDER BY e.id DESC LIMIT 1) h ON true"""


async def rows_with_newest(conn: asyncpg.Connection | asyncpg.Pool, memory_ids: list[UUID]) -> list[asyncpg.Record]:
    """Each memory's row (its state, scope, version, status, chain_hash) with its newest
    event's fields as `h_<field>`, read in one snapshot so that they can be judged together."""
    return await conn.fetch(
        f"""
        SELECT m.id, m.user_id, m.agent_id, m.run_id, m.version, m.status,
               {", ".join("m." + f for f in chain.STATE_FIELDS)}, {SEAL_COLUMNS}
        FROM memories m {NEWEST_EVENT_JOIN}
        WHERE m.id = ANY($1::uuid[])
        """,
        memory_ids,
    )


def newest_of(row: asyncpg.Record) -> dict[str, Any] | None:
    """The newest event's fields of a `rows_with_newest` row (None: it has none)."""
    if row["h_hash"] is None and row["h_event"] is None:
        return None
    return {f: row[f"h_{f}"] for f in _EVENT_FIELDS}


async def state_at(conn: asyncpg.Connection, memory_id: UUID, version: int) -> dict[str, Any] | None:
    """The state the memory's last event of `version` recorded, or None (no such version, or an
    event written before states were recorded). A QUARANTINE event's state is the row as it
    was found, not a version of the memory: never this."""
    return await conn.fetchval(
        "SELECT state FROM memory_history WHERE memory_id = $1 AND version = $2 AND state IS NOT NULL"
        " AND event <> 'QUARANTINE' ORDER BY id DESC LIMIT 1",
        memory_id, version,
    )


def recomputed(row: asyncpg.Record) -> str:
    """The hash an event row should carry, from its own fields."""
    return chain.event_hash(memory_id=row["memory_id"], scope=_scope_parts(row), event=row["event"],
                            version=row["version"], state=row["state"], actor_id=row["actor_id"], path=row["path"],
                            reason=row["reason"], created_at=row["created_at"], prev_hash=row["prev_hash"])


def _scope_parts(row) -> tuple[str | None, str | None, str | None]:
    return row["user_id"], row["agent_id"], row["run_id"]


# -- sealing --------------------------------------------------------------------------------------

async def seal_memory(conn: asyncpg.Connection, memory_id: UUID) -> str | None:
    """Give a memory written before history was chained its chain, in the caller's transaction
    (its row is locked here): each event hashed in order, the newest recording the row's
    current state. Returns the chain head (None: no such memory)."""
    row = await conn.fetchrow(
        "SELECT id, chain_hash, user_id, agent_id, run_id, version, content, type, tags, importance, pinned,"
        " metadata, is_deleted FROM memories WHERE id = $1 FOR UPDATE",
        memory_id,
    )
    if row is None or row["chain_hash"] is not None:
        return None if row is None else row["chain_hash"]
    scope = _scope_parts(row)
    found = await conn.fetch("SELECT * FROM memory_history WHERE memory_id = $1 ORDER BY id", memory_id)
    prev = None
    for i, e in enumerate(found):
        state = e["state"]
        if state is None and i == len(found) - 1:
            state = chain.state_of(row)
        digest = chain.event_hash(memory_id=memory_id, scope=scope, event=e["event"], version=e["version"],
                                  state=state, actor_id=e["actor_id"], path=e["path"], reason=e["reason"],
                                  created_at=e["created_at"], prev_hash=prev)
        await conn.execute(
            "UPDATE memory_history SET state = $2, hash = $3, prev_hash = $4, scope_key = engram_scope_key($5, $6, $7)"
            " WHERE id = $1",
            e["id"], state, digest, prev, *scope,
        )
        prev = digest
    if prev is None:  # no event at all: start the chain with one that says so
        prev = await append(conn, memory_id, scope, Event(
            event="CONFIRM", version=row["version"], state=chain.state_of(row), actor_type="system",
            actor_id=SYSTEM_CHAIN, path=SYSTEM_CHAIN, reason="sealed a memory that had no history"), None)
    else:
        await conn.execute("UPDATE memories SET chain_hash = $2 WHERE id = $1", memory_id, prev)
    return prev


async def seal_unsealed_memories(pool: asyncpg.Pool, limit: int) -> int:
    """Seal up to `limit` memories written before history was chained. Returns how many."""
    ids = await pool.fetch("SELECT id FROM memories WHERE chain_hash IS NULL ORDER BY created_at, id LIMIT $1", limit)
    for r in ids:
        async with pool.acquire() as conn:
            async with conn.transaction():
                await seal_memory(conn, r["id"])
    return len(ids)


async def seal_scopes(pool: asyncpg.Pool, limit: int) -> int:
    """Chain up to `limit` events not sealed yet into their scopes' chains, oldest first; safe
    in several processes at once (events are taken with SKIP LOCKED, heads locked in scope
    order). Returns how many were sealed."""
    async with pool.acquire() as conn:
        async with conn.transaction():
            rows = await conn.fetch(
                "SELECT id, scope_key, hash FROM memory_history WHERE scope_seq IS NULL AND hash IS NOT NULL"
                " ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
                limit,
            )
            by_scope: dict[str, list[asyncpg.Record]] = {}
            for r in rows:
                by_scope.setdefault(r["scope_key"], []).append(r)
            for scope_key in sorted(by_scope):
                await conn.execute("INSERT INTO scope_chains (scope_key, seq, head) VALUES ($1, 0, '')"
                                   " ON CONFLICT DO NOTHING", scope_key)
                head = await conn.fetchrow("SELECT seq, head FROM scope_chains WHERE scope_key = $1 FOR UPDATE",
                                           scope_key)
                seq, link = head["seq"], head["head"]
                ids, seqs, links = [], [], []
                for r in by_scope[scope_key]:
                    seq, link = seq + 1, chain.scope_link(link, r["hash"])
                    ids.append(r["id"])
                    seqs.append(seq)
                    links.append(link)
                await conn.execute(
                    "UPDATE memory_history h SET scope_seq = u.seq, scope_hash = u.link"
                    " FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS u(id, seq, link) WHERE h.id = u.id",
                    ids, seqs, links,
                )
                await conn.execute("UPDATE scope_chains SET seq = $2, head = $3, updated_at = now()"
                                   " WHERE scope_key = $1", scope_key, seq, link)
    return len(rows)


# -- verifying ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Break:
    """Where a chain is broken: the memory (or the scope, for a scope chain), the event, and why."""

    kind: str  # "memory" or "scope"
    where: str  # a memory id or a scope key
    event_id: int | None
    detail: str


def memory_breaks(row: asyncpg.Record | dict, found: list[asyncpg.Record]) -> list[Break]:
    """What is wrong with one memory's chain: its events (oldest first) against each other and
    against its row. A memory not sealed yet (chain_hash null) has nothing to check."""
    if row["chain_hash"] is None:
        return []
    where = str(row["id"])
    breaks = []
    prev = None
    for e in found:
        if e["hash"] is None:
            breaks.append(Break("memory", where, e["id"], "an event without a hash in a sealed chain"))
            continue
        if e["prev_hash"] != prev:
            breaks.append(Break("memory", where, e["id"], "does not link to the event before it (one was removed?)"))
        if recomputed({**dict(e), "user_id": row["user_id"], "agent_id": row["agent_id"],
                       "run_id": row["run_id"]}) != e["hash"]:
            breaks.append(Break("memory", where, e["id"], "its fields do not match its hash (edited?)"))
        prev = e["hash"]
    if not found:
        breaks.append(Break("memory", where, None, "no history at all"))
        return breaks
    last = found[-1]
    if last["hash"] != row["chain_hash"]:
        breaks.append(Break("memory", where, last["id"], "the newest event is not the row's chain head (removed?)"))
    if not chain.same_state(chain.state_of(row), last["state"]) or last["version"] != row["version"]:
        breaks.append(Break("memory", where, last["id"], "the row does not match the state its newest event recorded"))
    return breaks


async def verify_all(pool: asyncpg.Pool, *, batch: int = 1_000) -> tuple[int, int, list[Break]]:
    """Check every memory's chain and every scope's chain. Returns (memories checked, events
    checked, breaks).

    Everything is read in one snapshot (a repeatable-read transaction): a change or a seal that
    commits while the check runs would otherwise show as a row ahead of its events, or a scope
    head ahead of its chain."""
    breaks: list[Break] = []
    memories = events_checked = 0
    after = UUID(int=0)
    async with pool.acquire() as conn:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            while True:
                rows = await conn.fetch(
                    "SELECT id, chain_hash, user_id, agent_id, run_id, version, content, type, tags, importance,"
                    " pinned, metadata, is_deleted FROM memories WHERE id > $1 ORDER BY id LIMIT $2",
                    after, batch,
                )
                if not rows:
                    break
                found: dict[UUID, list] = {}
                for e in await conn.fetch("SELECT * FROM memory_history WHERE memory_id = ANY($1::uuid[])"
                                          " ORDER BY id", [r["id"] for r in rows]):
                    found.setdefault(e["memory_id"], []).append(e)
                for r in rows:
                    breaks += memory_breaks(r, found.get(r["id"], []))
                    events_checked += len(found.get(r["id"], []))
                memories += len(rows)
                after = rows[-1]["id"]
            breaks += await _scope_breaks(conn)
    return memories, events_checked, breaks


async def _scope_breaks(conn: asyncpg.Connection) -> list[Break]:
    """The scope chains' breaks, read in the caller's transaction."""
    breaks = []
    heads = {r["scope_key"]: r for r in await conn.fetch("SELECT scope_key, seq, head FROM scope_chains")}
    cursor = conn.cursor("SELECT id, scope_key, scope_seq, scope_hash, hash FROM memory_history"
                         " WHERE scope_seq IS NOT NULL ORDER BY scope_key, scope_seq")
    scope_key, seq, link = None, 0, ""
    seen: set[str] = set()
    async for e in cursor:
        if e["scope_key"] != scope_key:
            _scope_end(breaks, scope_key, seq, link, heads)
            scope_key, seq, link = e["scope_key"], 0, ""
            seen.add(scope_key)
        if e["scope_seq"] != seq + 1:
            breaks.append(Break("scope", scope_key, e["id"],
                                f"sealed events {seq + 1}..{e['scope_seq'] - 1} are missing"))
        link = chain.scope_link(link, e["hash"] or "")
        if link != e["scope_hash"]:
            breaks.append(Break("scope", scope_key, e["id"], "does not match the scope chain (edited?)"))
            link = e["scope_hash"]
        seq = e["scope_seq"]
    _scope_end(breaks, scope_key, seq, link, heads)
    for key, head in heads.items():
        if key not in seen and head["seq"] > 0:
            breaks.append(Break("scope", key, None, f"every one of its {head['seq']} sealed events is missing"))
    return breaks


def _scope_end(breaks: list[Break], scope_key: str | None, seq: int, link: str, heads: dict) -> None:
    if scope_key is None:
        return
    head = heads.get(scope_key)
    if head is None or head["seq"] != seq or head["head"] != link:
        breaks.append(Break("scope", scope_key, None, "the newest sealed events are missing, or the head was edited"))
