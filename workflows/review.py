"""ReviewWorkflow: one per contradiction the write pipeline kept for a person (a review item).

It waits for the `resolve` signal until the review's time limit, then applies the default
resolution (REVIEW_DEFAULT, keep_both unless set) as an expiry. `escalate` hands the review to
an operator: it then waits with no time limit. The first valid resolution is applied
(engram.review_steps), once; signals after it are ignored, and the `state` query says where it
stands. Who may send which resolution is checked by the service before it signals; a resolution
that is not one of the four, an escalation once escalating, or, from then on, a resolution from
a role that may not approve, is refused here too (a signal can arrive while the escalation's
own step runs, after the service read the review as open).

Signal for the Web UI: `resolve`, with JSON
{"resolution": "keep_both", "actor": "key:<uuid>", "role": "operator", "reason": "..."}
(`content` too for "merge").
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.models import EscalateInput, ResolveReviewInput
    from activities.review import ReviewActivities
    from workflows.models import ReviewInput, ReviewResolution, ReviewResult

_STEP = dict(start_to_close_timeout=timedelta(seconds=60),
             retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)))
FINAL = ("keep_existing", "replace", "keep_both", "merge")
APPROVERS = ("operator", "admin")  # who may resolve an escalated review


@workflow.defn
class ReviewWorkflow:
    def __init__(self) -> None:
        self._status = "open"
        self._pending: list[ReviewResolution] = []
        self._ignored = 0

    @workflow.run
    async def run(self, inp: ReviewInput) -> ReviewResult:
        resolution = await self._next(timeout_s=inp.ttl_s)
        if resolution is None:
            resolution = ReviewResolution(resolution=inp.default, actor="system:review", role="agent",
                                          reason=f"no resolution within {inp.ttl_s:g} s: the default applies")
            return await self._close(inp, resolution, expired=True)
        if resolution.resolution == "escalate":
            self._status = "escalating"
            await workflow.execute_activity_method(
                ReviewActivities.escalate,
                EscalateInput(review_id=inp.review_id, actor=resolution.actor, reason=resolution.reason), **_STEP)
            self._status = "escalated"
            resolution = await self._next(timeout_s=None)
        return await self._close(inp, resolution, expired=False)

    async def _next(self, timeout_s: float | None) -> ReviewResolution | None:
        """The next resolution this state accepts (None past `timeout_s`)."""
        try:
            await workflow.wait_condition(lambda: bool(self._pending),
                                          timeout=None if timeout_s is None else timedelta(seconds=timeout_s))
        except asyncio.TimeoutError:
            return None
        return self._pending.pop(0)

    async def _close(self, inp: ReviewInput, r: ReviewResolution, *, expired: bool) -> ReviewResult:
        self._status = "closing"
        done = await workflow.execute_activity_method(
            ReviewActivities.resolve,
            ResolveReviewInput(review_id=inp.review_id, resolution=r.resolution, actor=r.actor, role=r.role,
                               reason=r.reason, content=r.content, path=r.path, expired=expired), **_STEP)
        self._status = done.status
        await workflow.wait_condition(workflow.all_handlers_finished)
        return ReviewResult(status=done.status, resolution=r.resolution, detail=done.detail)

    @workflow.signal
    def resolve(self, r: ReviewResolution) -> None:
        if self._accepts(r):
            self._pending.append(r)
        else:
            self._ignored += 1

    def _accepts(self, r: ReviewResolution) -> bool:
        if self._pending or (r.resolution == "merge" and not r.content):
            return False
        if self._status == "open":
            return r.resolution in FINAL + ("escalate",)
        if self._status in ("escalating", "escalated"):
            return r.resolution in FINAL and r.role in APPROVERS
        return False

    @workflow.query
    def state(self) -> dict:
        return {"status": self._status, "ignored_signals": self._ignored}
