"""The pipeline's workflows on Temporal's time-skipping test server (real activities, real
Postgres, real Qdrant edge, the LLM faked at HTTP or down), and a replay of recorded histories so
that a change which breaks determinism fails here before it breaks running workflows.

RememberWorkflow is the one-memory pipeline from before batches: new runs of it hand their job
to the dispatcher at once; its histories recorded before that change still replay."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHistory, WorkflowQueryFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from activities.ingest import IndexActivities, IngestActivities
from activities.remember import RememberActivities
from engram.changes import MemoryChanges
from engram.control import Control
from engram.domain.models import MemoryDraft, Scope
from engram.fact_steps import FactWriter
from engram.inference.availability import Availability
from engram.inference.embedding_spaces import EmbeddingSpaces, Space
from engram.inference.providers import OllamaProvider
from engram.inference.vector_index import EdgeIndex
from engram.integrity import Integrity
from engram.ingest_steps import Retry
from engram.settings import Settings
from engram.store import pool as pool_module
from engram.store import jobs
from engram.store import embeddings
from tests.conftest import closed_port_url, new_database
from tests.fakes.llm_server import FakeReply
from workflows.control import ControlWorkflow
from workflows.drain import ExtractionDrainWorkflow, drain_workflow_id
from workflows.forget import BatchForgetWorkflow
from workflows.ingest import IngestWorkflow
from workflows.models import DrainInput, IngestInput, RememberInput
from workflows.reembed import ReembedWorkflow
from workflows.remember import RememberWorkflow
from workflows.approval import ApprovalWorkflow
from workflows.review import ReviewWorkflow

HISTORIES = Path(__file__).parent / "histories"
TEST_SERVER = Path(sys.executable).parent / "temporal-test-server"


async def _saved_memory(pool, content: str = "Quinn restores old motorbikes") -> uuid.UUID:
    """A memory and its job as remember's transaction writes them, through the service's own SQL."""
    from engram.store import memories as repo

    draft = MemoryDraft(content=content, scope=Scope(user_id="q"))
    memory_id, job_id = uuid.uuid4(), uuid.uuid4()
    async with pool.acquire() as conn:
        async with conn.transaction():
            await repo.insert_raw(conn, draft, memory_id=memory_id, actor="test", stemmer="english",
                                  extraction_status="pending")
            await jobs.insert(conn, job_id=job_id, memory_id=memory_id, job_type="extract", max_attempts=8,
                              payload={"extract": True})
    return job_id


async def _store_and_space(postgres, embedder, tmp_path, *, max_connections: int):
    """A fresh database (pool) and an edge shard (index) holding `embedder`'s space, active."""
    pool = await pool_module.create_pool(await new_database(postgres), min_size=1, max_size=max_connections)
    index = EdgeIndex(tmp_path / "shard")
    await index.ensure(model=embedder.name, dim=embedder.dim)
    async with pool.acquire() as conn:
        await embeddings.claim_active(conn, embedder.name)
    return pool, index, EmbeddingSpaces(pool, {embedder.name: Space(embedder, index)}, active=embedder.name)


@contextlib.asynccontextmanager
async def _pipeline_on_time_skipping_server(postgres, embedder, tmp_path, provider_url: str):
    """A saved memory and a worker running RememberWorkflow with real activities (real Postgres,
    a real Qdrant edge shard, the Ollama client against `provider_url`) on the time-skipping
    server. Yields (pool, job_id, handle) once the workflow has started."""
    pool, index, spaces = await _store_and_space(postgres, embedder, tmp_path, max_connections=4)
    provider = OllamaProvider(url=provider_url, model="llama3.2:3b", timeout_s=5)
    try:
        job_id = await _saved_memory(pool)
        async with await WorkflowEnvironment.start_time_skipping(
            test_server_existing_path=str(TEST_SERVER), data_converter=pydantic_data_converter,
        ) as env:
            activities = RememberActivities(pool, spaces, [provider], identity="test")
            async with Worker(env.client, task_queue="tq", workflows=[RememberWorkflow],
                              activities=activities.all()):
                handle = await env.client.start_workflow(
                    RememberWorkflow.run,
                    RememberInput(job_id=job_id, max_attempts=8, backoff_initial_s=30, backoff_max_s=600,
                                  extract_timeout_s=10),
                    id=jobs.workflow_id_for(job_id), task_queue="tq",
                )
                yield pool, job_id, handle
    finally:
        await provider.aclose()
        await index.close()
        await pool.close()


async def test_a_new_run_of_the_one_memory_workflow_hands_its_job_to_the_dispatcher(postgres, embedder, tmp_path):
    async with _pipeline_on_time_skipping_server(postgres, embedder, tmp_path, closed_port_url()) as (pool, job_id, handle):
        result = await handle.result()
        assert result.status == "handed_off"
        job = await jobs.get(pool, job_id)
        assert job.status == "pending" and job.workflow_id is None and job.workflow_started_at is None
        record_history(await handle.fetch_history(), "remember_handed_off")


@contextlib.asynccontextmanager
async def _batch_pipeline(postgres, temporal, embedder, tmp_path, provider_url: str, memories: int):
    """Saved memories and a worker running IngestWorkflow and ExtractionDrainWorkflow with real
    activities on the dev server, on a fresh task queue. Yields (client, task queue, pool, job_ids)."""
    pool, index, spaces = await _store_and_space(postgres, embedder, tmp_path, max_connections=8)
    provider = OllamaProvider(url=provider_url, model="llama3.2:3b", timeout_s=5)
    queue = f"tq-{uuid.uuid4().hex[:8]}"
    try:
        job_ids = [await _saved_memory(pool, f"Quinn restores old motorbike number {i}") for i in range(memories)]
        client = await Client.connect(temporal.address, data_converter=pydantic_data_converter)
        availability = Availability(pool, [provider], refresh_s=0)
        settings = Settings()
        control = Control(settings, pool, runs=None)  # switches read from Postgres; none is changed here
        facts = FactWriter(settings, pool, spaces, MemoryChanges(settings, pool, spaces, Integrity(pool), control),
                           control)
        ingest = IngestActivities(pool, spaces, availability, control, facts, retry=Retry(30, 600), lease_s=60,
                                  concurrency=2)
        async with Worker(client, task_queue=queue, workflows=[IngestWorkflow, ExtractionDrainWorkflow],
                          activities=ingest.all()), \
                Worker(client, task_queue=f"{queue}-index", activities=IndexActivities(spaces).all()):
            yield client, queue, pool, job_ids
    finally:
        await provider.aclose()
        await index.close()
        await pool.close()


def _ingest_input(queue: str, job_ids) -> IngestInput:
    return IngestInput(job_ids=job_ids, index_queue=f"{queue}-index", extract_timeout_s=10, extract_concurrency=2)


def _drain_input() -> DrainInput:
    return DrainInput(batch_size=8, rate_per_s=40, probe_initial_s=0.25, probe_max_s=2, idle_s=30,
                      extract_timeout_s=10, extract_concurrency=2, iterations_per_run=100)


async def test_a_batch_while_the_provider_is_down_is_embedded_indexed_and_parked_without_timers(
        postgres, temporal, embedder, tmp_path):
    async with _batch_pipeline(postgres, temporal, embedder, tmp_path, closed_port_url(), memories=5) as (
            client, queue, pool, job_ids):
        handle = await client.start_workflow(IngestWorkflow.run, _ingest_input(queue, job_ids),
                                             id=f"ingest-{queue}", task_queue=queue)
        result = await handle.result()
        assert (result.done, result.parked, result.dead) == (0, 5, 0)
        rows = await pool.fetch("SELECT status, attempt_count, next_attempt_at, last_error_code, outcome"
                                " FROM memory_jobs")
        assert {tuple(r) for r in rows} == {("parked", 0, None, "ProviderUnavailable", "raw_saved")}
        assert await pool.fetchval("SELECT count(*) FROM memories WHERE embedding IS NOT NULL"
                                   " AND extraction_status = 'unprocessed'") == 5
        history = await handle.fetch_history()
        assert not [e for e in history.events if e.HasField("timer_started_event_attributes")]
        record_history(history, "ingest_parked")


async def test_the_drain_probes_on_a_backoff_then_drains_every_parked_job_once(postgres, temporal, embedder,
                                                                               fake_llm, tmp_path):
    fake_llm.default = FakeReply.status(503)
    extraction = {"facts": [{"content": "Quinn restores motorbikes", "confidence": 0.9}], "entities": [],
                  "category": "hobbies", "tags": []}
    async with _batch_pipeline(postgres, temporal, embedder, tmp_path, fake_llm.url, memories=12) as (
            client, queue, pool, job_ids):
        batch = await client.start_workflow(IngestWorkflow.run, _ingest_input(queue, job_ids), id=f"ingest-{queue}",
                                            task_queue=queue)
        assert (await batch.result()).parked == 12
        calls_in_outage = len(fake_llm.chat_requests())
        assert calls_in_outage <= 2  # the first call found the provider down; the rest parked without one
        # Probes fail (the model server answers /api/tags, but the model is not pulled)...
        served, fake_llm.models = fake_llm.models, []
        drain = await client.start_workflow(ExtractionDrainWorkflow.run, _drain_input(), id=f"drain-{queue}",
                                            task_queue=queue)
        await asyncio.sleep(3)
        state = await drain.query(ExtractionDrainWorkflow.state)
        assert state.down == ["ollama/llama3.2:3b"] and state.drained == 0
        # ...then the provider is back: the next probe finds it, and the drain takes every job.
        fake_llm.models = served
        fake_llm.default = FakeReply.json(extraction)
        for _ in range(300):
            if await pool.fetchval("SELECT count(*) FROM memory_jobs WHERE status = 'done'") == 12:
                break
            await asyncio.sleep(0.1)
        assert await pool.fetchval("SELECT count(*) FROM memory_history WHERE event = 'UPDATE'") == 12
        assert len(fake_llm.chat_requests()) - calls_in_outage == 12
        history = await drain.fetch_history()
        probes = [e for e in history.events if e.HasField("activity_task_scheduled_event_attributes")
                  and e.activity_task_scheduled_event_attributes.activity_type.name == "drain_probe"]
        timers = [e.timer_started_event_attributes.start_to_fire_timeout.ToMilliseconds()
                  for e in history.events if e.HasField("timer_started_event_attributes")]
        # One probe per backoff step, however many jobs wait: 0.25 s doubling to 2 s over 3 s.
        assert 3 <= len(probes) <= 6
        # (each timer runs to the next probe's time, less the moment spent looking at the state)
        assert len(timers) >= 3 and all(want - 100 < t <= want for t, want in zip(timers, [250, 500, 1000]))
        await drain.terminate("test over")
        record_history(history, "drain_recovered")


async def _drain_configuration(client: Client, workflow_id: str, wanted) -> tuple:
    """(handle, the drain's settings) once they satisfy `wanted`, asked 100 times, 0.1 s apart."""
    handle = client.get_workflow_handle(workflow_id)
    found, error = None, None
    for _ in range(100):
        try:
            found = await handle.query(ExtractionDrainWorkflow.configuration, rpc_timeout=timedelta(seconds=2))
            if wanted(found):
                return handle, found
        except (RPCError, WorkflowQueryFailedError) as err:  # not started yet, or no worker to answer yet
            error = err
        await asyncio.sleep(0.1)
    raise AssertionError(f"the drain's settings never became what was wanted: {found} (last error {error!r})")


async def test_a_worker_started_with_other_drain_settings_hands_them_to_the_running_drain(make_app, monkeypatch):
    """The drain continues-as-new with its own input, so without the worker's `configure` a
    changed ENGRAM_DRAIN_* setting would never reach it, however often the service restarts."""
    import worker.outbox

    monkeypatch.setattr(worker.outbox, "_DRAIN_CHECK_S", 0.0)  # ensure_drain on every dispatcher pass
    queue = f"tq-{uuid.uuid4().hex[:8]}"
    async with make_app(temporal_task_queue=queue, drain_batch_size=5) as app:
        handle, first = await _drain_configuration(app.runtime.client, drain_workflow_id(queue),
                                                   lambda c: c is not None)
        assert (first.batch_size, first.rate_per_s) == (5, 1000)
        settings, run_id = app.runtime.settings, (await handle.describe()).run_id
    async with make_app(postgres_dsn=settings.postgres_dsn, data_dir=settings.data_dir, temporal_task_queue=queue,
                        drain_batch_size=7, drain_rate_per_s=3) as app:
        handle, now = await _drain_configuration(app.runtime.client, drain_workflow_id(queue),
                                                 lambda c: c.batch_size == 7)
        assert now.rate_per_s == 3 and now.idle_s == first.idle_s
        assert (await handle.describe()).run_id == run_id  # the same run, not a new one beside it
        await asyncio.sleep(1.0)  # several more dispatcher passes (every 0.2 s), each calling ensure_drain
        history = await handle.fetch_history()
        signals = [e for e in history.events if e.HasField("workflow_execution_signaled_event_attributes")]
        assert len(signals) == 2  # one per worker process, not one per pass
        await handle.terminate("test over")
    record_history(history, "drain_reconfigured")


async def test_settings_a_drain_is_handed_in_its_last_pass_carry_into_the_run_it_continues_as(
        postgres, temporal, embedder, fake_llm, tmp_path):
    async with _batch_pipeline(postgres, temporal, embedder, tmp_path, fake_llm.url, memories=0) as (
            client, queue, pool, job_ids):
        one_pass = _drain_input().model_copy(update={"idle_s": 1.5, "iterations_per_run": 1})
        drain = await client.start_workflow(ExtractionDrainWorkflow.run, one_pass, id=f"drain-{queue}",
                                            task_queue=queue)
        for _ in range(100):  # until its only pass sleeps: a signal now comes after the pass began
            if (await drain.query(ExtractionDrainWorkflow.state)).state == "idle":
                break
            await asyncio.sleep(0.05)
        await drain.signal(ExtractionDrainWorkflow.configure, one_pass.model_copy(update={"batch_size": 9}))
        later, now = await _drain_configuration(client, f"drain-{queue}", lambda c: c.batch_size == 9)
        assert (await later.describe()).run_id != drain.first_execution_run_id
        await later.terminate("test over")


def record_history(history: WorkflowHistory, name: str) -> None:
    """Keep one history per path through the workflow; recorded once, then replayed forever.
    Delete a file only when a deliberate, versioned change to the workflow makes it obsolete."""
    path = HISTORIES / f"{name}.json"
    if not path.exists():
        HISTORIES.mkdir(exist_ok=True)
        path.write_text(history.to_json())


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.stem)
async def test_recorded_histories_replay_deterministically(path):
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(workflows=[RememberWorkflow, ReembedWorkflow, IngestWorkflow, ExtractionDrainWorkflow,
                                   BatchForgetWorkflow, ControlWorkflow, ReviewWorkflow, ApprovalWorkflow],
                        data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
