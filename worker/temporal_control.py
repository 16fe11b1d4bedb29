"""engram.control.ControlRuns on Temporal: the ControlWorkflow, started where missing and
changed by its validated `change` update."""

from __future__ import annotations

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy

from engram.domain.errors import Forbidden
from engram.settings import Settings
from workflows.control import ControlWorkflow, control_workflow_id
from workflows.models import ControlChange, ControlInput


class TemporalControlRuns:
    def __init__(self, client: Client, settings: Settings) -> None:
        self._client = client
        self._settings = settings

    async def change(self, *, switch: str, on: bool, scope: dict | None, actor: str, role: str, reason: str) -> None:
        handle = await self._client.start_workflow(
            ControlWorkflow.run, args=[ControlInput(), None], id=control_workflow_id(self._settings.temporal_task_queue),
            task_queue=self._settings.temporal_task_queue, id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING)
        try:
            await handle.execute_update(ControlWorkflow.change, ControlChange(
                switch=switch, on=on, scope=scope, actor=actor, role=role, reason=reason))
        except WorkflowUpdateFailedError as err:
            raise Forbidden(f"the control workflow refused the change: {getattr(err.cause, 'message', err)}") from None
