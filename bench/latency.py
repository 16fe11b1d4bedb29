"""Latency and throughput of a running `engram up`, measured from a client over HTTP.

(a) async remember ack (mode=async), fake LLM with zero delay
(b) sync remember (mode=sync), fake LLM with zero delay
(c) raw save with the LLM down (mode=auto, ENGRAM_OLLAMA_URL at a closed port)
(d) ingestion throughput: memories/s from the first request until every job is done
(e) search latency with 10k memories in one scope
and, as a diagnostic, (c) again on a Temporal dev server allowed to poll its transfer queue faster

Baselines measured in the same run: `GET /healthz` (HTTP alone), `GET /api/memory/jobs/:id`
(HTTP + auth + two primary-key reads), search on a small scope, and the query
embedding called in this process, so the report shows where search time goes.

Requests in (a), (b), (c) and (e) go one at a time from one keep-alive client; each latency is
the client's round trip. Targets: search p95 <= 50 ms at 10k, async ack p95 <= 50 ms, raw save
with the provider down p95 <= 200 ms.

    .venv/bin/python -m bench.latency            # N=300, 10k memories -> bench/reports/latency.md
    .venv/bin/python -m bench.latency --quick    # N=50, 1k memories  -> bench/reports/latency-quick.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench import common
from tests.fakes.llm_server import FakeLLMServer
from worker.embedded import free_port

TARGETS_MS = {"search_10k_p95": 50.0, "async_ack_p95": 50.0, "raw_save_down_p95": 200.0}
# The Temporal history service polls its transfer queue at most 20 times a second by default; the
# dev server runs one shard, so a workflow's tasks queue behind that limit (see the report).
TRANSFER_POLL_RPS = "history.transferProcessorMaxPollRPS=1000"


# -- synthetic memories and queries ------------------------------------------------------------------

NAMES = ("Alice Bob Carla Dmitri Elena Farid Greta Hiro Ines Jonas Kwame Lena Mateo Nadia Oscar Priya "
         "Quentin Rosa Samir Tove Ugo Vera Wen Ximena Yusuf Zoe Amara Bruno Chloe Diego Esther Felix "
         "Gloria Hassan Ivy Jakub Keiko Liam Maya Noor").split()
CITIES = ("Lisbon Oslo Nairobi Kyoto Lima Porto Tallinn Dakar Hanoi Quito Bergen Seville Krakow Ghent "
          "Mombasa Sapporo Cusco Tbilisi Valletta Zagreb Leipzig Bologna Malmo Cork Bilbao Lyon Graz "
          "Tartu Split Riga").split()
FOODS = ("ramen paella dumplings falafel risotto tacos pierogi moussaka bibimbap ceviche goulash pho "
         "shakshuka gnocchi curry lasagna sushi empanadas borscht couscous").split()
HOBBIES = ("pottery climbing salsa chess watercolour sailing archery knitting fencing juggling origami "
           "kayaking calligraphy beekeeping birdwatching woodworking surfing bouldering improv").split()
TOPICS = ("budget hiring roadmap migration onboarding security audit launch pricing compliance "
          "retention analytics billing outage procurement accessibility localisation").split()
TECH = "Postgres Kafka Rust Go Elixir Temporal Redis Kotlin Terraform Svelte Django Flink".split()
PROJECTS = ("Atlas Beacon Cobalt Drift Ember Falcon Granite Harbor Iris Juniper Kestrel Lumen Meridian "
            "Nimbus Orchid Pioneer").split()
PETS = "cat dog parrot rabbit tortoise hamster ferret gecko".split()
PET_NAMES = "Miso Pixel Biscuit Nova Pepper Ziggy Luna Mochi Olive Rusty Sage Tofu".split()
DRINKS = "espresso matcha chai kombucha lemonade cocoa rooibos cortado".split()
DAYPARTS = "morning afternoon evening".split()
WEEKDAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
MONTHS = ("January February March April May June July August September October November "
          "December").split()
ITEMS = "bicycle backpack lamp kettle jacket tent guitar keyboard camera blender".split()
COLORS = "red blue green yellow black white orange purple".split()
STORES = ["the market", "the outlet", "the corner shop", "the mall", "the flea market", "the co-op"]
BOOKS = ("The Quiet Harbor|Salt and Iron|A Map of Rain|Night Trains|The Glass Orchard|Small Gods of "
         "Tuesday|Ferns|The Last Cartographer|North of Nowhere|Paper Lanterns").split("|")
LANDMARKS = ["cathedral", "harbour", "old bridge", "train station", "museum", "river", "market square"]


def _pick(rng: random.Random, seq):
    return seq[rng.randrange(len(seq))]


def _memory(rng: random.Random) -> str:
    p = lambda seq: _pick(rng, seq)  # noqa: E731
    year = rng.randint(2015, 2025)
    templates = [
        lambda: f"{p(NAMES)} moved to {p(CITIES)} in {p(MONTHS)} {year} to work on {p(TOPICS)}.",
        lambda: f"{p(NAMES)}'s favourite food is {p(FOODS)}, especially on {p(WEEKDAYS)}s in {p(CITIES)}.",
        lambda: f"{p(NAMES)} is allergic to {p(FOODS)} and always asks before ordering {p(FOODS)}.",
        lambda: f"{p(NAMES)} started learning {p(HOBBIES)} in {p(MONTHS)} {year} and practises "
                f"{rng.randint(1, 6)} times a week.",
        lambda: f"The {p(PROJECTS)} project uses {p(TECH)} and {p(TECH)} and is owned by {p(NAMES)}.",
        lambda: f"Meeting with {p(NAMES)} about {p(TOPICS)} moved to {p(WEEKDAYS)} at "
                f"{rng.randint(8, 18)}:{rng.choice(['00', '15', '30', '45'])}.",
        lambda: f"{p(NAMES)} has a {p(PETS)} called {p(PET_NAMES)} who was adopted in {p(CITIES)} in {year}.",
        lambda: f"{p(NAMES)} prefers {p(DRINKS)} over {p(DRINKS)} in the {p(DAYPARTS)} before {p(HOBBIES)}.",
        lambda: f"{p(NAMES)} visited {p(CITIES)} with {p(NAMES)} and recommends the {p(FOODS)} near the "
                f"{p(LANDMARKS)}.",
        lambda: f"{p(NAMES)} finished reading '{p(BOOKS)}' and rated it {rng.randint(1, 10)} out of 10.",
        lambda: f"Reminder: {p(NAMES)} needs the {p(TOPICS)} report by {p(WEEKDAYS)}, "
                f"{rng.randint(1, 28)} {p(MONTHS)}.",
        lambda: f"{p(NAMES)} bought a {p(COLORS)} {p(ITEMS)} for {rng.randint(5, 900)} dollars at {p(STORES)}.",
    ]
    return _pick(rng, templates)()


def synthetic_memories(n: int, seed: int = 7) -> list[str]:
    """`n` distinct short memories (the service deduplicates identical content per scope)."""
    rng = random.Random(seed)
    seen: dict[str, None] = {}
    while len(seen) < n:
        seen.setdefault(_memory(rng), None)
    return list(seen)


def synthetic_queries(n: int, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    p = lambda seq: _pick(rng, seq)  # noqa: E731
    templates = [
        lambda: f"Where did {p(NAMES)} move to?",
        lambda: f"What is {p(NAMES)}'s favourite food?",
        lambda: f"What is {p(NAMES)} allergic to?",
        lambda: f"When did {p(NAMES)} start learning {p(HOBBIES)}?",
        lambda: f"Who owns the {p(PROJECTS)} project?",
        lambda: f"When is the meeting about {p(TOPICS)}?",
        lambda: f"What is the name of {p(NAMES)}'s {p(PETS)}?",
        lambda: f"What does {p(NAMES)} drink in the {p(DAYPARTS)}?",
        lambda: f"Which dish did {p(NAMES)} recommend in {p(CITIES)}?",
        lambda: f"How did {p(NAMES)} rate {p(BOOKS)}?",
        lambda: f"When is the {p(TOPICS)} report due?",
        lambda: f"What did {p(NAMES)} buy at {p(STORES)}?",
        lambda: f"{p(HOBBIES)} lessons in {p(CITIES)}",
        lambda: f"who uses {p(TECH)}",
    ]
    return [_pick(rng, templates)() for _ in range(n)]


# -- measuring -------------------------------------------------------------------------------------

@dataclass
class Series:
    """One measured row of the report."""

    label: str
    latencies_ms: list[float]
    note: str = ""
    target_ms: float | None = None  # on p95
    outcomes: Counter = field(default_factory=Counter)
    stages_ms: dict[str, list[float]] = field(default_factory=dict)  # search `explain` timings

    def row(self) -> list[object]:
        p = common.percentiles(self.latencies_ms)
        verdict = ""
        if self.target_ms is not None:
            verdict = f"{'PASS' if p['p95'] <= self.target_ms else 'FAIL'} (p95 <= {self.target_ms:.0f} ms)"
        outcomes = ", ".join(f"{k}: {v}" for k, v in sorted(self.outcomes.items())) or ""
        return [self.label, p["n"], common.fmt_ms(p["p50"]), common.fmt_ms(p["p95"]), common.fmt_ms(p["p99"]),
                common.fmt_ms(p["max"]), verdict, outcomes, self.note]


def remember_series(svc: common.Service, label: str, texts: list[str], scope: dict, mode: str,
                    target_ms: float | None = None, note: str = "") -> tuple[Series, list[str]]:
    """Remember `texts` one at a time; the outcome column counts the answers' status and warnings."""
    series = Series(label, [], note=note, target_ms=target_ms)
    job_ids = []
    for text in texts:
        response, ms = common.timed(svc.client.post, "/api/memory/remember",
                                    json={"content": text, "scope": scope, "mode": mode})
        response.raise_for_status()
        body = response.json()
        series.latencies_ms.append(ms)
        series.outcomes[body["status"]] += 1
        for warning in body["warnings"]:
            series.outcomes[warning.split(":")[0]] += 1
        if body["job_id"]:
            job_ids.append(body["job_id"])
    return series, job_ids


def search_series(svc: common.Service, label: str, queries: list[str], scope: dict,
                  target_ms: float | None = None, note: str = "", explain: bool = False) -> Series:
    """Search `queries` one at a time (limit 10). With `explain`, the service's per-stage
    timings are kept in `stages_ms`."""
    series = Series(label, [], note=note, target_ms=target_ms)
    for query in queries:
        body = {"query": query, "scope": scope, "limit": 10}
        if explain:
            body["explain"] = True
        response, ms = common.timed(svc.client.post, "/api/memory/search", json=body)
        response.raise_for_status()
        series.latencies_ms.append(ms)
        answer = response.json()
        hits = len(answer["results"])
        series.outcomes["10 results" if hits == 10 else f"{hits} results"] += 1
        for stage, facts in (answer.get("explain") or {}).items():
            series.stages_ms.setdefault(stage, []).append(facts["ms"])
    return series


def get_series(svc: common.Service, label: str, path: str, n: int, note: str = "") -> Series:
    series = Series(label, [], note=note)
    for _ in range(n):
        response, ms = common.timed(svc.client.get, path)
        response.raise_for_status()
        series.latencies_ms.append(ms)
    return series


def embed_series(queries: list[str], model: str) -> Series:
    """The service's embedding model, called in this process (2 threads, as the service runs it)."""
    embedder = common.open_embedder(model)
    prefix = getattr(embedder.files, "query_prefix", "")
    embedder.embed_sync(queries[:10])  # warm-up
    series = Series(f"baseline: {model} query embedding, in process", [],
                    note="engram.inference.embedder.Embedder.embed_sync([query]) on the same queries as (e), while the "
                         "service idles")
    for query in queries:
        _, ms = common.timed(embedder.embed_sync, [prefix + query])
        series.latencies_ms.append(ms)
    return series


@dataclass
class Ingest:
    memories: int
    concurrency: int
    send_s: float  # first request sent -> last ack received
    done_s: float  # first request sent -> last job done (the job rows' updated_at)
    acks: Series
    cpu_s: dict[str, float]
    deferred_starts: int  # "could not start workflow; the dispatcher will" lines in the service log


def ingest(svc: common.Service, texts: list[str], scope: dict, concurrency: int) -> Ingest:
    """Remember `texts` with mode=async from `concurrency` concurrent clients, then wait until
    every job is done. Throughput = memories / (last job done - first request sent)."""
    cpu_before = common.tree_cpu_seconds(svc.proc.pid)
    deferred_before = _deferred_starts(svc)
    acks = Series(f"(d) async ack during bulk ingest ({concurrency} concurrent clients)", [])
    job_ids: list[str | None] = [None] * len(texts)

    async def send() -> None:
        queue = list(enumerate(texts))
        queue.reverse()

        async def worker(client) -> None:
            while queue:
                i, text = queue.pop()
                started = time.perf_counter()
                response = await client.post("/api/memory/remember",
                                             json={"content": text, "scope": scope, "mode": "async"})
                acks.latencies_ms.append((time.perf_counter() - started) * 1e3)
                response.raise_for_status()
                body = response.json()
                acks.outcomes[body["status"]] += 1
                job_ids[i] = body["job_id"]
                if (i + 1) % 2000 == 0:
                    print(f"  sent {i + 1}/{len(texts)}", flush=True)

        async with svc.async_client(limits=httpx.Limits(max_connections=concurrency)) as client:
            await asyncio.gather(*(worker(client) for _ in range(concurrency)))

    t0 = time.time()
    asyncio.run(send())
    send_s = time.time() - t0
    print(f"  all {len(texts)} acknowledged after {send_s:.0f} s; waiting for the jobs", flush=True)
    jobs = common.wait_jobs_done(svc, [j for j in job_ids if j], timeout_s=7200)
    done_s = max(common.parse_ts(j["updated_at"]) for j in jobs) - t0
    cpu_after = common.tree_cpu_seconds(svc.proc.pid)
    cpu = {k: cpu_after.get(k, 0.0) - cpu_before.get(k, 0.0) for k in cpu_after}
    return Ingest(len(texts), concurrency, send_s, done_s, acks, cpu, _deferred_starts(svc) - deferred_before)


def _deferred_starts(svc: common.Service) -> int:
    return svc.log.read_text(errors="replace").count("could not start workflow; the dispatcher will")


# -- the run ---------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N=50, 1k memories, 100 searches (a smoke run)")
    parser.add_argument("-n", type=int, default=None, help="requests per latency series (default 300)")
    parser.add_argument("--memories", type=int, default=None, help="memories in the search scope (default 10000)")
    parser.add_argument("--searches", type=int, default=None, help="searches at that scale (default 300)")
    parser.add_argument("--ingest-concurrency", type=int, default=4)
    parser.add_argument("--no-temporal-ab", dest="temporal_ab", action="store_false",
                        help=f"skip the diagnostic rerun of (c) on a Temporal dev server with {TRANSFER_POLL_RPS}")
    args = parser.parse_args(argv)
    n = args.n or (50 if args.quick else 300)
    memories = args.memories or (1_000 if args.quick else 10_000)
    searches = args.searches or (100 if args.quick else 300)
    started = time.time()
    rows: list[Series] = []
    facts: list[str] = []

    texts = synthetic_memories(memories + 2 * n + 20)
    big, small_async, small_sync, warm = (texts[:memories], texts[memories:memories + n],
                                          texts[memories + n:memories + 2 * n], texts[memories + 2 * n:])
    queries = synthetic_queries(searches + 10)
    ingest_result: Ingest | None = None

    with FakeLLMServer() as fake, common.data_dir() as data, common.service(
            "latency-fake-llm", data, {"ENGRAM_LLM_PROVIDER": "ollama", "ENGRAM_OLLAMA_URL": fake.url}) as svc:
        print(f"service up (fake LLM at {fake.url}); warming up", flush=True)
        _, warm_jobs = remember_series(svc, "warm-up", warm[:10], {"user_id": "warm-up"}, "async")
        remember_series(svc, "warm-up", warm[10:15], {"user_id": "warm-up"}, "sync")
        common.wait_jobs_done(svc, warm_jobs)
        search_series(svc, "warm-up", queries[:10], {"user_id": "warm-up"})
        get_series(svc, "warm-up", "/healthz", 20)

        print("baselines", flush=True)
        rows.append(get_series(svc, "baseline: GET /healthz", "/healthz", n, note="HTTP round trip, no auth, no I/O"))
        rows.append(get_series(svc, "baseline: GET /api/memory/jobs/:id", f"/api/memory/jobs/{warm_jobs[0]}", n,
                               note="HTTP + API-key lookup + 2 primary-key reads"))

        print(f"(a) {n} async remembers", flush=True)
        series, jobs_a = remember_series(svc, "(a) remember, mode=async (ack)", small_async, {"user_id": "lat-async"},
                                         "async", TARGETS_MS["async_ack_p95"], note="fake LLM, zero delay")
        rows.append(series)
        common.wait_jobs_done(svc, jobs_a)

        print(f"(b) {n} sync remembers", flush=True)
        series, jobs_b = remember_series(svc, "(b) remember, mode=sync", small_sync, {"user_id": "lat-sync"}, "sync",
                                         note="fake LLM, zero delay; until extraction is done")
        rows.append(series)
        common.wait_jobs_done(svc, jobs_b)

        rows.append(search_series(svc, f"search, scope of {n} memories", queries[10:], {"user_id": "lat-async"},
                                  note="for scale: same queries as (e)"))

        print(f"(d) ingesting {memories} memories", flush=True)
        ingest_result = ingest(svc, big, {"user_id": "bench-10k"}, args.ingest_concurrency)
        facts.append(f"Postgres planner statistics when (e) started (diagnostic, read from Postgres directly): "
                     f"{common.planner_stats(svc)}")

        print(f"(e) {searches} searches over {memories} memories", flush=True)
        search_series(svc, "warm-up", queries[:10], {"user_id": "bench-10k"})
        rows.append(search_series(svc, f"(e) search, scope of {memories} memories", queries[10:],
                                  {"user_id": "bench-10k"}, TARGETS_MS["search_10k_p95"], note="limit 10"))
        rows.append(search_series(svc, "(e) again with explain=true", queries[10:], {"user_id": "bench-10k"},
                                  note="for the service's per-stage timings", explain=True))
        model = common.service_embedder(svc)
        facts.append(f"The service's embedding model (from `/readyz`): {model}")
        print(f"baseline: embedding the queries in process ({model})", flush=True)
        rows.append(embed_series(queries[10:], model))

    closed = f"http://127.0.0.1:{free_port()}"
    with common.data_dir() as data, common.service(
            "latency-provider-down", data, {"ENGRAM_LLM_PROVIDER": "ollama", "ENGRAM_OLLAMA_URL": closed}) as svc:
        print(f"(c) {n} remembers with the provider down ({closed})", flush=True)
        remember_series(svc, "warm-up", warm[15:20], {"user_id": "warm-up"}, "auto")
        rows.append(remember_series(svc, "(c) remember, mode=auto, provider down", small_async,
                                    {"user_id": "lat-down"}, "auto", TARGETS_MS["raw_save_down_p95"],
                                    note=f"ENGRAM_OLLAMA_URL={closed} (closed port)")[0])

    if args.temporal_ab:
        # The same raw saves against a Temporal dev server whose history service may poll its
        # transfer queue faster than the default 20 times a second (each workflow task waits
        # for such a poll), to show how much of (b) and (c) is that limit.
        closed = f"http://127.0.0.1:{free_port()}"
        with common.data_dir() as data, common.temporal_dev_server(
                data / "own-temporal", [TRANSFER_POLL_RPS]) as address, common.service(
                "latency-provider-down-fast-transfer", data,
                {"ENGRAM_LLM_PROVIDER": "ollama", "ENGRAM_OLLAMA_URL": closed,
                 "ENGRAM_TEMPORAL_ADDRESS": address}) as svc:
            print(f"(c) again on a Temporal dev server with {TRANSFER_POLL_RPS}", flush=True)
            remember_series(svc, "warm-up", warm[15:20], {"user_id": "warm-up"}, "auto")
            rows.append(remember_series(
                svc, f"(c) diagnostic: same, Temporal with {TRANSFER_POLL_RPS}", small_sync,
                {"user_id": "lat-down"}, "auto",
                note="not the shipped stack: a dev server started by the benchmark, ENGRAM_TEMPORAL_ADDRESS")[0])

    body = report(rows, ingest_result, facts, n=n, memories=memories, quick=args.quick)
    path = common.write_report("latency-quick" if args.quick else "latency", "Engram latency and throughput",
                               body, started=started)
    print(body)
    print(f"\nreport: {path}")
    return path


def report(rows: list[Series], ing: Ingest, facts: list[str], *, n: int, memories: int, quick: bool) -> str:
    out = []
    if quick:
        out.append("**Quick run (smoke test): small N and 1k memories; the targets are defined at 10k.**\n")
    out.append(
        "Each latency is a client round trip over loopback HTTP (httpx, keep-alive), requests sent one at a "
        "time from one client unless stated. `engram up` on a fresh data directory; the fake LLM is "
        "`tests.fakes.llm_server.FakeLLMServer` (Ollama API, zero delay) running in the benchmark process. "
        "Percentiles: linear interpolation (numpy).\n")
    out.append("## Latency\n")
    out.append(common.md_table(["series", "n", "p50 ms", "p95 ms", "p99 ms", "max ms", "target", "outcomes", "notes"],
                               [s.row() for s in rows]))
    out.append("\n## Ingestion throughput (d)\n")
    total_cpu = sum(ing.cpu_s.values())
    cpu = ", ".join(f"{k} {v:.0f} s" for k, v in sorted(ing.cpu_s.items(), key=lambda kv: -kv[1]) if v >= 0.5)
    out.append(
        f"- {ing.memories} memories, mode=async, {ing.concurrency} concurrent clients, one scope, fake LLM with "
        f"zero delay (so each job runs the whole pipeline: lease, embed + index, extract, complete).\n"
        f"- all acknowledged after {ing.send_s:.1f} s ({ing.memories / ing.send_s:.1f} requests/s)\n"
        f"- all jobs done after {ing.done_s:.1f} s: **{ing.memories / ing.done_s:.1f} memories/s** "
        f"(first request sent to the last job's `updated_at`)\n"
        f"- CPU used by the service's process tree meanwhile: {total_cpu:.0f} s on {os.cpu_count()} cores "
        f"({cpu}); {total_cpu / ing.done_s:.2f} cores busy on average, {total_cpu / ing.memories * 1e3:.0f} ms "
        f"of CPU per memory\n"
        f"- workflow starts the API could not make within its 2 s RPC timeout and left to the outbox "
        f"dispatcher (`could not start workflow; the dispatcher will` in the service log): {ing.deferred_starts}\n")
    out.append(common.md_table(["series", "n", "p50 ms", "p95 ms", "p99 ms", "max ms", "target", "outcomes", "notes"],
                               [ing.acks.row()]))
    out.append("\n## Targets\n")
    by_label: dict[str, Series] = {}
    for s in rows:
        by_label.setdefault(s.label.split(" ")[0], s)  # the first "(c)" is the back-to-back one
    checks = [("search p95 at %d memories" % memories, by_label["(e)"], TARGETS_MS["search_10k_p95"]),
              ("async ack p95", by_label["(a)"], TARGETS_MS["async_ack_p95"]),
              ("raw save with provider down p95", by_label["(c)"], TARGETS_MS["raw_save_down_p95"])]
    target_rows = []
    for name, series, target in checks:
        p95 = common.percentiles(series.latencies_ms)["p95"]
        target_rows.append([name, f"{p95:.1f} ms", f"<= {target:.0f} ms", "PASS" if p95 <= target else "FAIL"])
    out.append(common.md_table(["target", "measured", "required", "verdict"], target_rows))
    for series in rows:
        if series.stages_ms:
            out.append(f"\n## Where search time goes: {series.label}\n")
            out.append("The service's own per-stage wall times (`explain`), next to the client round trip.\n")
            stage_rows = [[stage, *(common.fmt_ms(common.percentiles(v)[k]) for k in ("p50", "p95", "p99"))]
                          for stage, v in series.stages_ms.items()]
            path = common.critical_path(series.stages_ms)
            stage_rows.append(["critical path: max(embed_query + dense, bm25) + the rest",
                               *(common.fmt_ms(common.percentiles(path)[k]) for k in ("p50", "p95", "p99"))])
            stage_rows.append(["client round trip", *(common.fmt_ms(common.percentiles(series.latencies_ms)[k])
                                                      for k in ("p50", "p95", "p99"))])
            out.append(common.md_table(["stage", "p50 ms", "p95 ms", "p99 ms"], stage_rows))
    if facts:
        out.append("\n## Notes\n")
        out.extend(f"- {f}" for f in facts)
    return "\n".join(out)


if __name__ == "__main__":
    main()
