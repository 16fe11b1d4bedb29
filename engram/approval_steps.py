"""The step of an ApprovalWorkflow (workflows/approval.py): apply the decision on a write that
waited for one. Idempotent, as Temporal may run it again: an approval already decided is left
as it is. activities/approval.py adapts it to Temporal and owns nothing else."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from uuid import UUID

import asyncpg

from engram.changes import MemoryChanges
from engram.domain import auth
from engram.domain.approvals import OUTCOME, TIMEOUT_ACTOR
from engram.domain.changes import ChangeContext
from engram.domain.control import Frozen
from engram.domain.errors import NotFound
from engram.store import approvals, jobs
from engram.store import changes as change_store

log = logging.getLogger(__name__)
EVENT = {"approve": "APPROVE", "reject": "REJECT", "quarantine": "QUARANTINE"}


class Waiting(Exception):
    """The decision cannot be applied yet (its scope is frozen): nothing changed, and the step
    is to run again later."""


@dataclass(frozen=True)
class Decided:
    status: str  # approved, rejected, quarantined, withdrawn (or what an earlier run decided)
    detail: str | None


async def decide(pool: asyncpg.Pool, changes: MemoryChanges, approval_id: UUID, *, decision: str, actor: str,
                 role: str, reason: str, path: str, timed_out: bool) -> Decided:
    """Apply `decision` to the approval's memory, as `actor` (`system:approval` when the time
    limit decided), with its history event, and close the approval and, unless approved, the
    memory's extraction job, in one transaction. An approved memory's extraction goes on. A
    memory that no longer waits (its writer forgot it) closes the approval as `withdrawn`.
    Raises NotFound for an unknown approval, Waiting, with nothing changed, while its scope is
    frozen."""
    principal = auth.Principal(id=TIMEOUT_ACTOR if timed_out else actor, name="approval", role=role, grants=("*",))
    ctx = ChangeContext(path=TIMEOUT_ACTOR if timed_out else path)
    async with pool.acquire() as conn:
        async with conn.transaction():
            approval = await approvals.get(conn, approval_id, lock=True)
            if approval is None:
                raise NotFound(f"no approval {approval_id}")
            if approval.status != "pending":
                return Decided(approval.status, approval.decided_reason)
            memory_id = approval.memory.id
            await jobs.lock_extraction(conn, memory_id)
            if approval.memory.status != "pending":
                detail = f"its memory no longer waits (it is {approval.memory.status}): nothing was decided"
                await approvals.decide(conn, approval_id, status="withdrawn", by=principal.id, reason=detail,
                                       timed_out=timed_out)
                await jobs.end_unapproved(conn, memory_id, "Withdrawn")
                await jobs.finish(conn, approval_id, status="done")
                return Decided("withdrawn", detail)
            try:
                await changes.decide_approval_in(conn, principal, memory_id, EVENT[decision],
                                                 reason=f"approval {approval_id}: {decision}: {reason}", ctx=ctx)
            except Frozen as err:
                raise Waiting(err.detail) from err
            status = OUTCOME[decision]
            await approvals.decide(conn, approval_id, status=status, by=principal.id, reason=reason,
                                   timed_out=timed_out)
            if decision == "approve":
                await jobs.release_approved(conn, memory_id)
            else:
                await jobs.end_unapproved(conn, memory_id, status.capitalize())
            await jobs.finish(conn, approval_id, status="done")
            await change_store.wake_index_sync(conn)
    log.info("approval decided", extra={"stage": "approval", "outcome": status, "memory_id": str(memory_id),
                                        "actor": principal.id})
    return Decided(status, reason)
