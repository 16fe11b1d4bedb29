"""`engram up`: the whole service on the embedded stack, as one supervised process tree.

Starts (unless settings point at a real server instead) embedded Postgres and the Temporal dev
server with its Web UI, prepares the store, then runs the API and the worker as two child
processes, so that a busy worker cannot hold the API's event loop or its GIL. The API process
owns the in-process Qdrant shard (it searches it, and hosts the index writes); the worker
embeds, extracts and drains at a lower CPU priority. With the `local` LLM provider the model
server (worker.local_llm) is one more child. A child that crashes is restarted; Ctrl-C stops
the API, then the worker, then the model server, then Temporal, then Postgres. If `engram up`
is killed outright, every child gets SIGTERM from the kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys

import httpx

from engram import logs
from engram.domain import auth
from engram.domain.errors import ConfigError
from engram.settings import Settings
from engram.store import keys
from engram.store import pool as pool_module
from worker import huge_pages
from worker.embedded import (
    CrashLoop, EmbeddedPostgres, EmbeddedTemporal, EngramChild, supervise, wait_until_free,
)
from worker.local_llm import local_llm_server
from worker.startup import prepare_store

log = logging.getLogger("engram.up")


async def ensure_dev_key(settings: Settings) -> str:
    """The development admin key: reused from `$ENGRAM_DATA_DIR/api-key`, else created there."""
    path = settings.data_dir / "api-key"
    key = settings.dev_api_key or (path.read_text().strip() if path.exists() else auth.new_key())
    conn = await pool_module.connect(settings.postgres_dsn)
    try:
        await keys.install_admin(conn, key, name="dev")
    finally:
        await conn.close()
    path.write_text(key + "\n")
    path.chmod(0o600)
    return key


async def up(settings: Settings) -> None:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        llm = local_llm_server(settings)  # checked before anything starts: a missing model stops us at once
    except ConfigError as exc:
        raise SystemExit(f"engram up: {exc}") from exc
    servers: dict[str, object] = {}
    services: dict[str, EngramChild] = {}
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        if not settings.postgres_dsn:
            pg = EmbeddedPostgres(settings.data_dir / "postgres", settings.embedded_postgres_port,
                                  shared_buffers_mb=settings.embedded_postgres_shared_buffers_mb or None,
                                  stat_statements=settings.embedded_postgres_stat_statements)
            pg.start()
            servers["postgres"] = pg
            settings = settings.model_copy(update={"postgres_dsn": pg.dsn()})
        if not settings.temporal_address:
            temporal = EmbeddedTemporal(settings.data_dir / "temporal", settings.temporal_grpc_port,
                                        settings.temporal_ui_port)
            temporal.start()
            servers["temporal"] = temporal
            settings = settings.model_copy(update={"temporal_address": temporal.address})
        if llm is not None:
            llm.start()
            servers["local-llm"] = llm
        await prepare_store(settings)
        key = await ensure_dev_key(settings)
        env = huge_pages.environment({**os.environ, "ENGRAM_POSTGRES_DSN": settings.postgres_dsn,
                                      "ENGRAM_TEMPORAL_ADDRESS": settings.temporal_address,
                                      "ENGRAM_DATA_DIR": str(settings.data_dir)}, settings.malloc_huge_pages)
        wait_until_free(settings.http_port)  # a killed predecessor's API may still hold them
        wait_until_free(settings.grpc_port)
        for role in ("worker", "api"):
            services[role] = EngramChild(role, env)
            services[role].start()
        watch = asyncio.create_task(supervise({**servers, **services}))
        ready = asyncio.create_task(_wait_ready(settings))
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({ready, watch, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if ready.done() and not ready.exception():
            _announce(settings, key)
            await asyncio.wait({watch, stopped}, return_when=asyncio.FIRST_COMPLETED)
        for task in (ready, stopped, watch):
            task.cancel()
        if watch.done() and not watch.cancelled() and isinstance(watch.exception(), CrashLoop):
            raise SystemExit(f"engram up: {watch.exception()}")
    finally:
        for name in ("api", "worker"):
            if name in services:
                log.info("stopping %s", name)
                services[name].stop()
        for name in reversed(list(servers)):
            log.info("stopping %s", name)
            servers[name].stop()


async def _wait_ready(settings: Settings, timeout_s: float = 300) -> None:
    url = f"http://{settings.http_host}:{settings.http_port}/readyz"
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with httpx.AsyncClient(timeout=2) as client:
        while asyncio.get_running_loop().time() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url)).status_code == 200:
                    return
            await asyncio.sleep(0.2)
    raise TimeoutError(f"the API did not become ready within {timeout_s} s")


def _announce(settings: Settings, key: str) -> None:
    ui = f"http://127.0.0.1:{settings.temporal_ui_port}" if settings.temporal_address.endswith(
        f":{settings.temporal_grpc_port}") else "(external Temporal)"
    print(
        "\nEngram is up.\n"
        f"  HTTP API      http://{settings.http_host}:{settings.http_port}   (GET /readyz)\n"
        f"  gRPC API      {settings.grpc_host}:{settings.grpc_port}   (engram.memory.v1; health and reflection)\n"
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


def child_main() -> None:
    """`python -m worker.up api|worker`: one of `engram up`'s children (worker.main does the work)."""
    from worker.main import run_api, run_worker

    logs.configure()
    role = sys.argv[1]
    settings = Settings()
    huge_pages.ensure(settings)  # set already by `engram up`: this restarts a hand-started child only
    if role == "worker":
        asyncio.run(run_worker(settings))
    else:
        run_api(settings)


if __name__ == "__main__":
    child_main()
