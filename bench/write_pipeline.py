"""The semantic write pipeline against a gold set: duplicates, final-state accuracy, what the
guards refuse, and what the pipeline costs per remember.

Each user (scope) of the gold set (bench/write_pipeline_gold.py) remembers ~25 texts in `sync`
mode, one at a time from one client, on a fresh `engram up` per run:

- `full`: ENGRAM_WRITE_PIPELINE=full (the default);
- `add_only`: facts are added, no UPDATE or DELETE applied;
- `off`: raw memories only (extraction still runs): the latency baseline;
- and, computed from the gold set, what an ADD-everything store (no reconciliation) would hold.

The LLM is an oracle: a `FakeLLMServer` in this process answering each extraction with the
remember's gold facts, and each decision request with the gold action on the shown memory that
holds that attribute's current value (an ADD when none is shown). So the run measures the
pipeline's machinery (candidates, the near-duplicate MERGE, the guards, the rollout modes), not a
model. Stored facts and decisions are read from the service's Postgres afterwards.

    .venv/bin/python -m bench.write_pipeline                          # 40 users -> bench/reports/write-pipeline.md
    .venv/bin/python -m bench.write_pipeline --users 2 --sections full,off   # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from bench import common
from bench.write_pipeline_gold import REMOVED, GoldFact, Item, UserGold, add_everything, generate, norm, summary
from tests.fakes.llm_server import EMPTY_EXTRACTION, FakeLLMServer, FakeReply, _asks_for_decisions

SECTIONS = ("full", "add_only", "off")
DEFAULT_USERS = 40
TARGET_REDUCTION = 0.60  # the issue: at least 60% fewer duplicates than storing every fact
ORACLE_CONFIDENCE = 0.9  # above both decision thresholds (0.6 UPDATE, 0.8 DELETE)
_FACT = re.compile(r'<fact id="(\d+)">(.*?)</fact>', re.DOTALL)
_MEMORY = re.compile(r'<memory id="(\d+)">(.*?)</memory>', re.DOTALL)
_TEXT = re.compile(r"<memory>\n(.*)\n</memory>", re.DOTALL)


# -- the oracle --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Asked:
    """One fact the pipeline asked the oracle about, and what it answered."""

    user: str
    index: int
    gold: str  # the gold action
    answered: str
    note: str = ""  # why it answered otherwise
    fact: str = ""
    shown: tuple[str, ...] = ()  # the memories the request showed


class OracleLLM(FakeLLMServer):
    """The fake LLM answering from the gold set. `item` is the remember in flight: the driver
    sets it before each one (remembers go one at a time, so requests belong to it)."""

    def __init__(self, users: dict[str, UserGold]) -> None:
        super().__init__()
        self.users = users
        self.item: Item | None = None
        self.asked: list[Asked] = []
        self.calls: Counter = Counter()  # "extraction", "decision", "unrouted extraction"
        self.prompt_chars: Counter = Counter()  # characters of the messages sent, by call kind

    def _next_reply(self, body: Any) -> FakeReply:
        kind = "decision" if _asks_for_decisions(body) else "extraction"
        messages = [m for m in body.get("messages", []) if isinstance(m, dict)]
        self.calls[kind] += 1
        self.prompt_chars[kind] += sum(len(str(m.get("content", ""))) for m in messages)
        user_text = str(messages[-1].get("content", "")) if messages else ""
        return self._decide(user_text) if kind == "decision" else self._extract(user_text)

    def _extract(self, user_text: str) -> FakeReply:
        match = _TEXT.search(user_text)
        item = self.item
        if item is None or match is None or " ".join(match.group(1).split()) != " ".join(item.text.split()):
            self.calls["unrouted extraction"] += 1
            return FakeReply.json(EMPTY_EXTRACTION)
        return FakeReply.json({"facts": [f.extraction() for f in item.facts], "entities": [], "category": None,
                               "tags": []})

    def _decide(self, user_text: str) -> FakeReply:
        item = self.item
        shown = {int(i): text for i, text in _MEMORY.findall(user_text)}
        answers = []
        for fact_id, text in _FACT.findall(user_text):
            gold = next((f for f in item.facts if norm(f.content) == norm(text)), None) if item else None
            if gold is None:
                self.asked.append(Asked(item.user if item else "?", item.index if item else -1, "?", "ADD",
                                        "fact not in the gold set"))
                answers.append({"fact": int(fact_id), "action": "ADD", "reason": "unknown fact"})
                continue
            answer, note = self._answer(self.users[item.user], gold, shown)
            self.asked.append(Asked(item.user, item.index, gold.action, answer["action"], note, text,
                                    tuple(shown.values())))
            answers.append({"fact": int(fact_id)} | answer)
        return FakeReply.decisions(*answers)

    @staticmethod
    def _answer(user: UserGold, gold: GoldFact, shown: dict[int, str]) -> tuple[dict, str]:
        """The gold action on the shown memory holding the attribute's value the decision is
        about (any other value of the attribute for a change); ADD when none is shown."""
        base = {"confidence": ORACLE_CONFIDENCE, "reason": f"gold {gold.action}", "target": None, "content": None}
        if gold.action == "ADD":
            return base | {"action": "ADD"}, ""
        same_key = [(i, kv[1]) for i, text in shown.items() if (kv := user.lookup(text)) and kv[0] == gold.key]
        exact = [i for i, value in same_key if value == gold.target_value]
        near = [i for i, value in same_key if value != REMOVED]
        target = exact[0] if exact else (near[0] if near and gold.action != "NONE" else None)
        if target is None:
            return base | {"action": "ADD", "reason": "the attribute's fact is not shown"}, "target not shown"
        return base | {"action": gold.action, "target": target, "content": gold.new_content}, ""


# -- a run -----------------------------------------------------------------------------------------------

@dataclass
class Sent:
    item: Item
    memory_id: str
    ms: float
    status: str
    decision_calls: int


@dataclass
class Run:
    mode: str
    sent: list[Sent] = field(default_factory=list)
    live: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # user -> (attribute, value) per live fact
    unmapped: list[str] = field(default_factory=list)  # live facts no gold text states
    not_active: Counter = field(default_factory=Counter)  # live facts by status, when not active
    decisions: list[dict] = field(default_factory=list)
    asked: list[Asked] = field(default_factory=list)
    calls: Counter = field(default_factory=Counter)
    prompt_chars: Counter = field(default_factory=Counter)
    statuses: Counter = field(default_factory=Counter)


def run(mode: str, gold: list[UserGold], warm: list[UserGold], env: dict[str, str]) -> Run:
    """Every user's remembers, in order, against a fresh service with WRITE_PIPELINE=`mode`."""
    users = {u.user: u for u in gold + warm}
    result = Run(mode)
    with OracleLLM(users) as fake, common.data_dir() as data, common.service(
            f"write-pipeline-{mode}", data, {"ENGRAM_LLM_PROVIDER": "ollama", "ENGRAM_OLLAMA_URL": fake.url,
                                             "ENGRAM_WRITE_PIPELINE": mode} | env) as svc:
        print(f"{mode}: service up; warming up", flush=True)
        for user in warm:
            for item in user.items:
                _remember(svc, fake, item)
        fake.asked.clear()
        fake.calls.clear()
        fake.prompt_chars.clear()
        started = time.monotonic()
        for n, user in enumerate(gold, 1):
            for item in user.items:
                sent = _remember(svc, fake, item)
                result.sent.append(sent)
                result.statuses[sent.status] += 1
            if n % 10 == 0 or n == len(gold):
                print(f"  {mode}: {n}/{len(gold)} users, {len(result.sent)} remembers, "
                      f"{time.monotonic() - started:.0f} s", flush=True)
        result.asked, result.calls, result.prompt_chars = list(fake.asked), Counter(fake.calls), Counter(
            fake.prompt_chars)
        facts, result.decisions = asyncio.run(_read_store(svc, [u.user for u in gold]))
    for row in facts:
        stated = users[row["user_id"]].lookup(row["content"])
        if row["status"] != "active":
            result.not_active[row["status"]] += 1
        if stated is None:
            result.unmapped.append(row["content"])
        result.live.setdefault(row["user_id"], []).append(stated or ("?", row["content"]))
    return result


def _remember(svc: common.Service, fake: OracleLLM, item: Item) -> Sent:
    fake.item = item
    before = fake.calls["decision"]
    response, ms = common.timed(svc.client.post, "/api/memory/remember",
                                json={"content": item.text, "scope": {"user_id": item.user}, "mode": "sync"})
    if response.status_code != 200:
        raise RuntimeError(f"remember {item.text!r}: {response.status_code} {response.text[:300]}")
    body = response.json()
    status = body["status"] + ("".join(f" ({w.split(':')[0]})" for w in body["warnings"]))
    if body["job_id"] and body["status"] != "processed":
        common.wait_jobs_done(svc, [body["job_id"]], timeout_s=300)  # the next remember must not overtake it
    return Sent(item, body["memory_id"], ms, status, fake.calls["decision"] - before)


async def _read_store(svc: common.Service, users: list[str]) -> tuple[list, list[dict]]:
    """The users' live facts, and the decisions about their remembers' facts, straight from the
    service's Postgres (the DSN `engram up` logs)."""
    match = re.search(r"Postgres\s+(postgresql://\S+)", svc.log.read_text(errors="replace"))
    if not match:
        raise RuntimeError(f"no Postgres DSN in {svc.log}")
    conn = await asyncpg.connect(match.group(1))
    try:
        facts = await conn.fetch("SELECT user_id, content, status FROM memories"
                                 " WHERE kind = 'fact' AND NOT is_deleted AND user_id = ANY($1::text[])", users)
        decisions = await conn.fetch(
            """
            SELECT d.source_memory_id::text AS source, d.fact, d.action, d.outcome, d.detail,
                   t.content AS target_content, w.kind AS written_kind
            FROM memory_decisions d
            JOIN memories m ON m.id = d.source_memory_id
            LEFT JOIN memories t ON t.id = d.target_id
            LEFT JOIN memories w ON w.id = d.memory_id
            WHERE m.user_id = ANY($1::text[])
            ORDER BY d.id
            """, users)
    finally:
        await conn.close()
    return list(facts), [dict(r) for r in decisions]


# -- scores ------------------------------------------------------------------------------------------------

@dataclass
class Score:
    facts: int
    duplicates: int  # live facts of a user sharing an attribute beyond the first
    stale: int  # live facts stating no value of the gold final state
    recall: float  # share of the gold final (attribute, value) pairs held by a live fact
    precision: float  # share of live facts stating a gold final value


def score(live: dict[str, list[tuple[str, str]]], gold: list[UserGold]) -> Score:
    facts = duplicates = stale = held = wanted = 0
    for user in gold:
        rows = live.get(user.user, [])
        per_key = Counter(k for k, _ in rows if k != "?")
        facts += len(rows)
        duplicates += sum(n - 1 for n in per_key.values() if n > 1)
        stale += sum(1 for k, v in rows if v not in user.final.get(k, ()))
        pairs = set(rows)
        wanted += sum(len(values) for values in user.final.values())
        held += sum(1 for k, values in user.final.items() for v in values if (k, v) in pairs)
    return Score(facts, duplicates, stale, held / wanted if wanted else float("nan"),
                 (facts - stale) / facts if facts else float("nan"))


def gold_outcomes(r: Run, gold: list[UserGold]) -> tuple[dict[str, Counter], list[tuple[GoldFact, dict]]]:
    """Per gold action, the recorded "ACTION outcome" of its facts ("no decision" when none was
    recorded); and each (gold fact, decision row) pair."""
    found: dict[tuple[str, str], dict] = {}
    for d in r.decisions:
        found[(d["source"], norm(d["fact"]))] = d
    table: dict[str, Counter] = defaultdict(Counter)
    pairs = []
    for s in r.sent:
        for fact in s.item.facts:
            d = found.get((s.memory_id, norm(fact.content)))
            table[fact.action][f"{d['action']} {d['outcome']}" if d else "no decision"] += 1
            if d:
                pairs.append((fact, d))
    return table, pairs


# -- the report ------------------------------------------------------------------------------------------

def report(runs: dict[str, Run], gold: list[UserGold], args: argparse.Namespace) -> str:
    remembers = sum(len(u.items) for u in gold)
    counts = summary(gold)
    out = [
        f"{len(gold)} users (scopes), {remembers} remembers in `sync` mode, one at a time from one keep-alive client; "
        f"gold set seed {args.seed}, agent-note share {args.note_share}. Each run on a fresh `engram up` "
        f"(`ENGRAM_LLM_PROVIDER=ollama` at the oracle, bge-small embeddings, every other setting default"
        f"{'; also ' + ', '.join(f'`{k}={v}`' for k, v in args.env.items()) if args.env else ''}). The oracle "
        "answers each extraction with the gold facts and each decision with the gold action on the shown memory "
        "holding the attribute (an ADD when none is shown), at confidence "
        f"{ORACLE_CONFIDENCE}: a perfect model, so every miss below is the pipeline's machinery or its guards.\n",
        "Gold set: remembers by kind " + ", ".join(f"{k} {v}" for k, v in counts["kinds"].most_common())
        + "; facts by expected action " + ", ".join(f"{k} {v}" for k, v in counts["actions"].most_common()) + ".\n",
    ]
    out.append("## Duplicates and final state\n")
    out.append("Duplicates: a user's live facts about an attribute beyond the first (stale values and restatements; "
               "a contradiction keeps both claims by design, so each contradicted attribute counts one). Stale: live "
               "facts stating no value of the gold final state. Final recall: gold final (attribute, value) pairs held "
               "by a live fact; precision: live facts that state a gold final value.\n")
    rows, dup = [], {}
    baselines = {"ADD everything (every extracted fact kept)": add_everything(gold, fold_identical=False),
                 "ADD everything, identical texts held once (the content hash)": add_everything(gold, True)}
    measured = {f"{mode} (measured)": r.live for mode, r in runs.items() if mode != "off"}
    for label, live in (baselines | measured).items():
        s = score(live, gold)
        dup[label] = s.duplicates
        base = dup["ADD everything (every extracted fact kept)"]
        cut = 1 - s.duplicates / base if base else float("nan")
        rows.append([label, s.facts, s.duplicates, f"{s.duplicates * 1000 / remembers:.0f}", f"{cut:.0%}", s.stale,
                     f"{s.recall:.1%}", f"{s.precision:.1%}"])
    out.append(common.md_table(["store", "live facts", "duplicates", "per 1,000 remembers", "fewer than ADD everything",
                                "stale", "final recall", "final precision"], rows))
    if "full" in runs:
        base = dup["ADD everything (every extracted fact kept)"]
        cut = 1 - dup["full (measured)"] / base if base else float("nan")
        out.append(f"\n**Target (≥ {TARGET_REDUCTION:.0%} fewer duplicates than ADD everything): "
                   f"{'PASS' if cut >= TARGET_REDUCTION else 'FAIL'}** ({cut:.0%} with `full`).\n")
    for mode, r in runs.items():
        if r.unmapped or r.not_active:
            out.append(f"- {mode}: {len(r.unmapped)} live facts state no gold text (e.g. {r.unmapped[:3]}); "
                       f"live facts not active: {dict(r.not_active) or 'none'}.")
    for mode, r in runs.items():
        if mode == "off":
            continue
        out.append(f"\n## Decisions, `{mode}`\n")
        table = Counter((d["action"], d["outcome"]) for d in r.decisions)
        outcomes = sorted({o for _, o in table})
        actions = sorted({a for a, _ in table})
        out.append("From memory_decisions (MERGE: a near-duplicate, decided without the model).\n")
        out.append(common.md_table(["action", *outcomes, "total"],
                                   [[a, *(table[(a, o)] or "" for o in outcomes), sum(table[(a, o)] for o in outcomes)]
                                    for a in actions]))
        by_gold, pairs = gold_outcomes(r, gold)
        out.append("\nEach gold fact's recorded decision, by the action a perfect model takes:\n")
        out.append(common.md_table(["gold action", "facts", "recorded as (action outcome: facts)"],
                                   [[g, sum(c.values()), ", ".join(f"{k}: {v}" for k, v in c.most_common())]
                                    for g, c in sorted(by_gold.items())]))
        out.extend(_guards(r, pairs))
    out.extend(_latency(runs))
    out.append("\n## Model calls per remember\n")
    out.append("Counted at the oracle; prompt size is the characters of the messages sent (system prompt included).\n")
    rows = [["ADD everything (computed)", "1.00", "0.00", "1.00", "", ""]]
    for mode, r in runs.items():
        n = len(r.sent)
        rows.append([mode, f"{r.calls['extraction'] / n:.2f}", f"{r.calls['decision'] / n:.2f}",
                     f"{(r.calls['extraction'] + r.calls['decision']) / n:.2f}",
                     f"{r.prompt_chars['extraction'] / n:,.0f}", f"{r.prompt_chars['decision'] / n:,.0f}"])
    out.append(common.md_table(["run", "extraction calls", "decision calls", "total", "extraction prompt chars",
                                "decision prompt chars"], rows))
    out.append("\nTokens per remember: not measured. The fake LLM reports a fixed 10 prompt and 10 completion tokens "
               "per call, so any token accounting would only count calls; the prompt characters above are the size "
               "proxy (about 4 per token in English).\n")
    out.append("## Notes\n")
    for mode, r in runs.items():
        unrouted = r.calls["unrouted extraction"]
        unknown = sum(1 for a in r.asked if a.gold == "?")
        out.append(f"- {mode}: remember answers {dict(r.statuses)}; extraction requests not matched to the remember "
                   f"in flight: {unrouted}; facts in decision requests not in the gold set: {unknown}.")
    return "\n".join(out)


def _guards(r: Run, pairs: list[tuple[GoldFact, dict]]) -> list[str]:
    """Legitimate changes (gold UPDATE, DELETE, CONTRADICT) and what became of them."""
    out = ["\nLegitimate changes, and what the guards did with them (the oracle names the right target; "
           "`target not shown`: that attribute's fact was not among the memories the pipeline showed):\n"]
    not_shown = Counter(a.gold for a in r.asked if a.note == "target not shown")
    rows = []
    for action in ("UPDATE", "DELETE", "CONTRADICT", "NONE"):
        mine = [d for f, d in pairs if f.action == action]
        outcome = Counter(d["outcome"] for d in mine if d["action"] == action)
        rows.append([action, len(mine), outcome["applied"] + outcome["review_needed"], outcome["unrelated"],
                     outcome["below_threshold"], outcome["refused"], outcome["held"],
                     sum(1 for d in mine if d["action"] == "MERGE"), not_shown[action]])
    out.append(common.md_table(["gold", "decided", "applied (review_needed for CONTRADICT)", "unrelated (similarity "
                                "guard)", "below_threshold", "refused (pinned, version, conflict...)",
                                "held (add_only)",
                                "MERGE (no model)", "target not shown"], rows))
    missing = [a for a in r.asked if a.note == "target not shown"]
    if missing:
        out.append(f"\nTarget not shown ({len(missing)}; first 6): the fact, and the memories the request showed.\n")
        out.append(common.md_table(["gold", "fact", "shown"], [[a.gold, a.fact, " / ".join(a.shown)]
                                                               for a in missing[:6]]))
    refused = [(f, d) for f, d in pairs if d["outcome"] in ("unrelated", "refused", "below_threshold")]
    if refused:
        out.append(f"\nRefused legitimate changes ({len(refused)}; first 12): the fact, the target's current text, "
                   "the detail.\n")
        out.append(common.md_table(["gold", "fact", "target", "detail"],
                                   [[f.action, f.content, d["target_content"] or "", (d["detail"] or "")[:120]]
                                    for f, d in refused[:12]]))
        sims = [float(m.group(1)) for _, d in refused if (m := re.search(r"cosine (\d\.\d+)", d["detail"] or ""))]
        if sims:
            out.append(f"\nCosine of the refused targets to their facts: min {min(sims):.2f}, median "
                       f"{sorted(sims)[len(sims) // 2]:.2f}, max {max(sims):.2f} (floor: DECISION_MIN_SIMILARITY).")
    held_by_raw = [d for d in r.decisions if d["written_kind"] == "raw"]
    if held_by_raw:
        out.append(f"\nFacts not stored as facts because a raw memory of the scope has the same text (an agent's "
                   f"note is the fact): {len(held_by_raw)}, e.g. {[d['fact'] for d in held_by_raw[:3]]}.")
    return out


def _latency(runs: dict[str, Run]) -> list[str]:
    out = ["\n## Remember latency, `sync` mode\n",
           "Client round trip of each remember until its first pass is done (extraction, and with the pipeline on, "
           "the facts decided and written). Fake LLM with zero delay, so this is the pipeline's own cost.\n"]
    rows = []
    for mode, r in runs.items():
        subsets = {"all": [s.ms for s in r.sent], "with facts": [s.ms for s in r.sent if s.item.facts],
                   "with a decision call": [s.ms for s in r.sent if s.decision_calls]}
        for label, values in subsets.items():
            if values:
                p = common.percentiles(values)
                rows.append([mode, label, p["n"], *(common.fmt_ms(p[k]) for k in ("p50", "p95", "p99", "max"))])
    out.append(common.md_table(["run", "remembers", "n", "p50 ms", "p95 ms", "p99 ms", "max ms"], rows))
    if "full" in runs and "off" in runs:
        full = common.percentiles(s.ms for s in runs["full"].sent)
        off = common.percentiles(s.ms for s in runs["off"].sent)
        out.append("\nOverhead of the pipeline, `full` over `off` (all remembers): "
                   + ", ".join(f"{k} ×{full[k] / off[k]:.2f} (+{full[k] - off[k]:.1f} ms)"
                               for k in ("p50", "p95", "p99"))
                   + ".")
    return out


# -- the command -----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m bench.write_pipeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=DEFAULT_USERS, help="users (scopes) in the gold set")
    parser.add_argument("--remembers", type=int, default=25, help="remembers per user")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--note-share", type=float, default=0.15,
                        help="share of single-fact new remembers written as an agent's note (the text is the fact)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"runs, in order, from {','.join(SECTIONS)} (a subset or another --users names the "
                             "report after them)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an ENGRAM_<NAME> setting for every run, e.g. DECISION_MIN_SIMILARITY=0.6 (repeatable)")
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if unknown := set(sections) - set(SECTIONS):
        parser.error(f"unknown sections {sorted(unknown)}; choose from {','.join(SECTIONS)}")
    args.env = dict(e.split("=", 1) for e in args.env)
    started = time.time()
    gold = generate(args.users, args.remembers, args.seed, args.note_share)
    warm = generate(1, 8, args.seed + 1, args.note_share, prefix="wp-warm-up-")
    runs = {mode: run(mode, gold, warm, {f"ENGRAM_{k.upper()}": v for k, v in args.env.items()})
            for mode in sections}
    body = report(runs, gold, args)
    name = "write-pipeline"
    if args.users != DEFAULT_USERS:
        name += f"-{args.users}-users"
    if sections != list(SECTIONS):
        name += "-" + "-".join(sections)
    if args.env:
        name += "-" + "-".join(k.lower() for k in sorted(args.env))
    path = common.write_report(name, "Engram semantic write pipeline against a gold set", body, started=started)
    print(body)
    print(f"\nreport: {path}")
    return path


if __name__ == "__main__":
    main()
