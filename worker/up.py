"""`engram up`: the whole service on the embedded stack, in one supervised process tree.

Starts (unless settings point at a real server instead) embedded Postgres, the Temporal dev
server with its Web UI, then in this process the migrations, the Qdrant edge shard, the
worker, the outbox dispatcher and the HTTP API. Ctrl-C stops everything in reverse order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

import uvicorn

from api.http import create_app
from engram import logs
from engram.domain import auth
from engram.settings import Settings
from worker.embedded import EmbeddedPostgres, EmbeddedTemporal, supervise
from worker.runtime import Runtime
from worker.startup import prepare_store

log = logging.getLogger("engram.up")


async def ensure_dev_key(runtime: Runtime) -> str:
    """The development admin key: reused from `$ENGRAM_DATA_DIR/api-key`, else created there."""
    path = runtime.settings.data_dir / "api-key"
    key = runtime.settings.dev_api_key or (path.read_text().strip() if path.exists() else auth.new_key())
    await runtime.install_admin_key(key)
    path.write_text(key + "\n")
    path.chmod(0o600)
    return key


class _Server(uvicorn.Server):
    """uvicorn without its own signal capture: `up` installs handlers that stop the API first
    and then the child servers, instead of uvicorn re-raising the signal at the end."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield

    def request_stop(self) -> None:
        if self.should_exit:
            self.force_exit = True  # a second Ctrl-C: stop waiting for open requests
        self.should_exit = True


async def up(settings: Settings) -> None:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    children: dict[str, object] = {}
    if not settings.postgres_dsn:
        pg = EmbeddedPostgres(settings.data_dir / "postgres", settings.embedded_postgres_port)
        pg.start()
        children["postgres"] = pg
        settings = settings.model_copy(update={"postgres_dsn": pg.dsn()})
    if not settings.temporal_address:
        temporal = EmbeddedTemporal(settings.data_dir / "temporal", settings.temporal_grpc_port,
                                    settings.temporal_ui_port)
        temporal.start()
        children["temporal"] = temporal
        settings = settings.model_copy(update={"temporal_address": temporal.address})
    supervisor = asyncio.create_task(supervise(children))
    try:
        @contextlib.asynccontextmanager
        async def runtime_factory():
            await prepare_store(settings)
            runtime = await Runtime.open(settings)
            try:
                key = await ensure_dev_key(runtime)
                _announce(settings, key)
                yield runtime
            finally:
                await runtime.close()

        config = uvicorn.Config(create_app(runtime_factory), host=settings.http_host, port=settings.http_port,
                                log_config=None, access_log=False)
        server = _Server(config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, server.request_stop)
        await server.serve()
        if server.started is False:
            raise SystemExit("engram up: the service did not start (see the log above)")
    finally:
        supervisor.cancel()
        for name in reversed(list(children)):
            log.info("stopping %s", name)
            children[name].stop()


def _announce(settings: Settings, key: str) -> None:
    ui = f"http://127.0.0.1:{settings.temporal_ui_port}" if settings.temporal_address.endswith(
        f":{settings.temporal_grpc_port}") else "(external Temporal)"
    print(
        "\nEngram is up.\n"
        f"  HTTP API      http://{settings.http_host}:{settings.http_port}   (GET /readyz)\n"
        f"  Postgres      {settings.postgres_dsn}\n"
        f"  Temporal      {settings.temporal_address}   Web UI {ui}\n"
        f"  Qdrant        {settings.qdrant_url or settings.data_dir / 'qdrant'}\n"
        f"  API key       {key}   (saved in {settings.data_dir / 'api-key'})\n"
        "Ctrl-C stops everything.\n",
        flush=True,
    )


def main() -> None:
    logs.configure()
    asyncio.run(up(Settings()))
