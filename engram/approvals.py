"""Approvals through the service: list, show, and decide a write that waits for a person
(engram.domain.approvals says what each decision does).

A decision is validated here (who may, whether the write still waits) and handed to the
approval's workflow as its `decide` signal; the workflow applies it (engram.approval_steps).
The answer is the approval once the workflow has decided it, or as it stands after a short wait.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Protocol
from uuid import UUID

import asyncpg

from engram.control import Control
from engram.domain import auth
from engram.domain.approvals import Approval, ApprovalPage, DecideRequest
from engram.domain.errors import Conflict, Forbidden, NotFound
from engram.store import approvals

ANSWER_WAIT_S = 10.0


class ApprovalRuns(Protocol):
    """The workflows behind approvals (worker/temporal_approval.py)."""

    async def decide(self, approval: Approval, *, decision: str, actor: str, role: str, reason: str,
                     path: str) -> None:
        """Signal the approval's run, starting it if it has not started."""


class Approvals:
    def __init__(self, pool: asyncpg.Pool, runs: ApprovalRuns, control: Control) -> None:
        self._pool = pool
        self._runs = runs
        self._control = control

    async def list(self, principal: auth.Principal, *, status: str, limit: int) -> ApprovalPage:
        """Approvals of scopes the caller may see, oldest first, of `status` (pending: the queue).
        Operators only: the queue holds writes kept back as possible poison."""
        principal.require("approve")
        return ApprovalPage(items=await approvals.page(self._pool, principal.visibility, statuses=[status],
                                                       limit=limit))

    async def get(self, principal: auth.Principal, approval_id: UUID) -> Approval:
        principal.require("approve")
        return await self._visible(principal, approval_id)

    async def decide(self, principal: auth.Principal, approval_id: UUID, req: DecideRequest, *,
                     path: str = "http") -> Approval:
        """Approve, reject or quarantine a waiting write: an operator's, never its writer's.
        Raises Forbidden (not an operator, or the writer), NotFound, Frozen (its scope is),
        Conflict (decided already)."""
        principal.require("approve")
        approval = await self._visible(principal, approval_id)
        if approval.requested_by == principal.id:
            raise Forbidden("a write is approved by someone other than its writer: this key wrote it")
        if approval.status != "pending":
            raise Conflict(f"approval {approval_id} is {approval.status} already")
        await self._control.check(approval.scope)
        await self._runs.decide(approval, decision=req.decision, actor=principal.id, role=principal.role,
                                reason=req.reason, path=path)
        return await self._after(approval_id)

    async def _visible(self, principal: auth.Principal, approval_id: UUID) -> Approval:
        approval = await approvals.get(self._pool, approval_id)
        if approval is None or not principal.may_touch(approval.scope):
            raise NotFound(f"no approval {approval_id}")
        return approval

    async def _after(self, approval_id: UUID) -> Approval:
        """The approval once its workflow has decided it, or as it is after a short wait."""
        deadline = asyncio.get_running_loop().time() + ANSWER_WAIT_S
        while True:
            approval = await approvals.get(self._pool, approval_id)
            if approval.status != "pending" or asyncio.get_running_loop().time() > deadline:
                return approval
            await asyncio.sleep(0.1)


def expires_in_s(expires_at: datetime, now: datetime) -> float:
    """How long an approval still waits, however late its run starts (at least a second)."""
    return max((expires_at - now).total_seconds(), 1.0)
