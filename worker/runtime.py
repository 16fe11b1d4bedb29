"""Wiring: open every client once, hand them to the service, the activities and the worker.

`Runtime` is what a process runs, by role: "api" (the HTTP service, and the waiter that hears
first passes) and "worker" (the Temporal worker, the dispatcher and the drain), or both (the
tests). `engram up` and the compose deployment run them as separate processes, so a busy worker
never holds the API's event loop or its GIL. The vector index's writes run where it can be
written: the in-process Qdrant shard has one owner, the API process (which searches it), so
there the API hosts the index activities on their own task queue; a Qdrant server is written by
the worker. A runtime only connects: the start-up work on the store (migrations, a BM25
rebuild, a re-embed job) is worker.startup's, run before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import timedelta

import asyncpg
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from activities.control import ControlActivities
from activities.forget import ForgetActivities
from activities.ingest import IndexActivities, IngestActivities
from activities.reembed import ReembedActivities
from activities.remember import RememberActivities
from activities.approval import ApprovalActivities
from activities.review import ReviewActivities
from engram import lexical_steps
from engram.domain.errors import ConfigError
from engram.domain.text import bm25_terms
from engram.inference.availability import Availability
from engram.inference.embedder import Embedder
from engram.inference.embedding_spaces import EmbeddingSpaces, Space
from engram.inference.providers import LLMProvider, build_provider_chain
from engram.inference.remote_embedders import PROBE_TEXT, open_embedder
from engram.inference.vector_index import EdgeIndex, QdrantServerIndex, VectorIndex, vector_name
from engram.ingest_steps import Retry
from engram.recall.pipeline import Recall
from engram.recall.rerank import CrossEncoder, LLMReranker, Reranker, ms_marco_files
from engram.changes import MemoryChanges
from engram.fact_steps import FactWriter
from engram.control import Control
from engram.forget import BatchForgets
from engram.integrity import Integrity
from engram.approvals import Approvals
from engram.reviews import Reviews
from engram.service import MemoryService
from engram.settings import Settings
from engram.store import embeddings, facts, import_batches, jobs, keys, lexical_index, provider_health
from engram.store import pool as pool_module
from engram.store import approvals as approvals_store
from engram.store.notifications import FirstPassWaiter, Wakeups, listen_forever
from worker.index_maintenance import IndexOptimizer
from worker.chain_sealer import ChainSealer
from worker.import_writers import ImportWriters
from worker.index_sync import IndexSync
from worker.outbox import Dispatcher
from worker.startup import analyzer_of
from worker.temporal_control import TemporalControlRuns
from worker.temporal_forget import TemporalForgetRuns
from worker.temporal_pipeline import TemporalPipeline, index_queue, job_llm_s
from worker.temporal_approval import TemporalApprovalRuns
from worker.temporal_review import TemporalReviewRuns
from workflows.control import ControlWorkflow
from workflows.drain import ExtractionDrainWorkflow
from workflows.forget import BatchForgetWorkflow
from workflows.ingest import IngestWorkflow
from workflows.reembed import ReembedWorkflow
from workflows.remember import RememberWorkflow
from workflows.approval import ApprovalWorkflow
from workflows.review import ReviewWorkflow

log = logging.getLogger(__name__)
ROLES = frozenset({"api", "worker"})


def open_index(settings: Settings, model: str) -> VectorIndex:
    """The vector index of one embedding model: a collection (or shard directory) per model,
    so a re-embed fills a new one while the old one serves."""
    return _open_collection(settings, vector_name(model))


def open_lexical_index(settings: Settings) -> VectorIndex:
    """The lexical index: sparse BM25 vectors, one collection (or shard directory) for every
    model, beside the embedding spaces' (engram.lexical_steps fills it)."""
    return _open_collection(settings, "lexical")


def _open_collection(settings: Settings, suffix: str) -> VectorIndex:
    """`<qdrant_collection>__<suffix>` on the Qdrant server, or that shard directory under data_dir."""
    name = f"{settings.qdrant_collection}__{suffix}"
    if settings.qdrant_url:
        from qdrant_client import AsyncQdrantClient

        client = AsyncQdrantClient(url=settings.qdrant_url, api_key=settings.qdrant_api_key or None)
        return QdrantServerIndex(client, name)
    return EdgeIndex(settings.data_dir / "qdrant" / name, search_threads=settings.index_search_threads)


def hosts_index(settings: Settings, roles: frozenset[str]) -> bool:
    """Whether a process of these roles writes the vector index (and runs its activities)."""
    return "worker" in roles if settings.qdrant_url else "api" in roles


@dataclass
class Runtime:
    settings: Settings
    pool: asyncpg.Pool
    spaces: EmbeddingSpaces
    providers: list[LLMProvider]
    client: Client
    service: MemoryService
    changes: MemoryChanges
    forgets: BatchForgets
    control: Control
    reviews: Reviews
    approvals: Approvals
    roles: frozenset[str] = ROLES
    lexical: VectorIndex | None = None  # the sparse BM25 index, where this process reads or writes it
    optimizer: IndexOptimizer | None = None  # where this process optimises the edge shards it writes
    tasks: list[asyncio.Task] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    # A remote embedder's readiness probe is a real (maybe billed) call: its answer is reused this long.
    embedder_probe_ttl_s: float = 30.0
    _embedder_probe: tuple[float, str, dict] | None = None  # (when, model, what it said)
    _closing: bool = False

    @classmethod
    async def open(cls, settings: Settings, *, embedder: Embedder | None = None,
                   reranker: Reranker | None = None, roles: frozenset[str] = ROLES) -> "Runtime":
        """Connect every client the roles need and start their background work. The store must
        be prepared (worker.startup). Raises ConfigError (bad provider settings, an unknown
        stemmer, a wrong model file, an LLM reranker without a rerank-capable primary provider)
        before anything starts."""
        # Checked before any client opens, so refusing leaves nothing to close.
        if settings.rerank_model == "llm" and (settings.llm_provider == "none" or not settings.llm_rerank):
            raise ConfigError(
                "ENGRAM_RERANK_MODEL=llm reranks with the primary LLM provider: set ENGRAM_LLM_PROVIDER to "
                "ollama or openai and ENGRAM_LLM_RERANK=true to declare its model able to judge relevance"
            )
        analyzer_of(settings)
        providers = build_provider_chain(settings)
        if settings.rerank_model == "none" or "api" not in roles:
            reranker = None
        elif settings.rerank_model == "llm":
            reranker = LLMReranker(providers[0])
        elif reranker is None:
            reranker = await asyncio.to_thread(CrossEncoder.open, ms_marco_files(), threads=settings.embedding_threads)
        # The BM25 tokenizer builds its Unicode pattern once per process (~0.15 s): here, not in
        # the first search or remember.
        await asyncio.to_thread(bm25_terms, "", settings.bm25_stemmer)
        # A worker needs a connected client; a pure API process may start before Temporal.
        client = await _connect_temporal(settings, lazy="worker" not in roles)
        pool = await pool_module.create_pool(settings.postgres_dsn, min_size=settings.postgres_pool_min,
                                             max_size=settings.postgres_pool_max)
        with_index = "api" in roles or hosts_index(settings, roles)
        try:
            state = await embeddings.state(pool)
            loaded = {embedder.name: embedder} if embedder is not None else {}
            spaces = {}
            for model in dict.fromkeys(m for m in (state.active, state.target) if m):
                model_embedder = loaded.get(model) or await open_embedder(settings, model)
                index = open_index(settings, model) if with_index else None
                if index is not None:
                    await index.ensure(model=model, dim=model_embedder.dim)
                spaces[model] = Space(model_embedder, index)
            embedding_spaces = EmbeddingSpaces(pool, spaces, active=state.active)
            lexical = open_lexical_index(settings) if with_index else None
            if lexical is not None:
                await lexical.ensure_sparse()
        except BaseException:
            await pool.close()
            raise
        availability = Availability(pool, providers)
        waiter = FirstPassWaiter(pool)
        integrity = Integrity(pool)
        control = Control(settings, pool, TemporalControlRuns(client, settings))
        recall = Recall(settings, pool, embedding_spaces, reranker, lexical)
        imports = Wakeups() if "api" in roles else None
        service = MemoryService(settings, pool, recall, waiter, availability, integrity, control, imports=imports)
        changes = MemoryChanges(settings, pool, embedding_spaces, integrity, control)
        forgets = BatchForgets(settings, pool, recall, changes, TemporalForgetRuns(client, settings), control)
        reviews = Reviews(pool, TemporalReviewRuns(client, settings), control)
        approvals = Approvals(pool, TemporalApprovalRuns(client, settings), control)
        rt = cls(settings, pool, embedding_spaces, providers, client, service, changes, forgets, control, reviews,
                 approvals, roles=roles, lexical=lexical)
        if "api" in roles:
            rt._start(listen_forever(settings.postgres_dsn, {jobs.FIRST_PASS: waiter.notified,
                                                              keys.REVOKED: service.forget_principals,
                                                              import_batches.WRITTEN: imports.notified}),
                      "api-listener")
        if "worker" in roles:
            facts = FactWriter(settings, pool, embedding_spaces, changes, control)
            ingest = IngestActivities(
                pool, embedding_spaces, availability, control, facts,
                retry=Retry(settings.extraction_backoff_initial_s, settings.extraction_backoff_max_s),
                lease_s=2 * settings.drain_batch_size * job_llm_s(settings) / settings.extraction_concurrency,
                concurrency=settings.extraction_concurrency,
            )
            legacy = RememberActivities(pool, embedding_spaces, providers, identity=_identity())
            rt._add_worker(Worker(client, task_queue=settings.temporal_task_queue,
                                  workflows=[IngestWorkflow, ExtractionDrainWorkflow, ReembedWorkflow, RememberWorkflow,
                                             BatchForgetWorkflow, ControlWorkflow, ReviewWorkflow, ApprovalWorkflow],
                                  activities=ingest.all() + legacy.all() + ForgetActivities(pool, changes, control).all()
                                  + ControlActivities(pool).all()
                                  + ReviewActivities(pool, changes, embedding_spaces, control).all()
                                  + ApprovalActivities(pool, changes).all(),
                                  sticky_queue_schedule_to_start_timeout=timedelta(
                                      seconds=settings.temporal_sticky_queue_timeout_s)))
            dispatcher = Dispatcher(TemporalPipeline(client, pool, settings), pool, settings)
            rt._start(dispatcher.run_forever(), "outbox-dispatcher")
            rt._start(ChainSealer(pool, settings).run_forever(), "chain-sealer")
            if settings.import_writers:
                rt._start(ImportWriters(service, pool, settings).run_forever(), "import-writers")
        if hosts_index(settings, roles):
            if lexical is not None:
                await lexical_steps.settle(pool, lexical, k1=settings.bm25_k1, b=settings.bm25_b)
            rt._start(IndexSync(pool, lexical, embedding_spaces, settings).run_forever(), "index-sync")
        if hosts_index(settings, roles) and settings.index_optimize_after and not settings.qdrant_url:
            rt.optimizer = IndexOptimizer(rt.served_indexes, after=settings.index_optimize_after,
                                          check_s=settings.index_optimize_check_s)
            rt._start(rt.optimizer.run_forever(), "index-optimizer")
        if hosts_index(settings, roles):
            activities = IndexActivities(embedding_spaces).all() + ReembedActivities(pool, embedding_spaces).all()
            if "worker" in roles:
                rt._add_worker(Worker(client, task_queue=index_queue(settings), activities=activities))
            else:
                rt._start(rt._index_worker(activities), "index-worker")
        return rt

    def served_indexes(self) -> dict[str, VectorIndex]:
        """The vector indexes this process writes, by name: each model's and the lexical one."""
        indexes = {model: self.spaces.space(model).index for model in self.spaces.models}
        if self.lexical is not None:
            indexes["lexical"] = self.lexical
        return {name: index for name, index in indexes.items() if index is not None}

    def _add_worker(self, worker: Worker) -> None:
        self.workers.append(worker)
        self._start(worker.run(), f"temporal-worker-{worker.task_queue}")

    def _start(self, work: Coroutine, name: str) -> None:
        """Run `work` in the background until close(). Every such loop handles its own failures;
        one that ends anyway is logged at once, at ERROR, with its exception (not when the task
        is collected)."""
        task = asyncio.create_task(work, name=name)
        task.add_done_callback(self._report_end)
        self.tasks.append(task)

    def _report_end(self, task: asyncio.Task) -> None:
        if task.cancelled() or self._closing:
            return
        if (err := task.exception()) is not None:
            log.error("background task %s stopped", task.get_name(), exc_info=err)
        else:
            log.error("background task %s returned; it should run until the process stops", task.get_name())

    async def _index_worker(self, activities: list) -> None:
        """The index activities in an API process: connected in the background, so the API
        serves (search, remember) while Temporal is still starting or down."""
        client = await _connect_temporal(self.settings, lazy=False, timeout_s=float("inf"))
        worker = Worker(client, task_queue=index_queue(self.settings), activities=activities)
        self.workers.append(worker)
        await worker.run()

    async def close(self) -> None:
        """Stop the workers (letting running activities finish), then close the clients."""
        self._closing = True
        await self.service.aclose()
        for worker in self.workers:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await worker.shutdown()
        for task in self.tasks:
            task.cancel()
        if self.tasks:  # a task that ignores its cancel is reported, and does not hold the close
            _, stuck = await asyncio.wait(self.tasks, timeout=10)
            for task in stuck:
                log.error("background task %s did not stop when cancelled", task.get_name())
        for provider in self.providers:
            await provider.aclose()
        await self.spaces.close()
        if self.lexical is not None:
            await self.lexical.close()
        await self.pool.close()

    async def install_admin_key(self, key: str, name: str = "dev") -> None:
        """See engram.store.keys.install_admin."""
        await keys.install_admin(self.pool, key, name)

    async def readiness(self) -> dict[str, dict]:
        """Each component's state; never raises."""
        checks = {
            "postgres": self._check_postgres(), "temporal": self._check_temporal(),
            "vector_index": self._check_index(), "embedder": self._check_embedder(),
            "lexical_index": self._check_lexical(),
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
        try:
            state["pipeline"] = await self._pipeline_state()
        except (OSError, asyncpg.PostgresError) as err:
            state["pipeline"] = {"ok": False, "detail": repr(err)}
        return state

    async def _check_lexical(self) -> dict:
        """The lexical index's points, the memories it does not hold yet (search scores those in
        Postgres meanwhile, so a backlog slows BM25 but never hides a memory), and the points
        waiting to be reweighed (their scope's average length moved)."""
        if self.lexical is None:
            return {"ok": True, "detail": "not used by this process"}
        points, waiting, (to_index, to_reweigh) = await asyncio.gather(
            self.lexical.count(), self.lexical.unoptimized(), lexical_index.to_index_counts(self.pool))
        return {"ok": True, "detail": f"{self.lexical.name}", "points": points, "to_index": to_index,
                "to_reweigh": to_reweigh, **self._optimisation("lexical", waiting)}

    async def _pipeline_state(self) -> dict:
        """The write queue and the parked extractions, and why they are parked; never blocks readiness."""
        backlog = await jobs.backlog(self.pool)
        recorded = await provider_health.all_states(self.pool)
        return {
            "ok": True, "queued": backlog.pending, "parked": backlog.parked, "parked_due": backlog.parked_due,
            "draining": backlog.leased, "parked_because": backlog.reasons,
            "providers_down": {k: {"since": v.changed_at.isoformat(), "detail": v.detail}
                               for k, v in recorded.items() if v.state == "down"},
            "decisions_24h": await facts.decision_counts(self.pool),
            "reviews_waiting": await facts.reviews_waiting(self.pool),
            "approvals_waiting": await approvals_store.pending_count(self.pool),
        }

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
            async with asyncio.timeout(2):
                await space.embedder.embed_query(PROBE_TEXT)
            probe = {"reachable": True, "probe": f"{model} embedded the probe"}
        except Exception as exc:  # whatever the embedder raises, readiness answers
            probe = {"reachable": False, "probe": f"{model}: {type(exc).__name__}: {exc}"}
        self._embedder_probe = (time.monotonic(), model, probe)
        return {**state, **probe}

    async def _check_postgres(self) -> dict:
        async with asyncio.timeout(2):
            await self.pool.fetchval("SELECT 1")
        return {"ok": True, "detail": "select 1"}

    async def _check_temporal(self) -> dict:
        async with asyncio.timeout(2):
            await self.client.service_client.check_health()
        return {"ok": True, "detail": self.settings.temporal_address}

    async def _check_index(self) -> dict:
        model, space = await self.spaces.active()
        if space.index is None:
            return {"ok": True, "detail": "written by the API process"}
        async with asyncio.timeout(2):
            count, waiting = await asyncio.gather(space.index.count(), space.index.unoptimized())
        return {"ok": True, "detail": f"{space.index.name} ({model}), {count} points", "points": count,
                **self._optimisation(model, waiting)}

    def _optimisation(self, name: str, waiting: int) -> dict:
        """The points an index searches by brute force until it is optimised, and whether it is
        being optimised now (a child process busy on a core for seconds to minutes)."""
        return {"unoptimized": waiting, "optimising": self.optimizer is not None and self.optimizer.optimising == name}


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
