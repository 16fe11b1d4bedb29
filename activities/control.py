"""The ControlWorkflow's one activity: mirror a switch change in Postgres, with its audit event."""

from __future__ import annotations

import asyncpg
from temporalio import activity

from activities.models import ControlRecordInput
from engram.store import control


class ControlActivities:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @activity.defn(name="control_record")
    async def record(self, inp: ControlRecordInput) -> None:
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                await control.record(conn, switch=inp.switch, scope=inp.scope, value=inp.on, actor=inp.actor,
                                     role=inp.role, reason=inp.reason)

    def all(self) -> list:
        return [self.record]
