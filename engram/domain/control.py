"""The operational switches' wire models: a mutation freeze (global, or per scope) and the kill
switch of autonomous mutations (the pipeline's model decisions, and the maintenance loops)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, StrictBool

from engram.domain.changes import Reason
from engram.domain.errors import EngramError
from engram.domain.models import Scope, Strict

Switch = Literal["freeze", "kill_switch"]
SYSTEM_ROLE = "system"  # the service's own changes of a switch (a delete spike's freeze)


class Frozen(EngramError):
    """Mutations are frozen (everywhere, or in this memory's scope): nothing was changed."""

    type = "frozen"
    http_status = 423


class SwitchChange(Strict):
    switch: Switch
    on: StrictBool
    scope: Scope | None = None  # a freeze's scope; none: every scope (the kill switch has none)
    reason: Reason


class FrozenScope(BaseModel):
    user_id: str | None
    agent_id: str | None
    run_id: str | None
    reason: str
    frozen_by: str
    frozen_at: datetime

    def holds(self, scope: Scope) -> bool:
        """Whether a memory of `scope` is frozen: its scope holds every part this freeze names."""
        return all(mine is None or mine == theirs for mine, theirs in (
            (self.user_id, scope.user_id), (self.agent_id, scope.agent_id), (self.run_id, scope.run_id)))


class ControlStatus(BaseModel):
    frozen: bool
    kill_switch: bool
    frozen_scopes: list[FrozenScope]
    updated_at: datetime
