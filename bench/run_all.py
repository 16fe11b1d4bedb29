"""`make bench`: the LoCoMo retrieval benchmark, the latency benchmark, then search latency against
corpus size, one after the other (never together: each one loads both cores). `--quick` is passed
to each.

    .venv/bin/python -m bench.run_all [--quick]
"""

from __future__ import annotations

import argparse
import time

from bench import latency, locomo, scale


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.run_all", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke runs: conv-26 only; N=50 and 1k memories; 1k and 5k memories in 100 scopes")
    args = parser.parse_args(argv)
    passthrough = ["--quick"] if args.quick else []
    reports = []
    for name, bench in (("locomo", locomo), ("latency", latency), ("scale", scale)):
        started = time.time()
        print(f"== bench.{name} {' '.join(passthrough)}".rstrip(), flush=True)
        reports.append(bench.main(passthrough))
        print(f"== bench.{name} took {time.time() - started:.0f} s", flush=True)
    print("reports:", *reports, sep="\n  ")


if __name__ == "__main__":
    main()
