"""Changing the embedding model: a durable ReembedWorkflow moves every memory to the new model
while the old one keeps serving, writes during the run get both, and one transaction switches."""

from __future__ import annotations

import asyncio

from engram.store import embeddings
from tests.conftest import DEFAULT_MODEL
from tests.test_workflow import record_history

OTHER_MODEL = "all-MiniLM-L6-v2"
TOPICS = ["sailing a catamaran", "baking rye bread", "learning the violin", "growing chilli peppers",
          "restoring a vintage motorbike", "training for a triathlon", "painting with watercolours",
          "brewing kombucha", "writing a fantasy novel", "keeping honeybees"]
SCOPE = {"user_id": "re"}


async def _fill(app, count: int) -> dict[str, str]:
    ids = {}
    for n in range(count):
        topic = TOPICS[n % len(TOPICS)]
        text = f"Zoe spent week {n} {topic}"
        ids[text] = (await app.remember(text, scope=SCOPE, mode="async"))["memory_id"]
    return ids


async def _wait_all_done(app, timeout_s: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while await app.count("SELECT count(*) FROM memory_jobs WHERE job_type = 'extract' AND status <> 'done'"):
        assert asyncio.get_running_loop().time() < deadline, "remember jobs did not finish"
        await asyncio.sleep(0.1)


async def test_changing_the_embedder_reembeds_under_writes_and_never_goes_dark(make_app, tmp_path):
    async with make_app(data_dir=tmp_path / "state") as first:
        await _fill(first, 40)
        await _wait_all_done(first)
        dsn = first.settings.postgres_dsn
    assert DEFAULT_MODEL != OTHER_MODEL

    async with make_app(postgres_dsn=dsn, data_dir=tmp_path / "state", embedding_model=OTHER_MODEL,
                        reembed_batch_size=4) as app:
        state = await embeddings.state(app.pool)
        assert (state.active, state.target) == (DEFAULT_MODEL, OTHER_MODEL)
        job_id = str(state.reembed_job)
        searches, written = 0, []
        while True:
            # Recall keeps answering from the old model, with its dense leg, all the way through.
            hits = await app.search("who keeps bees?", scope=SCOPE, limit=3)
            assert "honeybees" in hits[0]["memory"]["content"]
            searches += 1
            if len(written) < 8:
                written.append((await app.remember(f"Zoe during the switch, note {len(written)}: loves origami",
                                                   scope=SCOPE, mode="async"))["memory_id"])
            job = await app.job(job_id)
            if job["status"] == "done":
                break
            await asyncio.sleep(0.05)
        assert searches > 3, "the re-embed finished before search could be watched during it"
        assert job["progress"]["done"] == job["progress"]["total"] >= 40
        await _wait_all_done(app)

        state = await embeddings.state(app.pool)
        assert (state.active, state.target) == (OTHER_MODEL, None)
        rows = await app.pool.fetch("SELECT embedding_model, count(*) AS n FROM memories GROUP BY 1")
        assert {r["embedding_model"]: r["n"] for r in rows} == {OTHER_MODEL: 40 + len(written)}
        assert await app.count("SELECT count(*) FROM memory_embeddings") == 0
        await asyncio.sleep(0.6)  # past the active-model cache
        response = await app.post("/api/memory/search", {"query": "origami", "scope": SCOPE, "limit": 20,
                                                         "explain": True})
        body = response.json()
        assert body["explain"]["embed_query"]["model"] == OTHER_MODEL
        found = {h["memory"]["id"]: h["components"]["vector"] for h in body["results"]}
        assert set(written) <= set(found) and all(found[m] > 0 for m in written)
        history = await app.runtime.client.get_workflow_handle(f"reembed-{job_id}").fetch_history()
        record_history(history, "reembed_under_writes")


async def test_a_reembed_stopped_mid_run_is_finished_by_the_next_worker(make_app, tmp_path):
    async with make_app(data_dir=tmp_path / "state") as first:
        await _fill(first, 60)
        await _wait_all_done(first)
        dsn = first.settings.postgres_dsn
    settings = dict(postgres_dsn=dsn, data_dir=tmp_path / "state", embedding_model=OTHER_MODEL, reembed_batch_size=3)
    async with make_app(**settings) as app:
        job_id = str((await embeddings.state(app.pool)).reembed_job)
        while not (await app.job(job_id)).get("progress"):
            await asyncio.sleep(0.05)
        task_queue = app.settings.temporal_task_queue
    progress = (await _job_row(dsn, job_id))
    assert progress["status"] != "done", "stopped too late to test a resume"

    async with make_app(temporal_task_queue=task_queue, **settings) as app:
        deadline = asyncio.get_running_loop().time() + 60
        while (job := await app.job(job_id))["status"] != "done":
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.1)
        assert job["progress"]["done"] == job["progress"]["total"] == 60
        assert await app.count("SELECT count(*) FROM memories WHERE embedding_model = $1", OTHER_MODEL) == 60


async def _count_embedded(dsn: str, model: str) -> int:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval("SELECT count(*) FROM memories WHERE embedding_model = $1"
                                   " AND embedding IS NOT NULL", model)
    finally:
        await conn.close()


async def _job_row(dsn: str, job_id: str) -> dict:
    import uuid

    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        return dict(await conn.fetchrow("SELECT status, payload FROM memory_jobs WHERE id = $1", uuid.UUID(job_id)))
    finally:
        await conn.close()


async def test_a_reembed_survives_its_process_being_killed(make_app, temporal, tmp_path):
    import signal
    import time
    import uuid as uuidlib

    from tests.process import FAST_FAILOVER, EngramProcess

    # The memories to re-embed are written in-process, in one request: only the re-embed has to
    # run (and be killed) in `engram up`, and a start of it costs seconds.
    async with make_app(data_dir=tmp_path / "data") as first:
        stored = await first.post("/api/memory/remember/batch", {"items": [
            {"content": f"Zoe note {n}: {TOPICS[n % len(TOPICS)]}", "scope": SCOPE} for n in range(60)]})
        assert stored.status_code == 200 and stored.json()["stored"] == 60, stored.text
        await _wait_all_done(first)
        dsn = first.settings.postgres_dsn
    assert await _count_embedded(dsn, DEFAULT_MODEL) == 60

    engram = EngramProcess(tmp_path / "data", postgres_dsn=dsn, temporal_address=temporal.address,
                           llm_provider="none", temporal_task_queue=f"rk-{uuidlib.uuid4().hex[:6]}",
                           dispatcher_interval_s=0.2, embedding_model=OTHER_MODEL, reembed_batch_size=3,
                           **FAST_FAILOVER)
    engram.start()
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        job_id = await conn.fetchval("SELECT reembed_job FROM embedding_state")
        deadline = time.monotonic() + 60
        while not await conn.fetchval("SELECT payload ? 'done' FROM memory_jobs WHERE id = $1", job_id):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        engram.stop(signal.SIGKILL)
        status = await conn.fetchval("SELECT status FROM memory_jobs WHERE id = $1", job_id)
        assert status != "done", "killed too late to test a resume"

        engram.start()
        deadline = time.monotonic() + 120
        while await conn.fetchval("SELECT status FROM memory_jobs WHERE id = $1", job_id) != "done":
            assert time.monotonic() < deadline, "the re-embed did not resume after the kill"
            await asyncio.sleep(0.2)
        assert await conn.fetchval("SELECT active_model FROM embedding_state") == OTHER_MODEL
        assert await conn.fetchval("SELECT count(*) FROM memories WHERE embedding_model = $1", OTHER_MODEL) == 60
        with engram.client() as http:
            hits = http.post("/api/memory/search", json={"query": "who keeps bees?", "scope": SCOPE}).json()
            assert "honeybees" in hits["results"][0]["memory"]["content"]
    finally:
        await conn.close()
        if engram.proc.poll() is None:
            engram.stop()
