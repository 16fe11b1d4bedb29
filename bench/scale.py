"""Search latency against corpus size, through the service's own HTTP search.

The corpus is 100 scopes (user_id `scale-000` .. `scale-099`) that grow together: 1k -> 10k ->
30k -> 100k memories in all (10 -> 1,000 per scope), measured after each step. Its texts are the
1,676 LoCoMo dev turns (`[<date>] <speaker>: <text>`): each scope holds a seeded random sample of
them, so the same texts recur across scopes; a scope bigger than that (`--scopes 1`) holds them
again in other orders, each repeat tagged with its round (`bench/scale_corpus.py`). The vector index filters on the scope's payload, so a search scores only its own
scope's points. The queries are LoCoMo dev questions, each sent to a seeded random scope.

The corpus is loaded offline, between service runs, through engram's own repository functions
(`bench/scale_corpus.py` says how and why).

At each size: `engram up` on the same data directory, then, one request at a time from one
keep-alive client: `GET /healthz` (baseline), the default search (no rerank; the latency series),
the same searches with `explain: true` (the service's per-stage timings), searches with
`rerank: true` (cross-encoder over the fused top 20), and the query embedding in this process
(baseline). Targets (2 cores): default search p95 <= 25 ms and rerank p95 <= 400 ms, at 100k
(in one scope or over 100) and at 1M over 1,000 scopes.

    .venv/bin/python -m bench.scale           # 1k..100k -> bench/reports/scale.md, scale-*.png
    .venv/bin/python -m bench.scale --quick   # 1k, 5k   -> bench/reports/scale-quick.md, scale-quick-*.png
    .venv/bin/python -m bench.scale --scopes 1 --sizes 2000,10000,100000   # one scope -> scale-1-scopes.md
"""

from __future__ import annotations

import argparse
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from bench import common, locomo_data
from bench.latency import Series, get_series
from bench.scale_corpus import BATCH, SERVICE_ENV, Corpus, LoadStep, build_corpus, load, queries

TARGETS_MS = {"search_p95": 25.0, "rerank_p95": 400.0}  # issue 22 holds the rerank's on every machine
RERANK_TOP_N = 20
STAGES = ("embed_query", "dense", "bm25", "fetch", "fusion", "expansion", "rows")


def target_size(scopes: int) -> int:
    """The size the targets are set at: 1,000,000 memories over 1,000 scopes (issue 22); else
    100,000, in one scope (issue 22) or over 100 (the first scale issue)."""
    return 1_000_000 if scopes >= 1000 else 100_000


# -- measuring ---------------------------------------------------------------------------------------

@dataclass
class SizeResult:
    size: int
    per_scope: int
    load: LoadStep
    points: int  # in the vector index, per /readyz
    planner: str
    healthz: Series
    search: Series
    explain: Series
    rerank: Series
    embed: Series
    cpu_ms_per_search: dict[str, float]
    page_cache: tuple[int, int] | None  # (bytes cached, bytes) of the data directory before the searches
    page_cache_drops: int | None = None  # the kernel's page cache dropped while searching (None: not counted)


def search_series(svc: common.Service, label: str, corpus: Corpus, asks: list[tuple[str, int]],
                  **request) -> Series:
    """Each (query, scope) once, one at a time, limit 10, plus `request`'s fields. Outcomes count
    result sizes, warnings and any result outside the asked scope; `explain` timings go to
    stages_ms."""
    series = Series(label, [])
    for query, scope_index in asks:
        scope = corpus.scope(scope_index)
        response, ms = common.timed(svc.client.post, "/api/memory/search", json={
            "query": query, "scope": scope.model_dump(exclude_none=True), "limit": 10, **request})
        response.raise_for_status()
        series.latencies_ms.append(ms)
        body = response.json()
        series.outcomes[f"{len(body['results'])} results"] += 1
        if any(hit["memory"]["user_id"] != scope.user_id for hit in body["results"]):
            series.outcomes["results outside the scope"] += 1
        for warning in body["warnings"]:
            series.outcomes[warning.split(":")[0]] += 1
        for stage, facts in (body.get("explain") or {}).items():
            series.stages_ms.setdefault(stage, []).append(facts["ms"])
    return series


def embed_series(embedder, asks: list[tuple[str, int]]) -> Series:
    """The service's embedding model on the same queries, in this process (2 threads, as the
    service runs it), while the service idles."""
    series = Series("baseline: query embedding, in process", [])
    prefix = embedder.files.query_prefix
    for query, _ in asks:
        _, ms = common.timed(embedder.embed_sync, [prefix + query])
        series.latencies_ms.append(ms)
    return series


def measure(svc: common.Service, corpus: Corpus, embedder, asks, rerank_asks, warm_asks,
            load_step: LoadStep, size: int) -> SizeResult:
    points = common.index_points(svc)
    if points != size:
        raise RuntimeError(f"the index holds {points} points, not {size}")
    lexical = svc.client.get("/readyz").json()["components"]["lexical_index"]
    if lexical.get("to_index"):
        raise RuntimeError(f"the lexical index does not hold {lexical['to_index']} memories yet")
    # An optimisation beside the searches would hold a core (a child process) for a minute or more.
    print(f"  waited {common.wait_indexes_settled(svc, 3600)[0]:.0f} s for the indexes to settle", flush=True)
    planner = common.planner_stats(svc)
    page_cache = common.page_cache_share(svc.data_dir)
    drops_before = common.page_cache_drops()
    search_series(svc, "warm-up", corpus, warm_asks)
    search_series(svc, "warm-up", corpus, warm_asks[:3], rerank=True)
    healthz = get_series(svc, "baseline: GET /healthz", "/healthz", len(asks))
    print(f"  {len(asks)} searches", flush=True)
    cpu_before = common.tree_cpu_seconds(svc.proc.pid)
    search = search_series(svc, "search (default, no rerank)", corpus, asks)
    cpu_after = common.tree_cpu_seconds(svc.proc.pid)
    cpu = {k: (cpu_after[k] - cpu_before.get(k, 0.0)) * 1e3 / len(asks) for k in cpu_after}
    explain = search_series(svc, "search with explain", corpus, asks, explain=True)
    print(f"  {len(rerank_asks)} searches with rerank", flush=True)
    rerank = search_series(svc, f"search with rerank (top {RERANK_TOP_N})", corpus, rerank_asks,
                           rerank=True, rerank_top_n=RERANK_TOP_N)
    drops = common.page_cache_drops_since(drops_before)
    embed = embed_series(embedder, asks)
    return SizeResult(size, size // len(corpus.order), load_step, points, planner, healthz, search, explain,
                      rerank, embed, cpu, page_cache, drops)


# -- the run -----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="sizes 1000,5000; 60 searches, 15 with rerank")
    parser.add_argument("--sizes", help="total memories at each step, ascending (default 1000,10000,30000,100000)")
    parser.add_argument("--scopes", type=int, default=100)
    parser.add_argument("--searches", type=int, default=None, help="searches per size (default 300)")
    parser.add_argument("--rerank-searches", type=int, default=None, help="rerank searches per size (default 100)")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--keep", action="store_true", help="keep the data directory (its path is printed)")
    parser.add_argument("--data", type=Path, help="measure a directory kept by --keep that holds one size, --sizes N")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in (args.sizes or ("1000,5000" if args.quick else "1000,10000,30000,100000")).split(",")]
    searches = args.searches or (60 if args.quick else 300)
    rerank_searches = args.rerank_searches or (15 if args.quick else 100)
    if sizes != sorted(set(sizes)) or any(s % args.scopes for s in sizes):
        parser.error(f"--sizes must ascend and be multiples of --scopes ({args.scopes})")
    started = time.time()
    conversations, _ = locomo_data.load()
    asks = queries(conversations, searches + rerank_searches + 20, args.scopes, args.seed)
    warm_asks, rerank_asks, asks = asks[:20], asks[20:20 + rerank_searches], asks[20 + rerank_searches:]
    results: list[SizeResult] = []

    if args.data and len(sizes) != 1:
        parser.error("--data measures the one size the directory holds: give it as --sizes")
    with (contextlib.nullcontext(args.data) if args.data else common.data_dir(keep=args.keep)) as data:
        print(f"data directory: {data}{' (kept)' if args.keep or args.data else ''}", flush=True)
        with common.service("scale-init", data, SERVICE_ENV) as svc:
            model = common.service_embedder(svc)
        print(f"service initialised ({model}); embedding the text pool", flush=True)
        embedder = common.open_embedder(model)
        corpus = build_corpus(conversations, embedder, args.scopes, args.seed, per_scope=sizes[-1] // args.scopes)
        held = 0
        for size in sizes:
            print(f"loading up to {size} memories ({size // args.scopes} per scope)", flush=True)
            step = LoadStep(0, 0.0, 0.0) if args.data else load(data, corpus, held // args.scopes, size // args.scopes)
            held = size
            print(f"  {step.added} memories in {step.seconds:.0f} s, VACUUM ANALYZE {step.vacuum_s:.0f} s", flush=True)
            with common.service(f"scale-{size}", data, SERVICE_ENV) as svc:
                results.append(measure(svc, corpus, embedder, asks, rerank_asks, warm_asks, step, size))
            print(f"  search p95 {common.percentiles(results[-1].search.latencies_ms)['p95']:.1f} ms", flush=True)

    name = ("scale-quick" if args.quick else "scale") + ("" if args.scopes == 100 else f"-{args.scopes}-scopes")
    plots = write_plots(results, name)
    body = report(results, model, args.scopes, len(corpus.entries), plots, quick=args.quick)
    path = common.write_report(name, "Engram search latency against corpus size", body, started=started)
    print(body)
    print(f"\nreport: {path}")
    return path


# -- the report --------------------------------------------------------------------------------------

def p(series: Series, key: str) -> float:
    return common.percentiles(series.latencies_ms)[key]


def report(results: list[SizeResult], model: str, scopes: int, pool: int, plots: list[Path], *,
           quick: bool) -> str:
    out = []
    if quick:
        out.append(f"**Quick run (smoke test): small sizes and few queries; the targets are defined at "
                   f"{target_size(scopes):,}.**\n")
    out.append(
        f"`engram up` (ENGRAM_LLM_PROVIDER=none, ENGRAM_RERANK_BUDGET_MS=0 so every rerank reorders its whole "
        f"top 20, otherwise default settings; embedding model {model}) on one data "
        f"directory whose corpus grows between runs: {scopes} scopes, the same number of memories in each. The texts "
        f"are the {pool} distinct LoCoMo dev turns: each scope holds a seeded random sample of them, so **the same "
        "texts recur across scopes** (never twice in one scope). Qdrant filters on the scope's payload (a tenant "
        "index on `user_id`) and BM25 reads the scope's postings, so a search scores only its own scope's memories. "
        "Queries: LoCoMo dev questions verbatim, each sent to a seeded random scope; the same queries at every "
        "size.\n")
    out.append(
        "The memories are loaded offline, between service runs, through engram's repository functions "
        "(`insert_raw`, `store_embedding`, then "
        "`index_point` into the edge shard): what a raw remember and its pipeline write. Each text was embedded "
        "once, in the benchmark process, with the service's model. Differences from memories remembered one by "
        f"one: the {BATCH} memories of one load transaction share a `created_at` (so session neighbours among "
        "them are ordered by id), their ADD history events carry no request id, there are no job rows, and "
        "VACUUM ANALYZE ran after each load step. After a step that leaves at least `INDEX_OPTIMIZE_AFTER` "
        "points unoptimised, the loader optimises the dense edge shard (`EdgeIndex.optimize`, a child process), "
        "as the service's index optimizer would have by then. Each size is measured once the lexical index "
        "holds every memory and neither index is being optimised.\n")
    out.append(
        "Requests go one at a time from one keep-alive client; each latency is the client's round trip over "
        "loopback HTTP. The latency series is measured without `explain`; a second pass of the same queries "
        "with `explain: true` gives the service's per-stage timings. Percentiles: linear interpolation (numpy). "
        "The latency series is the first search of most scopes since the service started (the targets are "
        "judged on it): with many scopes, a query meets a scope whose pages Postgres and the engine still have "
        "to read, as after a restart or for a user back after a while. The explain pass repeats the same "
        "queries on scopes read already, so where it is much faster the difference is that cold read.\n")
    out.append("## Targets\n")
    out.append(targets_table(results[-1], scopes))
    out.append("\n## Latency against corpus size\n")
    out.extend(f"![{path.stem}]({path.name})\n" for path in plots)
    rows = []
    for r in results:
        for series in (r.search, r.explain, r.rerank, r.healthz, r.embed):
            rows.append([f"{r.size:,}", r.per_scope, *series.row()[:6],
                         ", ".join(f"{k}: {v}" for k, v in sorted(series.outcomes.items()))])
    out.append(common.md_table(["memories", "per scope", "series", "n", "p50 ms", "p95 ms", "p99 ms", "max ms",
                                "outcomes"], rows))
    out.append("\n## Where search time goes\n")
    out.append(stages_section(results))
    out.append("\n## Service CPU per default search\n")
    out.append("CPU time (user + system) of the service's process tree during the default-search series, "
               "divided by the number of searches.\n")
    out.append(common.md_table(["memories", "engram ms (API + worker)", "postgres ms", "temporal ms",
                                "round trip p50 ms"], [
        [f"{r.size:,}", f"{r.cpu_ms_per_search.get('engram', 0.0) + r.cpu_ms_per_search.get('python3.11', 0.0):.1f}",
         *(f"{r.cpu_ms_per_search.get(k, 0.0):.1f}" for k in ("postgres", "temporal")),
         common.fmt_ms(p(r.search, "p50"))] for r in results]))
    out.append("\n## Loading\n")
    out.append(common.md_table(["memories after", "added", "write s", "memories/s", "VACUUM ANALYZE s",
                                "index points"], [
        [f"{r.size:,}", r.load.added, f"{r.load.seconds:.0f}", f"{r.load.added / max(r.load.seconds, 1e-9):.0f}",
         f"{r.load.vacuum_s:.0f}", r.points] for r in results]))
    out.append("\n## Notes\n")
    out.extend(f"- At {r.size:,} a scope holds {r.per_scope} memories, fewer than {RERANK_TOP_N}: rerank scores "
               "only those." for r in results if r.per_scope < RERANK_TOP_N)
    out.extend(f"- Postgres planner statistics at {r.size:,} (diagnostic, read from Postgres directly): {r.planner}"
               for r in results)
    out.extend(f"- At {r.size:,} the OS page cache held {r.page_cache[0] / 2**30:.1f} of the data directory's "
               f"{r.page_cache[1] / 2**30:.1f} GB before the searches (`fincore`): what it does not hold, a "
               "scope's first search reads from the disk." for r in results if r.page_cache)
    out.extend(f"- Times the kernel's page cache was dropped at {r.size:,}, from the warm-up to the last search: "
               f"{r.page_cache_drops} (/proc/vmstat drop_pagecache; our machines drop it about once an hour): after a "
               "drop, what Postgres's buffer cache does not hold is read from the disk (bench/reports/cold-cache.md)."
               for r in results if r.page_cache_drops is not None)
    return "\n".join(out)


def targets_table(last: SizeResult, scopes: int) -> str:
    rows = []
    at = target_size(scopes)
    for name, series, target in (("default search p95", last.search, TARGETS_MS["search_p95"]),
                                 (f"rerank top {RERANK_TOP_N} p95", last.rerank, TARGETS_MS["rerank_p95"])):
        measured = p(series, "p95")
        verdict = ("PASS" if measured <= target else "FAIL") if last.size == at else \
            f"not judged: targets are at {at:,}"
        rows.append([f"{name} at {last.size:,} memories", f"{measured:.1f} ms", f"<= {target:.0f} ms at {at:,}",
                     verdict])
    return common.md_table(["target", "measured", "required", "verdict"], rows)


def stages_section(results: list[SizeResult]) -> str:
    """Per-stage p50 / p95 at each size, the round trip of the explain pass, and the query
    embedding's share."""
    def cell(values: list[float]) -> str:
        q = common.percentiles(values)
        return f"{q['p50']:.1f} / {q['p95']:.1f}"

    rows = [[stage, *(cell(r.explain.stages_ms[stage]) for r in results)] for stage in STAGES]
    rows.append(["critical path: max(embed_query + dense, bm25) + the rest",
                 *(cell(list(common.critical_path(r.explain.stages_ms))) for r in results)])
    rows.append(["client round trip (explain pass)", *(cell(r.explain.latencies_ms) for r in results)])
    rows.append(["embed_query share of the round trip (mean)",
                 *(f"{np.mean(r.explain.stages_ms['embed_query']) / np.mean(r.explain.latencies_ms):.0%}"
                   for r in results)])
    rows.append(["baseline: query embedding in process", *(cell(r.embed.latencies_ms) for r in results)])
    rows.append(["baseline: GET /healthz", *(cell(r.healthz.latencies_ms) for r in results)])
    last = results[-1]
    embed = common.percentiles(last.explain.stages_ms["embed_query"])
    trip = common.percentiles(last.explain.latencies_ms)
    summary = (f"At {last.size:,} memories the query embedding (`embed_query`) took p50 {embed['p50']:.1f} ms / "
               f"p95 {embed['p95']:.1f} ms of a p50 {trip['p50']:.1f} ms / p95 {trip['p95']:.1f} ms round trip "
               f"(explain pass); the same embedding in the benchmark process, with the service idle, took p50 "
               f"{p(last.embed, 'p50'):.1f} ms. The BM25 leg runs while the query is embedded and the index searched, "
               "so the stages' critical path is max(embed_query + dense, bm25) plus the rest; the gap between it "
               "and the round trip is outside the stages: HTTP, the API-key lookup, JSON, and waiting for the "
               "event loop or a core.\n")
    header = ["ms, p50 / p95", *(f"{r.size:,}" for r in results)]
    return summary + "\n" + common.md_table(header, rows)


# -- plots -------------------------------------------------------------------------------------------

def write_plots(results: list[SizeResult], name: str) -> list[Path]:
    """PNGs beside the report: default search and rerank percentiles against size, and the
    mean per-stage breakdown."""
    directory = common.report_dir(name)
    directory.mkdir(parents=True, exist_ok=True)
    scopes = results[0].size // results[0].per_scope
    paths = [directory / f"{name}-{kind}.png" for kind in ("latency", "rerank", "stages")]
    plot_percentiles(results, "search", TARGETS_MS["search_p95"], target_size(scopes),
                     f"Default search (no rerank), {scopes} scopes", paths[0])
    plot_percentiles(results, "rerank", TARGETS_MS["rerank_p95"], target_size(scopes),
                     f"Search with rerank of the top {RERANK_TOP_N}, {scopes} scopes", paths[1])
    plot_stages(results, paths[2])
    return paths


def _axes(title: str):
    fig = Figure(figsize=(8, 4.2), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.set_title(title)
    ax.set_axisbelow(True)
    ax.grid(alpha=0.3)
    return fig, ax


def plot_percentiles(results: list[SizeResult], attr: str, target_ms: float, target_at: int, title: str,
                     path: Path) -> None:
    fig, ax = _axes(title)
    sizes = [r.size for r in results]
    for key, style in (("p50", "o-"), ("p95", "s-"), ("p99", "^--")):
        ax.plot(sizes, [p(getattr(r, attr), key) for r in results], style, label=key)
    ax.axhline(target_ms, color="red", linestyle=":", label=f"target: p95 <= {target_ms:.0f} ms at {target_at:,}")
    ax.set_xscale("log")
    ax.set_xticks(sizes, [f"{s:,}" for s in sizes])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_ylim(bottom=0)
    ax.set_xlabel("memories in the service (log scale)")
    ax.set_ylabel("client round trip, ms")
    fig.legend(loc="outside right upper", fontsize="small")
    fig.savefig(path)


def plot_stages(results: list[SizeResult], path: Path) -> None:
    """Mean stage times: the vector leg (embed_query, dense) and the BM25 leg side by side, as they
    run at once, then the later stages stacked on the longer of the two."""
    fig, ax = _axes("Where default search time goes (explain pass, mean ms)")
    x = np.arange(len(results))
    mean = {stage: np.array([np.mean(r.explain.stages_ms[stage]) for r in results]) for stage in STAGES}
    ax.bar(x - 0.15, mean["embed_query"], width=0.3, label="embed_query")
    ax.bar(x - 0.15, mean["dense"], bottom=mean["embed_query"], width=0.3, label="dense")
    ax.bar(x + 0.15, mean["bm25"], width=0.3, label="bm25 (beside the two above)")
    bottom = np.maximum(mean["embed_query"] + mean["dense"], mean["bm25"])
    for stage in STAGES:
        if stage not in ("embed_query", "dense", "bm25"):
            ax.bar(x, mean[stage], bottom=bottom, label=stage, width=0.6)
            bottom = bottom + mean[stage]
    ax.plot(x, [np.mean(r.explain.latencies_ms) for r in results], "kD", label="client round trip")
    ax.set_xticks(x, [f"{r.size:,}" for r in results])
    ax.set_xlabel("memories in the service")
    ax.set_ylabel("ms")
    fig.legend(loc="outside right upper", fontsize="small")
    fig.savefig(path)

if __name__ == "__main__":
    main()
