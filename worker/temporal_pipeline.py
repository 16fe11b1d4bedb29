"""The service's `Pipeline`, on a Temporal client: how a process starts and watches the
workflows. Not workflow code: it runs outside the sandbox.

A start from a request gives up after a second and opens a short circuit breaker, so while
Temporal is down remember answers `raw_saved` at once instead of waiting on every request; the
outbox dispatcher (worker.outbox) keeps trying with more patience and closes the breaker when a
start succeeds.
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

from engram.settings import Settings
from engram.store import jobs
from workflows.models import ReembedInput, RememberInput
from workflows.reembed import ReembedWorkflow
from workflows.remember import RememberWorkflow

log = logging.getLogger(__name__)
_REQUEST_WAIT_S = 1.0  # how long a request waits for a start before the outbox takes over
_DISPATCH_WAIT_S = 5.0
_BREAKER_S = 5.0


class TemporalPipeline:
    def __init__(self, client: Client, pool: asyncpg.Pool, settings: Settings) -> None:
        self._client = client
        self._pool = pool
        self._settings = settings
        self._down_until = 0.0

    async def start(self, job_id: UUID, *, extract: bool = True) -> bool:
        """Start a remember's workflow from a request; False if Temporal did not answer in time
        (or the breaker is open), in which case the outbox dispatcher starts it later."""
        if asyncio.get_running_loop().time() < self._down_until:
            return False
        return await self._start(RememberWorkflow.run, self._remember_input(job_id, extract),
                                 jobs.workflow_id_for(job_id), job_id, _REQUEST_WAIT_S)

    async def start_job(self, job: jobs.Unstarted) -> bool:
        """Start the workflow of a job nobody started (a remember's or a re-embed's), for the
        outbox dispatcher: no breaker, a longer wait. False if Temporal did not answer."""
        if job.job_type == "reembed":
            run, arg = ReembedWorkflow.run, ReembedInput(job_id=job.id, target=job.payload["target"],
                                                         batch_size=self._settings.reembed_batch_size)
        else:
            run, arg = RememberWorkflow.run, self._remember_input(job.id, job.payload.get("extract", True))
        return await self._start(run, arg, jobs.workflow_id_for(job.id, job.job_type), job.id, _DISPATCH_WAIT_S)

    def _remember_input(self, job_id: UUID, extract: bool) -> RememberInput:
        s = self._settings
        return RememberInput(
            job_id=job_id, max_attempts=s.extraction_max_attempts, backoff_initial_s=s.extraction_backoff_initial_s,
            backoff_max_s=s.extraction_backoff_max_s, extract_timeout_s=s.llm_timeout_s + 5, extract=extract,
        )

    async def _start(self, run, arg, workflow_id: str, job_id: UUID, wait_s: float) -> bool:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(self._client.start_workflow(
                run, arg, id=workflow_id, task_queue=self._settings.temporal_task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            ), wait_s)
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
