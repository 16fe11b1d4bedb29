"""A/B of search between two settings of this tree: two services on copies of one store, the
same questions, in blocks that take turns.

`--size` unique LoCoMo dev turn texts (bench.peer_mem0's corpus) are loaded into one scope through
the bulk endpoint, once, then vacuumed and its dense shard optimised (settle). The data directory
is then copied, and `engram up` runs on each copy at
once: A with the `--a` settings, B with the `--b` settings. Each answers every question once,
untimed (unless `--cold`). Then the same LoCoMo dev questions go one at a time from one client,
in blocks that alternate between the sides (A B, B A, ...), as in bench.peer_mem0, so the drift
of a shared machine falls on both. The claim is the ratio B / A with its paired-bootstrap
interval, never either latency alone.

    .venv/bin/python -m bench.search_ab --name search-threads \\
        --a ENGRAM_INDEX_SEARCH_THREADS=8 --b ENGRAM_INDEX_SEARCH_THREADS=1
        # ~2 min a run at 10k once loaded; writes bench/reports/search-ab-search-threads.md
    ... --keep /tmp/ab10k     # loads into /tmp/ab10k once; later runs of the same --size reuse it
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from bench import common, ingest, peer_mem0, scale_corpus

LOADED = "search-ab-loaded"  # in a kept store: how many memories it was loaded with
SETTLED = "search-ab-settled"  # in a kept store: vacuumed and optimised since (settle)
# Where each side's service lives: common.service sets them, per side.
RESERVED = {"ENGRAM_DATA_DIR", "ENGRAM_HTTP_PORT", "ENGRAM_GRPC_PORT", "ENGRAM_TEMPORAL_GRPC_PORT",
            "ENGRAM_TEMPORAL_UI_PORT", "ENGRAM_EMBEDDED_POSTGRES_PORT"}


def setting(text: str) -> tuple[str, str]:
    """`ENGRAM_NAME=value` as (name, value). Raises argparse.ArgumentTypeError unless NAME is
    one of engram.settings.Settings' fields (the service ignores any other) and not one of
    RESERVED."""
    from engram.settings import Settings

    name, sep, value = text.partition("=")
    known = {f"ENGRAM_{field.upper()}" for field in Settings.model_fields}
    if not sep or name not in known:
        raise argparse.ArgumentTypeError(f"{text!r}: expected ENGRAM_NAME=value, NAME one of the service's settings")
    if name in RESERVED:
        raise argparse.ArgumentTypeError(f"{name} is set by the benchmark for each side")
    return name, value


def scope_of(size: int) -> str:
    """The one scope the store's memories are in."""
    return f"peer-{size}"


def load(data: Path, size: int) -> float:
    """Seconds `size` memories took to become searchable in a fresh service on the empty
    directory `data` (default settings), which then stops; `data` is marked as loaded with
    `size`. Raises RuntimeError if the index holds other than `size` points."""
    texts = list(itertools.islice(ingest.unique_texts(scope_of(size)), size))
    with common.service(f"search-ab-load-{size}", data, {"ENGRAM_LLM_PROVIDER": "none"}) as svc:
        print(f"loading {size} memories", flush=True)
        seconds = peer_mem0.ingest_engram(svc, texts, scope_of(size))
        common.wait_indexes_settled(svc, peer_mem0.DRAIN_TIMEOUT_S)
        if (held := common.index_points(svc)) != size:
            raise RuntimeError(f"the index holds {held} points, not {size}")
    (data / LOADED).write_text(str(size))
    return seconds


def store(keep: Path | None, size: int, stack: contextlib.ExitStack) -> tuple[Path, float | None]:
    """A store of `size` memories and the seconds its load took (None: loaded by an earlier run
    into `keep`). Raises SystemExit if `keep` holds anything but such a store."""
    if keep is None:
        return _loaded(stack.enter_context(common.data_dir()), size)
    marker = keep / LOADED
    if marker.exists() and marker.read_text() == str(size):
        if not (keep / SETTLED).exists():  # loaded before stores were settled, or stopped in between
            settle(keep)
        return keep, None
    if keep.exists() and any(keep.iterdir()):
        raise SystemExit(f"{keep} holds something other than a store of {size} memories loaded by this "
                         "benchmark: give an empty or new directory")
    keep.mkdir(parents=True, exist_ok=True)
    return _loaded(keep, size)


def _loaded(data: Path, size: int) -> tuple[Path, float]:
    """`data`, loaded with `size` memories and settled; the load's seconds."""
    seconds = load(data, size)
    settle(data)
    return data, seconds


def settle(data: Path) -> None:
    """The loaded store in `data` as a deployment serves it minutes after the load
    (scale_corpus.settle: VACUUM ANALYZE, the dense shard optimised), and marked so. The peer
    benchmark's Engram store has settled by itself by the time it is searched (its service idles
    for minutes while mem0 loads); unsettled, every search of a store loaded moments before
    read the old row versions the indexers left, 2.9 ms a search at 10k for the BM25
    statistics alone, and searched the dense points by brute force."""
    scale_corpus.settle(data)
    (data / SETTLED).write_text("")


@dataclass
class Sided:
    """One side: what bench.peer_mem0 searches in turns, and its service."""

    side: peer_mem0.Side
    svc: common.Service


@contextlib.contextmanager
def side(label: str, data: Path, env: dict[str, str], size: int) -> Iterator[Sided]:
    """A service on `data` with `env`, settled and searchable, until the block ends. Raises
    RuntimeError unless its index holds `size` points."""
    run = peer_mem0.Run(label, size, "")
    with common.service(f"search-ab-{label}", data, {"ENGRAM_LLM_PROVIDER": "none", **env}) as svc:
        def search(query: str) -> tuple[float, int, None]:
            response, ms = common.timed(svc.client.post, "/api/memory/search",
                                        json={"query": query, "scope": {"user_id": scope_of(size)}, "limit": 10})
            response.raise_for_status()
            return ms, len(response.json()["results"]), None

        def settle() -> None:
            """No index is being optimised, and none waits for the lexical index. (The optimiser counts
        the points waiting from its start, so a side may still begin one later: the report
        counts those begun during the searches.)"""
            common.wait_indexes_settled(svc, peer_mem0.DRAIN_TIMEOUT_S)

        settle()
        if (held := common.index_points(svc)) != size:
            raise RuntimeError(f"side {label}'s index holds {held} points, not {size}")
        yield Sided(peer_mem0.Side(run, search, lambda: common.tree_cpu_seconds(svc.proc.pid), settle), svc)


def queries_arg(text: str) -> int:
    """How many questions to time; raises argparse.ArgumentTypeError past what LoCoMo dev holds."""
    n = int(text)
    held = len(peer_mem0.questions())
    most = held - peer_mem0.WARMUP
    if not peer_mem0.BLOCK <= n <= most:
        raise argparse.ArgumentTypeError(f"between {peer_mem0.BLOCK} and {most} (LoCoMo dev has {held} questions, "
                                         f"{peer_mem0.WARMUP} of them the warm-up)")
    return n


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m bench.search_ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True, help="the report is bench/reports/search-ab-NAME.md")
    parser.add_argument("--a", type=setting, action="append", default=[], metavar="ENGRAM_X=V",
                        help="a setting of side A (repeatable; none: the defaults)")
    parser.add_argument("--b", type=setting, action="append", default=[], metavar="ENGRAM_X=V",
                        help="a setting of side B (repeatable)")
    parser.add_argument("--size", type=int, default=10_000, help="memories in the one scope (10000)")
    parser.add_argument("--queries", type=queries_arg, default=400, help="timed searches per side (400)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", type=Path, help="a store to load once and reuse")
    parser.add_argument("--cold", action="store_true",
                        help="no warm pass (by default each side answers every question once, untimed, first)")
    args = parser.parse_args(argv)
    for label, given in (("--a", args.a), ("--b", args.b)):
        if len({name for name, _ in given}) < len(given):
            parser.error(f"{label} names a setting twice")
    if args.queries < peer_mem0.BLOCK * common.MIN_BOOTSTRAP_BLOCKS:
        print(f"fewer than {peer_mem0.BLOCK * common.MIN_BOOTSTRAP_BLOCKS} queries: the report gives no interval",
              flush=True)
    started = time.time()
    queries = peer_mem0.sample_queries(args.queries, args.seed)
    with contextlib.ExitStack() as stack:
        loaded, load_s = store(args.keep, args.size, stack)
        sides = []
        for label, env in (("A", dict(args.a)), ("B", dict(args.b))):
            copy = stack.enter_context(common.data_dir())
            # cp -a keeps each file's owner: the embedded Postgres's files belong to its own user.
            subprocess.run(["cp", "-a", f"{loaded}/.", str(copy)], check=True)
            sides.append(stack.enter_context(side(label, copy, env, args.size)))
        if not args.cold:
            print("a warm pass: every question once on each side, untimed", flush=True)
            for each in sides:
                for query in queries:
                    each.side.search(query)
        for each in sides:  # an optimisation the warm pass met ends before the count
            each.side.settle()
        drops = common.page_cache_drops()
        load_avg = os.getloadavg()[0]
        begun = [peer_mem0.optimisations(each.svc) for each in sides]
        print("searching, the sides taking turns", flush=True)
        peer_mem0.search_in_turns([each.side for each in sides], queries)
        facts = {"load_s": load_s, "page_cache_drops": common.page_cache_drops_since(drops),
                 "load_avg": (load_avg, os.getloadavg()[0]),
                 "optimisations": [peer_mem0.optimisations(each.svc) - n for each, n in zip(sides, begun)]}
    a, b = (each.side.run for each in sides)
    body = _body(args, a, b, facts)
    print(body)
    return common.write_report(f"search-ab-{args.name}", f"Search A/B: {args.name}", body, started=started)


def _body(args, a: peer_mem0.Run, b: peer_mem0.Run, facts: dict) -> str:
    pa, pb = common.percentiles(a.search_ms), common.percentiles(b.search_ms)
    ms = common.fmt_ms
    settings = {"A": args.a, "B": args.b}

    def row(run: peer_mem0.Run, p: dict) -> list[object]:
        named = ", ".join(f"`{k}={v}`" for k, v in settings[run.system]) or "defaults"
        return [run.system, named, ms(p["p50"]), ms(p["p95"]), ms(p["p99"]), ms(p["max"]), ms(run.search_cpu_ms)]

    ratio = ["**B / A**", "", *(f"**{pb[k] / pa[k]:.2f}×**" for k in ("p50", "p95", "p99", "max")),
             f"{b.search_cpu_ms / a.search_cpu_ms:.2f}×"]

    loaded = (f"loaded in {facts['load_s']:.0f} s" if facts["load_s"] is not None
              else f"loaded by an earlier run into `{args.keep}`")
    return "\n".join([
        f"{args.size:,} memories in one scope ({loaded}, default settings; then VACUUM ANALYZE and the dense "
        "shard optimised, as autovacuum and the index optimiser do within minutes; then copied for each side); "
        f"{args.queries} LoCoMo dev questions (seed {args.seed}) after {peer_mem0.WARMUP} untimed, one client, "
        f"`limit` 10 (no `rerank` in the request: each side's settings decide), in blocks of "
        f"{peer_mem0.BLOCK} the sides took in turns; "
        + ("no warm pass (the store's pages as each service found them after its start)." if args.cold else
           "before them, a warm pass: each side answered every question once, untimed, so the rows and index "
           "pages they read are in memory, as after a while of use."), "",
        common.md_table(["side", "settings", "search p50 ms", "p95 ms", "p99 ms", "max ms", "CPU ms per search"],
                        [row(a, pa), row(b, pb), ratio]), "",
        "- how far each ratio could move with the minutes this run met: its 90% interval when the blocks are "
        "drawn again with replacement, the same blocks for both (a paired block bootstrap, approximate; an "
        "interval holding 1.00 cannot tell the sides apart): "
        f"{common.ratio_intervals(b.search_ms, a.search_ms, peer_mem0.BLOCK)}.",
        "- CPU ms per search: CPU time every process of a side's `engram up` (API, worker, Postgres, Temporal) "
        f"used during its own blocks, over their searches. A: {common.by_process(a.facts['cpu_by_process'])}. "
        f"B: {common.by_process(b.facts['cpu_by_process'])}.",
        f"- 1-minute load average before / after the searches (2 sides idle between their turns): "
        f"{facts['load_avg'][0]:.2f} / {facts['load_avg'][1]:.2f}.",
        f"- times the kernel's page cache was dropped during the searches: {facts['page_cache_drops']}.",
        "- vector-index optimisations begun from the warm pass's end to the last search (a child process "
        f"competing with the searches for the cores): A {facts['optimisations'][0]}, B {facts['optimisations'][1]}.",
    ])


if __name__ == "__main__":
    main()
