"""Ingestion under load: the write path (remember rows + batched IngestWorkflows) measured from
concurrent clients over HTTP, every number beside a baseline taken in the same run.

1. sustained outage: the LLM provider down, 8 clients sending `auto` remembers back to back;
   latency, throughput, timeouts and the status mix against 1 client doing the same; then
   whether every stored memory got embedded
2. bursts: 10k memories through `POST /api/memory/remember/batch`, and 10k single `async`
   remembers from 32 clients, provider `none`; memories/s until every job is done
3. mixed: search latency while a 10k bulk burst drains, against the same searches idle
4. idle CPU in an outage: 2k memories imported with the provider down, then no traffic for
   10 minutes; CPU seconds of `engram up`'s whole process tree against the same with provider
   `none` and, with `--before REV`, against an older commit's code in the same outage

    .venv/bin/python -m bench.ingest                  # ~40 min -> bench/reports/ingest.md
    .venv/bin/python -m bench.ingest --before b9c5588 # + the old code's idle outage (~10 min more)
    .venv/bin/python -m bench.ingest --quick          # ~1/10 of every size -> bench/reports/ingest-quick.md
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import httpx

from bench import common, locomo_data
from bench.latency import synthetic_memories, synthetic_queries
from worker.embedded import free_port

CLIENT_TIMEOUT_S = 10.0  # a remember or search slower than this counts as a client timeout
BULK_TIMEOUT_S = 120.0  # one bulk request writes up to 500 memories in one transaction
TARGETS = {"outage_p95_ms": 200.0, "outage_max_ms": 2000.0, "memories_per_s": 100.0, "mixed_p95_ratio": 2.0}
SECTIONS = ("outage", "burst", "cpu")  # "burst" holds sections 2 and 3: one service, provider none
SAMPLE = 200  # memories and jobs read back to check what the pipeline did


# -- content ------------------------------------------------------------------------------------

def unique_texts(tag: str) -> Iterator[str]:
    """LoCoMo dev turn texts, cycled, each with a suffix that makes it unique (the service
    deduplicates identical content per scope)."""
    turns = [t.text for conv in locomo_data.load()[0] for t in conv.turns]
    for i in itertools.count():
        yield f"{turns[i % len(turns)]} ({tag} #{i})"


# -- measuring ----------------------------------------------------------------------------------

@dataclass
class Series:
    """Requests of one kind under one load. A latency is kept for every answer (any status);
    client timeouts and transport errors have none and are counted apart."""

    label: str
    note: str = ""
    latencies_ms: list[float] = field(default_factory=list)
    answered_at: list[float] = field(default_factory=list)  # time.monotonic() of each latency's answer
    outcomes: Counter = field(default_factory=Counter)  # remember status and warnings, search hits, errors
    timeouts: int = 0
    failures: int = 0  # non-200 answers and transport errors other than a timeout
    wall_s: float = 0.0

    def percentiles(self) -> dict[str, float]:
        return common.percentiles(self.latencies_ms)

    def between(self, start: float, end: float) -> dict[str, float]:
        """Percentiles of the answers given in [start, end) (time.monotonic())."""
        return common.percentiles(ms for ms, at in zip(self.latencies_ms, self.answered_at) if start <= at < end)

    def row(self) -> list[object]:
        p = self.percentiles()
        rate = f"{len(self.latencies_ms) / self.wall_s:.1f}" if self.wall_s else ""
        outcomes = ", ".join(f"{k}: {v}" for k, v in sorted(self.outcomes.items()))
        return [self.label, p["n"], common.fmt_ms(p["p50"]), common.fmt_ms(p["p95"]), common.fmt_ms(p["p99"]),
                common.fmt_ms(p["max"]), rate, self.timeouts, self.failures, outcomes, self.note]


SERIES_HEADERS = ["series", "n", "p50 ms", "p95 ms", "p99 ms", "max ms", "requests/s", "client timeouts",
                  "non-200 / errors", "outcomes", "notes"]


def client(svc: common.Service, timeout_s: float = CLIENT_TIMEOUT_S) -> httpx.AsyncClient:
    """One client: its own keep-alive connection, the admin key, a `timeout_s` client timeout."""
    return httpx.AsyncClient(base_url=svc.url, headers=svc.headers(), timeout=timeout_s,
                             limits=httpx.Limits(max_connections=1))


async def send(http: httpx.AsyncClient, series: Series, path: str, body: dict) -> dict | None:
    """POST `body`; the answer's JSON if it was a 200, else None (counted in `series`)."""
    started = time.perf_counter()
    try:
        response = await http.post(path, json=body)
    except httpx.TimeoutException:
        series.timeouts += 1
        return None
    except httpx.TransportError as err:
        series.failures += 1
        series.outcomes[type(err).__name__] += 1
        return None
    series.latencies_ms.append((time.perf_counter() - started) * 1e3)
    series.answered_at.append(time.monotonic())
    if response.status_code != 200:
        series.failures += 1
        series.outcomes[f"HTTP {response.status_code}"] += 1
        return None
    return response.json()


async def remember_clients(svc: common.Service, series: Series, texts: Iterator[str], *, clients: int,
                           mode: str, scope_of: Callable[[int], dict], count: int | None = None,
                           duration_s: float | None = None) -> list[dict]:
    """`clients` clients each sending remembers back to back (the next as soon as the last is
    answered) until `count` have been sent in all or `duration_s` has passed; the 200 answers."""
    answers: list[dict] = []
    todo = itertools.islice(texts, count) if count is not None else texts
    started = time.monotonic()
    until = started + duration_s if duration_s is not None else float("inf")

    async def one(k: int) -> None:
        async with client(svc) as http:
            for text in todo:
                body = await send(http, series, "/api/memory/remember",
                                  {"content": text, "scope": scope_of(k), "mode": mode})
                if body is not None:
                    answers.append(body)
                    series.outcomes[body["status"]] += 1
                    for warning in body["warnings"]:
                        series.outcomes[warning.split(":")[0]] += 1
                if time.monotonic() >= until:
                    return

    await asyncio.gather(*(one(k) for k in range(clients)))
    series.wall_s = time.monotonic() - started
    return answers


async def search_clients(svc: common.Service, series: Series, queries: list[str], scope: dict, *, clients: int,
                         until: asyncio.Event | None = None) -> None:
    """`clients` clients sharing `queries` (limit 10), each sending the next as soon as the last
    is answered: once through, or round and round until `until` is set."""
    todo = itertools.cycle(queries) if until is not None else iter(queries)
    started = time.monotonic()

    async def one() -> None:
        async with client(svc) as http:
            for query in todo:
                if until is not None and until.is_set():
                    return
                body = await send(http, series, "/api/memory/search", {"query": query, "scope": scope, "limit": 10})
                if body is not None:
                    hits = len(body["results"])
                    series.outcomes["10 results" if hits == 10 else f"{hits} results"] += 1

    await asyncio.gather(*(one() for _ in range(clients)))
    series.wall_s = time.monotonic() - started


@dataclass
class Bulk:
    """A burst through the bulk endpoint: its import jobs and what they stored."""

    requests: Series
    import_ids: list[str] = field(default_factory=list)
    item_jobs: list[str] = field(default_factory=list)
    memory_ids: list[str] = field(default_factory=list)
    stored: int = 0
    failed: int = 0
    statuses: Counter = field(default_factory=Counter)


async def bulk_import(svc: common.Service, texts: Iterator[str], scope: dict, *, memories: int, batch: int,
                      concurrency: int, label: str) -> Bulk:
    """`memories` texts in requests of `batch` items from `concurrency` concurrent senders."""
    bulk = Bulk(Series(label, note=f"{batch} items per request, {concurrency} concurrent senders"))
    chunks = iter([[{"content": t, "scope": scope} for t in itertools.islice(texts, n)]
                   for n in [batch] * (memories // batch) + ([memories % batch] if memories % batch else [])])
    started = time.monotonic()

    async def sender() -> None:
        async with client(svc, BULK_TIMEOUT_S) as http:
            for items in chunks:
                body = await send(http, bulk.requests, "/api/memory/remember/batch", {"items": items})
                if body is None:
                    continue
                bulk.import_ids.append(body["job_id"])
                bulk.stored += body["stored"]
                bulk.failed += body["failed"]
                for result in body["results"]:
                    bulk.statuses[result["status"] or f"error {result['error']['type']}"] += 1
                    if result["job_id"]:
                        bulk.item_jobs.append(result["job_id"])
                    if result["memory_id"]:
                        bulk.memory_ids.append(result["memory_id"])

    await asyncio.gather(*(sender() for _ in range(concurrency)))
    bulk.requests.wall_s = time.monotonic() - started
    bulk.requests.outcomes.update(bulk.statuses)
    return bulk


async def wait_imports(svc: common.Service, import_ids: list[str], *, timeout_s: float,
                       parked_counts: bool = False) -> float:
    """Poll the import jobs until each one's `progress.done` equals its `total` (with
    `parked_counts`, until done + parked does: an outage parks extractions); the monotonic time
    the last was seen finished. Raises RuntimeError at the timeout."""
    waiting = set(import_ids)
    deadline = time.monotonic() + timeout_s
    async with client(svc, 30) as http:
        while waiting:
            for job_id in list(waiting):
                response = await http.get(f"/api/memory/jobs/{job_id}")
                response.raise_for_status()
                progress = response.json()["progress"]
                finished = progress["done"] + (progress.get("parked", 0) if parked_counts else 0)
                if finished >= progress["total"]:
                    waiting.discard(job_id)
            if not waiting:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(waiting)} import jobs unfinished after {timeout_s} s")
            await asyncio.sleep(0.5)
    return time.monotonic()


def pipeline(svc: common.Service) -> dict:
    """`/readyz`'s `components.pipeline` ({} from a service that has none)."""
    return svc.client.get("/readyz").json()["components"].get("pipeline", {})


def wait_pipeline_idle(svc: common.Service, *, timeout_s: float, poll_s: float = 1.0) -> tuple[float, dict]:
    """Poll `/readyz` until no remember job waits for or sits in a batch (queued == 0 and
    draining == 0); the monotonic time that was seen and the pipeline's state then."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = pipeline(svc)
        if state.get("queued") == 0 and state.get("draining") == 0:
            return time.monotonic(), state
        if time.monotonic() > deadline:
            raise RuntimeError(f"pipeline still busy after {timeout_s} s: {state}")
        time.sleep(poll_s)


async def read_back(svc: common.Service, memory_ids: list[str], job_ids: list[str], seed: int = 5
                    ) -> tuple[Counter, Counter]:
    """A random sample of the memories (embedded or not) and of the jobs (by status)."""
    rng = random.Random(seed)
    memories = rng.sample(memory_ids, min(SAMPLE, len(memory_ids)))
    jobs = rng.sample(job_ids, min(SAMPLE, len(job_ids)))
    embedded, statuses = Counter(), Counter()
    async with client(svc, 30) as http:
        for memory_id in memories:
            response = await http.get(f"/api/memory/{memory_id}")
            response.raise_for_status()
            embedded["embedded" if response.json()["embedding_model"] else "not embedded"] += 1
        for job_id in jobs:
            response = await http.get(f"/api/memory/jobs/{job_id}")
            response.raise_for_status()
            statuses[response.json()["status"]] += 1
    return embedded, statuses


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


def role_cpu_seconds(root_pid: int) -> dict[str, float]:
    """CPU seconds of `engram up`'s direct Python children by role (`worker.up api|worker`),
    which `common.tree_cpu_seconds` counts together under their command name."""
    tick = os.sysconf("SC_CLK_TCK")
    roles: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()
        if int(fields[1]) != root_pid or b"worker.up" not in argv:
            continue
        role = argv[argv.index(b"worker.up") + 1].decode() if argv.index(b"worker.up") + 1 < len(argv) else "?"
        roles[role] = roles.get(role, 0.0) + sum(int(x) for x in fields[11:15]) / tick
    return roles


def fmt_cpu(cpu: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.1f} s" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if v >= 0.05)


# -- 1. sustained outage ------------------------------------------------------------------------

@dataclass
class Outage:
    closed_url: str
    warmup: Series
    warmup_s: float
    baseline: Series
    load: Series
    clients: int
    stored: int
    at_end: dict  # the pipeline as the load stopped
    settle_s: float  # last request answered -> queued == 0 and draining == 0
    state: dict
    index_points: int
    embedded: Counter
    job_statuses: Counter
    cpu: dict[str, float]


def outage(args) -> Outage:
    closed = f"http://127.0.0.1:{free_port()}"
    texts = unique_texts("outage")
    with common.data_dir() as data, common.service(
            "ingest-outage", data, {"ENGRAM_LLM_PROVIDER": "ollama", "ENGRAM_OLLAMA_URL": closed}) as svc:
        # Until the first failed extraction records the provider down, an `auto` remember waits
        # for its first pass (up to the pipeline timeout): that is the warm-up, not the load.
        print(f"1. outage: provider at {closed}; remembering until one answers raw_saved", flush=True)
        warmup = Series("warm-up: until the provider is recorded down")
        answers: list[dict] = []
        started = time.monotonic()
        while time.monotonic() - started < 120:
            got = asyncio.run(remember_clients(svc, warmup, texts, clients=1, mode="auto", count=1,
                                               scope_of=lambda _: {"user_id": "outage-warm-up"}))
            answers += got
            if got and got[0]["status"] == "raw_saved":
                break
        else:
            raise RuntimeError(f"no remember answered raw_saved within 120 s: {warmup.outcomes}")
        warmup_s = time.monotonic() - started

        print(f"   baseline: {args.baseline_requests} remembers from 1 client", flush=True)
        baseline = Series("baseline: 1 client, back to back", note="same requests, no concurrency")
        answers += asyncio.run(remember_clients(svc, baseline, texts, clients=1, mode="auto",
                                                count=args.baseline_requests,
                                                scope_of=lambda _: {"user_id": "outage-baseline"}))

        print(f"   load: {args.outage_clients} clients for {args.outage_s:.0f} s", flush=True)
        load = Series(f"{args.outage_clients} clients, back to back, {args.outage_s:.0f} s",
                      note="one scope per client")
        cpu_before = common.tree_cpu_seconds(svc.proc.pid)
        answers += asyncio.run(remember_clients(svc, load, texts, clients=args.outage_clients, mode="auto",
                                                duration_s=args.outage_s,
                                                scope_of=lambda k: {"user_id": f"outage-client-{k}"}))
        cpu = cpu_delta(cpu_before, common.tree_cpu_seconds(svc.proc.pid))
        ended = time.monotonic()
        at_end = pipeline(svc)

        print("   waiting for the write queue to empty", flush=True)
        idle_at, state = wait_pipeline_idle(svc, timeout_s=args.drain_timeout_s)
        memory_ids = sorted({a["memory_id"] for a in answers})
        embedded, statuses = asyncio.run(read_back(svc, memory_ids, [a["job_id"] for a in answers if a["job_id"]]))
        return Outage(closed, warmup, warmup_s, baseline, load, args.outage_clients, len(memory_ids),
                      at_end, idle_at - ended, state, common.index_points(svc), embedded, statuses, cpu)


# -- 2 and 3. bursts, and searches while one drains ---------------------------------------------

@dataclass
class Burst:
    label: str
    memories: int  # stored
    requests: Series  # the requests' own latency (bulk requests or single acks)
    done_s: float  # first request sent -> every job seen done
    job_statuses: Counter
    cpu: dict[str, float]
    note: str = ""
    started: float = 0.0  # time.monotonic() of the first request
    sent_s: float = 0.0  # first request -> the last bulk request answered (bulk bursts)

    @property
    def rate(self) -> float:
        return self.memories / self.done_s


@dataclass
class Bursts:
    search_corpus: int
    ceiling: float  # memories/s the local embedding model alone reaches on this machine
    bulk: Burst
    single: Burst
    mixed: Burst
    idle_before: Series
    under_load: Series
    idle_after: Series


def bulk_burst(svc: common.Service, args, texts: Iterator[str], scope: str, label: str,
               during: Callable[[asyncio.Event], object] | None = None) -> Burst:
    """A bulk burst of `args.burst` memories; memories/s until every import job is done. With
    `during`, that coroutine runs from the first request until then (it must stop when the
    event is set)."""
    cpu_before = common.tree_cpu_seconds(svc.proc.pid)

    async def run() -> tuple[Bulk, float, float, float]:
        finished = asyncio.Event()
        side = asyncio.create_task(during(finished)) if during else None
        started = time.monotonic()
        try:
            bulk = await bulk_import(svc, texts, {"user_id": scope}, memories=args.burst, batch=args.bulk_size,
                                     concurrency=args.bulk_concurrency, label=label)
            sent_s = time.monotonic() - started
            print(f"   {bulk.stored} stored ({bulk.failed} failed) in {sent_s:.1f} s; "
                  f"waiting for {len(bulk.import_ids)} import jobs", flush=True)
            done_at = await wait_imports(svc, bulk.import_ids, timeout_s=args.drain_timeout_s)
        finally:
            finished.set()
            if side:
                await side
        return bulk, done_at - started, started, sent_s

    bulk, done_s, started, sent_s = asyncio.run(run())
    cpu = cpu_delta(cpu_before, common.tree_cpu_seconds(svc.proc.pid))
    _, statuses = asyncio.run(read_back(svc, bulk.memory_ids, bulk.item_jobs))
    return Burst(label, bulk.stored, bulk.requests, done_s, statuses, cpu, started=started, sent_s=sent_s)


def single_burst(svc: common.Service, args, texts: Iterator[str], scope: str) -> Burst:
    """`args.single` remembers (`async`) from `args.single_clients` clients; memories/s until
    `/readyz` shows no job waiting for or in a batch."""
    cpu_before = common.tree_cpu_seconds(svc.proc.pid)
    label = f"{args.single} single remembers, mode=async, {args.single_clients} clients"
    acks = Series(label, note="the acknowledgement; one scope")
    started = time.monotonic()
    answers = asyncio.run(remember_clients(svc, acks, texts, clients=args.single_clients, mode="async",
                                           count=args.single, scope_of=lambda _: {"user_id": scope}))
    print(f"   {len(answers)} acknowledged in {acks.wall_s:.1f} s; waiting for the jobs", flush=True)
    done_at, _ = wait_pipeline_idle(svc, timeout_s=args.drain_timeout_s, poll_s=0.5)
    cpu = cpu_delta(cpu_before, common.tree_cpu_seconds(svc.proc.pid))
    _, statuses = asyncio.run(read_back(svc, [a["memory_id"] for a in answers],
                                        [a["job_id"] for a in answers if a["job_id"]]))
    return Burst(label, len(answers), acks, done_at - started, statuses, cpu,
                 note="done = `/readyz` pipeline queued == 0 and draining == 0 (polled every 0.5 s)")


def embedder_ceiling(memories: int) -> float:
    """Texts/s the service's local embedding model (default settings: 2 model runs side by side)
    embeds in this process with nothing else running, in batches of the dispatcher's default
    size: what no ingestion on this machine can beat."""
    from engram.settings import Settings

    default = {name: field.default for name, field in Settings.model_fields.items()}
    embedder = common.open_embedder(default["embedding_model"])
    texts = list(itertools.islice(unique_texts("ceiling"), memories))
    embedder.embed_sync(texts[:32])
    batch = default["ingest_batch_size"]
    started = time.perf_counter()
    for start in range(0, memories, batch):
        embedder.embed_sync(texts[start:start + batch])
    return memories / (time.perf_counter() - started)


def bursts(args) -> Bursts:
    texts = unique_texts("burst")
    ceiling = embedder_ceiling(min(args.burst, 2_000))
    print(f"2. the embedding model alone: {ceiling:.1f} texts/s", flush=True)
    corpus = synthetic_memories(args.search_memories)
    queries = synthetic_queries(args.searches + 10)
    warm, queries = queries[:10], queries[10:]
    search_scope = {"user_id": "search-corpus"}
    with common.data_dir() as data, common.service("ingest-burst", data, {"ENGRAM_LLM_PROVIDER": "none"}) as svc:
        print(f"2. bursts (provider none): loading the search scope ({len(corpus)} memories)", flush=True)

        async def load_corpus() -> None:
            bulk = await bulk_import(svc, iter(corpus), search_scope, memories=len(corpus), batch=args.bulk_size,
                                     concurrency=args.bulk_concurrency, label="search corpus")
            if bulk.failed or bulk.requests.failures:
                raise RuntimeError(f"loading the search corpus failed: {bulk.requests.outcomes}")
            await wait_imports(svc, bulk.import_ids, timeout_s=args.drain_timeout_s)

        asyncio.run(load_corpus())
        asyncio.run(search_clients(svc, Series("warm-up"), warm, search_scope, clients=1))

        print(f"   bulk burst: {args.burst} memories", flush=True)
        bulk = bulk_burst(svc, args, texts, "burst-bulk",
                          f"{args.burst} memories, bulk endpoint, {args.bulk_size} per request")
        print(f"   single burst: {args.single} remembers from {args.single_clients} clients", flush=True)
        single = single_burst(svc, args, texts, "burst-single")

        print(f"3. mixed: {len(queries)} idle searches from {args.search_clients} clients", flush=True)
        time.sleep(5)  # the last batches' workflows close
        asyncio.run(search_clients(svc, Series("warm-up"), warm, search_scope, clients=args.search_clients))
        label = f"search, {args.search_clients} clients, scope of {len(corpus)}"
        idle_before = Series(f"{label}: idle (baseline)", note="just before the burst")
        asyncio.run(search_clients(svc, idle_before, queries, search_scope, clients=args.search_clients))
        print(f"   the same searches, round and round, while {args.burst} memories drain", flush=True)
        under_load = Series(f"{label}: while a bulk burst drains",
                            note="from the burst's first request until its last import job is done")
        mixed = bulk_burst(svc, args, texts, "burst-mixed",
                           f"{args.burst} memories, bulk endpoint, with searches running",
                           during=lambda finished: search_clients(svc, under_load, queries, search_scope,
                                                                  clients=args.search_clients, until=finished))
        idle_after = Series(f"{label}: idle again", note="just after the burst drained")
        asyncio.run(search_clients(svc, idle_after, queries, search_scope, clients=args.search_clients))
        return Bursts(len(corpus), ceiling, bulk, single, mixed, idle_before, under_load, idle_after)


# -- 4. CPU of an idle service in an outage -----------------------------------------------------

@dataclass
class Idle:
    label: str
    code: str  # which tree ran
    imports: str  # where `engram`, `worker` and `api` were imported from, when not this tree
    imported: str  # how the memories went in
    memories: int
    wait_s: float  # import sent -> the window began
    window_s: float
    cpu: dict[str, float]  # by command name, over the window
    roles: dict[str, float]  # engram up's python children by role, over the window
    samples: list[tuple[float, float]]  # (seconds into the window, CPU seconds so far)
    state_before: dict
    state_after: dict
    points: int | str

    @property
    def total(self) -> float:
        return sum(self.cpu.values())


def idle_cpu(args, label: str, name: str, env: dict[str, str], *, code: str = "this tree",
             imports: str = "") -> Idle:
    """Import `args.cpu_memories` memories, wait until the pipeline has nothing in flight, then
    measure the process tree's CPU over `args.idle_minutes` without traffic."""
    texts = unique_texts(name)
    window_s = args.idle_minutes * 60
    with common.data_dir() as data, common.service(name, data, env) as svc:
        print(f"4. idle CPU, {label}: importing {args.cpu_memories} memories", flush=True)
        started = time.monotonic()
        bulk = asyncio.run(bulk_import(svc, texts, {"user_id": "idle"}, memories=args.cpu_memories,
                                       batch=args.bulk_size, concurrency=args.bulk_concurrency, label="import"))
        if bulk.requests.outcomes.get("HTTP 404") or bulk.requests.outcomes.get("HTTP 405"):
            # An older service without the bulk endpoint: the same memories as `auto` remembers.
            imported = f"single `auto` remembers from {args.outage_clients} clients (no bulk endpoint)"
            acks = Series("import")
            answers = asyncio.run(remember_clients(svc, acks, texts, clients=args.outage_clients, mode="auto",
                                                   count=args.cpu_memories, scope_of=lambda _: {"user_id": "idle"}))
            stored = len(answers)
            if acks.timeouts or acks.failures:
                imported += f"; {acks.timeouts} timeouts, {acks.failures} errors ({dict(acks.outcomes)})"
        else:
            imported = f"bulk endpoint, {args.bulk_size} per request"
            stored = bulk.stored
            if bulk.failed or bulk.requests.failures:
                raise RuntimeError(f"the import failed: {bulk.requests.outcomes}")
        # The window starts once nothing is in flight: embeddings written and extractions done,
        # parked (this tree) or on their retry timers (an old tree, whose /readyz has no pipeline).
        points: int | str = "unknown"
        deadline = time.monotonic() + args.drain_timeout_s
        while time.monotonic() < deadline:
            state = pipeline(svc)
            try:
                points = common.index_points(svc)
            except (KeyError, ValueError, IndexError):
                points = "unknown"
            if state:
                if state.get("queued") == 0 and state.get("draining") == 0:
                    break
            elif isinstance(points, int) and points >= stored:
                break
            time.sleep(1)
        else:
            print(f"   warning: still busy after {args.drain_timeout_s} s; measuring anyway", flush=True)
        time.sleep(5)  # let the last batch's workflow close
        wait_s = time.monotonic() - started
        state_before = pipeline(svc)
        print(f"   {stored} stored, pipeline {state_before or '(none in /readyz)'}; "
              f"measuring CPU for {window_s:.0f} s with no traffic", flush=True)
        cpu0, roles0 = common.tree_cpu_seconds(svc.proc.pid), role_cpu_seconds(svc.proc.pid)
        t0 = time.monotonic()
        samples = []
        step = window_s / 10
        for k in range(1, 11):
            time.sleep(max(0.0, t0 + k * step - time.monotonic()))
            samples.append((time.monotonic() - t0, sum(cpu_delta(cpu0, common.tree_cpu_seconds(svc.proc.pid))
                                                        .values())))
        cpu, roles = cpu_delta(cpu0, common.tree_cpu_seconds(svc.proc.pid)), cpu_delta(roles0, role_cpu_seconds(
            svc.proc.pid))
        measured_s = time.monotonic() - t0
        state_after = pipeline(svc)
        return Idle(label, code, imports, imported, stored, wait_s, measured_s, cpu, roles, samples, state_before,
                    state_after, points)


def before_tree(rev: str) -> tuple[Path, str]:
    """A worktree of `rev` at /tmp/engram-before-<short rev> (reused if there), and the file
    `import engram` resolves to with it first on PYTHONPATH (which must lie inside it)."""
    short = subprocess.run(["git", "rev-parse", "--short", rev], cwd=common.REPO, capture_output=True, text=True,
                           check=True).stdout.strip()
    path = Path(f"/tmp/engram-before-{short}")
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), short], cwd=common.REPO, check=True)
    at = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=path, capture_output=True, text=True,
                        check=True).stdout.strip()
    if at != short:
        raise RuntimeError(f"{path} is at {at}, not {short}: remove it (git worktree remove {path})")
    env = {**os.environ, **before_env(path)}
    probe = subprocess.run([sys.executable, "-c",
                            "import engram, worker, api; print(engram.__file__, worker.__file__, api.__file__)"],
                           cwd=common.REPO, env=env, capture_output=True, text=True, check=True).stdout.strip()
    if any(not p.startswith(str(path)) for p in probe.split()):
        raise RuntimeError(f"with PYTHONPATH={path} the old tree is not what gets imported: {probe}")
    return path, probe


def before_env(path: Path) -> dict[str, str]:
    # PYTHONSAFEPATH: `python -m` would otherwise put the working directory (this repository,
    # where common.service starts `engram up`) ahead of PYTHONPATH in a child process.
    return {"PYTHONPATH": os.pathsep.join([str(path), str(common.REPO)]), "PYTHONSAFEPATH": "1"}


# -- the run ------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="every size and duration at about 1/10 (a smoke run)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"which to run, comma-separated, of {','.join(SECTIONS)} (default all; "
                             "a subset writes ingest[-quick]-<sections>.md)")
    parser.add_argument("--outage-s", type=float, help="1: seconds of load with the provider down (300)")
    parser.add_argument("--outage-clients", type=int, default=8, help="1: concurrent clients (8)")
    parser.add_argument("--baseline-requests", type=int, help="1: remembers from one client, the baseline (200)")
    parser.add_argument("--burst", type=int, help="2, 3: memories per bulk burst (10000)")
    parser.add_argument("--bulk-size", type=int, default=500, help="2, 3: items per bulk request (500)")
    parser.add_argument("--bulk-concurrency", type=int, default=4, help="2, 3: concurrent bulk requests (4)")
    parser.add_argument("--single", type=int, help="2: single remembers in the concurrent burst (10000)")
    parser.add_argument("--single-clients", type=int, default=32, help="2: clients sending them (32)")
    parser.add_argument("--search-memories", type=int, help="3: memories in the searched scope (3000)")
    parser.add_argument("--searches", type=int, help="3: searches per idle series (200)")
    parser.add_argument("--search-clients", type=int, default=2, help="3: concurrent search clients (2)")
    parser.add_argument("--cpu-memories", type=int, help="4: memories imported before the idle window (2000)")
    parser.add_argument("--idle-minutes", type=float, help="4: the idle window (10)")
    parser.add_argument("--no-idle-baseline", dest="idle_baseline", action="store_false",
                        help="4: skip the same window with provider none")
    parser.add_argument("--before", metavar="REV",
                        help="4: also the idle outage on REV's code (a git worktree at /tmp/engram-before-<rev>)")
    parser.add_argument("--drain-timeout-s", type=float, default=1800, help="longest wait for a backlog to drain")
    args = parser.parse_args(argv)
    scale = 10 if args.quick else 1
    for name, full in (("outage_s", 300.0), ("baseline_requests", 200), ("burst", 10_000), ("single", 10_000),
                       ("search_memories", 3_000), ("searches", 200), ("cpu_memories", 2_000),
                       ("idle_minutes", 10.0)):
        if getattr(args, name) is None:
            setattr(args, name, type(full)(full / scale) if isinstance(full, float) else max(1, full // scale))
    if args.quick:
        args.searches = max(args.searches, 50)  # fewer makes the p95 the second-largest of a handful
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if unknown := set(sections) - set(SECTIONS):
        parser.error(f"unknown sections {sorted(unknown)}; choose from {','.join(SECTIONS)}")
    started = time.time()

    before = None
    if args.before and "cpu" in sections:
        before = before_tree(args.before)  # fail before anything long runs
        print(f"--before {args.before}: {before[1]}", flush=True)

    out = Results()
    if "outage" in sections:
        out.outage = outage(args)
    if "burst" in sections:
        out.bursts = bursts(args)
    if "cpu" in sections:
        closed = f"http://127.0.0.1:{free_port()}"
        down = {"ENGRAM_LLM_PROVIDER": "ollama", "ENGRAM_OLLAMA_URL": closed}
        out.idle.append(idle_cpu(args, f"provider down ({closed})", "ingest-idle-outage", down))
        if args.idle_baseline:
            out.idle.append(idle_cpu(args, "provider none (baseline: no outage)", "ingest-idle-none",
                                     {"ENGRAM_LLM_PROVIDER": "none"}))
        if before:
            path, probe = before
            out.idle.append(idle_cpu(args, f"provider down ({closed}), code of {args.before}",
                                     f"ingest-idle-before-{path.name.rsplit('-', 1)[1]}", {**down, **before_env(path)},
                                     code=f"{args.before} ({path})", imports=probe))

    body = report(out, args)
    name = "ingest-quick" if args.quick else "ingest"
    if sections != list(SECTIONS):
        name += "-" + "-".join(sections)
    path = common.write_report(name, "Engram ingestion under load", body, started=started)
    print(body)
    print(f"\nreport: {path}")
    return path


@dataclass
class Results:
    outage: Outage | None = None
    bursts: Bursts | None = None
    idle: list[Idle] = field(default_factory=list)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "n/a"


def report(out: Results, args) -> str:
    lines: list[str] = []
    if args.quick:
        lines.append("**Quick run (smoke test): every size and duration at about 1/10; the targets are defined "
                     "at the full sizes.**\n")
    lines.append(
        "`engram up` on a fresh data directory per section (the API and the worker as two child processes, "
        "embedded Postgres, the Temporal dev server), measured only over HTTP. Each client is its own httpx "
        f"keep-alive connection with a {CLIENT_TIMEOUT_S:.0f} s client timeout (bulk requests "
        f"{BULK_TIMEOUT_S:.0f} s) and sends its next request as soon as the last is answered. Latencies are "
        "client round trips of every answered request (timeouts are counted apart); percentiles by linear "
        "interpolation (numpy). Content: LoCoMo dev turn texts, cycled, each with a unique suffix. The "
        "benchmark's own clients run on the same machine.\n")
    if out.outage:
        lines += outage_report(out.outage)
    if out.bursts:
        lines += bursts_report(out.bursts, args)
    if out.idle:
        lines += idle_report(out.idle, args)
    return "\n".join(lines)


def outage_report(o: Outage) -> list[str]:
    base, load = o.baseline.percentiles(), o.load.percentiles()
    rows = [o.baseline.row(), o.load.row(),
            ["ratio load / baseline", "", ratio(load["p50"], base["p50"]), ratio(load["p95"], base["p95"]),
             ratio(load["p99"], base["p99"]), ratio(load["max"], base["max"]), "", "", "", "", ""]]
    rows.append(o.warmup.row())
    served = len(o.load.latencies_ms) + o.load.timeouts
    targets = [
        ["p95", f"{load['p95']:.1f} ms", f"<= {TARGETS['outage_p95_ms']:.0f} ms",
         verdict(load["p95"] <= TARGETS["outage_p95_ms"])],
        ["max", f"{load['max']:.1f} ms", f"<= {TARGETS['outage_max_ms']:.0f} ms",
         verdict(load["max"] <= TARGETS["outage_max_ms"])],
        ["client timeouts", f"{o.load.timeouts} of {served}", "0", verdict(o.load.timeouts == 0)],
        ["non-200 answers and errors", f"{o.load.failures}", "0", verdict(o.load.failures == 0)],
    ]
    embedded_ok = o.index_points >= o.stored and not o.embedded.get("not embedded")
    return [
        "## 1. Sustained load during a provider outage\n",
        f"`ENGRAM_LLM_PROVIDER=ollama`, `ENGRAM_OLLAMA_URL={o.closed_url}` (a closed port). `auto` remembers; the "
        f"load is {o.clients} clients, each in its own scope (`user_id` `outage-client-<k>`), back to back; the "
        "baseline is one client doing the same just before. The warm-up sent remembers one at a time until one "
        f"answered `raw_saved` (the provider recorded down): {len(o.warmup.latencies_ms)} requests in "
        f"{o.warmup_s:.1f} s.\n",
        common.md_table(SERIES_HEADERS, rows),
        "",
        common.md_table(["target (under load)", "measured", "required", "verdict"], targets),
        "",
        f"- CPU used by the service's process tree during the load: {sum(o.cpu.values()):.0f} s in "
        f"{o.load.wall_s:.0f} s ({fmt_cpu(o.cpu)}).",
        f"- As the load stopped: {o.at_end.get('queued')} remember jobs waited for or were in a batch "
        f"(queued), {o.at_end.get('draining')} draining, {o.at_end.get('parked')} parked.",
        f"- After the load: the write queue emptied (`/readyz` pipeline queued == 0 and draining == 0) "
        f"{o.settle_s:.1f} s after the last answer; pipeline then: queued {o.state.get('queued')}, parked "
        f"{o.state.get('parked')} (due now {o.state.get('parked_due')}), parked because "
        f"{o.state.get('parked_because')}, providers down {sorted(o.state.get('providers_down', {}))}.",
        f"- Every stored memory embedded: **{verdict(embedded_ok)}**: {o.stored} distinct memories stored, "
        f"{o.index_points} points in the vector index; of {sum(o.embedded.values())} sampled memories "
        f"{dict(o.embedded)}; of {sum(o.job_statuses.values())} sampled jobs, by status {dict(o.job_statuses)}.",
        "",
    ]


def bursts_report(b: Bursts, args) -> list[str]:
    rows = []
    for burst in (b.bulk, b.single, b.mixed):
        cpu = sum(burst.cpu.values())
        rows.append([burst.label, burst.memories, f"{burst.done_s:.1f}", f"{burst.rate:.1f}",
                     f"{ratio(burst.rate, TARGETS['memories_per_s'])} the target", f"{burst.rate / b.ceiling:.0%}",
                     verdict(burst.rate >= TARGETS["memories_per_s"]),
                     f"{cpu:.0f} s ({cpu / burst.done_s:.2f} cores)", dict(burst.job_statuses)])
    idle, loaded, after = (s.percentiles() for s in (b.idle_before, b.under_load, b.idle_after))
    search_rows = [b.idle_before.row(), b.under_load.row(), b.idle_after.row(),
                   ["ratio while draining / idle (baseline)", "", ratio(loaded["p50"], idle["p50"]),
                    ratio(loaded["p95"], idle["p95"]), ratio(loaded["p99"], idle["p99"]),
                    ratio(loaded["max"], idle["max"]), "", "", "", "", ""]]
    p95_ratio = loaded["p95"] / idle["p95"]
    sent_at = b.mixed.started + b.mixed.sent_s
    phases = [("while the bulk requests are written", b.under_load.between(b.mixed.started, sent_at),
               b.mixed.sent_s),
              ("after: the backlog drains", b.under_load.between(sent_at, float("inf")),
               b.mixed.done_s - b.mixed.sent_s)]
    phase_rows = [[name, f"{seconds:.0f}", p["n"], common.fmt_ms(p["p50"]), common.fmt_ms(p["p95"]),
                   common.fmt_ms(p["p99"]), ratio(p["p95"], idle["p95"])] for name, p, seconds in phases]
    return [
        "## 2. Bursts: memories/s until embedded and indexed\n",
        f"`ENGRAM_LLM_PROVIDER=none` (no extraction: each job embeds, indexes and finishes). One service for "
        f"sections 2 and 3, in this order: the search scope ({b.search_corpus} synthetic memories, bulk), the "
        f"bulk burst (scope `burst-bulk`), the single-remember burst (scope `burst-single`), then section 3 "
        "(scope `burst-mixed`), so each burst starts on a store holding the earlier ones. Time: from the first "
        "request sent until every job was seen done (bulk: every import job's `progress.done` == `total`, "
        "polled every 0.5 s). The baselines are the target, "
        f"{TARGETS['memories_per_s']:.0f} memories/s, and the ceiling: the embedding model alone, in the "
        f"benchmark's process with the service idle, embeds {b.ceiling:.1f} of the same texts a second "
        "(`embedder_ceiling`: the service's model and threads, batches of the dispatcher's size), which no "
        "ingestion here can beat.\n",
        common.md_table(["burst", "memories", "first request -> all done, s", "memories/s", "vs target",
                         "of the ceiling", "target >= 100/s", "service CPU", f"sampled jobs ({SAMPLE}) by status"],
                        rows),
        "",
        "The requests themselves (bulk: one request of up to 500 items; single: the `async` acknowledgement):\n",
        common.md_table(SERIES_HEADERS, [b.bulk.requests.row(), b.single.requests.row(), b.mixed.requests.row()]),
        f"\n- {b.single.note}.",
        "",
        "## 3. Search while a burst drains\n",
        f"`POST /api/memory/search` (limit 10) on the scope of {b.search_corpus} memories from "
        f"{args.search_clients} clients: {args.searches} synthetic queries idle (the baseline, just before the "
        f"burst), then the same queries round and round while a {args.burst}-memory bulk burst is sent and "
        "drains (until its last import job is done), then idle again.\n",
        common.md_table(SERIES_HEADERS, search_rows),
        "",
        common.md_table(["target", "measured", "required", "verdict"],
                        [["search p95 while draining / idle", f"{p95_ratio:.2f}×",
                          f"<= {TARGETS['mixed_p95_ratio']:.0f}×", verdict(p95_ratio <= TARGETS["mixed_p95_ratio"])]]),
        f"\n- The burst under that search load: {b.mixed.memories} memories done in {b.mixed.done_s:.1f} s "
        f"({b.mixed.rate:.1f}/s, against {b.bulk.rate:.1f}/s without searches); idle again after it: p95 "
        f"{after['p95']:.1f} ms.",
        "",
        "The searches under load by phase, by when each was answered: while the API writes the bulk requests "
        "(the worker embeds meanwhile), and after the last one was answered, while only the backlog drains.\n",
        common.md_table(["phase", "s", "n", "p50 ms", "p95 ms", "p99 ms", "p95 vs idle"], phase_rows),
        "",
    ]


def idle_report(runs: list[Idle], args) -> list[str]:
    ref = runs[0]
    rows = []
    for run in runs:
        rows.append([run.label, run.code, run.memories, f"{run.window_s:.0f}", f"{run.total:.1f}",
                     f"{run.total / run.window_s:.3f}", ratio(run.total / run.window_s, ref.total / ref.window_s),
                     fmt_cpu(run.cpu), fmt_cpu(run.roles) or "one process"])
    lines = [
        "## 4. CPU of an idle service during an outage\n",
        f"{args.cpu_memories} memories imported, then, once nothing was in flight (`/readyz` pipeline queued == 0 "
        "and draining == 0; for a tree without it, the vector index holding them all) and 5 s more, no traffic "
        f"for {args.idle_minutes:g} minutes. CPU seconds (user + system) of `engram up`'s whole process tree "
        "(Postgres, Temporal, the API and the worker), read from /proc: `engram` is `engram up` itself (the "
        "whole service in the old one-process layout), `python3.11` its API and worker children. Each run on a "
        "fresh data directory. The baseline is the first row; the ratio compares CPU per wall second.\n",
        common.md_table(["run", "code", "memories", "window s", "CPU s", "cores busy", "this row / first row",
                         "by command", "engram up's children"], rows),
        "",
    ]
    for run in runs:
        marks = ", ".join(f"{t:.0f} s: {c:.1f}" for t, c in run.samples)
        lines.append(f"- {run.label}: imported with {run.imported}; {run.wait_s:.0f} s from the first request to "
                     f"the window; vector index {run.points} points."
                     f"{f' Imported from: {run.imports}.' if run.imports else ''} CPU seconds so far during the window: {marks}. "
                     f"Pipeline at the start: {run.state_before or '(none in /readyz)'}; at the end: "
                     f"{run.state_after or '(none in /readyz)'}.")
    return lines


if __name__ == "__main__":
    main()
