"""Issue 20's benchmark: remember latency with trust classification and type lifetimes on
(`ENGRAM_TRUST_AND_LIFETIMES=true`, the default) beside the same load with them off (every
write TRUSTED, permanent, no approvals), in one run; and search with trust and confidence
filters beside the same searches without.

Each section is a fresh `engram up` (`ENGRAM_LLM_PROVIDER=none`: no model in the loop, so the
numbers are the write path's own cost) with the setting `off` or `on`, in ABBA order (off, on,
on, off with two rounds) so a machine that drifts during the run favours neither. In each:

1. preload: a big scope (`tl-big`) and three small ones through the bulk endpoint, with the
   same mix as the load, minus the writes `on` holds for approval; wait until processed;
2. load: 8 clients, each its own keep-alive connection, sending `auto` remembers back to back
   (the next as soon as the last is answered) from one seeded plan, the same in every section:
   70% into the big scope; source_type user, agent, none, web, email; memory_type FACT,
   PREFERENCE, CONTEXT, PATTERN, STATE, DECISION and a few LEARNED; session_ids that move on
   every 40 writes of a scope (so `on` ends the earlier session's STATE memories); some with
   origin, agent_chain, confidence, expires_at. With `on`, a FACT from an UNTRUSTED source (or
   relayed from one) and any LEARNED are answered `pending_approval` at once, without the
   first-pass wait: they are about 5% of the plan and reported apart, never in the comparison;
3. searches in the big scope, one client: each query without filters and with
   `{"trust": ["TRUSTED", "SEMI_TRUSTED"], "min_confidence": 0.6}`, the order alternating;
4. checks: STATE memories in default recall, pending memories listed and searched for.

    .venv/bin/python -m bench.trust_lifetimes                 # ~5 min -> bench/reports/trust-lifetimes.md
    .venv/bin/python -m bench.trust_lifetimes --mode async    # the acknowledgement only -> trust-lifetimes-async.md
    .venv/bin/python -m bench.trust_lifetimes --quick         # ~1 min smoke run -> trust-lifetimes-quick.md
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import itertools
import random
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench import common
from bench.ingest import CLIENT_TIMEOUT_S, client, wait_imports, wait_pipeline_idle
from bench.latency import synthetic_memories, synthetic_queries

SETTING = "ENGRAM_TRUST_AND_LIFETIMES"
SERVICE_ENV = {"ENGRAM_LLM_PROVIDER": "none"}
BIG = "tl-big"
SMALL = ("tl-small-1", "tl-small-2", "tl-small-3")
BIG_SHARE = 0.7  # of the load; the rest spread over SMALL
# The plan's mix: (value, weight). None: no source_type (the default class, SEMI_TRUSTED).
SOURCES = (("user", 0.30), ("agent", 0.30), (None, 0.30), ("web", 0.07), ("email", 0.03))
TYPES = (("FACT", 0.32), ("PREFERENCE", 0.20), ("CONTEXT", 0.15), ("PATTERN", 0.10), ("STATE", 0.18),
         ("DECISION", 0.045), ("LEARNED", 0.005))
# The bench's own reading of the default ENGRAM_TRUST_SOURCES, to predict what `on` answers
# (not imported from the product, so a product bug shows as a mismatch).
TRUST = {"user": "TRUSTED", "agent": "SEMI_TRUSTED", None: "SEMI_TRUSTED", "web": "UNTRUSTED",
         "email": "UNTRUSTED"}
LEVELS = ("UNTRUSTED", "SEMI_TRUSTED", "TRUSTED")
SEARCH_FILTER = {"trust": ["TRUSTED", "SEMI_TRUSTED"], "min_confidence": 0.6}
BULK_BATCH = 500
WARM_UP = 40  # untimed remembers before the load, from every client


# -- the plan ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Write:
    body: dict  # the remember (a bulk item: no mode)
    pending: bool  # `on` holds it for approval: a FACT whose trust is UNTRUSTED, or a LEARNED


def _pick(rng: random.Random, table: tuple) -> object:
    return rng.choices([v for v, _ in table], weights=[w for _, w in table])[0]


class Planner:
    """Seeded writes. Each scope's session moves on every `session_every` of its writes, and
    the counters run on from the preload into the load, as one history."""

    def __init__(self, seed: int, session_every: int, texts: list[str]) -> None:
        self.rng = random.Random(seed)
        self.session_every = session_every
        self.texts = iter(texts)
        self.writes_in: Counter = Counter()

    def session(self, scope: str) -> str:
        return f"{scope}-session-{self.writes_in[scope] // self.session_every}"

    def write(self, scope: str) -> Write:
        rng = self.rng
        source = _pick(rng, SOURCES)
        memory_type = _pick(rng, TYPES)
        body: dict = {"content": next(self.texts), "scope": {"user_id": scope}, "memory_type": memory_type,
                      "type": memory_type.lower()}
        trust = TRUST[source]
        if source is not None:
            body["source_type"] = source
            body["source_id"] = f"{source}-{rng.randrange(1000)}"
        if source == "agent":
            if rng.random() < 0.5:
                body["agent_chain"] = ["planner", "researcher"][:rng.randint(1, 2)]
            if rng.random() < 0.2:  # relaying another source
                relayed = rng.choice(["web", "user"])
                body["origin"] = {"source_type": relayed, "source_id": f"https://example.org/{rng.randrange(1000)}"}
                trust = min(trust, TRUST[relayed], key=LEVELS.index)
        if memory_type == "STATE" or rng.random() < 0.4:
            body["session_id"] = self.session(scope)
        if rng.random() < 0.5:
            body["confidence"] = round(rng.uniform(0.3, 1.0), 2)
        if rng.random() < 0.03:  # its own lifetime (one that has not passed in any run)
            body["expires_at"] = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=2)).isoformat()
        self.writes_in[scope] += 1
        pending = memory_type == "LEARNED" or (memory_type == "FACT" and trust == "UNTRUSTED")
        return Write(body, pending)

    def preload(self, per_scope: dict[str, int]) -> list[Write]:
        """`per_scope` writes into each scope, none that `on` holds for approval."""
        out = []
        for scope, n in per_scope.items():
            kept = 0
            while kept < n:
                if not (w := self.write(scope)).pending:
                    out.append(w)
                    kept += 1
        return out

    def load(self, n: int) -> list[Write]:
        return [self.write(BIG if self.rng.random() < BIG_SHARE else self.rng.choice(SMALL)) for _ in range(n)]


def plan(args: argparse.Namespace) -> tuple[list[Write], list[Write], list[Write]]:
    """(preload, warm-up, load): the same in every section."""
    per_scope = {BIG: args.preload, **{s: args.preload_small for s in SMALL}}
    total = sum(per_scope.values()) * 2 + WARM_UP + args.remembers  # the preload skips its pending draws
    planner = Planner(args.seed, args.session_every, synthetic_memories(total, seed=args.seed))
    preload = planner.preload(per_scope)
    warm = [Write({**w.body, "scope": {"user_id": "tl-warm-up"}}, w.pending)
            for w in planner.load(WARM_UP)]
    return preload, warm, planner.load(args.remembers)


# -- a section -----------------------------------------------------------------------------------

@dataclass
class Sent:
    write: Write
    ms: float | None  # None: a client timeout or transport error
    status: str  # the answer's status, "HTTP <code>", "timeout" or the error's name
    memory_id: str | None = None
    warnings: tuple[str, ...] = ()


@dataclass
class Section:
    setting: str  # "off" or "on"
    position: int  # 1-based, in the run's order
    round: int
    preload_s: float = 0.0
    sent: list[Sent] = field(default_factory=list)
    load_s: float = 0.0  # first request sent -> last answer
    drain_s: float = 0.0  # last answer -> the write queue empty
    cpu_s: float = 0.0  # the service's process tree, load and drain
    searches: dict[str, list[float]] = field(default_factory=dict)  # variant -> ms
    hits: dict[str, list[int]] = field(default_factory=dict)
    search_errors: Counter = field(default_factory=Counter)
    live_states: Counter = field(default_factory=Counter)  # session_id -> STATE memories of BIG in default recall
    pending_listed: int = 0  # memories listed with status=pending, every scope
    pending_found: int = 0  # pending memories a search for their own text returned
    pending_searched: int = 0
    last_session: str = ""

    def answered(self, subset: str) -> list[float]:
        return [s.ms for s in self.subset(subset) if s.ms is not None]

    def subset(self, name: str) -> list[Sent]:
        if name == "all":
            return self.sent
        return [s for s in self.sent if s.write.pending == (name == "approval-bound")]


async def _load(svc: common.Service, writes: list[Write], clients: int, mode: str) -> tuple[list[Sent], float]:
    todo = iter(writes)
    sent: list[Sent] = []
    started = time.monotonic()

    async def one() -> None:
        async with client(svc) as http:
            for w in todo:
                t0 = time.perf_counter()
                try:
                    response = await http.post("/api/memory/remember", json={**w.body, "mode": mode})
                except httpx.TimeoutException:
                    sent.append(Sent(w, None, "timeout"))
                    continue
                except httpx.TransportError as err:
                    sent.append(Sent(w, None, type(err).__name__))
                    continue
                ms = (time.perf_counter() - t0) * 1e3
                if response.status_code != 200:
                    sent.append(Sent(w, ms, f"HTTP {response.status_code}"))
                    continue
                body = response.json()
                sent.append(Sent(w, ms, body["status"], body["memory_id"],
                                 tuple(x.split(":")[0] for x in body["warnings"])))

    await asyncio.gather(*(one() for _ in range(clients)))
    return sent, time.monotonic() - started


async def _preload(svc: common.Service, writes: list[Write]) -> None:
    ids: list[str] = []
    async with client(svc, 300) as http:
        for k in range(0, len(writes), BULK_BATCH):
            response = await http.post("/api/memory/remember/batch",
                                       json={"items": [w.body for w in writes[k:k + BULK_BATCH]]})
            response.raise_for_status()
            body = response.json()
            if body["failed"]:
                raise RuntimeError(f"preload: {body['failed']} items failed: "
                                   f"{[r['error'] for r in body['results'] if r['error']][:3]}")
            ids.append(body["job_id"])
    await wait_imports(svc, ids, timeout_s=900)


def _search(svc: common.Service, section: Section, queries: list[str]) -> None:
    variants = {"no filter": {}, "trust + min_confidence": SEARCH_FILTER}
    for name in variants:
        section.searches[name], section.hits[name] = [], []
    for i, query in enumerate(queries):
        order = list(variants) if i % 2 == 0 else list(reversed(variants))
        for name in order:
            response, ms = common.timed(svc.client.post, "/api/memory/search", json={
                "query": query, "scope": {"user_id": BIG}, "limit": 10, "filters": variants[name]})
            if response.status_code != 200:
                section.search_errors[f"{name}: HTTP {response.status_code}"] += 1
                continue
            section.searches[name].append(ms)
            section.hits[name].append(len(response.json()["results"]))


def _list_all(svc: common.Service, params: dict) -> list[dict]:
    items, cursor = [], None
    while True:
        response = svc.client.get("/api/memory", params={**params, "limit": 100, **({"cursor": cursor} if cursor
                                                                                      else {})})
        response.raise_for_status()
        page = response.json()
        items += page["items"]
        if not (cursor := page["next_cursor"]):
            return items


def _checks(svc: common.Service, section: Section, sample: int = 20) -> None:
    """STATE memories of the big scope in default recall; pending memories listed; and whether a
    search for a pending memory's own text returns it (it must not)."""
    section.live_states = Counter(m["session_id"] for m in _list_all(
        svc, {"user_id": BIG, "memory_type": "STATE"}))
    section.pending_listed = sum(len(_list_all(svc, {"user_id": s, "status": "pending"})) for s in (BIG, *SMALL))
    pending = [s for s in section.sent if s.status == "pending_approval"][:sample]
    pending_ids = {s.memory_id for s in section.sent if s.status == "pending_approval"}
    for s in pending:
        response = svc.client.post("/api/memory/search", json={
            "query": s.write.body["content"], "scope": s.write.body["scope"], "limit": 10})
        response.raise_for_status()
        section.pending_searched += 1
        section.pending_found += sum(h["memory"]["id"] in pending_ids for h in response.json()["results"])


def run_section(setting: str, position: int, rnd: int, args: argparse.Namespace, preload: list[Write],
                warm: list[Write], load: list[Write], queries: list[str]) -> Section:
    section = Section(setting, position, rnd)
    env = {**SERVICE_ENV, SETTING: "true" if setting == "on" else "false"}
    with common.data_dir() as data, common.service(f"trust-lifetimes-{position}-{setting}", data, env) as svc:
        print(f"{position}. {setting}: service up; preloading {len(preload)} memories", flush=True)
        t0 = time.monotonic()
        asyncio.run(_preload(svc, preload))
        wait_pipeline_idle(svc, timeout_s=900)
        section.preload_s = time.monotonic() - t0
        asyncio.run(_load(svc, warm, args.clients, args.mode))
        wait_pipeline_idle(svc, timeout_s=900)
        print(f"   load: {len(load)} `{args.mode}` remembers from {args.clients} clients", flush=True)
        cpu_before = common.tree_cpu_seconds(svc.proc.pid)
        section.sent, section.load_s = asyncio.run(_load(svc, load, args.clients, args.mode))
        ended = time.monotonic()
        idle_at, _ = wait_pipeline_idle(svc, timeout_s=900, poll_s=0.25)
        section.drain_s = idle_at - ended
        section.cpu_s = sum(common.tree_cpu_seconds(svc.proc.pid).values()) - sum(cpu_before.values())
        print(f"   {len(load)} answered in {section.load_s:.1f} s, drained {section.drain_s:.1f} s later; "
              f"{len(queries)} searches x 2", flush=True)
        _search(svc, section, queries)
        _checks(svc, section)
    section.last_session = max((s.write.body["session_id"] for s in section.sent
                                if s.write.body["scope"]["user_id"] == BIG and "session_id" in s.write.body),
                               key=lambda x: int(x.rsplit("-", 1)[1]), default="")
    return section


# -- the report ----------------------------------------------------------------------------------

def _uncommitted() -> list[str]:
    """The working tree's changed and untracked files (the service runs this tree's code)."""
    try:
        status = subprocess.run(["git", "--no-optional-locks", "status", "--porcelain"], cwd=common.REPO,
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return [line[3:] for line in status.splitlines() if line.strip()]


def _errors(sents: list[Sent]) -> int:
    return sum(1 for s in sents if s.ms is None or s.status.startswith("HTTP"))


def _statuses(sents: list[Sent]) -> str:
    c = Counter(s.status for s in sents) + Counter(w for s in sents for w in s.warnings)
    return ", ".join(f"{k}: {v}" for k, v in c.most_common())


def _row(label: str, values: list[float], extra: list[object]) -> list[object]:
    p = common.percentiles(values)
    return [label, p["n"], *(common.fmt_ms(p[k]) for k in ("p50", "p95", "p99", "max")), *extra]


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "n/a"


def report(sections: list[Section], args: argparse.Namespace, preload: list[Write], load: list[Write]) -> str:
    by = {m: [s for s in sections if s.setting == m] for m in ("off", "on")}
    pending = sum(w.pending for w in load)
    mix = [("source_type", Counter(w.body.get("source_type", "none") for w in load)),
           ("memory_type", Counter(w.body["memory_type"] for w in load)),
           ("scope", Counter(w.body["scope"]["user_id"] for w in load))]
    flags = Counter(k for w in load for k in ("session_id", "origin", "agent_chain", "confidence", "expires_at")
                    if k in w.body)
    out: list[str] = []
    if dirty := _uncommitted():
        out.append(f"Uncommitted files the service ran with: {', '.join(f'`{f}`' for f in dirty)}.\n")
    if args.quick:
        out.append("**Quick run (smoke test): small sizes, one round; not a measurement.**\n")
    out.append(
        f"Each section a fresh `engram up` on a fresh data directory, `ENGRAM_LLM_PROVIDER=none` (no model: the "
        f"write path's own cost), `{SETTING}` `false` (off, the baseline) or `true` (on, the default), every other "
        f"setting default; order: {', '.join(s.setting for s in sections)}"
        f"{' (ABBA, so drift favours neither)' if args.rounds > 1 else ''}. "
        f"Preload per section: {len(preload)} memories through the bulk endpoint ({args.preload} in `{BIG}`, "
        f"{args.preload_small} in each of {', '.join(f'`{s}`' for s in SMALL)}; no write `on` holds for approval), "
        f"then {WARM_UP} untimed remembers. Load: the same {len(load)} remembers in every section, `mode: "
        f"\"{args.mode}\"`, from {args.clients} clients (each its own keep-alive connection, "
        f"{CLIENT_TIMEOUT_S:.0f} s client timeout, the next request as soon as the last is answered). "
        + ("`auto` with provider `none` waits for the first pass (embedded and indexed, no extraction), up to the "
           "2 s pipeline timeout. " if args.mode == "auto" else
           "`async` answers once the memory and its job are committed (the request's own transaction). ")
        + "Latency: the client round trip; percentiles by linear interpolation (numpy).\n")
    out.append("The load's mix: " + "; ".join(f"{name} " + ", ".join(f"{k} {v}" for k, v in c.most_common())
                                              for name, c in mix)
               + "; with " + ", ".join(f"{k} {v}" for k, v in flags.most_common())
               + f". Sessions move on every {args.session_every} writes of a scope "
               f"({len({w.body['session_id'] for w in load if 'session_id' in w.body})} session ids in the load). "
               f"Approval-bound (a FACT from an UNTRUSTED source or relayed from one, any LEARNED): {pending} "
               f"({pending / len(load):.1%}); `on` answers them `pending_approval` without waiting, so they are "
               "left out of the comparison and shown apart.\n")

    out.append("## Remember latency, on against off\n")
    rows, p95 = [], {}
    for m in ("off", "on"):
        sents = [x for s in by[m] for x in s.subset("comparable")]
        values = [x.ms for x in sents if x.ms is not None]
        rate = sum(len(s.sent) for s in by[m]) / sum(s.load_s for s in by[m]) if by[m] else float("nan")
        cpu = sum(s.cpu_s for s in by[m]) * 1e3 / max(1, sum(len(s.sent) for s in by[m]))
        rows.append(_row(f"{m}, {len(by[m])} section(s)", values,
                         [f"{rate:.1f}", f"{cpu:.0f}", _errors(sents), _statuses(sents)]))
        p95[m] = common.percentiles(values)
    if by["off"] and by["on"]:
        rows.append(["**ratio on / off**", "", *(f"**{_ratio(p95['on'][k], p95['off'][k])}**" if k == "p95" else
                                                 _ratio(p95["on"][k], p95["off"][k])
                                                 for k in ("p50", "p95", "p99", "max")), "", "", "", ""])
    out.append("The requests `on` answers after the same work as `off` (approval-bound ones left out). "
               "Remembers/s: every request of the sections (approval-bound too) over their load time; CPU: the "
               "service's process tree (API, worker, Postgres, Temporal) from the first request until the write "
               "queue was empty again, per remember.\n")
    out.append(common.md_table(["setting", "n", "p50 ms", "p95 ms", "p99 ms", "max ms", "remembers/s",
                                "CPU ms per remember", "errors", "answers"], rows))
    if by["off"] and by["on"]:
        out.append(f"\n**p95 on / off: {_ratio(p95['on']['p95'], p95['off']['p95'])}** "
                   f"({p95['on']['p95']:.1f} ms against {p95['off']['p95']:.1f} ms).")

    out.append("\nEach section (comparable requests), in the order run:\n")
    rows = []
    for s in sections:
        values = s.answered("comparable")
        rows.append(_row(f"{s.position}. {s.setting}", values,
                         [s.round, f"{len(s.sent) / s.load_s:.1f}", f"{s.drain_s:.1f}",
                          f"{s.cpu_s * 1e3 / len(s.sent):.0f}", f"{s.preload_s:.0f}"]))
    out.append(common.md_table(["section", "n", "p50 ms", "p95 ms", "p99 ms", "max ms", "round", "remembers/s",
                                "drain s", "CPU ms per remember", "preload s"], rows))
    pairs = []
    for r in sorted({s.round for s in sections}):
        on = [s for s in by["on"] if s.round == r]
        off = [s for s in by["off"] if s.round == r]
        if on and off:
            a, b = common.percentiles(on[0].answered("comparable")), common.percentiles(off[0].answered("comparable"))
            pairs.append(f"round {r}: {_ratio(a['p95'], b['p95'])}")
    if pairs:
        out.append("\np95 on / off within each round: " + ", ".join(pairs) + " (the spread is the noise).")

    out.append("\n## The other requests\n")
    rows = []
    for m in ("off", "on"):
        for subset in ("approval-bound", "all"):
            sents = [x for s in by[m] for x in s.subset(subset)]
            rows.append(_row(f"{m}: {subset}", [x.ms for x in sents if x.ms is not None],
                             [_errors(sents), _statuses(sents)]))
    out.append("Approval-bound: what `on` holds for approval (with `off` the same requests are ordinary writes).\n")
    out.append(common.md_table(["requests", "n", "p50 ms", "p95 ms", "p99 ms", "max ms", "errors", "answers"], rows))

    out.append("\n## Search with trust filters\n")
    in_big = args.preload + sum(w.body["scope"]["user_id"] == BIG for w in load)
    out.append(f"In `{BIG}` ({in_big} memories, some pending or expired with `on`) once each section's load had "
               f"been processed: {args.searches} queries (bench.latency's synthetic ones), "
               f"`limit` 10, one client, each without filters and with `filters: {SEARCH_FILTER}`, the order "
               "alternating per query. The `on` rows are the claim; `off` (every memory TRUSTED, confidence "
               "uncapped) for reference.\n")
    rows, sp95 = [], {}
    for m in ("on", "off"):
        for name in ("no filter", "trust + min_confidence"):
            values = [v for s in by[m] for v in s.searches.get(name, [])]
            hits = [h for s in by[m] for h in s.hits.get(name, [])]
            errors = sum(v for s in by[m] for k, v in s.search_errors.items() if k.startswith(name))
            rows.append(_row(f"{m}: {name}", values, [f"{sum(hits) / len(hits):.1f}" if hits else "", errors]))
            sp95[(m, name)] = common.percentiles(values)["p95"]
    out.append(common.md_table(["service: search", "n", "p50 ms", "p95 ms", "p99 ms", "max ms", "mean results",
                                "errors"], rows))
    if by["on"]:
        out.append(f"\nOn `on`: p95 with the filters / without: "
                   f"**{_ratio(sp95[('on', 'trust + min_confidence')], sp95[('on', 'no filter')])}**.")

    out.append("\n## Checks\n")
    rows = []
    for s in sections:
        live = s.live_states
        sent_pending = sum(x.status == "pending_approval" for x in s.sent)
        unexpected = sum(x.status == "pending_approval" for x in s.subset("comparable"))
        missed = sum(x.status != "pending_approval" for x in s.subset("approval-bound"))
        rows.append([f"{s.position}. {s.setting}", sum(live.values()), len(live),
                     ", ".join(f"{k}: {v}" for k, v in live.most_common(3)), s.last_session,
                     sent_pending, s.pending_listed, f"{unexpected} / {missed}" if s.setting == "on" else unexpected,
                     f"{s.pending_found} of {s.pending_searched}" if s.pending_searched else ""])
    out.append("STATE: the big scope's STATE memories in default recall (`GET /api/memory?memory_type=STATE`) and "
               "their sessions, beside the last session the load wrote; with `on` only the current session's "
               "should be left. Pending: `pending_approval` answers, memories listed with `status=pending`, "
               "answers the plan did not predict (pending among comparable / not pending among approval-bound), "
               "and pending memories a search for their own text returned (must be 0).\n")
    out.append(common.md_table(["section", "live STATE", "sessions", "largest sessions", "last session written",
                                "pending answers", "pending listed", "unpredicted", "pending returned by search"],
                               rows))
    return "\n".join(out)


# -- the command ---------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m bench.trust_lifetimes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", "--smoke", action="store_true",
                        help="one round (off, on), 300 remembers, small preload, 40 searches (a smoke run)")
    parser.add_argument("--rounds", type=int, help="ABBA rounds: each one off and one on section (2)")
    parser.add_argument("--remembers", type=int, help="remembers per section (1000)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (8)")
    parser.add_argument("--mode", choices=("auto", "async"), default="auto",
                        help="remember mode: auto waits for the first pass (default); async only for the commit")
    parser.add_argument("--preload", type=int, help=f"memories preloaded into {BIG} (2000)")
    parser.add_argument("--preload-small", type=int, help="memories preloaded into each small scope (200)")
    parser.add_argument("--searches", type=int, help="queries per section, each run with and without filters (150)")
    parser.add_argument("--session-every", type=int, default=40, help="a scope's session moves on every N writes (40)")
    parser.add_argument("--seed", type=int, default=20)
    args = parser.parse_args(argv)
    quick = args.quick
    args.rounds = args.rounds or (1 if quick else 2)
    args.remembers = args.remembers or (300 if quick else 1000)
    args.preload = args.preload if args.preload is not None else (300 if quick else 2000)
    args.preload_small = args.preload_small if args.preload_small is not None else (50 if quick else 200)
    args.searches = args.searches or (40 if quick else 150)
    started = time.time()
    preload, warm, load = plan(args)
    queries = synthetic_queries(args.searches, seed=args.seed)
    order = list(itertools.chain.from_iterable(
        [(r, "off"), (r, "on")] if r % 2 == 0 else [(r, "on"), (r, "off")] for r in range(args.rounds)))
    sections = [run_section(setting, i, r + 1, args, preload, warm, load, queries)
                for i, (r, setting) in enumerate(order, 1)]
    body = report(sections, args, preload, load)
    name = "trust-lifetimes" + ("-async" if args.mode == "async" else "") + ("-quick" if quick else "")
    path = common.write_report(name, "Engram remember with trust classification and type lifetimes, on against off",
                               body, started=started)
    print(body)
    print(f"\nreport: {path}")
    return path


if __name__ == "__main__":
    main()
