"""RememberWorkflow: the pipeline of one memory, as it ran before batches (workflows/ingest.py).

Nothing starts it any more. It stays registered so that runs started before the upgrade finish:
at the first point where such a run goes on past its recorded history (after its embedding, or
when a retry timer fires) it hands its job back to the dispatcher, which puts it in a batch, and
ends. A run's history up to that point replays unchanged (tests/histories).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.models import (
        CompleteInput, GiveUpInput, JobRef, LeaseInput, MemoryRef, NoteInput, OutcomeInput, RetryInput,
    )
    from activities.remember import RememberActivities
    from workflows.models import RememberInput, RememberResult

# Database and index steps, local or not: retried by Temporal until they succeed (a Postgres
# restart is ridden through); each is idempotent.
_STORE = dict(
    start_to_close_timeout=timedelta(seconds=30),
    retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=30),
                             backoff_coefficient=2.0),
)


# Short Postgres steps run as local activities on runs started after this patch: no round
# trip through the server for each, and the first extraction runs beside the embedding, so
# remember's first answer costs max(embed, extract) instead of the sum of every step.
FAST_FIRST_PASS = "local-db-steps-concurrent-first-pass"
# Each point where a run may hand off has its own patch id: `patched` remembers its first answer
# per id, and a run replaying old history answers False at every point it passed before.
HAND_OFF = "hand-off-to-batches"


@workflow.defn
class RememberWorkflow:
    def __init__(self) -> None:
        self._first_pass: str | None = None
        self._attempt = 0
        self._fast = False

    async def _db_step(self, method, arg):
        if self._fast:
            return await workflow.execute_local_activity_method(method, arg, **_STORE)
        return await workflow.execute_activity_method(method, arg, **_STORE)

    def _extract(self, inp: RememberInput, memory: MemoryRef):
        return workflow.start_activity_method(
            RememberActivities.extract, memory,
            start_to_close_timeout=timedelta(seconds=inp.extract_timeout_s),
            # One try per attempt: the run loop owns the backoff so the job row can show it.
            retry_policy=RetryPolicy(maximum_attempts=1),
        )

    async def _hand_off(self, inp: RememberInput, point: str) -> bool:
        """At a point past the recorded history, give the job to the dispatcher; True if done."""
        if not workflow.patched(f"{HAND_OFF}-{point}"):
            return False
        await self._db_step(RememberActivities.requeue, JobRef(job_id=inp.job_id))
        return True

    @workflow.run
    async def run(self, inp: RememberInput) -> RememberResult:
        if await self._hand_off(inp, "start"):
            return self._result(inp, "handed_off")
        self._fast = workflow.patched(FAST_FIRST_PASS)
        lease_input = LeaseInput(job_id=inp.job_id, lease_s=inp.extract_timeout_s + 60)
        lease = await self._db_step(RememberActivities.lease_attempt, lease_input)
        if lease.finished:
            self._first_pass = lease.outcome or "processed"
            return self._result(inp, "already_finished")
        memory = MemoryRef(memory_id=lease.memory_id, extract=inp.extract)
        self._attempt = lease.attempt
        attempt = None
        if self._fast:
            embedding = workflow.start_activity_method(RememberActivities.embed_and_index, memory, **_STORE)
            attempt = self._extract(inp, memory)
            await self._embedded(inp, embedding)
        else:
            await self._embedded(inp, workflow.execute_activity_method(RememberActivities.embed_and_index, memory,
                                                                       **_STORE))
        if await self._hand_off(inp, "embedded"):
            return await self._finish(inp, "handed_off")

        delay = inp.backoff_initial_s
        while True:
            try:
                extracted = await (attempt if attempt is not None else self._extract(inp, memory))
                break
            except ActivityError as err:
                attempt = None
                error, code = _describe(err)
                await self._note_first_pass(inp, lease.memory_id, "raw_saved")
                if self._attempt >= inp.max_attempts:
                    await self._db_step(RememberActivities.give_up,
                                        GiveUpInput(job_id=inp.job_id, memory_id=lease.memory_id, error=error,
                                                    code=code))
                    return await self._finish(inp, "dead")
                await self._db_step(RememberActivities.schedule_retry,
                                    RetryInput(job_id=inp.job_id, next_attempt_at=workflow.now() + timedelta(seconds=delay),
                                               error=error, code=code))
                await workflow.sleep(timedelta(seconds=delay))
                if await self._hand_off(inp, f"retry-{self._attempt}"):
                    return await self._finish(inp, "handed_off")
                delay = min(delay * 2, inp.backoff_max_s)
                lease = await self._db_step(RememberActivities.lease_attempt, lease_input)
                if lease.finished:
                    return await self._finish(inp, "already_finished")
                self._attempt = lease.attempt

        await self._db_step(
            RememberActivities.complete,
            CompleteInput(job_id=inp.job_id, memory_id=lease.memory_id, workflow_id=workflow.info().workflow_id,
                          result=extracted),
        )
        if self._first_pass is None:
            self._first_pass = "processed"
        return await self._finish(inp, "done")

    @workflow.update
    async def first_pass(self) -> str:
        """Waits until the first attempt has concluded: "processed" or "raw_saved"."""
        await workflow.wait_condition(lambda: self._first_pass is not None)
        return self._first_pass

    @workflow.query
    def attempt(self) -> int:
        return self._attempt

    async def _embedded(self, inp: RememberInput, embedding) -> None:
        """Wait for the embedding. A text the embedder refuses for good (`EmbeddingRejected`) is
        noted on the job and left to BM25; Temporal retries every other failure."""
        try:
            await embedding
        except ActivityError as err:
            error, code = _describe(err)
            if code != "EmbeddingRejected":
                raise
            await self._db_step(RememberActivities.note_error, NoteInput(job_id=inp.job_id, error=error, code=code))

    async def _note_first_pass(self, inp: RememberInput, memory_id, outcome: str) -> None:
        if self._first_pass is not None:
            return
        await self._db_step(RememberActivities.record_first_pass,
                            OutcomeInput(job_id=inp.job_id, memory_id=memory_id, outcome=outcome))
        self._first_pass = outcome

    async def _finish(self, inp: RememberInput, status: str) -> RememberResult:
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self._result(inp, status)

    def _result(self, inp: RememberInput, status: str) -> RememberResult:
        return RememberResult(job_id=inp.job_id, status=status, first_pass=self._first_pass or "processed",
                              attempts=self._attempt)


def _describe(err: ActivityError) -> tuple[str, str]:
    """(message, code) of the failure behind an activity error, for the job row."""
    cause = err.cause
    code = getattr(cause, "type", None) or type(cause).__name__
    return str(cause or err), str(code)
