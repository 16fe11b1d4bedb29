"""ExtractionDrainWorkflow: the one watcher of the LLM providers, and the drain of parked
extractions. One run per task queue (`drain_workflow_id`), started by every worker at start-up
and kept alive by the dispatcher.

While a provider is known to be down it probes it on a backoff (probe_initial_s, doubling to
probe_max_s): one timer for the whole outage, however many extractions wait. While at least one
provider is up and parked jobs are due, it takes them `batch_size` at a time, at most
`rate_per_s` jobs a second, so a drain after a long outage leaves search its CPU. Otherwise it
looks again every `idle_s`. It continues-as-new every `iterations_per_run` passes.

A run keeps its input across continue-as-new, so a worker started with other ENGRAM_DRAIN_*
or ENGRAM_PROVIDER_PROBE_* settings would never reach it: each worker process sends its
settings once, with the start (`configure`, a signal-with-start), and they apply from the next
pass. The last worker started wins, so the workers of one queue should share these settings.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.ingest import IngestActivities
    from activities.models import DrainStepInput
    from workflows.models import DrainInput, DrainState

_LOOK = dict(start_to_close_timeout=timedelta(seconds=30),
             retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)))


CONFIGURE = "configure"  # the signal that hands a running drain a worker's settings
CONFIGURE_PATCH = "drain-configure"  # workflow.patched id of applying it: older histories replay without


def drain_workflow_id(task_queue: str) -> str:
    return f"extraction-drain-{task_queue}"


@workflow.defn
class ExtractionDrainWorkflow:
    def __init__(self) -> None:
        self._state = DrainState(state="starting", down=[], drained=0, next_probe_in_s=None)
        self._inp: DrainInput | None = None
        self._configured: DrainInput | None = None  # settings a worker sent, not applied yet

    @workflow.run
    async def run(self, inp: DrainInput) -> None:
        self._inp = inp
        probe_delay = inp.probe_initial_s
        next_probe = workflow.now()
        for _ in range(inp.iterations_per_run):
            if (configured := self._take_configured()) is not None:
                inp = configured
                probe_delay = min(probe_delay, inp.probe_max_s)
                next_probe = min(next_probe, workflow.now() + timedelta(seconds=inp.probe_max_s))
            states = await workflow.execute_local_activity_method(IngestActivities.states, **_LOOK)
            self._state.down = states.down
            if states.down and workflow.now() >= next_probe:
                self._state.state = "probing"
                still = await workflow.execute_activity_method(IngestActivities.probe, **_LOOK)
                self._state.down = [s.split(": ", 1)[0] for s in still]
                if still:
                    next_probe = workflow.now() + timedelta(seconds=probe_delay)
                    probe_delay = min(probe_delay * 2, inp.probe_max_s)
                else:
                    probe_delay = inp.probe_initial_s
                continue
            if not states.down:
                probe_delay = inp.probe_initial_s
            if states.chain_down or states.parked_due == 0:
                self._state.state = "probing" if states.chain_down else "idle"
                await workflow.sleep(self._wait(inp, next_probe if states.down else None))
                continue
            self._state.state = "draining"
            started = workflow.now()
            settled = await workflow.execute_activity_method(
                IngestActivities.drain,
                DrainStepInput(owner=f"drain:{workflow.info().workflow_id}", limit=inp.batch_size),
                start_to_close_timeout=timedelta(seconds=inp.batch_size * inp.extract_timeout_s + 60),
                heartbeat_timeout=timedelta(seconds=inp.heartbeat_timeout_s),
                retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)),
            )
            self._state.drained += settled.taken
            pace = timedelta(seconds=settled.taken / inp.rate_per_s) - (workflow.now() - started)
            if pace > timedelta(0):
                await workflow.sleep(pace)
        workflow.continue_as_new(self._take_configured() or inp)

    def _take_configured(self) -> DrainInput | None:
        """The settings a worker sent since they were last taken, now this run's, or None.
        Gated: a run in which a worker from before this signal existed received (and dropped)
        one must replay as it ran."""
        if self._configured is None or not workflow.patched(CONFIGURE_PATCH):
            return None
        self._inp, self._configured = self._configured, None
        return self._inp

    def _wait(self, inp: DrainInput, next_probe) -> timedelta:
        wait = timedelta(seconds=inp.idle_s)
        if next_probe is not None:
            wait = min(wait, max(next_probe - workflow.now(), timedelta(milliseconds=100)))
        self._state.next_probe_in_s = (next_probe - workflow.now()).total_seconds() if next_probe else None
        return wait

    @workflow.signal(name=CONFIGURE)
    def configure(self, inp: DrainInput) -> None:
        """A worker's settings, applied from the next pass and kept by the runs this one continues as."""
        self._configured = inp

    @workflow.query
    def state(self) -> DrainState:
        return self._state

    @workflow.query
    def configuration(self) -> DrainInput | None:
        """The settings this run works with (None before it has begun)."""
        return self._inp
