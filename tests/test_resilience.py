"""Faults survived for real: Temporal stopped and restarted, the worker process killed mid-workflow."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid

import httpx

from tests.conftest import new_database, ollama_settings
from tests.fakes.llm_server import FakeReply
from tests.process import FAST_FAILOVER, EngramProcess
from worker.embedded import EmbeddedTemporal, free_port

FACTS = {"facts": [{"content": "Nina keeps bees", "type": "fact", "confidence": 0.9}], "entities": [],
         "category": "hobbies", "tags": []}


async def test_temporal_down_then_back_saves_raw_and_processes_once(make_app, fake_llm, tmp_path):
    fake_llm.default = FakeReply.json(FACTS)
    temporal = EmbeddedTemporal(tmp_path / "own-temporal", free_port(), free_port(), headless=True)
    temporal.start()
    try:
        async with make_app(temporal_address=temporal.address, **ollama_settings(fake_llm)) as app:
            before = await app.remember("Nina keeps bees in her garden", mode="sync")
            assert before["status"] == "processed"
            temporal.stop()
            started = time.monotonic()
            # Remember writes only to Postgres: each answers within its budget (auto: 2 s), saved...
            answers = [await app.remember(f"Nina harvested {n} jars of honey", mode="auto") for n in range(3)]
            assert time.monotonic() - started < 15
            assert {a["status"] for a in answers} == {"queued"}
            assert all(a["warnings"][0].startswith("pipeline_timeout") for a in answers)
            # ...and once the oldest waiting job is past pipeline_stall_s, at once. That job, the first
            # above, was written just after `started`: a second more puts it past, with room to spare.
            await asyncio.sleep(max(0.0, started + app.settings.pipeline_stall_s + 1 - time.monotonic()))
            started = time.monotonic()
            late = await app.remember("Nina sold honey at the market", mode="auto")
            assert time.monotonic() - started < 1
            assert late["status"] == "queued" and late["warnings"][0].startswith("pipeline_unavailable")
            answers.append(late)
            # Saved, but not yet embedded: still found by BM25 while Temporal is down.
            hits = await app.search("honey jars", scope={"user_id": "u1"})
            assert {h["memory"]["id"] for h in hits} >= {a["memory_id"] for a in answers}

            temporal.start()
            for answer in answers:
                job = await app.wait_job(answer["job_id"], "done", timeout_s=60)
                assert job["attempt_count"] == 1
            assert await app.count("SELECT count(*) FROM memories WHERE kind = 'raw'") == 5
            assert await app.count("SELECT count(*) FROM memory_history WHERE event = 'UPDATE'") == 5
            assert await app.count("SELECT count(*) FROM memories WHERE embedding IS NULL") == 0
            assert len(fake_llm.chat_requests()) == 5
    finally:
        temporal.stop()


async def test_worker_killed_mid_workflow_is_processed_exactly_once(postgres, temporal, fake_llm, tmp_path):
    # The first extraction hangs; the worker process is killed while it waits for it.
    fake_llm.script(FakeReply.delay(60, FakeReply.json(FACTS)))
    fake_llm.default = FakeReply.json(FACTS)
    dsn = await new_database(postgres)
    engram = EngramProcess(
        tmp_path / "engram", postgres_dsn=dsn, temporal_address=temporal.address,
        temporal_task_queue=f"kill-{uuid.uuid4().hex[:6]}", llm_provider="ollama", ollama_url=fake_llm.url,
        llm_timeout_s=2, extraction_backoff_initial_s=0.3, extraction_backoff_max_s=1, dispatcher_interval_s=0.2,
        **FAST_FAILOVER,
    ).start()
    try:
        with engram.client() as http:
            answer = http.post("/api/memory/remember", json={
                "content": "Nina keeps bees", "scope": {"user_id": "nina"}, "mode": "async"}).json()
            await _wait(lambda: len(fake_llm.chat_requests()) == 1, "the first extraction call")
        assert engram.stop(signal.SIGKILL) == -signal.SIGKILL

        engram.start()
        with engram.client() as http:
            job = await _wait_job(http, answer["job_id"], "done", timeout_s=60)
            # The batch's extract step was retried once the dead worker's heartbeat timed out; the
            # job counts only the attempt that completed it. The hung call is the one lost.
            assert job["attempt_count"] == 1 and job["outcome"] == "processed"
            # The raw memory (its extracted fact is a memory of kind "fact" beside it).
            hits = http.post("/api/memory/search", json={"query": "beekeeping", "scope": {"user_id": "nina"},
                                                         "filters": {"kind": "raw"}}).json()
            assert [h["memory"]["id"] for h in hits["results"]] == [answer["memory_id"]]
            assert hits["results"][0]["components"]["vector"] > 0.3
            memory = http.get(f"/api/memory/{answer['memory_id']}").json()
            assert memory["extraction_status"] == "done"
        import asyncpg

        conn = await asyncpg.connect(dsn)
        try:
            events = [r["event"] for r in await conn.fetch(
                "SELECT event FROM memory_history WHERE memory_id = $1 ORDER BY id", uuid.UUID(answer["memory_id"]))]
            assert events == ["ADD", "UPDATE"]
            assert await conn.fetchval("SELECT count(*) FROM memories WHERE kind = 'raw'") == 1
        finally:
            await conn.close()
    finally:
        if engram.proc and engram.proc.poll() is None:
            engram.stop()


async def _wait(predicate, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def _wait_job(http: httpx.Client, job_id: str, status: str, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        job = http.get(f"/api/memory/jobs/{job_id}").json()
        if job["status"] == status:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job still {job['status']}: {job}")
        await asyncio.sleep(0.2)


async def test_a_batch_forget_killed_mid_execution_resumes_without_deleting_twice(postgres, temporal, tmp_path):
    dsn = await new_database(postgres)
    engram = EngramProcess(
        tmp_path / "engram", postgres_dsn=dsn, temporal_address=temporal.address,
        temporal_task_queue=f"kill-{uuid.uuid4().hex[:6]}", llm_provider="none", approval_threshold=1000,
        dispatcher_interval_s=0.2, **FAST_FAILOVER,
    ).start()
    scope = {"user_id": "hoarder"}
    try:
        with engram.client() as http:
            for start in (0, 400):
                answer = http.post("/api/memory/remember/batch", json={"items": [
                    {"content": f"receipt number {n} from the shop", "scope": scope, "tags": ["receipts"], "raw": True}
                    for n in range(start, start + 400)]}).json()
                assert answer["stored"] == 400, answer
            preview = http.post("/api/memory/forget", json={
                "scope": scope, "filters": {"tags": ["receipts"]}, "limit": 1000, "reason": "old receipts"}).json()
            assert len(preview["candidates"]) == 800, preview
            executed = http.post(f"/api/memory/forget/{preview['operation_id']}/execute",
                                 json={"confirm_token": preview["confirm_token"]})
            assert executed.status_code == 200, executed.text
            done = await _wait_status(http, preview["operation_id"], lambda s: s["done"] > 0)
        assert done["done"] < 800, "the forget finished before the kill: nothing was tested"
        assert engram.stop(signal.SIGKILL) == -signal.SIGKILL

        engram.start()
        with engram.client() as http:
            finished = await _wait_status(http, preview["operation_id"], lambda s: s["status"] == "done", 120)
            receipt = finished["receipt"]
            assert receipt["deleted"] == 800 and {i["state"] for i in receipt["items"]} == {"deleted"}
            assert http.post("/api/receipts/verify", json=receipt).json() == {"ok": True, "problems": []}
            assert http.get("/api/memory", params={**scope, "limit": 10}).json()["items"] == []
        import asyncpg

        conn = await asyncpg.connect(dsn)
        try:
            deletes = await conn.fetchval("SELECT count(*) FROM memory_history WHERE event = 'DELETE'")
            assert deletes == 800
            assert await conn.fetchval("SELECT max(n) FROM (SELECT count(*) AS n FROM memory_history"
                                       " WHERE event = 'DELETE' GROUP BY memory_id) d") == 1
        finally:
            await conn.close()
    finally:
        if engram.proc and engram.proc.poll() is None:
            engram.stop()


async def _wait_status(http: httpx.Client, operation_id: str, done, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        status = http.get(f"/api/memory/forget/{operation_id}").json()
        if done(status):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"operation still {status}")
        await asyncio.sleep(0.02)
