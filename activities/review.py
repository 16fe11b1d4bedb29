"""ReviewWorkflow's activities: Temporal adapters over engram.review_steps."""

from __future__ import annotations

import asyncpg
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import EscalateInput, ResolveReviewInput, ResolveReviewOutput
from engram import review_steps as steps
from engram.changes import MemoryChanges
from engram.control import Control
from engram.domain.errors import NotFound
from engram.inference.embedding_spaces import EmbeddingSpaces


class ReviewActivities:
    def __init__(self, pool: asyncpg.Pool, changes: MemoryChanges, spaces: EmbeddingSpaces, control: Control) -> None:
        self._pool = pool
        self._changes = changes
        self._spaces = spaces
        self._control = control

    @activity.defn(name="review_escalate")
    async def escalate(self, inp: EscalateInput) -> None:
        await steps.escalate(self._pool, inp.review_id, actor=inp.actor, reason=inp.reason)

    @activity.defn(name="review_resolve")
    async def resolve(self, inp: ResolveReviewInput) -> ResolveReviewOutput:
        try:
            done = await steps.resolve(self._pool, self._changes, self._spaces, self._control, inp.review_id,
                                       resolution=inp.resolution, actor=inp.actor, role=inp.role, reason=inp.reason,
                                       content=inp.content, path=inp.path, expired=inp.expired)
        except NotFound as err:
            raise ApplicationError(err.detail, type="ReviewNotFound", non_retryable=True) from err
        except steps.Waiting as err:  # retried, with the step's backoff, until it can apply
            raise ApplicationError(str(err), type="ReviewWaiting") from err
        return ResolveReviewOutput(status=done.status, detail=done.detail)

    def all(self) -> list:
        return [self.escalate, self.resolve]
