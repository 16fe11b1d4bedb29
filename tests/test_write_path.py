"""The batched write path under load and faults: remember only writes rows, the dispatcher
batches them into IngestWorkflows, an LLM outage parks extractions at O(1) cost, and the one
drain workflow works them off once a provider answers again; bulk remember; the API and the
worker as separate processes (the worker SIGKILLed mid-drain, or not running at all)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import pytest

from api.http import create_app
from engram.domain import auth
from engram.settings import Settings
from tests.conftest import App, app_settings, new_database, ollama_settings, serving
from tests.fakes.llm_server import FakeLLMServer, FakeReply
from tests.process import ENGRAM, FAST_FAILOVER
from worker.runtime import Runtime
from worker.startup import prepare_store

FACTS = {"facts": [{"content": "The user keeps a journal", "type": "fact", "confidence": 0.9}],
         "entities": [], "category": "journal", "tags": ["journal"]}
PROVIDER = "ollama/llama3.2:3b"
ENTRY = re.compile(r"Journal entry (\d{5})\b")


# -- helpers -----------------------------------------------------------------------------------

@pytest.fixture
def llm(fake_llm: FakeLLMServer):
    """The session's fake Ollama, with the model list it started with put back afterwards
    (the conftest reset does not restore it)."""
    models = list(fake_llm.models)
    yield fake_llm
    fake_llm.models = models


def go_down(llm: FakeLLMServer, *, probe_too: bool = True) -> None:
    """The provider fails every chat with a 503; with `probe_too` its probe (GET /api/tags) no
    longer lists the model either, as when the server is really gone."""
    llm.default = FakeReply.status(503, "model server overloaded")
    if probe_too:
        llm.models = []


def come_back(llm: FakeLLMServer, reply: FakeReply = FakeReply.json(FACTS)) -> None:
    llm.models = ["llama3.2:3b", "gpt-4o-mini"]
    llm.default = reply


def entry(i: int) -> str:
    return f"Journal entry {i:05d}: walked {i % 17 + 1} km along the river and saw {i % 5 + 2} herons"


def items(numbers, scope: dict | None = None) -> list[dict]:
    return [{"content": entry(i), "scope": scope or {"user_id": "u1"}} for i in numbers]


def extracted_entries(llm: FakeLLMServer, since: int = 0) -> Counter:
    """How many chat requests (from the `since`-th on) asked to extract each journal entry."""
    seen = Counter()
    for request in llm.chat_requests()[since:]:
        seen.update(int(n) for n in set(ENTRY.findall(json.dumps(request.body))))
    return seen


async def chat_count(llm: FakeLLMServer) -> int:
    return len(llm.chat_requests())


async def probe_count(llm: FakeLLMServer) -> int:
    """How many times the provider's probe (GET /api/tags) has been called."""
    return sum(r.path == "/api/tags" for r in llm.requests)


async def job_states(pool) -> dict[str, int]:
    rows = await pool.fetch("SELECT status, count(*) AS n FROM memory_jobs WHERE job_type = 'extract'"
                            " GROUP BY status")
    return {r["status"]: r["n"] for r in rows}


async def until(read, done, what: str, timeout_s: float = 60, every_s: float = 0.2):
    """Poll `read()` until `done(value)`; the last value, or AssertionError naming it."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await read()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; last seen: {value}")
        await asyncio.sleep(every_s)


async def import_all(app: App, bodies: list[dict], chunk: int = 500) -> list[dict]:
    """Bulk-remember `bodies`, `chunk` per request; the answers, each with its import job's id."""
    answers = []
    for start in range(0, len(bodies), chunk):
        response = await app.post("/api/memory/remember/batch", {"items": bodies[start:start + chunk]})
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["failed"] == 0 and answer["stored"] == len(bodies[start:start + chunk]), answer
        answers.append(answer)
    return answers


async def assert_each_memory_extracted_once(pool, total: int) -> None:
    """Every memory is `done` with exactly one UPDATE history row; every job is done, its one
    counted attempt being the extraction that succeeded (an outage uses none)."""
    assert await pool.fetchval("SELECT count(*) FROM memories WHERE kind = 'raw'") == total
    statuses = await pool.fetch("SELECT extraction_status, count(*) AS n FROM memories WHERE kind = 'raw' GROUP BY 1")
    assert {r["extraction_status"]: r["n"] for r in statuses} == {"done": total}
    updates = await pool.fetch(
        "SELECT m.id, count(h.*) FILTER (WHERE h.event = 'UPDATE') AS n FROM memories m"
        " LEFT JOIN memory_history h ON h.memory_id = m.id WHERE m.kind = 'raw' GROUP BY m.id")
    assert Counter(r["n"] for r in updates) == Counter({1: total})
    jobs = await pool.fetch("SELECT status, attempt_count, count(*) AS n FROM memory_jobs"
                            " WHERE job_type = 'extract' GROUP BY 1, 2")
    assert {(r["status"], r["attempt_count"]): r["n"] for r in jobs} == {("done", 1): total}


@contextlib.asynccontextmanager
async def running(settings: Settings, embedder, reranker=None, roles: frozenset[str] = frozenset({"api"})):
    """Like conftest.running_app, but only the given roles of a process (default: the API, with
    the index activities and the first-pass listener, and no worker)."""
    await prepare_store(settings)
    runtime = await Runtime.open(settings, embedder=embedder, reranker=reranker, roles=roles)
    admin_key = auth.new_key()
    await runtime.install_admin_key(admin_key, name="admin")
    web = create_app(None)
    web.state.runtime = runtime
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=web), base_url="http://engram.test",
                                     timeout=60) as http:
            yield App(runtime, http, admin_key)
    finally:
        await runtime.close()


class WorkerProcess:
    """`python -m worker.up worker`, as `engram up` runs it, on `settings` passed as ENGRAM_* env."""

    def __init__(self, settings: Settings, log: Path) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
        self.env.update({f"ENGRAM_{name.upper()}": str(getattr(settings, name)) for name in settings.model_fields_set})
        self.env["ENGRAM_WORKER_NICENESS"] = "0"
        self.log = log
        self.proc: subprocess.Popen | None = None

    def start(self) -> "WorkerProcess":
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "worker.up", "worker"], env=self.env,
                                         stdout=out, stderr=out, cwd=Path(__file__).parent.parent)
        return self

    def kill(self) -> int:
        self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


# -- 1. thousands parked, drained once ----------------------------------------------------------

async def test_thousands_of_parked_extractions_cost_o1_calls_and_drain_once_when_the_provider_returns(make_app, llm):
    total = 1_000
    go_down(llm)
    async with make_app(**ollama_settings(llm), drain_batch_size=100, extraction_concurrency=8) as app:
        s = app.settings
        imports = await import_all(app, items(range(total)))
        assert await app.count("SELECT count(*) FROM memories WHERE kind = 'raw'") == total
        await until(lambda: job_states(app.pool), lambda st: st == {"parked": total}, "every job parked",
                    timeout_s=90)

        # Only the extractions already under way when the first one failed reached the model.
        during = len(llm.chat_requests())
        assert 1 <= during <= s.extraction_concurrency * s.ingest_inflight_batches, during
        assert await app.count(
            "SELECT count(*) FROM memory_jobs WHERE job_type = 'extract' AND NOT (attempt_count = 0"
            " AND next_attempt_at IS NULL AND last_error_code = 'ProviderUnavailable')") == 0
        assert await app.count("SELECT count(*) FROM memories WHERE extraction_status <> 'unprocessed'") == 0
        for answer in imports:
            job = await app.job(answer["job_id"])
            assert job["status"] == "parked" and job["progress"] == {"done": 0, "total": 500, "parked": 500}, job
        # The outage goes on: the drain probes (GET /api/tags) on its backoff, and calls no chat.
        probes = await probe_count(llm)
        await until(lambda: probe_count(llm), lambda n: n >= probes + 2, "two more probes",
                    timeout_s=3 * s.provider_probe_max_s + 5, every_s=0.05)
        assert len(llm.chat_requests()) == during

        come_back(llm)
        await until(lambda: job_states(app.pool), lambda st: st == {"done": total}, "every job done",
                    timeout_s=120, every_s=0.5)
        await assert_each_memory_extracted_once(app.pool, total)
        assert extracted_entries(llm, since=during) == Counter({i: 1 for i in range(total)})
        for answer in imports:
            job = await app.job(answer["job_id"])
            assert job["status"] == "done" and job["progress"] == {"done": 500, "total": 500, "parked": 0}, job


# -- 2. a flapping provider ---------------------------------------------------------------------

async def test_a_flapping_provider_loses_no_memory_and_extracts_each_once(make_app, llm):
    first, late = 300, 20
    go_down(llm)
    async with make_app(**ollama_settings(llm)) as app:
        await import_all(app, items(range(first)))
        await until(lambda: job_states(app.pool), lambda st: st == {"parked": first}, "the first outage parked all")

        # Up, slowly: the drain is part-way through when the provider fails again.
        come_back(llm, FakeReply.delay(0.02, FakeReply.json(FACTS)))
        await until(lambda: job_states(app.pool), lambda st: st.get("done", 0) >= 60, "the drain under way")

        # Down, but still answering its probe: each probe lets the drain lease a batch whose calls fail.
        go_down(llm, probe_too=False)
        failing_from = len(llm.chat_requests())
        answers = [await app.remember(entry(i), mode="auto", pipeline_timeout_ms=300)
                   for i in range(first, first + late)]
        assert {a["status"] for a in answers} <= {"queued", "raw_saved", "processed"}
        await until(lambda: chat_count(llm), lambda n: n > failing_from, "a call to the half-down provider",
                    timeout_s=10, every_s=0.05)

        # Down for good, then back.
        go_down(llm)
        await until(lambda: job_states(app.pool), lambda st: set(st) <= {"done", "parked"}
                    and sum(st.values()) == first + late, "the second outage settled")
        await asyncio.sleep(1)  # any extraction still under way has failed and parked by now
        mid = await job_states(app.pool)
        assert 0 < mid.get("parked", 0) < first + late, mid
        assert await app.count("SELECT count(*) FROM memory_jobs WHERE status = 'parked'"
                               " AND (attempt_count <> 0 OR last_error_code <> 'ProviderUnavailable')") == 0
        parked = [int(ENTRY.search(r["content"]).group(1)) for r in await app.pool.fetch(
            "SELECT m.content FROM memories m JOIN memory_jobs j ON j.memory_id = m.id WHERE j.status = 'parked'")]

        back_from = len(llm.chat_requests())
        come_back(llm)
        await until(lambda: job_states(app.pool), lambda st: st == {"done": first + late}, "every job done")
        await assert_each_memory_extracted_once(app.pool, first + late)
        # After the last outage exactly the parked memories were extracted, each once.
        assert extracted_entries(llm, since=back_from) == Counter({n: 1 for n in parked})


async def test_after_an_outage_malformed_answers_use_attempts_until_the_parked_job_is_dead(make_app, llm):
    go_down(llm)
    async with make_app(**ollama_settings(llm), extraction_max_attempts=2, extraction_backoff_initial_s=0.3) as app:
        answer = await app.remember("Sven restores old clocks", mode="async")
        job = await app.wait_job(answer["job_id"], "parked")
        assert job["attempt_count"] == 0
        back_from = len(llm.chat_requests())
        come_back(llm, FakeReply.malformed("{never json"))
        job = await app.wait_job(answer["job_id"], "dead", timeout_s=30)
        assert job["attempt_count"] == 2 and job["last_error_code"] == "ProviderMalformedOutput"
        assert len(llm.chat_requests()) - back_from == 2
        memory = (await app.get(f"/api/memory/{answer['memory_id']}")).json()
        assert memory["extraction_status"] == "failed"
        assert await app.count("SELECT count(*) FROM memory_history WHERE event = 'UPDATE'") == 0
        assert (await app.search("antique clock repair"))[0]["memory"]["id"] == answer["memory_id"]


# -- 3. the worker SIGKILLed mid-drain ------------------------------------------------------------

async def test_worker_killed_mid_drain_leaves_nothing_leased_and_extracts_each_memory_once(
        postgres, temporal, embedder, reranker, llm, tmp_path):
    total = 120
    settings = app_settings(
        tmp_path / "data", await new_database(postgres), temporal_address=temporal.address, **ollama_settings(llm),
        llm_timeout_s=2, drain_batch_size=8, extraction_concurrency=4, drain_idle_s=0.2, **FAST_FAILOVER,
    )
    go_down(llm)
    async with running(settings, embedder, reranker) as api:
        first = WorkerProcess(settings, tmp_path / "worker-1.log").start()
        second = WorkerProcess(settings, tmp_path / "worker-2.log")
        try:
            await import_all(api, items(range(total)))
            await until(lambda: job_states(api.pool), lambda st: st == {"parked": total} or not first.alive(),
                        "every job parked by the worker process", timeout_s=90)
            assert first.alive(), first.tail()

            back_from = len(llm.chat_requests())
            # Each call is slow enough that the kill finds some in flight; no slower, since the
            # second worker makes every call left, one after another in its few slots.
            come_back(llm, FakeReply.delay(0.15, FakeReply.json(FACTS)))
            await until(lambda: job_states(api.pool), lambda st: st.get("done", 0) >= 16 and st.get("leased", 0) > 0,
                        "the drain part-way, with jobs leased", timeout_s=60, every_s=0.05)
            assert first.kill() == -signal.SIGKILL
            orphaned = await job_states(api.pool)
            assert orphaned.get("leased", 0) > 0 and orphaned.get("done", 0) < total, orphaned

            # While no worker runs, nothing moves.
            await asyncio.sleep(1)
            assert await job_states(api.pool) == orphaned

            second.start()
            await until(lambda: job_states(api.pool), lambda st: st == {"done": total} or not second.alive(),
                        "every job done by the second worker", timeout_s=120)
            assert second.alive(), second.tail()
            await assert_each_memory_extracted_once(api.pool, total)
            seen = extracted_entries(llm, since=back_from)
            assert set(seen) == set(range(total))
            # Only the extractions in flight at the kill ran twice.
            assert sum(seen.values()) <= total + settings.extraction_concurrency, seen.most_common(8)
        finally:
            first.stop()
            second.stop()


# -- 4. the API without a worker ----------------------------------------------------------------

async def test_the_api_answers_while_no_worker_runs_and_the_work_waits_for_one(
        postgres, temporal, embedder, reranker, llm, tmp_path):
    llm.default = FakeReply.json(FACTS)
    settings = app_settings(tmp_path / "data", await new_database(postgres), temporal_address=temporal.address,
                            **ollama_settings(llm))
    async with running(settings, embedder, reranker) as api:
        started = time.monotonic()
        auto = await api.remember("Olga repairs violins in Cremona", mode="auto", pipeline_timeout_ms=300)
        auto_s = time.monotonic() - started
        started = time.monotonic()
        queued = await api.remember("Olga's workshop smells of varnish", mode="async")
        async_s = time.monotonic() - started
        assert auto["status"] == "queued" and any(w.startswith("pipeline_timeout") for w in auto["warnings"])
        assert queued["status"] == "queued"
        assert auto_s < 2 and async_s < 2, (auto_s, async_s)
        bulk = await api.post("/api/memory/remember/batch", {"items": items(range(3))})
        assert bulk.status_code == 200 and bulk.json()["stored"] == 3

        hits = await api.search("violins Cremona")
        assert hits and hits[0]["memory"]["id"] == auto["memory_id"]
        for answer in (auto, queued):
            job = await api.job(answer["job_id"])
            assert job["status"] == "pending" and job["workflow_id"] is None, job
        await asyncio.sleep(1)
        assert await job_states(api.pool) == {"pending": 5}
        assert llm.chat_requests() == []
        ready = (await api.http.get("/readyz")).json()
        assert ready["components"]["pipeline"]["queued"] == 5

        async with running(settings, embedder, roles=frozenset({"worker"})):
            for answer in (auto, queued):
                job = await api.wait_job(answer["job_id"], "done", timeout_s=60)
                assert job["attempt_count"] == 1 and job["workflow_id"].startswith("ingest-")
            import_job = await api.wait_job(bulk.json()["job_id"], "done", timeout_s=60)
            assert import_job["progress"] == {"done": 3, "total": 3, "parked": 0}
        assert await api.count("SELECT count(*) FROM memories WHERE extraction_status = 'done'") == 5
        assert await api.count("SELECT count(*) FROM memories WHERE embedding IS NULL") == 0
        assert len(llm.chat_requests()) == 5
        # The worker's batches were indexed by the API process, which owns the vector index.
        hits = await api.search("a luthier in Italy")
        assert hits[0]["memory"]["id"] == auto["memory_id"] and hits[0]["components"]["vector"] > 0.3, hits[0]


async def test_auto_remember_answers_queued_at_once_while_the_write_queue_is_over_its_bound(
        postgres, temporal, embedder, reranker, llm, tmp_path):
    settings = app_settings(tmp_path / "data", await new_database(postgres), temporal_address=temporal.address,
                            **ollama_settings(llm), write_queue_bound=3)
    async with running(settings, embedder, reranker) as api:  # no worker: the queue only grows
        under = await api.remember("Rosa sings in a choir", mode="auto", pipeline_timeout_ms=300)
        assert under["status"] == "queued" and under["warnings"][0].startswith("pipeline_timeout")
        await import_all(api, items(range(4)))
        await asyncio.sleep(0.6)  # the depth is read at most every half second
        started = time.monotonic()
        over = await api.remember("Rosa sings alto", mode="auto", pipeline_timeout_ms=5_000)
        assert time.monotonic() - started < 2
        assert over["status"] == "queued" and over["warnings"][0].startswith("backpressure"), over
        assert await job_states(api.pool) == {"pending": 6}


# -- 5. bulk remember ---------------------------------------------------------------------------

async def test_bulk_remember_stores_the_valid_items_and_answers_each_bad_one_with_its_own_error(make_app, llm):
    llm.default = FakeReply.json(FACTS)
    async with make_app(**ollama_settings(llm)) as app:
        u1_writer = await app.key("writer", ["user:u1", "agent:a"])
        u1 = {"user_id": "u1"}
        batch = [
            {"content": "Pia keeps three cats", "scope": u1},
            {"content": "Pia keeps three cats", "scope": {"user_id": "u1", "agent_id": "a"}},  # another scope
            {"content": "  pia KEEPS three   cats ", "scope": u1},  # the first, again
            {"content": "   ", "scope": u1},
            {"content": 42, "scope": u1},
            {"content": "Pia is in Oslo", "scope": u1, "mode": "sync"},
            {"content": "Pia's secret", "scope": {"user_id": "someone-else"}},
            {"content": "Pia plays chess", "scope": u1, "tags": ["games"]},
        ]
        response = await app.post("/api/memory/remember/batch", {"items": batch}, key=u1_writer)
        assert response.status_code == 200, response.text
        answer = response.json()
        results = answer["results"]
        assert [r["index"] for r in results] == list(range(len(batch)))
        errors = {r["index"]: r["error"]["type"] for r in results if r["error"]}
        assert errors == {3: "validation_error", 4: "validation_error", 5: "validation_error", 6: "forbidden"}
        assert "content" in results[4]["error"]["detail"] and "mode" in results[5]["error"]["detail"]
        assert all(results[i]["memory_id"] is None and results[i]["job_id"] is None for i in errors)
        assert answer["failed"] == 4 and answer["stored"] == 4
        assert [results[i]["status"] for i in (0, 1, 7)] == ["queued"] * 3
        assert len({results[i]["memory_id"] for i in (0, 1, 7)}) == 3
        # The duplicate inside the batch points at the memory stored for its first occurrence.
        assert results[2]["memory_id"] == results[0]["memory_id"]
        assert results[2]["status"] == results[0]["status"] == "queued"
        assert results[2]["warnings"] and results[2]["warnings"][0].startswith("duplicate")
        assert await app.count("SELECT count(*) FROM memories WHERE kind = 'raw'") == 3
        assert await app.count("SELECT count(*) FROM memories WHERE content LIKE '%secret%' OR content LIKE '%Oslo%'"
                               " OR content = '   '") == 0

        progress = await app.wait_job(answer["job_id"], "done", timeout_s=60)
        assert progress["progress"] == {"done": 3, "total": 3, "parked": 0}
        for i in (0, 1, 7):
            assert (await app.job(results[i]["job_id"]))["status"] == "done"
        assert await app.count("SELECT count(*) FROM memory_history WHERE event = 'UPDATE'") == 3
        # The import's job is its caller's to read, and nobody else's but an admin's.
        assert (await app.get(f"/api/memory/jobs/{answer['job_id']}", key=u1_writer)).status_code == 200
        other = await app.key("writer", ["user:u2"])
        assert (await app.get(f"/api/memory/jobs/{answer['job_id']}", key=other)).status_code == 404


async def test_bulk_remember_replays_an_idempotency_key_across_batches_and_refuses_it_for_another_body(app):
    carol = {"content": "Carol bakes sourdough on Fridays", "scope": {"user_id": "u1"}, "idempotency_key": "imp-1"}
    first = (await app.post("/api/memory/remember/batch", {"items": [carol]})).json()
    assert first["stored"] == 1, first
    again = await app.post("/api/memory/remember/batch", {"items": [
        carol,
        {**carol, "content": "Carol bakes rye on Fridays"},
        {"content": "Dan fixes bicycles", "scope": {"user_id": "u1"}, "idempotency_key": "imp-2"},
    ]})
    assert again.status_code == 200, again.text
    replay, conflict, fresh = again.json()["results"]
    assert replay["error"] is None and replay["memory_id"] == first["results"][0]["memory_id"]
    assert conflict["error"]["type"] == "conflict" and conflict["memory_id"] is None
    assert fresh["error"] is None and fresh["status"] == "queued"
    assert await app.count("SELECT count(*) FROM memories WHERE kind = 'raw'") == 2
    assert await app.count("SELECT count(*) FROM memories WHERE content LIKE '%rye%'") == 0
    # A single remember with the key replays it too.
    single = await app.remember(carol["content"], idempotency_key="imp-1", mode="async")
    assert single["memory_id"] == first["results"][0]["memory_id"]
    assert await app.count("SELECT count(*) FROM memory_jobs WHERE job_type = 'extract'") == 2


async def test_a_bulk_item_replayed_by_its_idempotency_key_gets_the_answer_the_first_request_gave(app):
    """As for a single remember (test_remember: a replay returns the same answer), a finished
    first request is not reported as one still in flight."""
    carol = {"content": "Carol bakes sourdough on Fridays", "scope": {"user_id": "u1"}, "idempotency_key": "imp-1"}
    first = (await app.post("/api/memory/remember/batch", {"items": [carol]})).json()["results"][0]
    again = (await app.post("/api/memory/remember/batch", {"items": [carol]})).json()["results"][0]
    assert again == first
    single = await app.remember(carol["content"], idempotency_key="imp-1", mode="async")
    assert single == {k: v for k, v in first.items() if k not in ("index", "error")}


async def test_bulk_remember_over_the_limit_is_refused_whole(make_app):
    async with make_app(remember_batch_max=10) as app:
        over = await app.post("/api/memory/remember/batch", {"items": items(range(11))})
        assert over.status_code == 422, over.text
        error = over.json()["error"]
        assert error["type"] == "validation_error" and "10" in error["detail"]
        assert await app.count("SELECT count(*) FROM memories WHERE kind = 'raw'") == 0
        assert await app.count("SELECT count(*) FROM memory_jobs") == 0
        empty = await app.post("/api/memory/remember/batch", {"items": []})
        assert empty.status_code == 422 and empty.json()["error"]["type"] == "validation_error"
        at_limit = await app.post("/api/memory/remember/batch", {"items": items(range(10))})
        assert at_limit.status_code == 200 and at_limit.json()["stored"] == 10
        job = await app.wait_job(at_limit.json()["job_id"], "done", timeout_s=60)
        assert job["progress"] == {"done": 10, "total": 10, "parked": 0}


# -- bulk remembers written by a worker: the API stages them and waits -----------------------------

HOLD_A_STAGED_IMPORT = """
import asyncio, sys
import asyncpg
from engram.store import import_batches

async def main():
    conn = await asyncpg.connect(sys.argv[1])
    await conn.execute("BEGIN")
    print("ready", flush=True)
    while (batch := await import_batches.take(conn)) is None:
        await asyncio.sleep(0.01)
    await conn.execute("INSERT INTO memory_jobs (id, job_type, status, max_attempts) VALUES ($1, 'import', 'pending', 1)",
                       batch["id"])  # half of a write, as a writer killed mid-way leaves it
    print("holding", flush=True)
    await asyncio.sleep(120)

asyncio.run(main())
"""


async def test_a_bulk_remember_is_written_by_a_worker_process_while_the_api_waits(
        postgres, temporal, embedder, reranker, tmp_path):
    settings = app_settings(tmp_path / "data", await new_database(postgres), temporal_address=temporal.address,
                            import_handoff_s=60)
    async with running(settings, embedder, reranker) as api:
        worker = WorkerProcess(settings, tmp_path / "worker.log").start()
        try:
            started = time.monotonic()
            bulk = await api.post("/api/memory/remember/batch", {"items": items(range(20)) + [{"scope": {"user_id": "u1"}}]})
            assert bulk.status_code == 200, (bulk.text, worker.tail())
            assert time.monotonic() - started < 60  # the API writes a batch itself only after import_handoff_s
            body = bulk.json()
            assert (body["stored"], body["failed"]) == (20, 1) and body["results"][20]["error"]["type"] == "validation_error"
            assert await api.count("SELECT count(*) FROM memories") == 20
            assert await api.count("SELECT count(*) FROM import_batches") == 0  # the answer was collected
            await api.wait_job(body["job_id"], "done", timeout_s=60)
        finally:
            worker.stop()


async def test_an_import_whose_writer_is_killed_mid_write_is_written_once_by_the_api(
        postgres, temporal, embedder, reranker, tmp_path):
    settings = app_settings(tmp_path / "data", await new_database(postgres), temporal_address=temporal.address,
                            import_handoff_s=1.0)
    async with running(settings, embedder, reranker) as api:
        holder = subprocess.Popen([sys.executable, "-c", HOLD_A_STAGED_IMPORT, settings.postgres_dsn],
                                  stdout=subprocess.PIPE, cwd=Path(__file__).parent.parent)
        try:
            assert await asyncio.wait_for(asyncio.to_thread(holder.stdout.readline), 60) == b"ready\n"
            request = asyncio.create_task(api.post("/api/memory/remember/batch", {"items": items(range(5))}))
            line = await asyncio.wait_for(asyncio.to_thread(holder.stdout.readline), 30)
            assert line.strip() == b"holding"
            await asyncio.sleep(2.0)  # past the handoff: the API finds the batch held and waits
            assert not request.done()
            holder.send_signal(signal.SIGKILL)
            assert holder.wait(10) == -signal.SIGKILL
            bulk = await asyncio.wait_for(request, 30)
        finally:
            if holder.poll() is None:
                holder.kill()
        assert bulk.status_code == 200 and bulk.json()["stored"] == 5, bulk.text
        assert await api.count("SELECT count(*) FROM memories") == 5
        assert await api.count("SELECT count(*) FROM memory_jobs WHERE job_type = 'import'") == 1


async def test_a_staged_import_nobody_waits_for_any_more_is_written_by_a_worker(app):
    """The API staged it and went away (a crash, a client that hung up): the items are durable."""
    from engram.store import import_batches

    principal = dataclasses.asdict(await app.runtime.service.authenticate(app.admin_key))
    batch_id = uuid.uuid4()
    await import_batches.stage(app.pool, batch_id, principal=principal, items=items(range(3), {"user_id": "gone"}),
                               request_id=None, path="http", model={"provider": None, "model": None,
                                                                    "prompt_version": None})
    deadline = time.monotonic() + 60
    while await app.count("SELECT count(*) FROM import_batches WHERE id = $1 AND response IS NULL", batch_id):
        assert time.monotonic() < deadline, "no worker wrote the staged import"
        await asyncio.sleep(0.1)
    answered = await app.pool.fetchval("SELECT response FROM import_batches WHERE id = $1", batch_id)
    assert answered["stored"] == 3, answered  # kept for the purge: nobody collects it
    assert await app.count("SELECT count(*) FROM memories WHERE user_id = 'gone'") == 3
    await app.wait_job(str(batch_id), "done", timeout_s=60)


async def test_cli_import_reports_bad_lines_and_waits_until_every_item_is_processed(app, tmp_path):
    lines = [entry(1), "", json.dumps({"content": entry(2), "tags": ["river"]}), json.dumps({"content": ""}),
             entry(3), json.dumps({"content": entry(4), "scope": {"user_id": "u2"}})]
    source = tmp_path / "journal.jsonl"
    source.write_text("\n".join(lines) + "\n")
    async with serving(app) as url:
        env = {**os.environ, "ENGRAM_URL": url, "ENGRAM_API_KEY": app.admin_key}
        run = await asyncio.to_thread(subprocess.run, [ENGRAM, "import", str(source), "--user-id", "u1", "--wait",
                                                       "--batch-size", "3"],
                                      env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run.stderr  # one line failed
    assert "line 4: validation_error" in run.stderr
    summary = json.loads(run.stdout)
    assert summary["stored"] == 4 and summary["failed"] == 1 and len(summary["jobs"]) == 2
    for job_id in summary["jobs"]:
        assert (await app.job(job_id))["status"] == "done"
    scopes = await app.pool.fetch("SELECT user_id, count(*) AS n FROM memories GROUP BY user_id")
    assert {r["user_id"]: r["n"] for r in scopes} == {"u1": 3, "u2": 1}


# -- 6. while every provider is known down ------------------------------------------------------

async def test_while_every_provider_is_down_auto_answers_raw_saved_at_once_without_a_model_call_and_parks(
        postgres, temporal, embedder, reranker, llm, tmp_path):
    settings = app_settings(tmp_path / "data", await new_database(postgres), temporal_address=temporal.address,
                            **ollama_settings(llm))
    worker = frozenset({"worker"})
    go_down(llm)
    async with running(settings, embedder, reranker) as api:
        # A worker finds the provider down, once, and records it for every process.
        async with running(settings, embedder, roles=worker):
            first = await api.remember("Quinn grows chillies on the balcony", mode="async")
            await api.wait_job(first["job_id"], "parked")
        calls = len(llm.chat_requests())
        assert calls >= 1
        await asyncio.sleep(1.2)  # the API rereads provider_health at most every second

        # No worker runs now: an `auto` remember that waited for its first pass would wait out
        # its whole pipeline_timeout_ms and answer `queued`.
        slowest = 0.0
        answers = []
        for i in range(50):
            started = time.monotonic()
            answers.append(await api.remember(entry(i), mode="auto", pipeline_timeout_ms=5_000))
            slowest = max(slowest, time.monotonic() - started)
        assert {a["status"] for a in answers} == {"raw_saved"}
        assert slowest < 2, slowest
        assert all(a["warnings"] and a["warnings"][0].startswith("provider_unavailable") for a in answers)
        assert len(llm.chat_requests()) == calls

        async with running(settings, embedder, roles=worker):
            await until(lambda: job_states(api.pool), lambda st: st == {"parked": 51}, "every job parked")
            for answer in answers[:5]:
                job = await api.job(answer["job_id"])
                assert job["status"] == "parked" and job["last_error_code"] == "ProviderUnavailable"
                assert job["attempt_count"] == 0 and job["next_attempt_at"] is None
                assert job["outcome"] == "raw_saved"
                memory = (await api.get(f"/api/memory/{answer['memory_id']}")).json()
                assert memory["extraction_status"] == "unprocessed"
            hits = await api.search("Journal entry 00007 herons")
            assert answers[7]["memory_id"] in {h["memory"]["id"] for h in hits}

            ready = await api.http.get("/readyz")
            assert ready.status_code == 200
            pipeline = ready.json()["components"]["pipeline"]
            assert pipeline["parked"] == 51 and pipeline["parked_because"] == {"ProviderUnavailable": 51}
            assert list(pipeline["providers_down"]) == [PROVIDER]
            await asyncio.sleep(2 * settings.provider_probe_max_s)  # the drain probes; it calls no chat
            assert len(llm.chat_requests()) == calls
