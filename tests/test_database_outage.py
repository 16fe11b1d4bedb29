"""Postgres stopped for real under a running Engram: every call that needs it answers 503
`database_unavailable` with Retry-After (never a 500, never a traceback), nothing already stored
is lost, and once Postgres is back the same process stores and processes writes again (the
pool, the dispatcher and the notification listener all recover on their own)."""

from __future__ import annotations

import asyncio
import logging

from engram.store import migrate as db
from tests.process import free_port
from worker.embedded import EmbeddedPostgres


async def test_postgres_stopped_answers_503_and_loses_nothing_and_the_service_recovers_when_it_returns(
        make_app, tmp_path, caplog):
    server = EmbeddedPostgres(tmp_path / "pg-outage", free_port())
    await asyncio.to_thread(server.start)
    try:
        await db.migrate(server.dsn())
        async with make_app(postgres_dsn=server.dsn()) as app:
            before = await app.remember("Omar tunes pianos", mode="sync")
            assert before["status"] == "processed", before

            await asyncio.to_thread(server.stop)
            caplog.clear()
            caplog.set_level(logging.WARNING)
            body = {"content": "Omar tunes harpsichords", "scope": {"user_id": "u1"}}
            calls = {
                "remember": app.post("/api/memory/remember", body),
                "bulk": app.post("/api/memory/remember/batch", {"items": [body]}),
                "search": app.post("/api/memory/search", {"query": "pianos", "scope": {"user_id": "u1"}}),
                "get": app.get(f"/api/memory/{before['memory_id']}"),
                "list": app.get("/api/memory", user_id="u1"),
                "job": app.get(f"/api/memory/jobs/{before['job_id']}"),
                "keys": app.get("/api/keys"),
            }
            for name, call in calls.items():
                response = await call
                assert response.status_code == 503, (name, response.text)
                assert response.json()["error"]["type"] == "database_unavailable", (name, response.text)
                assert response.headers["retry-after"] == "1", name
            assert (await app.http.get("/healthz")).status_code == 200
            assert (await app.http.get("/readyz")).status_code == 503
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR and r.name == "engram.http"]

            await asyncio.to_thread(server.start)
            after = await _remember_when_back(app, "Omar tunes harpsichords")
            job = await app.wait_job(after["job_id"], timeout_s=60)  # the dispatcher lived through it
            assert not [task.get_name() for task in app.runtime.tasks if task.done()]
            assert job["outcome"] in ("processed", None) and job["status"] == "done", job
            contents = {m["content"] for m in (await app.get("/api/memory", user_id="u1")).json()["items"]}
            assert contents == {"Omar tunes pianos", "Omar tunes harpsichords"}
            assert {hit["memory"]["content"] for hit in await app.search("who tunes harpsichords?")} >= contents
    finally:
        if server.proc is not None:
            await asyncio.to_thread(server.stop)


async def _remember_when_back(app, content: str, timeout_s: float = 30) -> dict:
    """The first remember Postgres answers after its restart (the pool reconnects on demand)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        response = await app.post("/api/memory/remember", {"content": content, "scope": {"user_id": "u1"},
                                                           "mode": "async"})
        if response.status_code != 503 or asyncio.get_running_loop().time() > deadline:
            assert response.status_code == 200, response.text
            return response.json()
        await asyncio.sleep(0.2)
