"""A peer benchmark: Engram against mem0 2.2.1 (the open-source `Memory` on pgvector), on the
same corpus and the same queries, in one run, the two systems taking turns.

For each size N: N unique LoCoMo dev turn texts in one scope, loaded into a fresh Engram
(`engram up`, provider `none`, the bulk endpoint) and into a fresh mem0 (its own virtualenv,
pgvector on an embedded PostgreSQL 18 started here, `add(..., infer=False)`); then, with both
up, the same LoCoMo dev questions, one at a time from one client, in blocks of BLOCK that
alternate between the systems (A B, B A, ...), so the drift of a shared machine falls on both. Both embed with the same
local ONNX model (bge-small-en-v1.5): Engram in its own process, mem0 through an
OpenAI-compatible `/v1/embeddings` endpoint this benchmark serves on loopback (mem0 has no local
ONNX embedder; that HTTP hop is mem0's cost here and the report names it).

    .venv/bin/python -m bench.peer_mem0                               # 2k and 10k -> bench/reports/peer-mem0.md
    .venv/bin/python -m bench.peer_mem0 --sizes 2000,10000,100000     # + 100k (mem0 loaded in batches)
    .venv/bin/python -m bench.peer_mem0 --quick                       # 500 and 2k, 50 queries -> peer-mem0-quick.md

mem0 runs in a child process (bench/peer_mem0_runner.py) of bench/out/mem0-venv, which this
creates on first use (`pip install` from PyPI; MEM0_TELEMETRY=False in its environment).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Iterator

from bench import common, ingest, locomo_data
from worker.embedded import EmbeddedPostgres, default_shared_buffers_mb, free_port

# mem0ai and the psycopg pins of its `vector-stores` extra (the binary build brings libpq)
MEM0_REQUIREMENTS = ["mem0ai==2.2.1", "psycopg[binary]>=3.2.8", "psycopg-pool>=3.2.6,<4"]
MEM0_VENV = common.BENCH_DIR / "out" / "mem0-venv"
RUNNER = common.BENCH_DIR / "peer_mem0_runner.py"
MODEL = "bge-small-en-v1.5"  # Engram's default embedding model
DIM = 384
BATCH = 500  # memories per bulk request (the endpoint's maximum) and per command to the runner
WARMUP = 10  # queries sent before the timed ones, not timed
BLOCK = 20  # timed queries per turn (search_in_turns)
DRAIN_TIMEOUT_S = 3 * 3600


# -- mem0's side: its virtualenv, the embedding endpoint, the runner ----------------------------

def mem0_venv() -> Path:
    """The python of bench/out/mem0-venv, created and filled from PyPI unless it already holds
    mem0ai 2.2.1 and psycopg."""
    python = MEM0_VENV / "bin" / "python"
    probe = "import importlib.metadata as m, psycopg, psycopg_pool; print(m.version('mem0ai'))"
    if python.exists():
        found = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
        if found.returncode == 0 and found.stdout.strip() == "2.2.1":
            return python
    print(f"creating {MEM0_VENV} with {' '.join(MEM0_REQUIREMENTS)}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(MEM0_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *MEM0_REQUIREMENTS], check=True)
    return python


class EmbeddingEndpoint:
    """`POST /v1/embeddings` (the OpenAI shape mem0's `openai` embedder sends) answered with the
    local model, on a loopback port, from a thread of this process. Any other request is counted
    in `unexpected` and answered 503: mem0's LLM is pointed at `<url>/llm/v1`, so an LLM call
    would show up there."""

    def __init__(self, embedder) -> None:
        self.embedder = embedder
        self.requests = 0
        self.texts = 0
        self.unexpected: Counter = Counter()
        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def _handler(self):
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the OpenAI client expects
            # Without TCP_NODELAY a keep-alive answer waits ~40 ms for the client's delayed ACK.
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path != "/v1/embeddings":
                    endpoint.unexpected[self.path] += 1
                    return self._send(503, {"error": {"message": "no LLM in this benchmark"}})
                if body.get("dimensions", DIM) != DIM:
                    return self._send(400, {"error": {"message": f"{MODEL} has {DIM} dimensions"}})
                texts = [body["input"]] if isinstance(body["input"], str) else list(body["input"])
                # One text (a query, or mem0's per-memory add) runs in this thread, as Engram embeds
                # a query; a batch runs on the embedder's pool, as Engram embeds documents.
                vectors = endpoint.embedder.embed_sync(texts, parallel=len(texts) > 1)
                endpoint.requests += 1
                endpoint.texts += len(texts)
                self._send(200, {"object": "list", "model": MODEL,
                                 "data": [{"object": "embedding", "index": i, "embedding": v.tolist()}
                                          for i, v in enumerate(vectors)],
                                 "usage": {"prompt_tokens": 0, "total_tokens": 0}})

            def do_GET(self) -> None:
                endpoint.unexpected[self.path] += 1
                self._send(503, {"error": {"message": "not served"}})

            def _send(self, status: int, payload: dict) -> None:
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args) -> None:
                pass

        return Handler

    def __enter__(self) -> "EmbeddingEndpoint":
        threading.Thread(target=self.server.serve_forever, name="embeddings-endpoint", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class Runner:
    """bench/peer_mem0_runner.py in mem0's virtualenv: one JSON command per line in, one answer out."""

    def __init__(self, python: Path, config: dict, home: Path, log: Path) -> None:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("ENGRAM_", "OPENAI_", "MEM0_")) and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update({"MEM0_TELEMETRY": "False", "MEM0_DIR": str(home)})  # MEM0_DIR: not ~/.mem0
        self.log = open(log, "ab")
        # -P: the script's folder (bench/) is not put on sys.path, so nothing of ours shadows mem0's imports.
        self.proc = subprocess.Popen([str(python), "-P", str(RUNNER), json.dumps(config)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     bufsize=1)
        self._answer()  # {"ready": true} once Memory.from_config returned

    def call(self, **cmd) -> dict:
        """Send one command, return its answer; raises RuntimeError if the command failed."""
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._answer(cmd["op"])

    def _answer(self, op: str = "start") -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"mem0 runner exited ({op}); see {self.log.name}")
        answer = json.loads(line)
        if not answer["ok"]:
            raise RuntimeError(f"mem0 runner: {op} failed: {answer['error']}; see {self.log.name}")
        return answer

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def mem0_config(dsn: str, endpoint: str, history: Path) -> dict:
    """mem0's own defaults except what points it at our Postgres and our embedding model: pgvector
    (HNSW, cosine; its keyword leg; 1 to 5 pooled connections), no reranker."""
    return {
        "vector_store": {"provider": "pgvector", "config": {"connection_string": dsn, "embedding_model_dims": DIM}},
        "embedder": {"provider": "openai", "config": {"model": MODEL, "api_key": "unused",
                                                      "openai_base_url": f"{endpoint}/v1", "embedding_dims": DIM}},
        # add(..., infer=False) and search() need no LLM; the config still builds an OpenAI client.
        "llm": {"provider": "openai", "config": {"model": "none", "api_key": "unused",
                                                 "openai_base_url": f"{endpoint}/llm/v1"}},
        "history_db_path": str(history),
    }


# -- one system at one size -----------------------------------------------------------------------

@dataclass
class Run:
    system: str
    size: int
    ingest_path: str
    stored: int = 0  # memories confirmed searchable at the end
    ingest_s: float = 0.0
    search_ms: list[float] = field(default_factory=list)  # client round trips
    inner_ms: list[float] = field(default_factory=list)  # mem0: Memory.search inside the runner
    hits: Counter = field(default_factory=Counter)
    search_cpu_ms: float = 0.0  # CPU the system used per timed search, every process of it
    load: list[float] = field(default_factory=list)  # 1-minute load average before ingesting, after searching
    facts: dict = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.size / self.ingest_s


def chunks(texts: list[str], n: int) -> Iterator[list[str]]:
    for start in range(0, len(texts), n):
        yield texts[start:start + n]


@dataclass
class Side:
    """One system, loaded and searchable."""

    run: Run
    search: Callable[[str], tuple[float, int, float | None]]  # query -> (round trip ms, results, inner ms)
    cpu_s: Callable[[], dict[str, float]]  # CPU seconds used so far, by process
    settle: Callable[[], None] = lambda: None  # called once the other system is loaded, before searching


@contextlib.contextmanager
def engram_loaded(size: int, texts: list[str], scope: str) -> Iterator[Side]:
    """`texts` in a fresh `engram up` (provider none) in scope `scope`, settled (`_wait_settled`),
    until the block ends. Raises RuntimeError if a bulk request stores less than it was sent or
    the index ends up with other than `size` points."""
    run = Run("Engram", size, f"`POST /api/memory/remember/batch`, {BATCH} per request, one at a time")
    run.load.append(os.getloadavg()[0])
    with common.data_dir() as data, common.service(f"peer-engram-{size}", data, {"ENGRAM_LLM_PROVIDER": "none"}) as svc:
        run.facts["embedder"] = common.service_embedder(svc)
        print(f"  Engram: ingesting {size}", flush=True)
        run.ingest_s = ingest_engram(svc, texts, scope)
        (run.facts["settle_s"], run.facts["lexical_backlog"], run.facts["was_optimising"],
         run.facts["unoptimized"]) = common.wait_indexes_settled(svc, DRAIN_TIMEOUT_S)
        run.stored = common.index_points(svc)
        if run.stored != size:
            raise RuntimeError(f"Engram's index holds {run.stored} points, not {size}")
        print(f"  Engram: {run.stored} index points after {run.ingest_s:.1f} s", flush=True)

        def search(query: str) -> tuple[float, int, None]:
            response, ms = common.timed(svc.client.post, "/api/memory/search",
                                        json={"query": query, "scope": {"user_id": scope}, "limit": 10})
            response.raise_for_status()
            return ms, len(response.json()["results"]), None

        loaded = optimisations(svc)
        counts = []

        def settle() -> None:
            """While mem0 loaded, the optimiser may have begun on the points waiting: searching
            waits until it is done, as it waited after the ingest."""
            counts.append(optimisations(svc))
            run.facts["resettle_s"] = common.wait_indexes_settled(svc, DRAIN_TIMEOUT_S)[0]

        yield Side(run, search, lambda: common.tree_cpu_seconds(svc.proc.pid), settle)
        idle = counts[0] if counts else loaded
        run.facts["optimisations"] = (loaded, idle - loaded, optimisations(svc) - idle)
        run.facts["unoptimized_at_search"] = common.wait_indexes_settled(svc, DRAIN_TIMEOUT_S)[3]
        run.load.append(os.getloadavg()[0])


def ingest_engram(svc: common.Service, texts: list[str], scope: str) -> float:
    """Seconds until `texts`, sent to the bulk endpoint BATCH at a time into `scope`, are all
    imported and the pipeline is idle. Raises RuntimeError if a request stores less than it was
    sent, httpx.HTTPStatusError if one fails, and whatever ingest's waits raise past
    DRAIN_TIMEOUT_S."""
    started = time.monotonic()
    jobs = []
    for chunk in chunks(texts, BATCH):
        response = svc.client.post("/api/memory/remember/batch",
                                   json={"items": [{"content": t, "scope": {"user_id": scope}} for t in chunk]})
        response.raise_for_status()
        body = response.json()
        if body["stored"] != len(chunk):
            raise RuntimeError(f"bulk request stored {body['stored']} of {len(chunk)}: {body['failed']} failed")
        jobs.append(body["job_id"])
    asyncio.run(ingest.wait_imports(svc, jobs, timeout_s=DRAIN_TIMEOUT_S))
    idle_at, _ = ingest.wait_pipeline_idle(svc, timeout_s=DRAIN_TIMEOUT_S, poll_s=0.25)
    return idle_at - started


def optimisations(svc: common.Service) -> int:
    """Vector-index optimisations the service has begun so far (its log says each): one that
    overlaps the searches competes with them for the 2 cores."""
    return svc.log.read_text(errors="replace").count('"msg": "optimising a vector index"')


@contextlib.contextmanager
def mem0_loaded(python: Path, embedder, size: int, texts: list[str], scope: str, fast_load: bool,
                plan_query: str) -> Iterator[Side]:
    """`texts` in a fresh mem0 (a runner of `python` on a fresh embedded Postgres, embedding with
    `embedder` through the loopback endpoint), until the block ends; then how Postgres plans
    mem0's vector query for `plan_query`. Raises RuntimeError if a runner command fails or the
    table ends up with other than `size` rows."""
    op = "load" if fast_load else "add"
    path = (f"batches of {BATCH}: `embed_batch` (100 texts per embedding request), one `vector_store.insert`, "
            "one `batch_add_history`" if fast_load else "`Memory.add(text, user_id=..., infer=False)`, one per memory")
    run = Run("mem0", size, path)
    run.load.append(os.getloadavg()[0])
    with tempfile.TemporaryDirectory(prefix="peer-mem0-") as tmp, contextlib.ExitStack() as stack:
        data = Path(tmp)
        postgres = EmbeddedPostgres(data / "postgres", free_port())
        postgres.start()
        stack.callback(postgres.stop)
        endpoint = stack.enter_context(EmbeddingEndpoint(embedder))
        runner = Runner(python, mem0_config(postgres.dsn("postgres"), endpoint.url, data / "history.db"),
                        data / "mem0-home", common.LOGS / f"peer-mem0-runner-{size}.log")
        stack.callback(runner.close)
        run.facts.update(runner.call(op="info"))
        print(f"  mem0: ingesting {size} ({op})", flush=True)
        started = time.monotonic()
        for chunk in chunks(texts, BATCH):
            runner.call(op=op, user_id=scope, texts=chunk)
        run.ingest_s = time.monotonic() - started
        run.stored = runner.call(op="count")["count"]
        if run.stored != size:
            raise RuntimeError(f"mem0 holds {run.stored} memories, not {size}")
        ingest_requests = endpoint.requests
        print(f"  mem0: {run.stored} rows after {run.ingest_s:.1f} s", flush=True)

        def search(query: str) -> tuple[float, int, float]:
            answer, ms = common.timed(runner.call, op="search", user_id=scope, query=query, limit=10)
            return ms, answer["hits"], answer["ms"]

        def cpu_s() -> dict[str, float]:  # this process: the embedding endpoint and the pipe's client side
            return {"runner": sum(common.tree_cpu_seconds(runner.proc.pid).values()),
                    "postgres": sum(common.tree_cpu_seconds(postgres.proc.pid).values()),
                    "benchmark process": time.process_time()}

        yield Side(run, search, cpu_s)
        run.load.append(os.getloadavg()[0])
        searches = WARMUP + len(run.search_ms)
        run.facts["embedding requests while ingesting"] = ingest_requests
        run.facts["embedding requests per search"] = (endpoint.requests - ingest_requests) / searches
        run.facts["requests other than /v1/embeddings (LLM)"] = sum(endpoint.unexpected.values())
        run.facts["plan"] = vector_plan(postgres, embedder.embed_sync([plan_query])[0], scope)
        started_line = re.search(r"starting (PostgreSQL [\d.]+)", (postgres.data_dir / "postgres.log").read_text())
        run.facts["postgres"] = started_line.group(1) if started_line else "PostgreSQL 18"


def search_in_turns(sides: list[Side], queries: list[str]) -> None:
    """The first WARMUP `queries` untimed on each system, then the rest in blocks of BLOCK, the
    systems taking turns (A B, B A, A B, ...): a slower or busier minute on this shared machine
    falls on both. CPU per search counts each system's processes over its own blocks only."""
    for side in sides:
        side.settle()
    for side in sides:
        for query in queries[:WARMUP]:
            side.search(query)
    timed = queries[WARMUP:]
    used: dict[int, Counter] = {id(side): Counter() for side in sides}
    for turn, start in enumerate(range(0, len(timed), BLOCK)):
        for side in sides if turn % 2 == 0 else sides[::-1]:
            before = side.cpu_s()
            for query in timed[start:start + BLOCK]:
                ms, hits, inner = side.search(query)
                side.run.search_ms.append(ms)
                side.run.hits[hits] += 1
                if inner is not None:
                    side.run.inner_ms.append(inner)
            for name, seconds in side.cpu_s().items():
                used[id(side)][name] += seconds - before.get(name, 0.0)
    for side in sides:
        side.run.facts["cpu_by_process"] = {name: s * 1e3 / len(timed) for name, s in used[id(side)].items()}
        side.run.search_cpu_ms = sum(side.run.facts["cpu_by_process"].values())


def vector_plan(postgres: EmbeddedPostgres, vector, scope: str) -> str:
    """How Postgres runs mem0's vector query now (the node types of its plan): whether the HNSW
    index is used or the scope's rows are scanned and sorted."""
    literal = "[" + ",".join(f"{x:.6f}" for x in vector) + "]"
    sql = (f"EXPLAIN SELECT id, vector <=> '{literal}'::vector AS distance, payload FROM mem0 "
           f"WHERE payload->>'user_id' = '{scope}' ORDER BY distance LIMIT 60")
    out = subprocess.run([str(postgres.bin_dir / "psql"), postgres.dsn("postgres"), "-tAc", sql],
                         capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    nodes = [lines[0]] + [line.strip()[2:] for line in lines[1:] if line.strip().startswith("->")]
    return " → ".join(node.split("  (cost")[0].strip() for node in nodes)


# -- the report -----------------------------------------------------------------------------------

def size_section(size: int, engram: Run, mem0: Run) -> list[str]:
    e, m, inner = (common.percentiles(r) for r in (engram.search_ms, mem0.search_ms, mem0.inner_ms))
    ms = common.fmt_ms

    def row(label: str, run: Run | None, p: dict) -> list[object]:
        ingest_cells = [run.stored, f"{run.ingest_s:.1f}", f"{run.rate:.1f}"] if run else ["", "", ""]
        cpu = ms(run.search_cpu_ms) if run else ""
        return [label, *ingest_cells, ms(p["p50"]), ms(p["p95"]), ms(p["p99"]), ms(p["max"]), cpu]

    rows = [row("Engram (HTTP round trip)", engram, e),
            row("mem0 (round trip through the runner's pipe)", mem0, m),
            row("mem0 (`Memory.search` inside the runner)", None, inner),
            ["**ratio Engram / mem0** (pipe)", "", "", f"**{engram.rate / mem0.rate:.2f}×**",
             *(f"**{e[k] / m[k]:.2f}×**" for k in ("p50", "p95", "p99", "max")),
             f"{engram.search_cpu_ms / mem0.search_cpu_ms:.2f}×"],
            ["ratio Engram / mem0 (inside the runner)", "", "", "",
             *(f"{e[k] / inner[k]:.2f}×" for k in ("p50", "p95", "p99", "max")), ""]]
    hits = lambda r: ", ".join(f"{n}: {c}" for n, c in sorted(r.hits.items(), reverse=True))  # noqa: E731
    return [
        f"## {size:,} memories in one scope", "",
        common.md_table(["system", "memories", "ingest s", "memories/s", "search p50 ms", "p95 ms", "p99 ms",
                         "max ms", "CPU ms per search"], rows), "",
        "- how far the ratio (pipe) could move with the minutes this run met: its 90% interval when the blocks "
        f"of {BLOCK} searches, which the systems took in turns, are drawn again with replacement, the same "
        "blocks for both (a paired block bootstrap, approximate; an interval holding 1.00 cannot tell the "
        f"systems apart): {common.ratio_intervals(engram.search_ms, mem0.search_ms, BLOCK)}.",
        f"- Engram ingest: {engram.ingest_path}; until every import job is done and `/readyz` shows the "
        "pipeline idle (queued 0, draining 0); memories = points in the vector index then. Searching began "
        "once the lexical index held every memory with its current weights (`/readyz` lexical_index "
        f"to_index and to_reweigh 0; at the pipeline's idle {engram.facts['lexical_backlog'][0]} and "
        f"{engram.facts['lexical_backlog'][1]}) and no index was being optimised (one was at the pipeline's "
        f"idle: {'yes' if engram.facts['was_optimising'] else 'no'}): {engram.facts['settle_s']:.1f} s later, "
        "not counted in the ingest time. Points the indexes then searched by brute force (written since their "
        f"last optimisation): dense {engram.facts['unoptimized'][0]}, lexical {engram.facts['unoptimized'][1]}.",
        f"- mem0 ingest: {mem0.ingest_path}; until the last call returned (mem0 writes synchronously); "
        "memories = rows in its pgvector table.",
        f"- results per search (results: searches): Engram {hits(engram)}; mem0 {hits(mem0)}.",
        "- Engram's vector-index optimisations (a child process that builds the HNSW graphs once "
        f"ENGRAM_INDEX_OPTIMIZE_AFTER points wait): {engram.facts['optimisations'][0]} begun while ingesting, "
        f"{engram.facts['optimisations'][1]} while mem0 loaded (searching waited {engram.facts['resettle_s']:.1f} s "
        f"for it to end), {engram.facts['optimisations'][2]} while searching; points searched by brute force "
        f"after the searches: dense {engram.facts['unoptimized_at_search'][0]}, lexical "
        f"{engram.facts['unoptimized_at_search'][1]}.",
        f"- mem0's vector query as Postgres plans it after the load: {mem0.facts['plan']}.",
        "- CPU ms per search: CPU time used during a system's own blocks of timed searches divided by their number: "
        "Engram, every process of `engram up` (API, worker, Postgres, Temporal); mem0, the runner, its "
        "Postgres and this benchmark's process (the embedding endpoint; also the pipe's client side). "
        "Well above the search's own work means something else in that system was busy. Engram's by "
        f"process: {common.by_process(engram.facts['cpu_by_process'])}.",
        "- 1-minute load average before ingesting / after the last search (2 cores; anything above the "
        f"system's own load is another engineer's work): Engram {engram.load[0]:.2f} / {engram.load[1]:.2f}, "
        f"mem0 {mem0.load[0]:.2f} / {mem0.load[1]:.2f}.",
        "- times the kernel's page cache was dropped from Engram's ingest to the last search (/proc/vmstat "
        f"drop_pagecache; after one, what is not in Postgres's buffer cache, {default_shared_buffers_mb()} MB "
        f"for each system, is read from the disk): {engram.facts['page_cache_drops']}.",
        "",
    ]


def report(args, runs: list[tuple[Run, Run]], started: float, queries: int) -> Path:
    first_mem0 = runs[0][1]
    facts = first_mem0.facts
    body = [
        f"Engram against mem0 on the same corpus and the same queries in one run (issue 22): both loaded, "
        f"then searched in blocks of {BLOCK} queries that alternate between them (A B, B A, ...), so a busier "
        "minute on this shared machine falls on both. Ratio = Engram / mem0: below 1 Engram is faster for latency; above 1 "
        "Engram ingests faster.",
        "",
        *itertools.chain.from_iterable(size_section(e.size, e, m) for e, m in runs),
        "## What ran",
        "",
        f"- corpus: for each size N, the first N of `bench.ingest.unique_texts` (the LoCoMo dev turns, "
        "cycled, each with a unique suffix), the same texts for both systems, all in one scope "
        "(`user_id` `peer-<N>`); a fresh data directory / database per system and size.",
        f"- queries: {queries} LoCoMo dev questions, a seeded sample (seed {args.seed}), the same for both "
        f"systems and every size, after {WARMUP} other questions as an untimed warm-up; one client, one "
        "at a time, `limit` 10.",
        f"- Engram: `engram up` of this tree, `ENGRAM_LLM_PROVIDER=none`, every other setting default; "
        f"embedding model {runs[0][0].facts['embedder']} (local ONNX, int8, in the service's process); "
        "search = `POST /api/memory/search` with `{query, scope: {user_id}, limit: 10}` from one "
        "keep-alive httpx client: the time includes HTTP, auth and JSON.",
        f"- mem0: mem0ai {facts['mem0']} (open-source `Memory`, not the platform client), in its own "
        f"virtualenv `bench/out/mem0-venv` ({', '.join(MEM0_REQUIREMENTS)} from PyPI), "
        f"`MEM0_TELEMETRY=False` (telemetry seen as {facts['telemetry']}); driven by "
        "`bench/peer_mem0_runner.py` over JSON lines on stdin/stdout.",
        f"- mem0's vector store: `{facts['vector_store']}` on an embedded {facts['postgres']} with pgvector "
        "started by the benchmark (default settings, `max_connections=200`); mem0's defaults: table `mem0`, "
        f"HNSW index with `vector_cosine_ops` (hnsw {facts['hnsw']}, diskann {facts['diskann']}), "
        "a GIN full-text index on `payload->>'text_lemmatized'`, psycopg pool of 1 to 5 connections, "
        f"no reranker (reranker configured: {facts['reranker']}).",
        "- mem0's search (2.2.1 defaults, `top_k` 10, threshold 0.1): embed the query, a pgvector query for "
        "max(4·10, 60) = 60 candidates filtered on `payload->>'user_id'` (the HNSW index exists, but "
        "Postgres chooses the plan: each size above names it; a Seq Scan + Sort is an exact search), "
        "a keyword query (`to_tsvector('simple', …) @@ plainto_tsquery('simple', …)`) "
        f"for 60 more (keyword search supported: {facts['keyword_search']}), then its BM25-sigmoid + "
        "semantic scoring. 2.2.1 takes the scope in `filters={'user_id': …}` and the limit as `top_k` "
        "(a top-level `user_id` raises).",
        f"- mem0's lemmatizer and entity boost need spaCy and its `en_core_web_sm` model (the `nlp` extra; "
        "the model is not on PyPI): not installed, as a plain `pip install mem0ai` leaves it. So 2.2.1 "
        f"falls back as it is written to (spaCy lemmatizer loaded: {facts['spacy_lemmatizer']}): the "
        "keyword leg runs on the raw text and no entity boost is computed (the entity store stays empty).",
        f"- **the extra hop**: mem0 embeds through its `openai` embedder (`openai_base_url` = a loopback "
        f"`/v1/embeddings` endpoint this benchmark serves from a thread of its own process with the same "
        f"model, {MODEL}, via `engram.inference.embedder`, on a `ThreadingHTTPServer` with TCP_NODELAY): "
        "one HTTP request per memory added (per 100 in the batch load) and "
        f"{facts['embedding requests per search']:.0f} per search, 384 floats per text as JSON. mem0 has "
        "no in-process ONNX embedder (its local ones, `huggingface`/`fastembed`, need torch or a model "
        "download), so this hop is part of mem0's numbers; Engram embeds in its own process.",
        "- **the other hop**: Engram's search time is an HTTP round trip; mem0's main row is the round "
        "trip through the runner's pipe (a JSON line each way, timed in this process), and the row "
        "beneath it the time of `Memory.search` alone inside the runner.",
        f"- mem0's LLM: `openai` pointed at `<endpoint>/llm/v1`, which answers 503 and counts; requests "
        f"that reached it: {sum(r[1].facts['requests other than /v1/embeddings (LLM)'] for r in runs)} "
        "(`infer=False` and `search` make none).",
        "",
    ]
    name = "peer-mem0-quick" if args.quick else "peer-mem0"
    return common.write_report(name, "Peer benchmark: Engram against mem0 2.2.1 on pgvector", "\n".join(body),
                               started=started)


# -- main -----------------------------------------------------------------------------------------

def questions() -> list[str]:
    """Every LoCoMo dev question, in the split's order."""
    return [q.question for conv in locomo_data.load()[0] for q in conv.questions]


def sample_queries(n: int, seed: int) -> list[str]:
    """WARMUP + n distinct LoCoMo dev questions, a seeded sample; the first WARMUP are the warm-up."""
    return random.Random(seed).sample(questions(), n + WARMUP)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="2000,10000", help="memories in the one scope, comma-separated")
    parser.add_argument("--queries", type=int, default=200, help="timed searches per system and size")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--mem0-fast-load-above", type=int, default=10000,
                        help="sizes above this load mem0 in batches instead of one add() per memory")
    parser.add_argument("--quick", action="store_true", help="sizes 500 and 2000, 50 queries")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.queries = "500,2000", 50
    sizes = [int(s) for s in args.sizes.split(",")]
    started = time.time()

    python = mem0_venv()
    embedder = common.open_embedder(MODEL)
    queries = sample_queries(args.queries, args.seed)
    runs = []
    for size in sizes:
        print(f"{size} memories", flush=True)
        texts = list(itertools.islice(ingest.unique_texts(f"peer-{size}"), size))
        scope = f"peer-{size}"
        drops = common.page_cache_drops()
        with contextlib.ExitStack() as stack:
            engram = stack.enter_context(engram_loaded(size, texts, scope))
            mem0 = stack.enter_context(
                mem0_loaded(python, embedder, size, texts, scope, size > args.mem0_fast_load_above, queries[WARMUP]))
            print("  searching, the systems taking turns", flush=True)
            search_in_turns([engram, mem0], queries)
        engram, mem0 = engram.run, mem0.run
        engram.facts["page_cache_drops"] = common.page_cache_drops_since(drops)
        for r in (engram, mem0):
            p = common.percentiles(r.search_ms)
            print(f"  {r.system}: {r.rate:.1f} memories/s; search p50/p95/p99 "
                  f"{p['p50']:.1f}/{p['p95']:.1f}/{p['p99']:.1f} ms", flush=True)
        runs.append((engram, mem0))
    print(report(args, runs, started, args.queries))


if __name__ == "__main__":
    main()
