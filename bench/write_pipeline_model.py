"""The semantic write pipeline with a real model: a sample of the gold set through the service
with the local LLM (`ENGRAM_LLM_PROVIDER=local`, Qwen2.5-Coder-1.5B-Instruct on llama.cpp), to
measure what bench.write_pipeline's oracle cannot: extraction precision and recall, the
precision of the model's UPDATE and DELETE decisions, and the tokens (so the cost) a remember
takes.

Each remember goes in `sync` mode, one at a time, and waits for its job, so every decision sees
the facts before it. What the model extracted and decided is read from the service's Postgres
(`memory_decisions`: one row per valid fact, with its action and outcome), and the tokens from
each job's `usage`, as the provider's server counted them.

Scoring. A model fact *states* a gold fact of the same remember when it holds the gold value's
words (`User lives in Oslo` for the city Oslo; for a removal, a "none" or "single", at least half
of the gold text's content words). Extraction precision: model facts stating a gold fact, over
model facts; recall: gold facts stated by a model fact, over gold facts (chatter has none, so any
fact from it counts against precision). A model's UPDATE or DELETE is correct when its fact
states a gold fact of that action and its target (as the model saw it) held the attribute's old
value. Every extracted fact and every UPDATE/DELETE is listed in the report, so each verdict can
be checked by eye.

Needs `make llm` (the model file at data/models/, or ENGRAM_LOCAL_LLM_MODEL_PATH). About 20 s a
remember on 2 idle cores; run nothing else meanwhile: the model slows 3-30x under contention.

    .venv/bin/python -m bench.write_pipeline_model      # 3 users x 10 -> bench/reports/write-pipeline-model.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from bench import common
from bench.write_pipeline_gold import REMOVED, GoldFact, Item, UserGold, generate, norm, summary
from engram.inference import local_llm

# Words a fact restates around its value, so they say nothing about which fact it is.
_FILLER = frozenset("user user s the a an is are was their they them to of with as has have had and now in on "
                    "for from by at who his her its".split())
# What a gold value of "none" or "single" is about, since the value's own word rarely appears.
_NONE_OF = {"pet": ("pet",), "car": ("car",), "partner": ("single",)}
# Illustrative list prices (USD per 1M tokens) of a small hosted model, for the cost column:
# set your own with --price-in / --price-out. The local model itself costs only CPU time.
PRICE_IN, PRICE_OUT = 0.15, 0.60


def _words(text: str) -> set[str]:
    return set(norm(text).split())


def states(text: str, gold: GoldFact, *, value: str | None = None) -> bool:
    """Whether `text` states `gold`'s value (or `value`, for a target's old one): every content
    word of the value, or, where the value names no words of its own (a removal, "none",
    "single"), at least half of the gold text's content words."""
    value = gold.value if value is None else value
    words = _words(text)
    raw = value.split(":", 1)[-1]  # "not:peanuts", "dislikes:chess"
    if value == REMOVED or raw in ("none", "single"):
        wanted = _words(gold.content) - _FILLER
        if raw in ("none", "single") and wanted & set(_NONE_OF.get(gold.key, ())):
            return bool(words & set(_NONE_OF[gold.key]))
        return len(wanted & words) * 2 >= len(wanted)
    wanted = _words(raw.replace(" named ", " ")) - _FILLER
    if gold.key == "children":
        wanted = {raw}
    return wanted <= words


@dataclass
class Sent:
    item: Item
    memory_id: str
    seconds: float


def run(items: list[Item], env: dict[str, str]) -> tuple[list[Sent], list[dict], list[dict]]:
    """Remember `items` one at a time on a fresh service with the local model; return what was
    sent, the decision rows and the jobs' usage."""
    sent: list[Sent] = []
    with common.data_dir() as data, common.service("write-pipeline-model", data, env, ready_timeout_s=600) as svc:
        print("service up with the local model", flush=True)
        started = time.monotonic()
        for n, item in enumerate(items, 1):
            t0 = time.monotonic()
            response = svc.client.post("/api/memory/remember", json={
                "content": item.text, "scope": {"user_id": item.user}, "mode": "sync"}, timeout=900)
            if response.status_code != 200:
                raise RuntimeError(f"remember {item.text!r}: {response.status_code} {response.text[:300]}")
            body = response.json()
            if body["job_id"] and body["status"] != "processed":
                common.wait_jobs_done(svc, [body["job_id"]], timeout_s=900)
            sent.append(Sent(item, body["memory_id"], time.monotonic() - t0))
            print(f"  {n}/{len(items)} remembers, {time.monotonic() - started:.0f} s", flush=True)
        decisions, usage = asyncio.run(_read_store(svc, [s.memory_id for s in sent]))
    return sent, decisions, usage


async def _read_store(svc: common.Service, ids: list[str]) -> tuple[list[dict], list[dict]]:
    match = re.search(r"Postgres\s+(postgresql://\S+)", svc.log.read_text(errors="replace"))
    if not match:
        raise RuntimeError(f"no Postgres DSN in {svc.log}")
    conn = await asyncpg.connect(match.group(1))
    try:
        # The target as the model saw it: an applied UPDATE changed its content since, so take
        # the old content of its first UPDATE at or after the decision, else the current one.
        decisions = await conn.fetch(
            """
            SELECT d.source_memory_id::text AS source, d.fact, d.action, d.outcome, d.detail, d.content,
                   d.confidence, d.provider,
                   coalesce((SELECT h.old_content FROM memory_history h
                             WHERE h.memory_id = d.target_id AND h.event = 'UPDATE' AND h.created_at >= d.created_at
                             ORDER BY h.version LIMIT 1), t.content) AS target_content
            FROM memory_decisions d LEFT JOIN memories t ON t.id = d.target_id
            WHERE d.source_memory_id = ANY($1::uuid[])
            ORDER BY d.id
            """, ids)
        usage = await conn.fetch("SELECT memory_id::text AS memory_id, usage FROM memory_jobs"
                                 " WHERE memory_id = ANY($1::uuid[])", ids)
    finally:
        await conn.close()
    return [dict(r) for r in decisions], [dict(r) for r in usage]


# -- scores --------------------------------------------------------------------------------------

@dataclass
class Extracted:
    item: Item
    fact: str
    action: str
    outcome: str
    gold: GoldFact | None  # the gold fact it states, if any
    row: dict  # its memory_decisions row


def extraction(sent: list[Sent], decisions: list[dict]) -> tuple[list[Extracted], int, int]:
    """Each model fact with the gold fact it states; and the gold facts stated, of all."""
    by_source: dict[str, list[dict]] = {}
    for d in decisions:
        by_source.setdefault(d["source"], []).append(d)
    facts, stated, wanted = [], 0, 0
    for s in sent:
        rows = by_source.get(s.memory_id, [])
        wanted += len(s.item.facts)
        stated += sum(1 for g in s.item.facts if any(states(r["fact"], g) for r in rows))
        for r in rows:
            gold = next((g for g in s.item.facts if states(r["fact"], g)), None)
            facts.append(Extracted(s.item, r["fact"], r["action"], r["outcome"], gold, r))
    return facts, stated, wanted


def correct_change(e: Extracted, target: str | None) -> bool:
    """An UPDATE or DELETE is right when its fact states a gold fact of that action and the
    target held the attribute's old value."""
    g = e.gold
    return (g is not None and g.action == e.action and target is not None and g.target_value is not None
            and states(target, g, value=g.target_value))


def report(sent: list[Sent], decisions: list[dict], usage: list[dict], args: argparse.Namespace) -> str:
    items = [s.item for s in sent]
    counts = summary([UserGold("sample", items)])
    facts, stated, wanted = extraction(sent, decisions)
    out = [f"{len({i.user for i in items})} users, {len(items)} remembers of the gold set of `bench.write_pipeline` "
           f"(seed {args.seed}), in `sync` mode one at a time, each waiting for its job; `ENGRAM_LLM_PROVIDER=local` "
           f"({local_llm.MODEL_NAME}, llama.cpp on {os.cpu_count()} cores), `ENGRAM_WRITE_PIPELINE={args.mode}`, "
           "every other setting default.\n",
           "Sample: remembers by kind " + ", ".join(f"{k} {v}" for k, v in counts["kinds"].most_common())
           + "; gold facts by action " + ", ".join(f"{k} {v}" for k, v in counts["actions"].most_common()) + ".\n"]

    good = sum(1 for f in facts if f.gold)
    precision = good / len(facts) if facts else float("nan")
    recall = stated / wanted if wanted else float("nan")
    out += ["## Extraction\n",
            common.md_table(["model facts", "stating a gold fact", "precision", "gold facts", "stated", "recall"],
                            [[len(facts), good, f"{precision:.2f}", wanted, stated, f"{recall:.2f}"]])]

    changes = [(f, f.row) for f in facts if f.action in ("UPDATE", "DELETE")]
    out.append("\n## The model's UPDATE and DELETE\n")
    rows = []
    for action in ("UPDATE", "DELETE"):
        mine = [(f, d) for f, d in changes if d["action"] == action]
        right = [(f, d) for f, d in mine if correct_change(f, d["target_content"])]
        applied = [(f, d) for f, d in mine if d["outcome"] == "applied"]
        applied_right = [(f, d) for f, d in applied if correct_change(f, d["target_content"])]
        gold_n = sum(1 for i in items for g in i.facts if g.action == action)
        rows.append([action, gold_n, len(mine), len(right), _ratio(len(right), len(mine)), len(applied),
                     _ratio(len(applied_right), len(applied))])
    out.append(common.md_table(["action", "gold", "proposed", "correct", "precision (proposed)", "applied",
                                "precision (applied)"], rows))
    out.append("\nThe issue asks for a precision of at least 0.90. The guards (similarity floors, thresholds, "
               "pins, locks) act between proposed and applied.\n")
    if changes:
        out.append(common.md_table(
            ["action", "outcome", "fact", "target as the model saw it", "new content", "correct", "detail"],
            [[d["action"], d["outcome"], f.fact, d["target_content"] or "", d["content"] or "",
              "yes" if correct_change(f, d["target_content"]) else "no", (d["detail"] or "")[:90]]
             for f, d in changes]))

    out.append("\n## Decisions by action and outcome\n")
    table = Counter((d["action"], d["outcome"]) for d in decisions)
    out.append(common.md_table(["action", "outcome", "facts"], [[a, o, n] for (a, o), n in sorted(table.items())]))
    out.extend(_tokens(usage, len(sent), args))
    seconds = common.percentiles(s.seconds * 1e3 for s in sent)
    out.append(f"\nRemember until its job is done: p50 {seconds['p50'] / 1e3:.1f} s, p95 {seconds['p95'] / 1e3:.1f} s, "
               f"max {seconds['max'] / 1e3:.1f} s.\n")
    out.append("## Every extracted fact\n")
    out.append(common.md_table(["remember", "kind", "model fact", "decided", "states gold fact"],
                               [[f.item.text, f.item.kind, f.fact, f"{f.action} {f.outcome}",
                                 f.gold.content if f.gold else "no"] for f in facts]))
    silent = [s.item for s in sent if s.item.facts and not any(f.item is s.item for f in facts)]
    if silent:
        out.append(f"\nRemembers with gold facts of which the model extracted none ({len(silent)}): "
                   + "; ".join(repr(i.text) for i in silent) + ".")
    return "\n".join(out)


def _tokens(usage: list[dict], remembers: int, args: argparse.Namespace) -> list[str]:
    totals: Counter = Counter()
    for row in usage:
        for counts in json.loads(row["usage"] or "{}").values():  # jsonb, as text on a plain connection
            totals.update(counts)
    per = {k: totals[k] / remembers for k in ("calls", "in", "out")}
    cost = (totals["in"] * args.price_in + totals["out"] * args.price_out) / 1e6 * 1000 / remembers
    return ["\n## Tokens and cost\n",
            "As the model server counted them, from each job's `usage` (also `GET /api/memory/jobs/{id}`).\n",
            common.md_table(["model calls per remember", "tokens in per remember", "tokens out per remember",
                             "tokens per 1,000 remembers", f"USD per 1,000 remembers at ${args.price_in}/"
                             f"${args.price_out} per 1M in/out"],
                            [[f"{per['calls']:.2f}", f"{per['in']:.0f}", f"{per['out']:.0f}",
                              f"{(totals['in'] + totals['out']) * 1000 / remembers:,.0f}", f"{cost:.3f}"]])]


def _ratio(a: int, b: int) -> str:
    return f"{a / b:.2f}" if b else "n/a"


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m bench.write_pipeline_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=3)
    parser.add_argument("--remembers", type=int, default=10, help="remembers per user")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--mode", default="full", choices=("full", "add_only", "shadow"))
    parser.add_argument("--price-in", type=float, default=PRICE_IN, help="USD per 1M input tokens")
    parser.add_argument("--price-out", type=float, default=PRICE_OUT, help="USD per 1M output tokens")
    args = parser.parse_args(argv)
    model = Path(os.environ.get("ENGRAM_LOCAL_LLM_MODEL_PATH") or common.REPO / "data" / "models" / local_llm.MODEL_FILE)
    local_llm.check(model)
    started = time.time()
    items = [i for u in generate(args.users, args.remembers, args.seed, 0.15) for i in u.items]
    env = {"ENGRAM_LLM_PROVIDER": "local", "ENGRAM_LOCAL_LLM_MODEL_PATH": str(model), "ENGRAM_LLM_TIMEOUT_S": "300",
           "ENGRAM_WRITE_PIPELINE": args.mode}
    sent, decisions, usage = run(items, env)
    body = report(sent, decisions, usage, args)
    path = common.write_report("write-pipeline-model", "Engram semantic write pipeline with the local model",
                               body, started=started)
    print(body)
    print(f"\nreport: {path}")
    return path


if __name__ == "__main__":
    main()
