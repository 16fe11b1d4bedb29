"""engram.approvals.ApprovalRuns on Temporal: an approval's workflow receives its `decide`
signal, started with it if the dispatcher has not started it yet."""

from __future__ import annotations

from datetime import datetime, timezone

from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from engram.approvals import expires_in_s
from engram.domain.approvals import Approval
from engram.domain.errors import Conflict
from engram.settings import Settings
from engram.store import jobs
from workflows.approval import ApprovalWorkflow
from workflows.models import ApprovalDecision, ApprovalInput


def approval_input(s: Settings, approval_id, requested_by: str, expires_at: datetime) -> ApprovalInput:
    return ApprovalInput(approval_id=approval_id, requested_by=requested_by,
                         ttl_s=expires_in_s(expires_at, datetime.now(timezone.utc)),
                         timeout_decision=s.write_approval_timeout)


class TemporalApprovalRuns:
    def __init__(self, client: Client, settings: Settings) -> None:
        self._client = client
        self._settings = settings

    async def decide(self, approval: Approval, *, decision: str, actor: str, role: str, reason: str,
                     path: str) -> None:
        signal = ApprovalDecision(decision=decision, actor=actor, role=role, reason=reason, path=path)
        try:
            await self._client.start_workflow(
                ApprovalWorkflow.run, approval_input(self._settings, approval.id, approval.requested_by,
                                                     approval.expires_at),
                id=jobs.workflow_id_for(approval.id, "approval"), task_queue=self._settings.temporal_task_queue,
                # Signal-with-start: a running approval gets the signal; a closed one is not started again.
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                start_signal="decide", start_signal_args=[signal])
        except WorkflowAlreadyStartedError:
            raise Conflict(f"approval {approval.id} is decided already") from None
