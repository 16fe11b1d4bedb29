"""ReembedWorkflow: move every memory to a new embedding model while the old one keeps serving.

Batches fill the new model's canonical vectors and its own vector index; remembers during the
run are embedded with both models; when every memory has a new vector, one transaction makes the
new model active. A crashed worker resumes at the first memory without a new vector. The run
continues-as-new every `batches_per_run` batches to keep its history small.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.models import ReembedBatchInput, SwitchInput
    from activities.reembed import ReembedActivities
    from workflows.models import ReembedInput, ReembedResult

_STEP = dict(
    start_to_close_timeout=timedelta(minutes=5),
    retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=60)),
)


@workflow.defn
class ReembedWorkflow:
    def __init__(self) -> None:
        self._done = 0
        self._total = 0

    @workflow.run
    async def run(self, inp: ReembedInput) -> ReembedResult:
        # A batch heartbeats; a worker that dies mid-batch is noticed within this, not after 5 min.
        options = dict(heartbeat_timeout=timedelta(seconds=inp.heartbeat_timeout_s), **_STEP)
        for _ in range(inp.batches_per_run):
            step = await workflow.execute_activity_method(
                ReembedActivities.batch,
                ReembedBatchInput(job_id=inp.job_id, target=inp.target, batch_size=inp.batch_size),
                task_queue=inp.task_queue, **options,
            )
            self._done, self._total = step.done, step.total
            if step.embedded == 0:
                switch = SwitchInput(job_id=inp.job_id, target=inp.target)
                if await workflow.execute_activity_method(ReembedActivities.switch, switch, task_queue=inp.task_queue,
                                                          **options):
                    return ReembedResult(job_id=inp.job_id, target=inp.target, total=self._total)
                # New memories arrived from a process without the target model: embed them too.
        workflow.continue_as_new(inp)

    @workflow.query
    def progress(self) -> tuple[int, int]:
        return self._done, self._total
