"""Review items through the service: list, show, and resolve a contradiction the write
pipeline kept for a person (engram.domain.reviews says what each resolution does).

A resolution is validated here (who may, whether the review still waits) and handed to the
review's workflow as its `resolve` signal; the workflow applies it (engram.review_steps). The
answer is the review once the workflow has closed it, or as it stands after a short wait.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Protocol
from uuid import UUID

import asyncpg

from engram.control import Control
from engram.domain import auth
from engram.domain.errors import Conflict, Forbidden, NotFound
from engram.domain.reviews import Review, ReviewPage, ResolveRequest
from engram.domain.text import content_hash, normalize
from engram.store import reviews
from engram.store import memories as repo

WAITING = ("open", "escalated")
ANSWER_WAIT_S = 10.0


class ReviewRuns(Protocol):
    """The workflows behind reviews (worker/temporal_review.py)."""

    async def resolve(self, review_id: UUID, *, resolution: str, actor: str, role: str, reason: str,
                      content: str | None, path: str, expires_at: datetime) -> None:
        """Signal the review's run, starting it (to expire at `expires_at`) if it has not started."""


class Reviews:
    def __init__(self, pool: asyncpg.Pool, runs: ReviewRuns, control: Control) -> None:
        self._pool = pool
        self._runs = runs
        self._control = control

    async def list(self, principal: auth.Principal, *, status: str | None, limit: int) -> ReviewPage:
        """Reviews the caller may see, oldest first: waiting ones (open or escalated) unless
        `status` names one."""
        principal.require("read")
        statuses = [status] if status else list(WAITING)
        return ReviewPage(items=await reviews.page(self._pool, principal.visibility, statuses=statuses, limit=limit))

    async def get(self, principal: auth.Principal, review_id: UUID) -> Review:
        principal.require("read")
        return await self._visible(principal, review_id)

    async def resolve(self, principal: auth.Principal, review_id: UUID, req: ResolveRequest, *,
                      path: str = "http") -> Review:
        """Resolve (or escalate) a waiting review. A review is for a person: an agent key may not;
        an escalated one needs an operator. Raises Forbidden, NotFound, Frozen (its scope is),
        Conflict (closed already, escalated twice, a pinned memory the caller may not delete,
        or merged content another live fact of the scope holds already)."""
        if principal.role in auth.AUTOMATIC_ROLES:
            raise Forbidden("a review is for a person to resolve: an agent key may not")
        principal.require("modify")
        principal.require("forget")
        review = await self._visible(principal, review_id)
        if review.status not in WAITING:
            raise Conflict(f"review {review_id} is {review.status} already")
        if review.status == "escalated":
            principal.require("approve")
            if req.resolution == "escalate":
                raise Conflict(f"review {review_id} is escalated already")
        if (doomed := {"keep_existing": review.new.id, "replace": review.existing.id,
                       "merge": review.new.id}.get(req.resolution)) is not None:
            memory = await repo.get(self._pool, doomed)
            if memory is not None and memory.pinned and not principal.may("force_delete"):
                raise Conflict(f"memory {doomed} is pinned: only an operator may resolve this review by deleting it")
        await self._control.check(review.scope)
        if req.resolution == "merge":
            twin = await repo.find_live_by_hash(self._pool, review.scope, content_hash(normalize(req.content)), "fact")
            if twin is not None and twin not in (review.new.id, review.existing.id):
                raise Conflict(f"memory {twin} of this scope already holds the merged content")
        await self._runs.resolve(review_id, resolution=req.resolution, actor=principal.id, role=principal.role,
                                 reason=req.reason, content=req.content, path=path, expires_at=review.expires_at)
        return await self._after(review_id, review.status)

    async def _visible(self, principal: auth.Principal, review_id: UUID) -> Review:
        review = await reviews.get(self._pool, review_id)
        if review is None or not principal.may_touch(review.scope):
            raise NotFound(f"no review {review_id}")
        return review

    async def _after(self, review_id: UUID, was: str) -> Review:
        """The review once its workflow has moved it on from `was`, or as it is after a short wait."""
        deadline = asyncio.get_running_loop().time() + ANSWER_WAIT_S
        while True:
            review = await reviews.get(self._pool, review_id)
            if review.status != was or asyncio.get_running_loop().time() > deadline:
                return review
            await asyncio.sleep(0.1)
