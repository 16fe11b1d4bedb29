"""Shared fixtures: one real Postgres and one real Temporal dev server per test session,
a fresh database (cloned from a migrated template) and a fresh task queue per app, and a
scripted fake LLM server. Nothing but the LLM is faked.

The session's servers skip fsync and apps keep their data directories in RAM where the machine
has room (`app_root`): what a test checks survives a killed process either way, and on our disks
syncing took the suite from ~14 to ~20 minutes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest
import uvicorn

from api.http import create_app
from engram.domain import auth
from engram.inference.embedder import Embedder, model_files
from engram.settings import Settings
from engram.store import migrate as db
from engram.store import keys
from tests.fakes.llm_server import FakeLLMServer
from worker.embedded import EmbeddedPostgres, EmbeddedTemporal, free_port
from worker.runtime import Runtime
from worker.startup import prepare_store

TEMPLATE_DB = "engram_template"
DEFAULT_MODEL = Settings.model_fields["embedding_model"].default


@pytest.fixture(scope="session", autouse=True)
async def _session_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


@pytest.fixture(autouse=True)
def _hang_report(request, _session_loop):
    """Shortly before pytest-timeout ends a hung run (it prints only threads), print where every
    task on the event loop is waiting: for async code, that is where the hang is."""
    timeout = request.config.getini("timeout")
    if not timeout or float(timeout) <= 30:
        yield
        return

    def print_tasks() -> None:
        print(f"\n--- {request.node.nodeid} still running: event loop tasks ---", file=sys.stderr)
        for task in asyncio.all_tasks(_session_loop):
            task.print_stack(limit=8, file=sys.stderr)

    timer = threading.Timer(float(timeout) - 20, lambda: _session_loop.call_soon_threadsafe(print_tasks))
    timer.daemon = True
    timer.start()
    yield
    timer.cancel()


@pytest.fixture(scope="session")
def tmp_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("engram")


# A RAM-backed directory, where the machine has one with this much room: see `app_root`.
RAM_DIR, RAM_DIR_FREE = Path("/dev/shm"), 2 << 30


@pytest.fixture(scope="session")
def ram_root(tmp_root) -> Iterator[Path]:
    """This worker's directory in RAM_DIR, removed at the end (and, if the worker was killed
    instead, by the next session); tmp_root where there is none."""
    try:
        _remove_orphans()
        if shutil.disk_usage(RAM_DIR).free < RAM_DIR_FREE:
            raise OSError("too full")
        root = Path(tempfile.mkdtemp(prefix=f"engram-tests-{os.getpid()}-", dir=RAM_DIR))
    except OSError:
        yield tmp_root
        return
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _remove_orphans() -> None:
    """The RAM directories of test workers that are gone (killed, so never cleaned up)."""
    for leftover in RAM_DIR.glob("engram-tests-*-*"):
        pid = leftover.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(leftover, ignore_errors=True)


@pytest.fixture
def app_root(ram_root) -> Iterator[Path]:
    """Where a test's apps keep their data directories (their vector index shards), removed after
    the test. In RAM: qdrant-edge syncs each file of a new shard to disk, 0.25 of an app's 0.55 s
    start on our disks, and the suite starts about a thousand apps. Nothing a test checks of a
    shard depends on the disk under it."""
    root = ram_root / uuid.uuid4().hex[:8]
    root.mkdir()
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres(tmp_root):
    server = EmbeddedPostgres(tmp_root / "pg", free_port(), fsync=False)
    server.start()
    asyncio.run(_make_template(server))
    yield server
    server.stop()


async def _make_template(server: EmbeddedPostgres) -> None:
    conn = await asyncpg.connect(server.dsn("postgres"))
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE_DB}")
        await conn.execute(f"CREATE DATABASE {TEMPLATE_DB}")
    finally:
        await conn.close()
    await db.migrate(server.dsn(TEMPLATE_DB))


@pytest.fixture(scope="session")
def temporal(tmp_root):
    server = EmbeddedTemporal(tmp_root / "temporal", free_port(), free_port(), headless=True, fsync=False)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    return Embedder.open(model_files(DEFAULT_MODEL), threads=2)


@pytest.fixture(scope="session")
def reranker():
    from engram.recall.rerank import CrossEncoder, ms_marco_files

    return CrossEncoder.open(ms_marco_files(), threads=2)


@pytest.fixture(scope="session")
def fake_llm():
    with FakeLLMServer() as server:
        yield server


@pytest.fixture(autouse=True)
def _reset_fake_llm(request):
    if "fake_llm" in request.fixturenames:
        request.getfixturevalue("fake_llm").reset()


async def new_database(postgres: EmbeddedPostgres, template: str = TEMPLATE_DB) -> str:
    """A fresh database cloned from `template` (default: the migrated one); returns its DSN."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(postgres.dsn("postgres"))
    try:
        await conn.execute(f"CREATE DATABASE {name} TEMPLATE {template}")
    finally:
        await conn.close()
    return postgres.dsn(name)


class App:
    """A running Engram (API + worker + dispatcher) on a fresh database and task queue,
    reached through its real HTTP gateway in-process."""

    def __init__(self, runtime: Runtime, http: httpx.AsyncClient, admin_key: str) -> None:
        self.runtime = runtime
        self.http = http
        self.admin_key = admin_key
        self.settings = runtime.settings
        self.pool = runtime.pool

    async def key(self, role: str = "writer", scopes: list[str] | None = None) -> str:
        key = auth.new_key()
        await keys.insert(self.pool, key_id=uuid.uuid4(), name=f"{role}-{key[-6:]}", key_hash=auth.hash_key(key),
                          role=role, scopes=scopes or ["*"])
        return key

    async def post(self, path: str, body, key: str | None = None) -> httpx.Response:
        return await self.http.post(path, json=body, headers=self._auth(key))

    async def get(self, path: str, key: str | None = None, **params) -> httpx.Response:
        return await self.http.get(path, params=params, headers=self._auth(key))

    def _auth(self, key: str | None) -> dict:
        return {"Authorization": f"Bearer {key or self.admin_key}"}

    async def remember(self, content: str, scope: dict | None = None, **fields) -> dict:
        response = await self.post("/api/memory/remember", {"content": content, "scope": scope or {"user_id": "u1"},
                                                             **fields})
        assert response.status_code == 200, response.text
        return response.json()

    async def search(self, query: str, scope: dict | None = None, **fields) -> list[dict]:
        response = await self.post("/api/memory/search", {"query": query, "scope": scope or {"user_id": "u1"},
                                                          **fields})
        assert response.status_code == 200, response.text
        return response.json()["results"]

    async def forget(self, memory_id: str, reason: str = "the test forgets it") -> dict:
        response = await self.http.delete(f"/api/memory/{memory_id}", params={"reason": reason},
                                          headers=self._auth(None))
        assert response.status_code == 200, response.text
        return response.json()

    async def job(self, job_id: str) -> dict:
        response = await self.get(f"/api/memory/jobs/{job_id}")
        assert response.status_code == 200, response.text
        return response.json()

    async def wait_job(self, job_id: str, status: str | tuple = ("done",), timeout_s: float = 30) -> dict:
        wanted = (status,) if isinstance(status, str) else status
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            job = await self.job(job_id)
            if job["status"] in wanted:
                return job
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"job {job_id} still {job['status']} after {timeout_s} s: {job}")
            await asyncio.sleep(0.1)

    async def count(self, sql: str, *args) -> int:
        return await self.pool.fetchval(sql, *args)


def app_settings(tmp_path: Path, dsn: str, **overrides) -> Settings:
    base = dict(
        data_dir=tmp_path, postgres_dsn=dsn,
        temporal_task_queue=f"tq-{uuid.uuid4().hex[:8]}", llm_provider="none", llm_secondary="none",
        extraction_backoff_initial_s=0.3, extraction_backoff_max_s=1.0, extraction_max_attempts=5,
        llm_timeout_s=5.0, dispatcher_interval_s=0.2, postgres_pool_min=1, postgres_pool_max=30,
        provider_probe_initial_s=0.2, provider_probe_max_s=1.0, drain_idle_s=0.2, drain_rate_per_s=1000,
        ingest_batch_window_ms=5,
        rerank_budget_ms=0,  # the whole top N, however busy the machine: the budget has its own tests
    )
    base.update(overrides)
    return Settings(**base)


@contextlib.asynccontextmanager
async def running_app(settings: Settings, embedder: Embedder, reranker=None):
    await prepare_store(settings)
    runtime = await Runtime.open(settings, embedder=embedder, reranker=reranker)
    admin_key = auth.new_key()
    await runtime.install_admin_key(admin_key, name="admin")
    app = create_app(None)
    app.state.runtime = runtime
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://engram.test", timeout=60) as http:
            yield App(runtime, http, admin_key)
    finally:
        await runtime.close()


@contextlib.asynccontextmanager
async def serving(app: App):
    """`app`'s HTTP gateway on a real uvicorn server on a loopback port; yields its base URL.
    For what an in-process transport cannot show: keep-alive connections, chunked bodies."""
    web = create_app(None)
    web.state.runtime = app.runtime
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(web, host="127.0.0.1", port=port, lifespan="off", log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # raises why it could not start
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@pytest.fixture
def make_app(postgres, temporal, embedder, reranker, app_root):
    """`async with make_app(**setting_overrides) as app:` a fresh Engram."""

    @contextlib.asynccontextmanager
    async def factory(**overrides):
        """Overrides are settings; `postgres_dsn` and `data_dir` reopen an earlier app's state."""
        dsn = overrides.pop("postgres_dsn", None) or await new_database(postgres)
        data_dir = overrides.pop("data_dir", None) or app_root / uuid.uuid4().hex[:6]
        overrides.setdefault("temporal_address", temporal.address)
        settings = app_settings(data_dir, dsn, **overrides)
        async with running_app(settings, embedder, reranker) as app:
            yield app

    return factory


@pytest.fixture
async def app(make_app):
    async with make_app() as running:
        yield running


def ollama_settings(fake_llm: FakeLLMServer) -> dict:
    return {"llm_provider": "ollama", "ollama_url": fake_llm.url}


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"
