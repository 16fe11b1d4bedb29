"""Search right after the kernel drops its page cache, with the embedded Postgres's buffer cache
at Postgres's default (128 MB) and at Engram's (worker.embedded.default_shared_buffers_mb).

Our machines drop the page cache about once an hour (/proc/vmstat drop_pagecache), and an
hour-long benchmark meets that: at 100,000 memories in one scope a search reads ~135 blocks
from outside a 128 MB buffer cache, so after a drop it reads the disk. For each buffer size,
taking turns (`--rounds`): `engram up` on one kept store, the warm-up questions and one untimed
pass of the timed ones, a timed pass (warm), the page cache dropped (needs root), and two timed
passes (cold 1, cold 2). Each pass reports latency, the Postgres blocks read from outside the
buffer cache per search, and CPU per search. The claim is each size's cold / warm ratio.

    .venv/bin/python -m bench.cold_cache --size 100000 [--data DIR] [--rounds 2]

`--data` keeps the store (bench/out/cold-cache-<size> by default; made by the peer benchmark's
ingest, through the API, if it holds no memories yet).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import subprocess
import time
from pathlib import Path

from bench import common, ingest
from bench.peer_mem0 import BATCH, DRAIN_TIMEOUT_S, WARMUP, chunks, sample_queries
from worker.embedded import MIN_SHARED_BUFFERS_MB, EmbeddedPostgres, default_shared_buffers_mb

PASSES = ("warm", "cold 1", "cold 2")


def build(svc: common.Service, size: int, scope: str) -> float:
    """Ingest the peer corpus's first `size` texts into `scope`; the seconds it took."""
    started = time.monotonic()
    texts = list(itertools.islice(ingest.unique_texts(scope), size))
    jobs = []
    for chunk in chunks(texts, BATCH):
        response = svc.client.post("/api/memory/remember/batch",
                                   json={"items": [{"content": t, "scope": {"user_id": scope}} for t in chunk]})
        response.raise_for_status()
        jobs.append(response.json()["job_id"])
    asyncio.run(ingest.wait_imports(svc, jobs, timeout_s=DRAIN_TIMEOUT_S))
    ingest.wait_pipeline_idle(svc, timeout_s=DRAIN_TIMEOUT_S, poll_s=0.25)
    return time.monotonic() - started


def blocks(data: Path, port: str) -> tuple[int, int]:
    """(blocks read from outside the buffer cache, blocks found in it) of the engram database so far."""
    psql = EmbeddedPostgres(data / "postgres", int(port)).bin_dir / "psql"
    out = subprocess.run([str(psql), "-h", "127.0.0.1", "-p", port,
                          "-U", "postgres", "engram", "-Atc",
                          "SELECT blks_read, blks_hit FROM pg_stat_database WHERE datname = 'engram'"],
                         capture_output=True, text=True, check=True).stdout
    read, hit = out.split("|")
    return int(read), int(hit)


def drop_page_cache() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("1\n")


def measure(data: Path, scope: str, buffers_mb: int, queries: list[str]) -> dict[str, dict]:
    """The passes of one start of `engram up` on `data` with `buffers_mb` of buffer cache."""
    port = str(common.free_port())
    env = {"ENGRAM_LLM_PROVIDER": "none", "ENGRAM_EMBEDDED_POSTGRES_SHARED_BUFFERS_MB": str(buffers_mb),
           "ENGRAM_EMBEDDED_POSTGRES_PORT": port}
    passes = {}
    with common.service(f"cold-cache-{buffers_mb}", data, env) as svc:
        common.wait_indexes_settled(svc, DRAIN_TIMEOUT_S)

        def search(query: str) -> float:
            response, ms = common.timed(svc.client.post, "/api/memory/search",
                                        json={"query": query, "scope": {"user_id": scope}, "limit": 10})
            response.raise_for_status()
            return ms

        for query in queries:  # the warm-up questions, then the timed ones untimed
            search(query)
        for name in PASSES:
            if name == "cold 1":
                drop_page_cache()
            before, cpu = blocks(data, port), common.tree_cpu_seconds(svc.proc.pid)
            latencies = [search(q) for q in queries[WARMUP:]]
            after, cpu_after = blocks(data, port), common.tree_cpu_seconds(svc.proc.pid)
            n = len(latencies)
            passes[name] = {**common.percentiles(latencies), "read": (after[0] - before[0]) / n,
                            "hit": (after[1] - before[1]) / n,
                            "cpu": sum(cpu_after[k] - cpu.get(k, 0.0) for k in cpu_after) * 1e3 / n}
    return passes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--data", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench.cold_cache drops the kernel's page cache: run it as root")
    started = time.time()
    scope = f"peer-{args.size}"
    data = args.data or common.BENCH_DIR / "out" / f"cold-cache-{args.size}"
    data.mkdir(parents=True, exist_ok=True)
    built = None
    if not (data / "postgres").exists():
        with common.service(f"cold-cache-build-{args.size}", data, {"ENGRAM_LLM_PROVIDER": "none"}) as svc:
            built = build(svc, args.size, scope)
    queries = sample_queries(200, 7)
    sizes = (MIN_SHARED_BUFFERS_MB, default_shared_buffers_mb())
    runs: dict[int, list[dict]] = {mb: [] for mb in sizes}
    for _ in range(args.rounds):
        for mb in sizes:
            runs[mb].append(measure(data, scope, mb, queries))
            print(f"  {mb} MB: " + ", ".join(f"{p} p50 {runs[mb][-1][p]['p50']:.1f}" for p in PASSES), flush=True)
    rows = []
    for mb in sizes:
        for turn, passes in enumerate(runs[mb], 1):
            for name in PASSES:
                p = passes[name]
                rows.append([f"{mb} MB", turn, name, common.fmt_ms(p["p50"]), common.fmt_ms(p["p95"]),
                             common.fmt_ms(p["p99"]), f"{p['read']:.1f}", f"{p['hit']:.0f}", f"{p['cpu']:.1f}",
                             f"{p['p50'] / passes['warm']['p50']:.2f}× / {p['p95'] / passes['warm']['p95']:.2f}×"])
    body = [
        f"{args.size:,} memories in one scope (`{scope}`, the peer benchmark's corpus"
        + (f", ingested through the API in {built:.0f} s" if built else ", a kept store") + "). "
        f"Buffer sizes taken in turn, {args.rounds} starts each; {len(queries) - WARMUP} timed searches per pass, "
        "one client, `limit` 10, after the warm-up questions and one untimed pass of the same questions. "
        "Between `warm` and `cold 1` the kernel's page cache is dropped (`sync; echo 1 > /proc/sys/vm/drop_caches`), "
        "as our machines do about once an hour.",
        "",
        common.md_table(["shared_buffers", "start", "pass", "p50 ms", "p95 ms", "p99 ms",
                         "blocks read / search", "blocks hit / search", "CPU ms / search",
                         "p50 / p95 against warm"], rows),
        "",
        "- blocks read: from outside Postgres's buffer cache (the kernel's page cache, or the disk after a drop).",
        f"- {default_shared_buffers_mb()} MB is `worker.embedded.default_shared_buffers_mb()` on this machine "
        "(an eighth of its memory, 128 MB to 1 GB).",
    ]
    path = common.write_report("cold-cache", "Search after the page cache is dropped: Postgres's buffer cache",
                               "\n".join(body), started=started)
    print(path)


if __name__ == "__main__":
    main()
