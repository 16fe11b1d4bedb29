"""ControlWorkflow: the one holder of the operational switches (a mutation freeze, global or per
scope, and the kill switch of autonomous mutations). A long-lived entity: one run per task queue
(`control_workflow_id`), continued as new every `changes_per_run` changes with its state.

The `state` query reads the switches. The `change` update flips one: its validator requires an
operator (or the service itself, for a delete spike's freeze) and a reason; the handler mirrors
the change in Postgres with its audit event (every mutating path reads the mirror, at most a
second old) before it answers. Changes are applied one at a time, in the order accepted.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.control import ControlActivities
    from activities.models import ControlRecordInput
    from workflows.models import ControlChange, ControlInput, ControlSnapshot

CHANGERS = ("operator", "admin", "system")
_RECORD = dict(start_to_close_timeout=timedelta(seconds=30),
               retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10)))


def control_workflow_id(task_queue: str) -> str:
    return f"engram-control-{task_queue}"


@workflow.defn
class ControlWorkflow:
    @workflow.init
    def __init__(self, inp: ControlInput, state: ControlSnapshot | None = None) -> None:
        self._state = state or ControlSnapshot()
        self._state.changes = 0
        self._lock = asyncio.Lock()

    @workflow.run
    async def run(self, inp: ControlInput, state: ControlSnapshot | None = None) -> None:
        await workflow.wait_condition(lambda: self._state.changes >= inp.changes_per_run)
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(args=[inp, self._state])

    @workflow.update
    async def change(self, change: ControlChange) -> ControlSnapshot:
        async with self._lock:
            await workflow.execute_activity_method(ControlActivities.record, ControlRecordInput(
                switch=change.switch, on=change.on, scope=change.scope, actor=change.actor, role=change.role,
                reason=change.reason), **_RECORD)
            if change.switch == "kill_switch":
                self._state.kill_switch = change.on
            elif change.scope is None:
                self._state.frozen = change.on
            else:
                scopes = [s for s in self._state.frozen_scopes if s != change.scope]
                self._state.frozen_scopes = scopes + ([change.scope] if change.on else [])
            self._state.changes += 1
            return self._state

    @change.validator
    def _check(self, change: ControlChange) -> None:
        if change.role not in CHANGERS:
            raise ValueError(f"role {change.role} may not change the switches: operators do")
        if not change.reason.strip():
            raise ValueError("a switch change needs a reason")
        if change.switch == "kill_switch" and change.scope is not None:
            raise ValueError("the kill switch has no scope")

    @workflow.query
    def state(self) -> ControlSnapshot:
        return self._state
