"""engram.reviews.ReviewRuns on Temporal: a review's workflow receives its `resolve` signal,
started with it if the dispatcher has not started it yet."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from engram.domain.errors import Conflict
from engram.settings import Settings
from engram.store import jobs
from worker.temporal_pipeline import review_input
from workflows.models import ReviewResolution
from workflows.review import ReviewWorkflow


class TemporalReviewRuns:
    def __init__(self, client: Client, settings: Settings) -> None:
        self._client = client
        self._settings = settings

    async def resolve(self, review_id: UUID, *, resolution: str, actor: str, role: str, reason: str,
                      content: str | None, path: str, expires_at: datetime) -> None:
        signal = ReviewResolution(resolution=resolution, actor=actor, role=role, reason=reason, content=content,
                                  path=path)
        try:
            await self._client.start_workflow(
                ReviewWorkflow.run, review_input(self._settings, review_id, expires_at),
                id=jobs.workflow_id_for(review_id, "review"), task_queue=self._settings.temporal_task_queue,
                # Signal-with-start: a running review gets the signal; a closed one is not started again.
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                start_signal="resolve", start_signal_args=[signal])
        except WorkflowAlreadyStartedError:
            raise Conflict(f"review {review_id} is closed already") from None
