"""RememberWorkflow on Temporal's time-skipping test server (real activities, real Postgres,
real Qdrant edge, the LLM down), and a replay of recorded histories so that a change which
breaks determinism fails here before it breaks running workflows."""

from __future__ import annotations

import contextlib
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from activities.remember import RememberActivities
from engram.domain.models import MemoryDraft, Scope
from engram.inference.embedding_spaces import EmbeddingSpaces, Space
from engram.inference.providers import OllamaProvider
from engram.inference.vector_index import EdgeIndex
from engram.store import pool as pool_module
from engram.store import jobs
from engram.store import embeddings
from tests.conftest import closed_port_url, new_database
from tests.fakes.llm_server import FakeReply
from workflows.models import RememberInput
from workflows.reembed import ReembedWorkflow
from workflows.remember import RememberWorkflow

HISTORIES = Path(__file__).parent / "histories"
TEST_SERVER = Path(sys.executable).parent / "temporal-test-server"


async def _saved_memory(pool) -> uuid.UUID:
    """A memory and its job as remember's transaction writes them, through the service's own SQL."""
    from engram.store import memories as repo

    draft = MemoryDraft(content="Quinn restores old motorbikes", scope=Scope(user_id="q"))
    memory_id, job_id = uuid.uuid4(), uuid.uuid4()
    async with pool.acquire() as conn:
        async with conn.transaction():
            await repo.insert_raw(conn, draft, memory_id=memory_id, actor="test", stemmer="english",
                                  extraction_status="pending")
            await jobs.insert(conn, job_id=job_id, memory_id=memory_id, job_type="extract", max_attempts=8,
                              payload={"extract": True})
    return job_id


@contextlib.asynccontextmanager
async def _pipeline_on_time_skipping_server(postgres, embedder, tmp_path, provider_url: str):
    """A saved memory and a worker running RememberWorkflow with real activities (real Postgres,
    a real Qdrant edge shard, the Ollama client against `provider_url`) on the time-skipping
    server. Yields (pool, job_id, handle) once the workflow has started."""
    dsn = await new_database(postgres)
    pool = await pool_module.create_pool(dsn, min_size=1, max_size=4)
    index = EdgeIndex(tmp_path / "shard")
    await index.ensure(model=embedder.name, dim=embedder.dim)
    async with pool.acquire() as conn:
        await embeddings.claim_active(conn, embedder.name)
    spaces = EmbeddingSpaces(pool, {embedder.name: Space(embedder, index)}, active=embedder.name)
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


async def test_extraction_backs_off_exponentially_then_gives_up(postgres, embedder, tmp_path):
    async with _pipeline_on_time_skipping_server(postgres, embedder, tmp_path, closed_port_url()) as (pool, job_id, handle):
        result = await handle.result()
        history = await handle.fetch_history()
        assert result.status == "dead" and result.first_pass == "raw_saved" and result.attempts == 8
        timers = [e.timer_started_event_attributes.start_to_fire_timeout.ToSeconds()
                  for e in history.events if e.HasField("timer_started_event_attributes")]
        assert timers == [30, 60, 120, 240, 480, 600, 600]
        job = await jobs.get(pool, job_id)
        assert job.status == "dead" and job.attempt_count == 8 and job.last_error_code == "ProviderUnavailable"
        row = await pool.fetchrow("SELECT extraction_status, embedding_model FROM memories")
        assert dict(row) == {"extraction_status": "failed", "embedding_model": embedder.name}
        record_history(history, "remember_fast_backoff_dead")


async def test_extraction_recovers_after_failures_and_completes_once(postgres, embedder, fake_llm, tmp_path):
    fake_llm.script(FakeReply.status(503), FakeReply.malformed())
    fake_llm.default = FakeReply.json({"facts": [{"content": "Quinn restores motorbikes", "confidence": 0.9}],
                                       "entities": [], "category": "hobbies", "tags": []})
    async with _pipeline_on_time_skipping_server(postgres, embedder, tmp_path, fake_llm.url) as (pool, job_id, handle):
        assert await handle.execute_update(RememberWorkflow.first_pass) == "raw_saved"
        result = await handle.result()
        history = await handle.fetch_history()
        assert result.status == "done" and result.attempts == 3
        job = await jobs.get(pool, job_id)
        assert job.status == "done" and job.outcome == "raw_saved" and job.attempt_count == 3
        assert await pool.fetchval("SELECT count(*) FROM memory_history WHERE event = 'UPDATE'") == 1
        assert await pool.fetchval("SELECT extraction_status FROM memories") == "done"
        record_history(history, "remember_fast_recovered")


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
    replayer = Replayer(workflows=[RememberWorkflow, ReembedWorkflow], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
