"""How a worker process starts workflows on its Temporal client: the batches the dispatcher
forms, jobs with a run of their own (a re-embed), and the one drain workflow. Not workflow
code: it runs outside the sandbox. Requests never come here: remember only writes rows, and the
dispatcher (worker.outbox) turns them into runs.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from uuid import UUID

import asyncpg
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from engram.settings import Settings
from engram.store import jobs
from worker.temporal_approval import approval_input
from workflows.approval import ApprovalWorkflow
from workflows.drain import CONFIGURE, ExtractionDrainWorkflow, drain_workflow_id
from workflows.ingest import IngestWorkflow
from workflows.models import DrainInput, IngestInput, ReembedInput, ReviewInput
from workflows.reembed import ReembedWorkflow
from workflows.review import ReviewWorkflow

log = logging.getLogger(__name__)
_START_WAIT_S = 5.0


def index_queue(settings: Settings) -> str:
    """The task queue of the process that owns the vector index."""
    return f"{settings.temporal_task_queue}-index"


class TemporalPipeline:
    def __init__(self, client: Client, pool: asyncpg.Pool, settings: Settings) -> None:
        self._client = client
        self._pool = pool
        self._settings = settings
        self._drain_configured = False  # whether the drain has this process's settings

    async def start_batch(self, workflow_id: str, job_ids: list[UUID]) -> bool:
        """Start the IngestWorkflow of a formed batch (again, harmlessly, if it already runs).
        False if Temporal did not answer; the batch stays formed and unstarted."""
        s = self._settings
        arg = IngestInput(job_ids=job_ids, index_queue=index_queue(s), extract_timeout_s=job_llm_s(s),
                          extract_concurrency=s.extraction_concurrency,
                          heartbeat_timeout_s=s.ingest_heartbeat_timeout_s)
        if not await self._start(IngestWorkflow.run, arg, workflow_id):
            return False
        await jobs.mark_batch_started(self._pool, workflow_id)
        return True

    async def start_job(self, job: jobs.Unstarted) -> bool:
        """Start the run of a job that has one of its own (a re-embed, a review, an approval). False if
        Temporal did not answer."""
        s = self._settings
        if job.job_type == "review":
            expires_at = job.payload.get("expires_at")
            run, arg = ReviewWorkflow.run, review_input(s, UUID(job.payload["review_id"]),
                                                        datetime.fromisoformat(expires_at) if expires_at else None)
        elif job.job_type == "approval":
            run, arg = ApprovalWorkflow.run, approval_input(s, UUID(job.payload["approval_id"]),
                                                            job.payload["requested_by"],
                                                            datetime.fromisoformat(job.payload["expires_at"]))
        else:
            run = ReembedWorkflow.run
            arg = ReembedInput(job_id=job.id, target=job.payload["target"], batch_size=s.reembed_batch_size,
                               task_queue=index_queue(s), heartbeat_timeout_s=s.reembed_heartbeat_timeout_s)
        if not await self._start(run, arg, jobs.workflow_id_for(job.id, job.job_type)):
            return False
        await jobs.mark_started(self._pool, job.id)
        return True

    async def ensure_drain(self) -> bool:
        """Start the drain workflow unless it runs; the first time this process succeeds, also
        hand a running one this process's settings (ExtractionDrainWorkflow.configure). False if
        Temporal did not answer."""
        s = self._settings
        arg = DrainInput(batch_size=s.drain_batch_size, rate_per_s=s.drain_rate_per_s,
                         probe_initial_s=s.provider_probe_initial_s, probe_max_s=s.provider_probe_max_s,
                         idle_s=s.drain_idle_s, extract_timeout_s=job_llm_s(s),
                         extract_concurrency=s.extraction_concurrency, heartbeat_timeout_s=s.drain_heartbeat_timeout_s)
        signal = None if self._drain_configured else CONFIGURE
        started = await self._start(ExtractionDrainWorkflow.run, arg, drain_workflow_id(s.temporal_task_queue),
                                    reuse=WorkflowIDReusePolicy.ALLOW_DUPLICATE, signal=signal)
        self._drain_configured |= started
        return started

    async def _start(self, run, arg, workflow_id: str,
                     reuse: WorkflowIDReusePolicy = WorkflowIDReusePolicy.REJECT_DUPLICATE,
                     signal: str | None = None) -> bool:
        """Start `run(arg)` as `workflow_id` unless it runs; with `signal` (a signal's name),
        signal-with-start: the run, new or running, also gets that signal with `arg`."""
        with_signal = {"start_signal": signal, "start_signal_args": [arg]} if signal is not None else {}
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow the dispatcher's cancel.
            async with asyncio.timeout(_START_WAIT_S):
                await self._client.start_workflow(
                    run, arg, id=workflow_id, task_queue=self._settings.temporal_task_queue,
                    id_reuse_policy=reuse, id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                    **with_signal,
                )
        except WorkflowAlreadyStartedError:
            pass
        except (RPCError, RuntimeError, asyncio.TimeoutError) as err:
            log.warning("could not start a workflow; the dispatcher tries again",
                        extra={"workflow_id": workflow_id, "error": repr(err)})
            return False
        return True


def job_llm_s(s: Settings) -> float:
    """The longest one job's model calls may take: its extraction, and with the write pipeline
    on, its decision call too."""
    calls = 1 if s.write_pipeline == "off" else 2
    return calls * s.llm_timeout_s + 5


def review_input(s: Settings, review_id: UUID, expires_at: datetime | None) -> ReviewInput:
    """The run of a review that expires at `expires_at` (as stored when it opened), however late
    its run starts; a review of before that was stored gets the whole REVIEW_TTL_S."""
    ttl_s = s.review_ttl_s if expires_at is None else (expires_at - datetime.now(timezone.utc)).total_seconds()
    return ReviewInput(review_id=review_id, ttl_s=max(ttl_s, 1.0), default=s.review_default)
