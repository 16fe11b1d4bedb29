"""Retrieval quality on the LoCoMo dev split, through the service's own HTTP search.

Follows /work/shared/bench/README.md: one memory per dialogue turn (`[<date>] <speaker>: <text>`,
`dia_id` in metadata), each conversation in its own scope (user_id = sample_id), the question
verbatim as the query, top 10, evidence clean-up, categories 1-4 as "overall" (456 questions)
and category 5 apart; Recall@5, Recall@10, nDCG@10, Hit@10.

Each turn also carries its session as `session_id` (`session_3`), which the service's context
expansion reads. The questions are asked of the same data several times, restarting the service
between runs: with default settings (pure retrieval: the access weight is 0, so no question's
ranking depends on the questions before it); with the access boost on (ENGRAM_RANK_ACCESS_WEIGHT
=0.02, the default until 2026-11: later questions see earlier questions' hits boosted); with each
stage off in turn; and with the opt-in cross-encoder rerank. The
README's baselines (BM25, dense MiniLM, 0.5/0.5 min-max hybrid, RRF) are computed in this
process for comparison.

    .venv/bin/python -m bench.locomo            # all three conversations -> bench/reports/locomo.md
    .venv/bin/python -m bench.locomo --quick    # conv-26 only -> bench/reports/locomo-quick.md
    .venv/bin/python -m bench.locomo --no-rerank   # skip the rerank run (about 4 minutes)
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench import common
from bench.locomo_data import (
    CATEGORY_NAMES, DATA, METRICS, TOP_K, Conversation, MethodResult, Question, Turn, load, score,
)
from engram.domain.text import STOPWORDS, bm25_terms

# The README's dev numbers for the same harness: a check that this one reproduces them.
README_BASELINES = {
    "BM25": (0.501, 0.581, 0.443, 0.632),
    "dense MiniLM": (0.397, 0.518, 0.337, 0.575),
    "hybrid 0.5/0.5 min-max (dense + BM25)": (0.550, 0.662, 0.496, 0.724),
    "hybrid RRF k=60 (dense + BM25)": (0.512, 0.594, 0.425, 0.649),
    "BM25 + stem": (0.538, 0.612, 0.483, 0.667),
    "hybrid 0.5/0.5 min-max (dense + stemmed BM25)": (0.586, 0.677, 0.516, 0.735),
}


# -- the service ---------------------------------------------------------------------------------

def ingest(svc: common.Service, conversations: list[Conversation]) -> tuple[int, float]:
    """Remember every turn (mode=async, in turn order so created_at orders ties), then wait
    until every job is done. Returns (memories, seconds until the last job was done)."""
    job_ids = []
    started = time.time()
    for conv in conversations:
        scope = {"user_id": conv.sample_id}
        for turn in conv.turns:
            response = svc.client.post("/api/memory/remember", json={
                "content": turn.text, "scope": scope, "session_id": turn.session,
                "metadata": {"dia_id": turn.dia_id}, "mode": "async",
            })
            response.raise_for_status()
            body = response.json()
            if body["status"] != "queued" or body["job_id"] is None:
                raise RuntimeError(f"{conv.sample_id} {turn.dia_id}: unexpected answer {body}")
            job_ids.append(body["job_id"])
        print(f"  sent {conv.sample_id}: {len(conv.turns)} turns", flush=True)
    jobs = common.wait_jobs_done(svc, job_ids)
    last_done = max(common.parse_ts(j["updated_at"]) for j in jobs)
    return len(job_ids), last_done - started


@dataclass
class ServiceRun:
    """One pass of every scored question through POST /api/memory/search."""

    name: str
    env: dict[str, str]  # on top of ENGRAM_LLM_PROVIDER=none; a new env means a restart
    request: dict  # extra search request fields
    stage: str = ""  # what the ablation turns on or off; empty for the reference rows
    model: str | None = None  # an embedding model to re-embed into before asking
    result: MethodResult | None = None
    latencies_ms: list[float] = field(default_factory=list)
    notes: Counter = field(default_factory=Counter)
    stages_ms: dict[str, list[float]] = field(default_factory=dict)  # from `explain`, when asked
    planner: str = ""
    seconds: float = 0.0


REFERENCE = "service, default settings"  # what the ablation compares with


def service_runs(*, rerank: bool) -> list[ServiceRun]:
    """The default, then an ablation: each stage off (or on) against it. Runs with the same
    settings share a service; the access boost goes first, while no search has counted an
    access yet (the others do not weigh them), and the stemmer and embedder runs last, because
    changing them rebuilds the BM25 postings and re-embeds every memory at start-up."""
    runs = [
        ServiceRun("service, ENGRAM_RANK_ACCESS_WEIGHT=0.02", {"ENGRAM_RANK_ACCESS_WEIGHT": "0.02"}, {},
                   stage="access boost on (0.02, the default until 2026-11)"),
        ServiceRun(REFERENCE, {}, {}),
        ServiceRun("service, stage timings (explain=true)", {}, {"explain": True}),
        ServiceRun("service, ENGRAM_EXPANSION_WEIGHT=0", {"ENGRAM_EXPANSION_WEIGHT": "0"},
                   {}, stage="context expansion off"),
        ServiceRun("service, BM25 leg only (vector weight 0, expansion off)",
                   {"ENGRAM_EXPANSION_WEIGHT": "0", "ENGRAM_RANK_VECTOR_WEIGHT": "0"}, {},
                   stage="dense leg off (BM25 only)"),
        ServiceRun("service, dense leg only (BM25 weight 0, expansion off)",
                   {"ENGRAM_EXPANSION_WEIGHT": "0", "ENGRAM_RANK_BM25_WEIGHT": "0"}, {},
                   stage="BM25 leg off (dense only)"),
    ]
    whole = {"ENGRAM_RERANK_BUDGET_MS": "0"}  # every rerank reorders its whole top 20, however busy the machine
    if rerank:
        runs += [
            ServiceRun("service, rerank=true (cross-encoder, top 20)", whole, {"rerank": True}, stage="rerank on"),
            ServiceRun("service, rerank=true, ENGRAM_RERANK_SESSION_CONTEXT=false",
                       whole | {"ENGRAM_RERANK_SESSION_CONTEXT": "false"}, {"rerank": True},
                       stage="rerank on, without session context"),
            ServiceRun("service, rerank=true within the default ENGRAM_RERANK_BUDGET_MS (350)", {}, {"rerank": True},
                       stage="rerank on, as many of the top 20 as fit 350 ms"),
            ServiceRun("service, rerank=true, ENGRAM_RERANK_BUDGET_MS=175", {"ENGRAM_RERANK_BUDGET_MS": "175"},
                       {"rerank": True}, stage="rerank on, as many as fit 175 ms (as on a machine 2x slower)"),
        ]
    more = {"ENGRAM_SEARCH_CANDIDATES": "50"}  # the default until 30 measured the same
    runs.append(ServiceRun("service, ENGRAM_SEARCH_CANDIDATES=50", more, {}, stage="50 candidates per leg (not 30)"))
    if rerank:
        fewer = {"ENGRAM_RERANK_CANDIDATES": "30"}  # what a rerank would fuse if it took the search's 30
        runs.append(ServiceRun("service, rerank=true, ENGRAM_RERANK_CANDIDATES=30", fewer | whole, {"rerank": True},
                               stage="rerank on, 30 candidates per leg (not 50)"))
    runs += [
        ServiceRun("service, ENGRAM_BM25_STEMMER=none", {"ENGRAM_BM25_STEMMER": "none"}, {}, stage="stemming off"),
        ServiceRun(f"service, ENGRAM_EMBEDDING_MODEL={MINILM}", {"ENGRAM_EMBEDDING_MODEL": MINILM}, {},
                   stage="MiniLM instead of bge-small", model=MINILM),
    ]
    return runs


def wait_for_model(svc: common.Service, model: str, memories: int, timeout_s: float = 1800) -> None:
    """Until the service searches with `model` over all `memories` (its re-embed job switched)."""
    deadline = time.time() + timeout_s
    print(f"  waiting for the re-embed into {model}", flush=True)
    while time.time() < deadline:
        index = svc.client.get("/readyz").json()["components"]["vector_index"]["detail"]
        if f"({model})" in index and common.index_points(svc) == memories:
            return
        time.sleep(2)
    raise RuntimeError(f"the service did not switch to {model} in {timeout_s:.0f} s")


def ask(svc: common.Service, conversations: list[Conversation], run: ServiceRun) -> None:
    """Every scored question (categories 1-5, in file order), one at a time."""
    per_question = {}
    started = time.time()
    for conv in conversations:
        scope = {"user_id": conv.sample_id}
        for q in conv.questions:
            response, ms = common.timed(svc.client.post, "/api/memory/search",
                                        json={"query": q.question, "scope": scope, "limit": TOP_K, **run.request})
            response.raise_for_status()
            body = response.json()
            run.latencies_ms.append(ms)
            results = body["results"]
            ranked = [hit["memory"]["metadata"].get("dia_id") for hit in results]
            if len(ranked) < TOP_K:
                run.notes["fewer than 10 results"] += 1
            if any(hit["memory"]["user_id"] != conv.sample_id for hit in results):
                run.notes["results outside the question's scope"] += 1
            for warning in body.get("warnings", []):
                run.notes[warning.split(":")[0]] += 1
            for stage, facts in (body.get("explain") or {}).items():
                run.stages_ms.setdefault(stage, []).append(facts["ms"])
            per_question[(q.sample_id, q.index)] = score(ranked, q.evidence)
    if len(per_question) != sum(len(c.questions) for c in conversations):
        raise RuntimeError("two questions share a key")
    run.result = MethodResult(run.name, per_question)
    run.seconds = time.time() - started


# -- in-process baselines (the README's) ----------------------------------------------------------

def bm25_matrix(docs: list[list[str]], queries: list[list[str]], k1: float = 1.2, b: float = 0.75) -> np.ndarray:
    """Okapi BM25 of each query (rows) against each document (columns), statistics over `docs`;
    each distinct query term counted once; IDF = ln(1 + (N - df + 0.5) / (df + 0.5))."""
    n = len(docs)
    tfs = [Counter(d) for d in docs]
    lengths = np.array([len(d) for d in docs], dtype=float)
    avgdl = lengths.mean() if n else 1.0
    df = Counter(t for tf in tfs for t in tf)
    out = np.zeros((len(queries), n))
    norm = k1 * (1 - b + b * lengths / avgdl)
    for qi, query in enumerate(queries):
        for term in sorted(set(query)):  # a fixed order: float sums (and so ties) do not vary by run
            if term not in df:
                continue
            idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
            tf = np.array([d.get(term, 0) for d in tfs], dtype=float)
            out[qi] += idf * tf * (k1 + 1) / (tf + norm)
    return out


def minmax(row: np.ndarray) -> np.ndarray:
    span = row.max() - row.min()
    return (row - row.min()) / span if span > 0 else np.zeros_like(row)


def rrf(a: np.ndarray, b: np.ndarray, k: int = 60) -> np.ndarray:
    out = np.zeros_like(a)
    for row in (a, b):
        order = np.lexsort((np.arange(len(row)), -row))  # best first, ties by turn order
        ranks = np.empty(len(row))
        ranks[order] = np.arange(1, len(row) + 1)
        out += 1 / (k + ranks)
    return out


def rank(scores: np.ndarray, turns: list[Turn]) -> list[str]:
    """dia_ids best first; equal scores by turn order (earlier first)."""
    order = np.lexsort((np.arange(len(scores)), -scores))
    return [turns[i].dia_id for i in order[:TOP_K]]


MINILM = "all-MiniLM-L6-v2"


def baselines(conversations: list[Conversation], extra_model: str | None = None
              ) -> tuple[list[MethodResult], dict[str, dict[str, float]]]:
    """The README's baselines over all memories of each conversation (MiniLM), plus dense and
    hybrid rows for `extra_model` (the service's embedder, when it is another one); and each
    model's embedding costs in this process."""
    assert len(STOPWORDS) == 179, f"stopword list has {len(STOPWORDS)} words, not 179"
    results: dict[str, dict] = {}
    costs: dict[str, dict[str, float]] = {}
    bm25 = {}
    for conv in conversations:
        bm25[conv.sample_id] = {stem: bm25_matrix([bm25_terms(t.text, stem) for t in conv.turns],
                                                  [bm25_terms(q.question, stem) for q in conv.questions])
                                for stem in ("none", "english")}

    def put(name: str, q: Question, conv: Conversation, scores) -> None:
        ranked = rank(np.asarray(scores, dtype=float), conv.turns)
        results.setdefault(name, {})[(q.sample_id, q.index)] = score(ranked, q.evidence)

    for conv in conversations:
        for i, q in enumerate(conv.questions):
            put("BM25", q, conv, bm25[conv.sample_id]["none"][i])
            put("BM25 + stem", q, conv, bm25[conv.sample_id]["english"][i])

    for model in [MINILM] + ([extra_model] if extra_model and extra_model != MINILM else []):
        embedder = common.open_embedder(model)
        prefix = getattr(embedder.files, "query_prefix", "")
        short = "MiniLM" if model == MINILM else model
        turn_s, turns, query_ms = 0.0, 0, []
        for conv in conversations:
            started = time.perf_counter()
            doc_vecs = embedder.embed_sync([t.text for t in conv.turns])
            turn_s += time.perf_counter() - started
            turns += len(conv.turns)
            query_vecs = np.empty((len(conv.questions), embedder.dim), dtype=np.float32)
            for i, q in enumerate(conv.questions):
                vec, ms = common.timed(embedder.embed_sync, [prefix + q.question])
                query_vecs[i] = vec[0]
                query_ms.append(ms)
            dense = query_vecs @ doc_vecs.T
            lex = bm25[conv.sample_id]
            for i, q in enumerate(conv.questions):
                put(f"dense {short}", q, conv, dense[i])
                if model == MINILM:
                    put("hybrid 0.5/0.5 min-max (dense + BM25)", q, conv,
                        0.5 * minmax(dense[i]) + 0.5 * minmax(lex["none"][i]))
                    put("hybrid 0.5/0.5 min-max (dense + stemmed BM25)", q, conv,
                        0.5 * minmax(dense[i]) + 0.5 * minmax(lex["english"][i]))
                    put("hybrid RRF k=60 (dense + BM25)", q, conv, rrf(dense[i], lex["none"][i]))
                else:
                    put(f"hybrid 0.5/0.5 min-max (dense {short} + stemmed BM25)", q, conv,
                        0.5 * minmax(dense[i]) + 0.5 * minmax(lex["english"][i]))
        p = common.percentiles(query_ms)
        costs[model] = {"turns/s": turns / turn_s, "query p50 ms": p["p50"], "query p95 ms": p["p95"]}
    return [MethodResult(name, per_question) for name, per_question in results.items()], costs


# -- the run -------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m bench.locomo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="conv-26 only (a smoke run; not comparable)")
    parser.add_argument("--no-rerank", action="store_true", help="skip the run with the cross-encoder rerank")
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args(argv)
    started = time.time()

    conversations, dropped = load(args.data)
    if args.quick:
        conversations = conversations[:1]
    questions = [q for c in conversations for q in c.questions]
    print(f"LoCoMo dev: {len(conversations)} conversations, {sum(len(c.turns) for c in conversations)} turns, "
          f"{sum(q.category != 5 for q in questions)} scored questions in categories 1-4, "
          f"{sum(q.category == 5 for q in questions)} in category 5; dropped: {dropped}", flush=True)

    runs = service_runs(rerank=not args.no_rerank)
    ingest_facts: dict[str, float] = {}
    service_model = None
    with common.data_dir() as data:
        # Consecutive runs with the same settings share one service; new settings mean a restart.
        for i, (env, group) in enumerate(itertools.groupby(runs, key=lambda r: r.env)):
            with common.service(f"locomo-{i}", data, {"ENGRAM_LLM_PROVIDER": "none", **env}) as svc:
                if i == 0:
                    print("ingesting", flush=True)
                    memories, ingest_s = ingest(svc, conversations)
                    ingest_facts = {"memories": memories, "seconds": ingest_s}
                    print(f"  {memories} memories embedded and indexed in {ingest_s:.1f} s", flush=True)
                group = list(group)
                if group[0].model:
                    wait_for_model(svc, group[0].model, sum(len(c.turns) for c in conversations))
                elif i == 0:
                    service_model = common.service_embedder(svc)
                for run in group:
                    print(f"asking: {run.name}", flush=True)
                    run.planner = common.planner_stats(svc)
                    ask(svc, conversations, run)

    print("in-process baselines", flush=True)
    t = time.time()
    offline, embed_costs = baselines(conversations, service_model)
    baseline_s = time.time() - t

    body = report(conversations, questions, dropped, runs, offline, embed_costs, ingest_facts, baseline_s,
                  service_model=service_model, quick=args.quick)
    path = common.write_report("locomo-quick" if args.quick else "locomo", "LoCoMo dev: retrieval quality", body,
                               started=started)
    print(body)
    print(f"\nreport: {path}")
    return path


def report(conversations, questions, dropped, runs: list[ServiceRun], offline: list[MethodResult], embed_costs,
           ingest_facts, baseline_s: float, *, service_model: str | None, quick: bool) -> str:
    overall = {1, 2, 3, 4}
    n_overall = sum(q.category in overall for q in questions)
    n_adv = sum(q.category == 5 for q in questions)
    quality_runs = [r for r in runs if "explain" not in r.request]  # the explain pass repeats access 0
    methods = [r.result for r in quality_runs] + offline

    def row(result: MethodResult) -> list[object]:
        s = result.summary(questions, overall)
        return [result.name, *(s[m] for m in METRICS), result.summary(questions, {5})["R@10"]]

    out = []
    if quick:
        out.append("**Quick run: conv-26 only. Not comparable with the README's dev numbers.**\n")
    out.append(
        f"Data: `{DATA}` ({len(conversations)} conversations, {sum(len(c.turns) for c in conversations)} "
        f"memories, one per turn, `[<date>] <speaker>: <text>`, `dia_id` in metadata, `session_id` = "
        f"`session_N`, one scope per conversation: `user_id` = `sample_id`). Scored: {n_overall} questions of "
        f"categories 1-4 (\"overall\"); {n_adv} of category 5 reported apart. Dropped by the evidence clean-up "
        f"(whole file): {dropped}.\n\n"
        "Service rows: `POST /api/memory/search` (`limit` 10, the question verbatim) on `engram up` with "
        "`ENGRAM_LLM_PROVIDER=none`; memories sent with `mode=async` in turn order and every job `done` before "
        "the first question; questions asked in file order. All rows use the same stored memories; the service "
        "was restarted whenever the settings change. The access boost is off by default (weight 0), so "
        "no question's ranking depends on the questions before it; the `ENGRAM_RANK_ACCESS_WEIGHT=0.02` row "
        "turns it on (each search counts its hits' accesses, score += 0.02·log(1+access_count)). "
        "Context expansion (each "
        "candidate lifted by 0.1 × the fused scores of its session neighbours) is on by default.\n\n"
        f"The service's embedding model (from `/readyz`): **{service_model}**.\n\n"
        "Other rows: the README's baselines computed in this process (statistics and min-max over all memories "
        "of the conversation; ties by turn order), with MiniLM as the README specifies, plus the same dense and "
        "hybrid rows for the service's own model when it is another one.\n")
    out.append("## Overall (categories 1-4)\n")
    out.append(common.md_table(["method", "R@5", "R@10", "nDCG@10", "Hit@10", "cat 5 R@10"],
                               [row(m) for m in methods]))

    out.append("\n## Ablation through the service\n")
    out.append(f"Each row changes one thing against `{REFERENCE}` (every default stage on, rerank off, no access "
               "boost, so the question order cannot move rankings). Categories 1-4.\n")
    out.append(ablation_table(quality_runs, questions))

    for run in [r for r in quality_runs if r.name == REFERENCE or r.stage == "rerank on"]:
        out.append(f"\n## Per category: {run.name}\n")
        out.append(per_category_table(run.result, questions))

    out.append("\n## Does the hybrid beat both single legs?\n")
    out.append("The issue requires the hybrid to beat BM25-only and vector-only. Differences on each metric "
               "(categories 1-4) against BM25-only, taken as the better of unstemmed and stemmed BM25 per metric, "
               "and against vector-only, taken as the better of the dense rows per metric.\n")
    by_name = {m.name: m.summary(questions, overall) for m in methods}
    best_bm25 = {m: max(by_name["BM25"][m], by_name["BM25 + stem"][m]) for m in METRICS}
    dense = {m: max(v[m] for k, v in by_name.items() if k.startswith("dense ")) for m in METRICS}
    verdicts = []
    hybrids = [r.name for r in quality_runs if "leg only" not in r.name]
    for name in hybrids + [m.name for m in offline if m.name.startswith("hybrid 0.5")]:
        s = by_name[name]
        beats = [m for m in METRICS if s[m] > best_bm25[m] and s[m] > dense[m]]
        verdicts.append([name, *(f"{s[m] - best_bm25[m]:+.3f} / {s[m] - dense[m]:+.3f}" for m in METRICS),
                         "YES" if len(beats) == len(METRICS) else f"NO (beats both on {', '.join(beats) or 'none'})"])
    out.append(common.md_table(["method", *(f"{m} vs BM25 / dense" for m in METRICS), "beats both on all four"],
                               verdicts))

    if not quick:
        out.append("\n## Harness check against the README's dev baselines\n")
        out.append("Measured here (README value in brackets).\n")
        out.append(common.md_table(["method", *METRICS], [
            [name, *(f"{by_name[name][m]:.3f} ({r:.3f})" for m, r in zip(METRICS, ref))]
            for name, ref in README_BASELINES.items()]))

    out.append("\n## Search latency through the service\n")
    out.append("Client round trip per question, one request at a time from one keep-alive client.\n")
    lat_rows = []
    for run in runs:
        p = common.percentiles(run.latencies_ms)
        lat_rows.append([run.name, p["n"], common.fmt_ms(p["p50"]), common.fmt_ms(p["p95"]), common.fmt_ms(p["p99"]),
                         common.fmt_ms(p["max"]), ", ".join(f"{k}: {v}" for k, v in run.notes.items()) or "none"])
    out.append(common.md_table(["run", "searches", "p50 ms", "p95 ms", "p99 ms", "max ms", "anomalies"], lat_rows))
    for run in runs:
        if run.stages_ms:
            out.append(f"\nServer-side stage timings from `explain` ({run.name}):\n")
            out.append(common.md_table(["stage", "p50 ms", "p95 ms", "max ms"], [
                [stage, *(common.fmt_ms(common.percentiles(v)[k]) for k in ("p50", "p95", "max"))]
                for stage, v in run.stages_ms.items()]))
    out.append("\nFor comparison, query embedding alone, in this process with the service stopped: " + "; ".join(
        f"{model}: p50 {c['query p50 ms']:.1f} ms, p95 {c['query p95 ms']:.1f} ms (turns: {c['turns/s']:.0f}/s)"
        for model, c in embed_costs.items()) + ".\n")
    out.append("## Run times\n")
    out.append(f"- ingest: {ingest_facts['memories']} memories sent and every job done in "
               f"{ingest_facts['seconds']:.1f} s ({ingest_facts['memories'] / ingest_facts['seconds']:.1f} memories/s, "
               "`ENGRAM_LLM_PROVIDER=none`, one client)")
    out.extend(f"- questions, {run.name}: {run.seconds:.1f} s" for run in runs)
    out.append(f"- in-process baselines (embedding every turn and question): {baseline_s:.1f} s\n")
    out.append("## Postgres planner statistics\n")
    out.append("When each run started (diagnostic, read from the embedded Postgres directly, not through the API): "
               "the plan of the BM25 query, and so search latency, depends on whether autovacuum has analysed the "
               "tables since the memories were written.\n")
    out.append(common.md_table(["run", "statistics"], [[run.name, run.planner] for run in runs]))
    return "\n".join(out)


def ablation_table(runs: list[ServiceRun], questions: list[Question]) -> str:
    overall = {1, 2, 3, 4}
    ref_run = next(r for r in runs if r.name == REFERENCE)
    ref = ref_run.result.summary(questions, overall)
    rows = [["(reference) the default: every default stage, no access boost", *(ref[m] for m in METRICS), "", "",
             common.fmt_ms(common.percentiles(ref_run.latencies_ms)["p95"])]]
    for run in runs:
        if run.stage:
            s = run.result.summary(questions, overall)
            rows.append([run.stage, *(s[m] for m in METRICS), f"{s['R@10'] - ref['R@10']:+.3f}",
                         f"{s['nDCG@10'] - ref['nDCG@10']:+.3f}",
                         common.fmt_ms(common.percentiles(run.latencies_ms)["p95"])])
    return common.md_table(["change", *METRICS, "ΔR@10", "ΔnDCG@10", "search p95 ms"], rows)


def per_category_table(result: MethodResult, questions: list[Question]) -> str:
    rows = []
    for cat in (1, 2, 3, 4, 5):
        n = sum(q.category == cat for q in questions)
        if n:
            s = result.summary(questions, {cat})
            rows.append([CATEGORY_NAMES[cat], *(s[m] for m in METRICS), n])
    s = result.summary(questions, {1, 2, 3, 4})
    rows.append(["overall (1-4)", *(s[m] for m in METRICS), sum(q.category != 5 for q in questions)])
    return common.md_table(["category", *METRICS, "n"], rows)


if __name__ == "__main__":
    main()
