"""Review items: a contradiction the write pipeline would not decide alone, waiting for a person.

A model said a new fact opposes a stored one (CONTRADICT); both were kept, linked by a review
that a ReviewWorkflow holds open until someone resolves it or its time limit applies the
default (`REVIEW_DEFAULT`):
- keep_existing: the new fact is forgotten (soft, recoverable);
- replace: the existing fact is forgotten;
- keep_both: nothing changes;
- merge: the existing fact becomes `content`, and the new one is forgotten;
- escalate: it waits for an operator, with no time limit.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from uuid import UUID

from pydantic import BaseModel, model_validator

from engram.domain.changes import Reason
from engram.domain.models import Content, Scope, Strict

Resolution = Literal["keep_existing", "replace", "keep_both", "merge"]
RESOLUTIONS: tuple[str, ...] = ("keep_existing", "replace", "keep_both", "merge", "escalate")


class ResolveRequest(Strict):
    """How a review ends (or `escalate`, to an operator), and why; `content` only with merge."""

    resolution: Literal["keep_existing", "replace", "keep_both", "merge", "escalate"]
    reason: Reason
    content: Content | None = None

    @model_validator(mode="after")
    def _content_with_merge(self) -> "ResolveRequest":
        if (self.resolution == "merge") != (self.content is not None):
            raise ValueError("content is required with merge, and only with merge")
        return self


class ReviewedMemory(BaseModel):
    id: UUID
    content: str
    is_deleted: bool


class Review(BaseModel):
    id: UUID
    status: Literal["open", "escalated", "resolved", "expired"]
    user_id: str | None
    agent_id: str | None
    run_id: str | None
    new: ReviewedMemory  # the fact that arrived
    existing: ReviewedMemory  # the fact it opposes
    reason: str | None  # the model's
    resolution: Resolution | None
    merged_content: str | None
    resolved_by: str | None
    resolved_reason: str | None
    detail: str | None
    created_at: datetime
    expires_at: datetime
    resolved_at: datetime | None

    @property
    def scope(self) -> Scope:
        """The scope of the two facts under review (its three parts as stored, unchecked)."""
        return Scope.model_construct(user_id=self.user_id, agent_id=self.agent_id, run_id=self.run_id)


class ReviewPage(BaseModel):
    items: list[Review]
