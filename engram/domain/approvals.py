"""Approvals: a write that could poison what agents recall, waiting for a person.

A FACT from an UNTRUSTED source, and any LEARNED memory, is stored as `pending`: out of recall
(and of every list but `status=pending`), not extracted, until an operator other than its
writer decides (an ApprovalWorkflow waits for the decision, with a time limit):
- approve: it joins recall, and the write pipeline takes its facts;
- reject: it is forgotten (soft: a REJECT event; only an operator may recover it);
- quarantine: it is held aside, out of recall, with a QUARANTINE event; an operator may still
  confirm it (`engram confirm`) or roll it back.
Past the time limit WRITE_APPROVAL_TIMEOUT (reject unless set) applies, by `system:approval`.
A pending memory forgotten by its writer meanwhile ends its approval as `withdrawn`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from uuid import UUID

from pydantic import BaseModel

from engram.domain.changes import Reason
from engram.domain.models import Memory, Scope, Strict

Decision = Literal["approve", "reject", "quarantine"]
ApprovalStatus = Literal["pending", "approved", "rejected", "quarantined", "withdrawn"]
OUTCOME: dict[str, str] = {"approve": "approved", "reject": "rejected", "quarantine": "quarantined"}
TIMEOUT_ACTOR = "system:approval"


class DecideRequest(Strict):
    decision: Decision
    reason: Reason


class Approval(BaseModel):
    id: UUID
    status: ApprovalStatus
    memory: Memory  # as it is now
    reason: str  # why it needs approval
    requested_by: str  # who wrote it: never its approver
    decided_by: str | None
    decided_reason: str | None
    timed_out: bool
    expires_at: datetime
    created_at: datetime
    decided_at: datetime | None

    @property
    def scope(self) -> Scope:
        return self.memory.scope


class ApprovalPage(BaseModel):
    items: list[Approval]
