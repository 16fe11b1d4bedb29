"""IngestWorkflow: a batch of saved memories (up to the dispatcher's batch size) through the
pipeline: embed them (one model run per text, on the embedder's pool), write their index
points (in the process that owns the index), then extract each (or skip it, or park it while
every provider is down).

One workflow per batch, not per memory: orchestration cost is paid once for the batch. Every
step is idempotent and moves only the jobs still pending, so a retried step or a rerun batch
processes each memory once. Memories are embedded before extraction, so they are searchable
even while every LLM is down.
"""

from __future__ import annotations

import math
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.ingest import IndexActivities, IngestActivities
    from activities.models import BatchInput, ExtractBatchInput, IndexInput
    from workflows.models import IngestInput, IngestResult

# Temporal retries these until they succeed (an embedder or Postgres restart is ridden through).
_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=30),
                     backoff_coefficient=2.0)


@workflow.defn
class IngestWorkflow:
    @workflow.run
    async def run(self, inp: IngestInput) -> IngestResult:
        embedded = await workflow.execute_activity_method(
            IngestActivities.embed, BatchInput(job_ids=inp.job_ids),
            start_to_close_timeout=timedelta(minutes=2), heartbeat_timeout=timedelta(seconds=inp.heartbeat_timeout_s),
            retry_policy=_RETRY,
        )
        if embedded.memory_ids:
            await workflow.execute_activity_method(
                IndexActivities.index, IndexInput(memory_ids=embedded.memory_ids), task_queue=inp.index_queue,
                start_to_close_timeout=timedelta(seconds=60), retry_policy=_RETRY,
            )
        rounds = math.ceil(len(inp.job_ids) / max(inp.extract_concurrency, 1))
        settled = await workflow.execute_activity_method(
            IngestActivities.extract, ExtractBatchInput(job_ids=inp.job_ids, workflow_id=workflow.info().workflow_id),
            start_to_close_timeout=timedelta(seconds=rounds * inp.extract_timeout_s + 60),
            heartbeat_timeout=timedelta(seconds=inp.heartbeat_timeout_s), retry_policy=_RETRY,
        )
        return IngestResult(done=settled.done, parked=settled.parked, dead=settled.dead)
