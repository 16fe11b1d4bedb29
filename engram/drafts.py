"""How a remember request becomes the memory stored: its provenance, type and lifetime, and,
for a write that needs one, the approval it waits for; and the end of a scope's earlier
sessions, which a STATE memory lasts for (engram.domain.provenance holds the rules)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

import asyncpg

from engram.domain import provenance
from engram.domain.errors import ValidationFailed
from engram.domain.models import MemoryDraft, RememberItem, Scope
from engram.settings import Settings
from engram.store import approvals, jobs
from engram.store import memories as repo

log = logging.getLogger(__name__)
SESSION_END_ATTEMPTS = 3


@dataclass(frozen=True)
class Session:
    """A write in `scope`'s session `session_id` at `at`: the scope's earlier sessions end."""

    scope: Scope
    session_id: str
    at: datetime


def draft_of(s: Settings, writer: str, req: RememberItem, now: datetime) -> MemoryDraft:
    """The memory to store for `req`, written by the key `writer` at `now`: its trust, confidence
    (capped for UNTRUSTED), type, expiry, agent chain, and whether it waits for approval. With
    trust_and_lifetimes off: TRUSTED, only the request's own expiry, no approval. Raises
    ValidationFailed for an `expires_at` that has passed."""
    memory_type = req.memory_type or provenance.type_of(req.type)
    if req.expires_at is not None and req.expires_at <= now:
        raise ValidationFailed(f"expires_at: {req.expires_at.isoformat()} has passed")
    trust, expires_at, approval = "TRUSTED", req.expires_at, None
    if s.trust_and_lifetimes:
        trust = provenance.classify(req.source_type, s.trust_sources, s.trust_default)
        if req.origin is not None:
            trust = provenance.lowest(trust, provenance.classify(req.origin.source_type, s.trust_sources,
                                                                 s.trust_default))
        expires_at = expires_at or s.lifetimes.expires_at(memory_type, now)
        approval = "pending" if provenance.needs_approval(memory_type, trust) else None
    agent_chain = list(req.agent_chain)
    if agent_chain[-1:] != [writer]:
        agent_chain.append(writer)  # the last hop: the key that wrote it
    return MemoryDraft(
        scope=req.scope, content=req.content, type=req.type, tags=req.tags, who=req.who,
        source_type=req.source_type, source_id=req.source_id, session_id=req.session_id, metadata=req.metadata,
        pinned=req.pinned, importance=req.importance, confidence=provenance.capped(req.confidence, trust),
        trust=trust, memory_type=memory_type, expires_at=expires_at, agent_chain=agent_chain,
        origin=req.origin.model_dump() if req.origin is not None else None, approval=approval)


async def hold_for_approval(conn: asyncpg.Connection, s: Settings, memory_id: UUID, draft: MemoryDraft,
                            writer: str, now: datetime) -> UUID:
    """In the write's transaction: the approval the memory waits for, and the job whose run (an
    ApprovalWorkflow, started by the dispatcher) holds it open until decided or past
    WRITE_APPROVAL_TTL_S. Returns the approval's id."""
    approval_id = uuid.uuid4()
    expires_at = now + timedelta(seconds=s.write_approval_ttl_s)
    await approvals.insert(conn, approval_id, memory_id=memory_id, scope=draft.scope,
                           reason=provenance.needs_approval(draft.memory_type, draft.trust),
                           requested_by=writer, expires_at=expires_at)
    await jobs.insert(conn, job_id=approval_id, memory_id=memory_id, job_type="approval", max_attempts=1,
                      payload={"approval_id": str(approval_id), "expires_at": expires_at.isoformat(),
                               "requested_by": writer})
    return approval_id


async def end_earlier_sessions(conn: asyncpg.Connection, sessions: list[Session]) -> None:
    """Expire the STATE memories of each scope's other sessions, in the transaction of the write
    that began the session: its answer, and a bulk import's, is published only with the
    sessions ended, and a crash cannot keep one write without the other. Each attempt is a
    savepoint, retried when it deadlocks with the pipeline's own row updates. It never fails
    the write: a STATE left over still ends by its lifetime (LIFETIME_STATE_S), and the
    failure is logged."""
    for session in sessions:
        for attempt in range(1, SESSION_END_ATTEMPTS + 1):
            try:
                async with conn.transaction():
                    await repo.end_other_sessions(conn, session.scope, session.session_id, session.at)
                break
            except (asyncpg.DeadlockDetectedError, asyncpg.SerializationError) as err:
                if attempt == SESSION_END_ATTEMPTS:
                    log.warning("could not end a scope's earlier sessions; their STATE memories end by lifetime",
                                extra={"session_id": session.session_id, "error": repr(err)})
                else:
                    await asyncio.sleep(0.01 * attempt)
