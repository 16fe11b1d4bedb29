"""Batch forget's activities: Temporal adapters over engram.forget_steps."""

from __future__ import annotations

import asyncpg
from temporalio import activity

from activities.ingest import heartbeating
from activities.models import FinishForgetInput, ForgetChunkInput, ForgetChunkResult, OperationStatusInput
from engram import forget_steps as steps
from engram.changes import MemoryChanges
from engram.control import Control


class ForgetActivities:
    def __init__(self, pool: asyncpg.Pool, changes: MemoryChanges, control: Control) -> None:
        self._pool = pool
        self._changes = changes
        self._control = control

    @activity.defn(name="forget_set_status")
    async def set_status(self, inp: OperationStatusInput) -> bool:
        return await steps.set_status(self._pool, inp.operation_id, inp.status, approver=inp.approver,
                                      event=inp.event, actor=inp.actor, reason=inp.reason)

    @activity.defn(name="forget_delete_chunk")
    async def delete_chunk(self, inp: ForgetChunkInput) -> ForgetChunkResult:
        async with heartbeating():
            chunk = await steps.delete_chunk(self._pool, self._changes, self._control, inp.operation_id, inp.limit)
        return ForgetChunkResult(settled=chunk.settled, remaining=chunk.remaining)

    @activity.defn(name="forget_finish")
    async def finish(self, inp: FinishForgetInput) -> dict:
        return await steps.finish(self._pool, inp.operation_id, inp.approver)

    def all(self) -> list:
        return [self.set_status, self.delete_chunk, self.finish]
