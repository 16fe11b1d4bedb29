"""ApprovalWorkflow's activity: a Temporal adapter over engram.approval_steps."""

from __future__ import annotations

import asyncpg
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import DecideApprovalInput, DecideApprovalOutput
from engram import approval_steps as steps
from engram.changes import MemoryChanges
from engram.domain.errors import NotFound


class ApprovalActivities:
    def __init__(self, pool: asyncpg.Pool, changes: MemoryChanges) -> None:
        self._pool = pool
        self._changes = changes

    @activity.defn(name="approval_decide")
    async def decide(self, inp: DecideApprovalInput) -> DecideApprovalOutput:
        try:
            done = await steps.decide(self._pool, self._changes, inp.approval_id, decision=inp.decision,
                                      actor=inp.actor, role=inp.role, reason=inp.reason, path=inp.path,
                                      timed_out=inp.timed_out)
        except NotFound as err:
            raise ApplicationError(err.detail, type="ApprovalNotFound", non_retryable=True) from err
        except steps.Waiting as err:  # retried, with the step's backoff, until the scope thaws
            raise ApplicationError(str(err), type="ApprovalWaiting") from err
        return DecideApprovalOutput(status=done.status, detail=done.detail)

    def all(self) -> list:
        return [self.decide]
