"""The operational switches as every mutating path sees them: read from Postgres (where the
ControlWorkflow mirrors them) at most a second old, and changed only through the workflow,
which validates the change (operators, with a reason) and audits it.

A freeze refuses every change in the scopes it holds (Frozen, 423) within a second; the kill
switch stops autonomous mutations (the pipeline's model output) at their next step while
people's and the API's changes go on. A delete spike (more than `delete_spike_threshold`
single deletes in one scope within `delete_spike_window_s`) freezes that scope until an
operator lifts it, with an alert logged.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta, timezone
from typing import Protocol
from uuid import UUID

import asyncpg

from engram.domain import auth
from engram.domain.control import SYSTEM_ROLE, ControlStatus, Frozen, FrozenScope, SwitchChange
from engram.domain.models import Scope
from engram.settings import Settings
from engram.store import control as store

log = logging.getLogger(__name__)
CACHE_S = 1.0
SPIKE_ACTOR = "system:delete-spike"


class ControlRuns(Protocol):
    """The ControlWorkflow (worker/temporal_control.py)."""

    async def change(self, *, switch: str, on: bool, scope: dict | None, actor: str, role: str,
                     reason: str) -> None:
        """Raises Forbidden or ValidationFailed when the workflow refuses the change."""


class Control:
    def __init__(self, settings: Settings, pool: asyncpg.Pool, runs: ControlRuns) -> None:
        self._settings = settings
        self._pool = pool
        self._runs = runs
        self._cached: tuple[float, ControlStatus] | None = None

    async def status(self, conn: asyncpg.Connection | None = None) -> ControlStatus:
        """The switches now (at most CACHE_S old); read through `conn` when one is given (a
        caller inside a transaction need not take a second connection)."""
        if self._cached is None or time.monotonic() - self._cached[0] > CACHE_S:
            state, scopes = await store.read(conn or self._pool)
            self._cached = (time.monotonic(), ControlStatus(
                frozen=state["frozen"], kill_switch=state["kill_switch"], updated_at=state["updated_at"],
                frozen_scopes=[FrozenScope.model_validate(dict(s)) for s in scopes]))
        return self._cached[1]

    async def status_for(self, principal: auth.Principal) -> ControlStatus:
        """The switches as `principal` may see them: operators (`maintenance`) every scope's
        freeze; other keys only the freezes that can hold a memory they see, so a key bounded to
        one user learns no other tenant's scope ids or freeze reasons."""
        state = await self.status()
        if principal.may("maintenance"):
            return state
        sees = principal.visibility
        return state.model_copy(update={"frozen_scopes": [
            s for s in state.frozen_scopes if sees.admits(s.user_id, s.agent_id, s.run_id)]})

    async def change(self, principal: auth.Principal, req: SwitchChange) -> ControlStatus:
        """Flip a switch through the ControlWorkflow. Operators only; raises Forbidden."""
        principal.require("maintenance")
        await self._runs.change(switch=req.switch, on=req.on, scope=req.scope.model_dump(exclude_none=True)
                                if req.scope else None, actor=principal.id, role=principal.role, reason=req.reason)
        self._cached = None
        return await self.status()

    async def check(self, scope: Scope, conn: asyncpg.Connection | None = None) -> None:
        """Raise Frozen if mutations in `scope` are frozen."""
        state = await self.status(conn)
        if state.frozen:
            raise Frozen("mutations are frozen everywhere by an operator: nothing was changed")
        for freeze in state.frozen_scopes:
            if freeze.holds(scope):
                raise Frozen(f"mutations in this scope are frozen ({freeze.reason}, by {freeze.frozen_by}): "
                             "nothing was changed")

    async def autonomous_allowed(self, conn: asyncpg.Connection | None = None) -> bool:
        """False while the kill switch is on: no autonomous mutation starts."""
        return not (await self.status(conn)).kill_switch

    async def note_delete(self, memory_id: UUID, scope: Scope) -> None:
        """After a single delete: freeze its scope if deletes there spiked."""
        s = self._settings
        since = datetime.now(timezone.utc) - timedelta(seconds=s.delete_spike_window_s)
        if await store.recent_deletes(self._pool, memory_id, since) <= s.delete_spike_threshold:
            return
        exact = {k: v for k, v in scope.model_dump().items() if v is not None}
        log.error("delete spike: freezing the scope until an operator lifts it",
                  extra={"scope": exact, "threshold": s.delete_spike_threshold, "window_s": s.delete_spike_window_s})
        try:
            await self._runs.change(switch="freeze", on=True, scope=exact, actor=SPIKE_ACTOR, role=SYSTEM_ROLE,
                                    reason=f"delete spike: more than {s.delete_spike_threshold} deletes in "
                                           f"{s.delete_spike_window_s:g} s")
        except Exception:
            # The delete has committed: answering an error would tell the caller it had not. The
            # next delete in the scope, still over the threshold, tries the freeze again.
            log.exception("delete spike: the scope could not be frozen", extra={"scope": exact})
            return
        self._cached = None
