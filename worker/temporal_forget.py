"""engram.forget.ForgetRuns on Temporal: batch forgets' workflows, started, confirmed (an
update, validated by the workflow) and decided (the `approve` / `reject` signals)."""

from __future__ import annotations

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError

from engram.domain.errors import Conflict
from engram.settings import Settings
from workflows.forget import BatchForgetWorkflow
from workflows.models import ForgetConfirmation, ForgetDecision, ForgetRunInput


class TemporalForgetRuns:
    def __init__(self, client: Client, settings: Settings) -> None:
        self._client = client
        self._settings = settings

    async def start(self, operation_id: str, *, requester: str, needs_approval: bool, dry_run: bool,
                    confirm_ttl_s: float, approval_ttl_s: float, total: int, token_sha256: str) -> None:
        await self._client.start_workflow(
            BatchForgetWorkflow.run,
            ForgetRunInput(operation_id=operation_id, requester=requester, needs_approval=needs_approval,
                           dry_run=dry_run, confirm_ttl_s=confirm_ttl_s, approval_ttl_s=approval_ttl_s, total=total,
                           token_sha256=token_sha256, heartbeat_timeout_s=self._settings.forget_heartbeat_timeout_s),
            id=operation_id, task_queue=self._settings.temporal_task_queue)

    async def confirm(self, operation_id: str, *, actor: str, reason: str, stale: bool, token: str) -> str:
        handle = self._client.get_workflow_handle(operation_id)
        try:
            return await handle.execute_update(BatchForgetWorkflow.confirm,
                                               ForgetConfirmation(actor=actor, reason=reason, stale=stale, token=token))
        except (WorkflowUpdateFailedError, RPCError) as err:
            cause = getattr(err, "cause", None)
            raise Conflict(f"the operation refused the confirmation: {getattr(cause, 'message', None) or err}") from None

    async def decide(self, operation_id: str, *, approve: bool, actor: str, role: str, reason: str) -> None:
        handle = self._client.get_workflow_handle(operation_id)
        signal = BatchForgetWorkflow.approve if approve else BatchForgetWorkflow.reject
        await handle.signal(signal, ForgetDecision(actor=actor, role=role, reason=reason))
