"""The client side of the remember workflow: how the API process starts and watches it.

This is the `Pipeline` seam of `engram.service`, implemented on a Temporal client. It is not
workflow code and runs outside the sandbox.
"""

from __future__ import annotations

import asyncio
import logging
from uuid import UUID

import asyncpg
from temporalio.client import Client, WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from engram.repositories import jobs
from engram.settings import Settings
from workflows.models import ReembedInput, RememberInput
from workflows.reembed import ReembedWorkflow
from workflows.remember import RememberWorkflow

log = logging.getLogger(__name__)
# How long a start may take before the caller gives up (the outbox retries it).
_REQUEST_WAIT_S = 1.0
_DISPATCH_WAIT_S = 5.0
_BREAKER_S = 5.0


class TemporalPipeline:
    def __init__(self, client: Client, pool: asyncpg.Pool, settings: Settings) -> None:
        self._client = client
        self._pool = pool
        self._settings = settings
        self._down_until = 0.0

    def _input(self, job_id: UUID) -> RememberInput:
        s = self._settings
        return RememberInput(
            job_id=job_id, max_attempts=s.extraction_max_attempts, backoff_initial_s=s.extraction_backoff_initial_s,
            backoff_max_s=s.extraction_backoff_max_s, extract_timeout_s=s.llm_timeout_s + 5,
        )

    async def start(self, job_id: UUID, *, job_type: str = "extract", payload: dict | None = None,
                    from_dispatcher: bool = False) -> bool:
        """Start the job's workflow (a remember's, unless `job_type` says otherwise; a re-embed
        reads its target from `payload`); False if Temporal did not answer in time.

        On the request path a failure opens a short circuit breaker: while Temporal is down,
        remember answers `raw_saved` at once instead of waiting on every request; the
        dispatcher keeps trying and closes the breaker when a start succeeds.
        """
        loop = asyncio.get_running_loop()
        if not from_dispatcher and loop.time() < self._down_until:
            return False
        if job_type == "reembed":
            run, arg = ReembedWorkflow.run, ReembedInput(job_id=job_id, target=payload["target"],
                                                         batch_size=self._settings.reembed_batch_size)
        else:
            run, arg = RememberWorkflow.run, self._input(job_id)
        try:
            await asyncio.wait_for(self._client.start_workflow(
                run, arg, id=jobs.workflow_id_for(job_id, job_type),
                task_queue=self._settings.temporal_task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            ), _DISPATCH_WAIT_S if from_dispatcher else _REQUEST_WAIT_S)
        except WorkflowAlreadyStartedError:
            pass
        except (RPCError, RuntimeError, asyncio.TimeoutError) as err:
            self._down_until = loop.time() + _BREAKER_S
            log.warning("could not start workflow; the dispatcher will",
                        extra={"job_id": str(job_id), "error": repr(err)})
            return False
        self._down_until = 0.0
        await jobs.mark_started(self._pool, job_id)
        return True

    async def wait_first_pass(self, job_id: UUID, timeout_s: float) -> str | None:
        handle = self._client.get_workflow_handle(jobs.workflow_id_for(job_id))
        try:
            return await asyncio.wait_for(handle.execute_update(RememberWorkflow.first_pass), timeout_s)
        except (asyncio.TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
            return None
        except (RPCError, WorkflowUpdateFailedError):
            # The run already ended (an update cannot reach it): the job row has the answer.
            job = await jobs.get(self._pool, job_id)
            return job.outcome if job else None


async def dispatch_forever(pipeline: TemporalPipeline, pool: asyncpg.Pool, interval_s: float) -> None:
    """The outbox dispatcher: start the workflow of every job nobody has started yet.

    Safe to run in several processes: the workflow id is derived from the job, so a job's
    workflow starts once whoever gets there first.
    """
    while True:
        try:
            for job in await jobs.unstarted(pool, limit=100):
                if not await pipeline.start(job.id, job_type=job.job_type, payload=job.payload, from_dispatcher=True):
                    break
        except (OSError, asyncpg.PostgresError) as err:
            log.warning("dispatcher pass failed", extra={"error": str(err)})
        await asyncio.sleep(interval_s)
