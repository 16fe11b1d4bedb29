"""BatchForgetWorkflow: one per batch forget, from its preview to its receipt.

The preview (engram.forget) recorded the exact set and started this run, which then waits:
- for its confirmation, the `confirm` update (validated: only the requester, only with the
  preview's confirm token, whose SHA-256 the run was started with, only while waiting), until
  the token expires (`expired`); a confirmation that found the set changed ends it `stale`;
  under the dry-run policy a confirmation ends it `dry_run`;
- where the set needs it (above the approval threshold, or pinned memories in it), for an
  operator's `approve` or `reject` signal, until the approval's time limit (`expired`). The
  requester's own signal, or one from a role that may not approve, is refused and noted in
  the state.
Then it deletes the set a chunk at a time (progress in the `state` query) and writes the
signed erasure receipt. A worker crash mid-way resumes with the items still pending.

Signals for the Web UI: `approve` and `reject`, each with JSON
{"actor": "key:<uuid>", "role": "operator", "reason": "..."}.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.forget import ForgetActivities
    from activities.models import FinishForgetInput, ForgetChunkInput, OperationStatusInput
    from engram.domain.forget import token_digest
    from workflows.models import ForgetConfirmation, ForgetDecision, ForgetRunInput, ForgetRunResult, ForgetState

_STEP = dict(start_to_close_timeout=timedelta(seconds=60),
             retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)))
_CHUNK = dict(start_to_close_timeout=timedelta(minutes=10),
              retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)))
APPROVERS = ("operator", "admin")


@workflow.defn
class BatchForgetWorkflow:
    # The input in __init__: an update or a signal that comes with the start is handled before
    # run() begins, and its validator must know the requester.
    @workflow.init
    def __init__(self, inp: ForgetRunInput) -> None:
        self._state = ForgetState(status="awaiting_confirmation", done=0, total=inp.total)
        self._confirmation: ForgetConfirmation | None = None
        self._decision: tuple[bool, ForgetDecision] | None = None
        self._requester = inp.requester
        self._token_sha256 = inp.token_sha256

    @workflow.run
    async def run(self, inp: ForgetRunInput) -> ForgetRunResult:
        try:
            await workflow.wait_condition(lambda: self._confirmation is not None,
                                          timeout=timedelta(seconds=inp.confirm_ttl_s))
        except asyncio.TimeoutError:
            return await self._end(inp, "expired", reason=f"not confirmed within {inp.confirm_ttl_s:g} s")
        confirmed = self._confirmation
        if confirmed.stale:
            return await self._end(inp, "stale", actor=confirmed.actor, reason="the set changed since the preview")
        if inp.dry_run:
            return await self._end(inp, "dry_run", actor=confirmed.actor, reason="dry-run policy: nothing deleted")
        if inp.needs_approval:
            await self._move(inp, "awaiting_approval", event="confirmed", actor=confirmed.actor,
                             reason=confirmed.reason)
            try:
                await workflow.wait_condition(lambda: self._decision is not None,
                                              timeout=timedelta(seconds=inp.approval_ttl_s))
            except asyncio.TimeoutError:
                return await self._end(inp, "expired", reason=f"not approved within {inp.approval_ttl_s:g} s")
            approved, decision = self._decision
            self._state.approver = decision.actor
            if not approved:
                return await self._end(inp, "rejected", actor=decision.actor, reason=decision.reason)
            await self._move(inp, "executing", event="approved", actor=decision.actor, reason=decision.reason)
        else:
            await self._move(inp, "executing", event="confirmed", actor=confirmed.actor, reason=confirmed.reason)
        while True:
            chunk = await workflow.execute_activity_method(
                ForgetActivities.delete_chunk, ForgetChunkInput(operation_id=inp.operation_id, limit=inp.chunk),
                heartbeat_timeout=timedelta(seconds=inp.heartbeat_timeout_s), **_CHUNK)
            self._state.done += chunk.settled
            if chunk.remaining == 0:
                break
        receipt = await workflow.execute_activity_method(
            ForgetActivities.finish, FinishForgetInput(operation_id=inp.operation_id, approver=self._state.approver),
            **_STEP)
        self._state.status = "done"
        await workflow.wait_condition(workflow.all_handlers_finished)
        return ForgetRunResult(status="done", receipt=receipt)

    async def _move(self, inp: ForgetRunInput, status: str, *, event: str | None = None, actor: str | None = None,
                    reason: str | None = None) -> None:
        """Move the operation to `status`, recording the move (`event`, default the status) by
        `actor` (default the workflow itself) and why."""
        self._state.status = status
        await workflow.execute_activity_method(
            ForgetActivities.set_status,
            OperationStatusInput(operation_id=inp.operation_id, status=status, approver=self._state.approver,
                                 event=event, actor=actor, reason=reason), **_STEP)

    async def _end(self, inp: ForgetRunInput, status: str, *, actor: str | None = None,
                   reason: str | None = None) -> ForgetRunResult:
        await self._move(inp, status, actor=actor, reason=reason)
        await workflow.wait_condition(workflow.all_handlers_finished)
        return ForgetRunResult(status=status)

    @workflow.update
    async def confirm(self, confirmation: ForgetConfirmation) -> str:
        self._confirmation = confirmation
        return "stale" if confirmation.stale else "confirmed"

    @confirm.validator
    def _check_confirm(self, confirmation: ForgetConfirmation) -> None:
        if self._confirmation is not None or self._state.status != "awaiting_confirmation":
            raise ValueError(f"this operation is {self._state.status}, not awaiting its confirmation")
        if confirmation.actor != self._requester:
            raise ValueError("only the requester confirms an operation")
        if self._token_sha256 is not None and (confirmation.token is None
                                               or token_digest(confirmation.token) != self._token_sha256):
            raise ValueError("the confirmation does not carry this operation's confirm token")

    @workflow.signal
    def approve(self, decision: ForgetDecision) -> None:
        self._decide(True, decision)

    @workflow.signal
    def reject(self, decision: ForgetDecision) -> None:
        self._decide(False, decision)

    def _decide(self, approved: bool, decision: ForgetDecision) -> None:
        why = None
        if decision.actor == self._requester:
            why = "the requester may not decide its own operation"
        elif decision.role not in APPROVERS:
            why = f"role {decision.role} may not approve"
        elif self._state.status != "awaiting_approval" or self._decision is not None:
            why = f"the operation is {self._state.status}, not awaiting approval"
        if why is not None:
            self._state.refused.append(f"{'approve' if approved else 'reject'} from {decision.actor}: {why}")
            return
        self._decision = (approved, decision)

    @workflow.query
    def state(self) -> ForgetState:
        return self._state
