"""`engram worker` and `engram api`: the scaled deployment's processes (docker-compose.yml).

Both need a real Postgres, Temporal and Qdrant server (ENGRAM_POSTGRES_DSN,
ENGRAM_TEMPORAL_ADDRESS, ENGRAM_QDRANT_URL). The worker prepares the store (worker.startup);
an API process waits until it has.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal

import uvicorn

from api.http import create_app
from engram import logs
from engram.domain.errors import ConfigError
from engram.settings import Settings
from worker.runtime import Runtime
from worker.startup import prepare_store, wait_until_prepared


def _require_servers(settings: Settings) -> None:
    missing = [name for name, value in (("ENGRAM_POSTGRES_DSN", settings.postgres_dsn),
                                        ("ENGRAM_TEMPORAL_ADDRESS", settings.temporal_address),
                                        ("ENGRAM_QDRANT_URL", settings.qdrant_url)) if not value]
    if missing:
        raise ConfigError(f"set {', '.join(missing)} (or use `engram up` for the embedded stack)")


async def run_worker(settings: Settings) -> None:
    """Prepare the store, then run the Temporal worker and the outbox dispatcher until SIGINT/SIGTERM."""
    await prepare_store(settings)
    runtime = await Runtime.open(settings, run_worker=True, run_dispatcher=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runtime.close()


def worker_main() -> None:
    logs.configure()
    settings = Settings()
    _require_servers(settings)
    asyncio.run(run_worker(settings))


def api_main() -> None:
    logs.configure()
    settings = Settings()
    _require_servers(settings)

    @contextlib.asynccontextmanager
    async def runtime_factory():
        await wait_until_prepared(settings)  # by a worker: API replicas never migrate or rebuild
        runtime = await Runtime.open(settings, run_worker=False, run_dispatcher=False)
        try:
            if settings.dev_api_key:  # the deployment's first admin key
                await runtime.install_admin_key(settings.dev_api_key, name="bootstrap")
            yield runtime
        finally:
            await runtime.close()

    uvicorn.run(create_app(runtime_factory), host=settings.http_host, port=settings.http_port, log_config=None)
