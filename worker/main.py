"""`engram worker` and `engram api`: the service's two processes. The scaled deployment
(docker-compose.yml) runs them against real servers; `engram up` runs them as its children
against the embedded stack.

The worker prepares the store (worker.startup); an API process waits until it has. The worker
runs at a lower CPU priority (ENGRAM_WORKER_NICENESS), so that a backlog it works off yields the
CPU to searches.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal

import uvicorn

from api.grpc.server import serving as serving_grpc
from api.http import create_app
from engram import logs
from engram.domain.errors import ConfigError
from engram.settings import Settings
from worker import huge_pages
from worker.runtime import Runtime
from worker.startup import prepare_store, wait_until_prepared


def _require_servers(settings: Settings) -> None:
    missing = [name for name, value in (("ENGRAM_POSTGRES_DSN", settings.postgres_dsn),
                                        ("ENGRAM_TEMPORAL_ADDRESS", settings.temporal_address),
                                        ("ENGRAM_QDRANT_URL", settings.qdrant_url)) if not value]
    if missing:
        raise ConfigError(f"set {', '.join(missing)} (or use `engram up` for the embedded stack)")


async def run_worker(settings: Settings) -> None:
    """Prepare the store, then run the Temporal worker, the dispatcher and the drain until
    SIGINT/SIGTERM."""
    os.nice(settings.worker_niceness)
    await prepare_store(settings)
    runtime = await Runtime.open(settings, roles=frozenset({"worker"}))
    _freeze_start_up_heap()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runtime.close()


def _freeze_start_up_heap() -> None:
    """Put what start-up left alive (modules, models, clients: about 200,000 objects) out of the
    cycle collector's reach. Each full collection walked them all: a pause of the event loop of
    up to 110 ms every few hundred searches. Objects made later are collected as before. What is
    garbage already is collected first; a frozen object that becomes garbage later is never
    collected, which start-up's objects, living as long as the process, do not."""
    gc.collect()
    gc.freeze()


def run_api(settings: Settings) -> None:
    """Serve the HTTP API, and the gRPC API on its own port over the same runtime, until
    SIGINT/SIGTERM."""

    @contextlib.asynccontextmanager
    async def runtime_factory():
        await wait_until_prepared(settings)  # by a worker: API replicas never migrate or rebuild
        runtime = await Runtime.open(settings, roles=frozenset({"api"}))
        try:
            if settings.dev_api_key:  # the deployment's first admin key
                await runtime.install_admin_key(settings.dev_api_key, name="bootstrap")
            async with serving_grpc(runtime, settings.grpc_host, settings.grpc_port):
                _freeze_start_up_heap()
                yield runtime
        finally:
            await runtime.close()

    uvicorn.run(create_app(runtime_factory), host=settings.http_host, port=settings.http_port, log_config=None,
                access_log=False, loop="asyncio", http="httptools")  # httptools: see pyproject.toml


def worker_main() -> None:
    logs.configure()
    settings = Settings()
    _require_servers(settings)
    huge_pages.ensure(settings)
    asyncio.run(run_worker(settings))


def api_main() -> None:
    logs.configure()
    settings = Settings()
    _require_servers(settings)
    huge_pages.ensure(settings)
    run_api(settings)
