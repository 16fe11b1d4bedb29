"""ApprovalWorkflow: one per write that waits for a person (engram.domain.approvals).

It waits for the `decide` signal until the approval's time limit, then applies the timeout
decision (WRITE_APPROVAL_TIMEOUT, reject unless set) as `system:approval`. The first valid
decision is applied (engram.approval_steps), once; signals after it are ignored, and the
`state` query says where it stands. The service checks who may decide before it signals; the
workflow refuses too a decision from a role that may not approve, and any from the memory's own
writer (a signal may come straight from the Temporal UI).

Signal for the Web UI: `decide`, with JSON
{"decision": "approve", "actor": "key:<uuid>", "role": "operator", "reason": "..."}
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.approval import ApprovalActivities
    from activities.models import DecideApprovalInput
    from workflows.models import ApprovalDecision, ApprovalInput, ApprovalResult

_STEP = dict(start_to_close_timeout=timedelta(seconds=60),
             retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)))
DECISIONS = ("approve", "reject", "quarantine")
APPROVERS = ("operator", "admin")


@workflow.defn
class ApprovalWorkflow:
    @workflow.init
    def __init__(self, inp: ApprovalInput) -> None:
        # The input here, not in run(): a signal sent with the start is handled before run() begins.
        self._requested_by = inp.requested_by
        self._status = "pending"
        self._decision: ApprovalDecision | None = None
        self._ignored = 0

    @workflow.run
    async def run(self, inp: ApprovalInput) -> ApprovalResult:
        timed_out = False
        try:
            await workflow.wait_condition(lambda: self._decision is not None, timeout=timedelta(seconds=inp.ttl_s))
        except asyncio.TimeoutError:
            pass
        if self._decision is None:  # a decision accepted in the same activation as the timer still counts
            timed_out = True
            self._decision = ApprovalDecision(
                decision=inp.timeout_decision, actor="system:approval", role="agent", path="system:approval",
                reason=f"no decision within {inp.ttl_s:g} s: {inp.timeout_decision} applies")
        d = self._decision
        self._status = "deciding"
        done = await workflow.execute_activity_method(
            ApprovalActivities.decide,
            DecideApprovalInput(approval_id=inp.approval_id, decision=d.decision, actor=d.actor, role=d.role,
                                reason=d.reason, path=d.path, timed_out=timed_out), **_STEP)
        self._status = done.status
        await workflow.wait_condition(workflow.all_handlers_finished)
        return ApprovalResult(status=done.status, decision=d.decision, timed_out=timed_out, detail=done.detail)

    @workflow.signal
    def decide(self, d: ApprovalDecision) -> None:
        if self._accepts(d):
            self._decision = d
        else:
            self._ignored += 1

    def _accepts(self, d: ApprovalDecision) -> bool:
        return (self._decision is None and self._status == "pending" and d.decision in DECISIONS
                and d.role in APPROVERS and d.actor != self._requested_by)

    @workflow.query
    def state(self) -> dict:
        return {"status": self._status, "ignored_signals": self._ignored}
