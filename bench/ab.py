"""A/B of concurrent single remembers: this tree against an older commit, in turns, one machine.

bench.ingest's single-remember burst (`async` remembers from 32 clients, provider `none`,
memories/s until every job is embedded and indexed), run `--rounds` times on each tree in
turn (old, new, old, new, ...), each on a fresh service, after measuring the embedding model's
ceiling. Our machines differ by up to 2× in speed and drift within a day, so the claim is the
ratio of the two trees measured together, not either rate alone.

    .venv/bin/python -m bench.ab --before fd9ffcb          # ~15 min; writes bench/reports/ab-singles.md
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench import common, ingest


def run(label: str, env: dict[str, str], args) -> dict:
    with common.data_dir() as data, common.service(f"ab-{label}", data, {"ENGRAM_LLM_PROVIDER": "none", **env}) as svc:
        burst = ingest.single_burst(svc, args, ingest.unique_texts(f"ab-{label}"), "ab-single")
    rate = burst.rate
    acks = burst.requests.percentiles()
    cpu = burst.cpu
    print(f"   {label}: {rate:.1f} memories/s, ack p95 {acks['p95']:.0f} ms, CPU {cpu}", flush=True)
    return {"label": label, "rate": rate, "acks": acks, "cpu": cpu, "memories": burst.memories}


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", metavar="REV", required=True, help="the older commit (a worktree under /tmp)")
    parser.add_argument("--rounds", type=int, default=2, help="bursts per tree (2)")
    parser.add_argument("--single", type=int, default=10_000, help="remembers per burst (10000)")
    parser.add_argument("--single-clients", type=int, default=32, help="clients sending them (32)")
    parser.add_argument("--drain-timeout-s", type=float, default=1800, help="longest wait for a burst to drain")
    args = parser.parse_args(argv)
    started = time.time()
    old_tree, _ = ingest.before_tree(args.before)
    ceiling = ingest.embedder_ceiling(2_000)
    print(f"the embedding model alone: {ceiling:.1f} texts/s", flush=True)
    runs = []
    for round_ in range(args.rounds):
        runs.append(run(f"{args.before}-{round_ + 1}", ingest.before_env(old_tree), args) | {"tree": args.before})
        runs.append(run(f"new-{round_ + 1}", {}, args) | {"tree": "this tree"})
    return common.write_report("ab-singles", "Engram single remembers: this tree against an older commit",
                               _body(args, ceiling, runs), started=started)


def _body(args, ceiling: float, runs: list[dict]) -> str:
    rows = [[r["label"], r["tree"], r["memories"], f"{r['rate']:.1f}", f"{r['rate'] / ceiling:.0%}",
             common.fmt_ms(r["acks"]["p50"]), common.fmt_ms(r["acks"]["p95"]),
             f"{r['cpu'].get('python3.11', 0):.0f}", f"{r['cpu'].get('postgres', 0):.0f}",
             f"{r['cpu'].get('temporal', 0):.0f}"] for r in runs]
    median = {tree: statistics.median(r["rate"] for r in runs if r["tree"] == tree) for tree in (args.before,
                                                                                                 "this tree")}
    return "\n".join([
        f"{args.single} `async` single remembers from {args.single_clients} clients per burst, "
        "`ENGRAM_LLM_PROVIDER=none`, a fresh `engram up` per burst, the trees in turns "
        f"({args.before} first). memories/s: first request until `/readyz` shows no job waiting "
        f"or in a batch. The ceiling: the service's embedding model alone embeds {ceiling:.1f} "
        "texts/s in the benchmark's process (bench.ingest's `embedder_ceiling`). CPU: seconds "
        "of the service's processes over the burst (`python3.11` is the API and the worker).",
        "",
        common.md_table(["run", "tree", "memories", "memories/s", "of the ceiling", "ack p50 ms", "ack p95 ms",
                         "CPU python s", "CPU postgres s", "CPU temporal s"], rows),
        "",
        f"Median memories/s: {args.before} {median[args.before]:.1f}, this tree {median['this tree']:.1f}: "
        f"**{median['this tree'] / median[args.before]:.2f}×**.",
    ])


if __name__ == "__main__":
    print(f"report: {main()}")
