"""Verify on read: every read that returns memories checks each against its chain's newest
event (one statement for the lot), and a memory whose row no longer matches (edited behind the
service's back) is quarantined: it leaves recall, a QUARANTINE event records what differed, an
error is logged for the alert, and an operator rolls it back or confirms it.

`verify_all` is `engram verify`: every memory's chain and every scope's chain, in full.
"""

from __future__ import annotations

import logging
from uuid import UUID

import asyncpg

from engram.domain import chain
from engram.domain.changes import ChainBreak, VerifyReport
from engram.store import changes as store
from engram.store import history

log = logging.getLogger(__name__)
VERIFY_ACTOR = "system:verify"


class Integrity:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def check(self, memory_ids: list[UUID], *, request_id: str | None = None) -> set[UUID]:
        """Quarantine those of `memory_ids` whose row does not match its history; returns their
        ids (ones quarantined earlier are not judged again)."""
        if not memory_ids:
            return set()
        return await self.judge(await history.rows_with_newest(self._pool, memory_ids), request_id=request_id)

    async def judge(self, rows: list, *, request_id: str | None = None) -> set[UUID]:
        """`check` of rows already read with their chain heads (history.SEAL_COLUMNS and the
        state fields, in one snapshot): a search reads its results that way, in the statement
        that reads them anyway. Only a row that does not match is read again, under its lock."""
        suspect = {r["id"]: why for r in rows if r["status"] != "quarantined"
                   and (why := chain.newest_mismatch(r, history.newest_of(r))) is not None}
        quarantined = set()
        for memory_id in suspect:
            if await self._quarantine(memory_id, request_id):
                quarantined.add(memory_id)
        return quarantined

    async def _quarantine(self, memory_id: UUID, request_id: str | None) -> bool:
        """Judge the memory again under its row lock (a change may have committed since the
        read) and quarantine it if it still does not match. Returns whether it did."""
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                row = await store.lock(conn, memory_id)
                newest = (await history.newest(conn, [memory_id])).get(memory_id)
                why = None if row is None or row["status"] == "quarantined" else chain.newest_mismatch(row, newest)
                if why is None:
                    return False
                marked = await store.mark(conn, memory_id, status="quarantined")
                recorded = newest["state"] if newest is not None else None
                # The event records the row as found, so the chain matches it again: the memory
                # stays quarantined by its status until an operator acts, and this event says why.
                await history.append(conn, memory_id, (row["user_id"], row["agent_id"], row["run_id"]), history.Event(
                    event="QUARANTINE", version=row["version"], state=chain.state_of(marked), actor_type="system",
                    actor_id=VERIFY_ACTOR, path=VERIFY_ACTOR, reason=f"the row does not match its history: {why}",
                    request_id=request_id, old_content=(recorded or {}).get("content"), new_content=row["content"],
                    old_metadata=recorded), row["chain_hash"])
        log.error("memory quarantined: its row does not match its history",
                  extra={"memory_id": str(memory_id), "why": why, "request_id": request_id})
        return True

    async def verify_all(self) -> VerifyReport:
        memories, events, breaks = await history.verify_all(self._pool)
        return VerifyReport(ok=not breaks, memories=memories, events=events,
                            breaks=[ChainBreak(kind=b.kind, where=b.where, event_id=b.event_id, detail=b.detail)
                                    for b in breaks])
