"""What each rerank lever costs and buys, on the cross-encoder alone (no service).

For 150 LoCoMo dev questions, a top 20 like the service's: the question's evidence turns plus
the turns of its conversation sharing the most BM25 terms with it (hard negatives), each read
as the service reads it (`with_context`: the turn, then the one before it in its session).
Every lever reranks the same lists, one at a time, in this process, on an idle machine:

- batch: pairs per model run (sorted by length, padded to the longest of the run);
- context: how many characters of the previous turn are kept (recall.rerank.CONTEXT_CHARS);
- threads: one model run at a time on ONNX Runtime's intra-op threads (the default until
  2026-11-29), or lanes: that many model runs side by side, one intra-op thread each (the
  service's default: 2 lanes on 2 cores, runs of up to 4 pairs as even as the lanes allow).

Quality is R@10 / nDCG@10 of the evidence in the reranked list (a proxy: the real figure is
bench.locomo's run through the service), and how often the top 10 is the same set as the
baseline's (batch 1, full context, 2 threads).

    .venv/bin/python -m bench.rerank_levers     # -> bench/reports/rerank-levers.md
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter

import numpy as np

from bench import common, locomo_data
from engram.domain.text import bm25_terms
from engram.recall import rerank
from engram.recall.rerank import CrossEncoder, ms_marco_files

TOP_N = 20


def candidate_lists(n_questions: int, seed: int) -> list[tuple[str, list[tuple[str, str, str | None]], list[str]]]:
    """(question, [(dia_id, text, previous text in its session)], evidence)."""
    conversations, _ = locomo_data.load()
    rng = random.Random(seed)
    out = []
    for conv in conversations:
        previous = {}
        for a, b in zip(conv.turns, conv.turns[1:]):
            if a.session == b.session:
                previous[b.dia_id] = a.text
        terms = {t.dia_id: Counter(bm25_terms(t.text)) for t in conv.turns}
        for q in conv.questions:
            if not q.evidence:
                continue
            asked = set(bm25_terms(q.question))
            by_overlap = sorted(conv.turns, key=lambda t: -sum(terms[t.dia_id][w] > 0 for w in asked))
            chosen = [t for t in conv.turns if t.dia_id in set(q.evidence)]
            chosen += [t for t in by_overlap if t not in chosen][:TOP_N - len(chosen)]
            rng.shuffle(chosen)
            out.append((q.question, [(t.dia_id, t.text, previous.get(t.dia_id)) for t in chosen[:TOP_N]],
                        list(q.evidence)))
    rng.shuffle(out)
    return out[:n_questions]


def run(encoder: CrossEncoder, lists, context_chars: int) -> tuple[list[float], list[list[str]]]:
    saved, rerank.CONTEXT_CHARS = rerank.CONTEXT_CHARS, context_chars
    try:
        latencies, rankings = [], []
        for question, items, _ in lists:
            texts = [rerank.with_context(text, prev if context_chars else None) for _, text, prev in items]
            started = time.perf_counter()
            scores = encoder._score_all(question, texts, _never)
            latencies.append((time.perf_counter() - started) * 1e3)
            rankings.append([items[i][0] for i in np.argsort(scores)[::-1]])
        return latencies, rankings
    finally:
        rerank.CONTEXT_CHARS = saved


class _Never:
    def is_set(self) -> bool:
        return False


_never = _Never()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=150)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--only", help="lever labels to run, separated by semicolons (the baseline always runs)")
    parser.add_argument("--report", help="the report's name (default rerank-levers, or rerank-levers-only with --only)")
    args = parser.parse_args()
    started = time.time()
    lists = candidate_lists(args.questions, args.seed)
    encoders = {"2 threads": CrossEncoder.open(ms_marco_files(), threads=2, lanes=False),
                "1 thread": CrossEncoder.open(ms_marco_files(), threads=1, lanes=False),
                "2 lanes": CrossEncoder.open(ms_marco_files(), threads=2, lanes=True)}
    levers = [  # (label, batch, context chars, how the runs go: an `encoders` key)
        ("baseline: batch 1, context 500, 2 threads", 1, 500, "2 threads"),
        ("batch 4", 4, 500, "2 threads"), ("batch 10", 10, 500, "2 threads"), ("batch 20", 20, 500, "2 threads"),
        ("context 200", 1, 200, "2 threads"), ("context 100", 1, 100, "2 threads"), ("no context", 1, 0, "2 threads"),
        ("batch 4, context 200", 4, 200, "2 threads"), ("batch 10, context 200", 10, 200, "2 threads"),
        ("batch 20, context 200", 20, 200, "2 threads"),
        ("1 thread", 1, 500, "1 thread"), ("batch 10, 1 thread", 10, 500, "1 thread"),
        ("batch 4, 2 lanes", 4, 500, "2 lanes"), ("batch 2, 2 lanes", 2, 500, "2 lanes"),
        ("batch 1, 2 lanes", 1, 500, "2 lanes"), ("batch 4, context 200, 2 lanes", 4, 200, "2 lanes"),
    ]
    if args.only:
        wanted = {label.strip() for label in args.only.split(";")}
        levers = [levers[0], *(lever for lever in levers[1:] if lever[0] in wanted)]
    for encoder in encoders.values():  # warm-up
        run(encoder, lists[:10], 500)
    results = []
    baseline_top = None
    for turn in range(2):  # every lever twice, interleaved: drift in machine speed hits all alike
        for label, batch, chars, mode in levers:
            encoder = encoders[mode]
            encoder.batch = batch
            latencies, rankings = run(encoder, lists, chars)
            if baseline_top is None:
                baseline_top = [set(r[:10]) for r in rankings]
            quality = locomo_data.mean_scores([locomo_data.score(r, ev) for r, (_, _, ev) in zip(rankings, lists)])
            same = np.mean([set(r[:10]) == b for r, b in zip(rankings, baseline_top)])
            results.append((turn, label, common.percentiles(latencies), quality, same))
            print(f"  {turn} {label}: p50 {results[-1][2]['p50']:.0f} ms", flush=True)
    rows = []
    for label, *_ in levers:
        mine = [r for r in results if r[1] == label]
        p50 = np.mean([r[2]["p50"] for r in mine])
        p95 = np.mean([r[2]["p95"] for r in mine])
        base = np.mean([r[2]["p95"] for r in results if r[1] == levers[0][0]])
        q = mine[0][3]
        rows.append([label, f"{p50:.0f}", f"{p95:.0f}", f"{p95 / base:.2f}", f"{q['R@10']:.3f}", f"{q['nDCG@10']:.3f}",
                     f"{mine[0][4]:.0%}"])
    body = [
        f"{len(lists)} LoCoMo dev questions, {TOP_N} candidates each (evidence plus the conversation's turns "
        "sharing the most BM25 terms with the question), read with their session context as the service reads "
        "them; ms-marco-MiniLM-L-12-v2 int8 in this process. Each lever ran twice, interleaved with the others; "
        "latencies are the mean of the two runs' percentiles of one 20-pair rerank.",
        "",
        common.md_table(["lever", "p50 ms", "p95 ms", "p95 / baseline", "R@10", "nDCG@10", "same top 10 as baseline"],
                        rows),
    ]
    name = args.report or "rerank-levers" + ("-only" if args.only else "")
    path = common.write_report(name, "Rerank levers: latency and quality of the cross-encoder alone", "\n".join(body),
                               started=started)
    print(path)


if __name__ == "__main__":
    main()
