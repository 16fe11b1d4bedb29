"""gRPC beside HTTP: search and remember p50/p95/p99 and throughput through each gateway of one
`engram up`, in the same run, at 10k memories in one scope, from concurrent clients.

Both gateways call the same service layer in the same API process, so what differs is the
transport and the translation: HTTP/1.1 keep-alive connections (one per client, httpx) against
HTTP/2 streams multiplexed on one channel (grpc.aio), JSON against protobuf. Each comparison runs
in ABBA order (HTTP, gRPC, gRPC, HTTP), so a drift of the machine during the run weighs on both
alike. Baselines in the same run: each gateway's cheapest authenticated-free round trip
(`GET /healthz`, `grpc.health.v1.Health/Check`).

Remember is mode=async (the ack: the durable write, not the pipeline behind it); the fake LLM
answers at once, so the worker's extraction of what the series write competes for the CPU as it
would in service. Target: gRPC costs no more than HTTP (p95 within 10%).

    .venv/bin/python -m bench.grpc_vs_http            # 10k memories, 400 requests a series, 8 clients
    .venv/bin/python -m bench.grpc_vs_http --quick    # 300 memories, 80 requests a series: a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass, field

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench import common
from bench.latency import ingest, synthetic_memories, synthetic_queries
from engram_grpc.memory.v1 import memory_pb2 as pb
from engram_grpc.memory.v1 import memory_pb2_grpc as rpc
from tests.fakes.llm_server import FakeLLMServer
from worker.embedded import free_port

P95_RATIO_TARGET = 1.10  # gRPC's p95 over HTTP's, at most


@dataclass
class Series:
    label: str
    gateway: str
    latencies_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    errors: int = 0

    def row(self) -> list[object]:
        p = common.percentiles(self.latencies_ms)
        rate = p["n"] / self.wall_s if self.wall_s else float("nan")
        return [self.label, self.gateway, p["n"], common.fmt_ms(p["p50"]), common.fmt_ms(p["p95"]),
                common.fmt_ms(p["p99"]), common.fmt_ms(p["max"]), f"{rate:.0f}", self.errors]


async def _run(series: Series, requests: list, send, clients: int) -> Series:
    """Send `requests` through `send` from `clients` concurrent workers; time each one."""
    queue = list(reversed(requests))

    async def worker() -> None:
        while queue:
            item = queue.pop()
            started = time.perf_counter()
            try:
                await send(item)
            except (httpx.HTTPError, grpc.aio.AioRpcError):
                series.errors += 1
                continue
            series.latencies_ms.append((time.perf_counter() - started) * 1e3)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    series.wall_s += time.perf_counter() - started
    return series


class Gateways:
    """An HTTP client and a gRPC channel to one service, with its admin key."""

    def __init__(self, svc: common.Service, grpc_port: int, clients: int) -> None:
        self.http = svc.async_client(limits=httpx.Limits(max_connections=clients))
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}")
        self.memories = rpc.MemoryServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.metadata = (("authorization", f"Bearer {svc.key}"),)

    async def http_search(self, body: dict) -> None:
        (await self.http.post("/api/memory/search", json=body)).raise_for_status()

    async def grpc_search(self, body: dict) -> None:
        await self.memories.Search(pb.SearchRequest(query=body["query"], scope=pb.Scope(**body["scope"]),
                                                    limit=body["limit"]), metadata=self.metadata, timeout=60)

    async def http_remember(self, body: dict) -> None:
        (await self.http.post("/api/memory/remember", json=body)).raise_for_status()

    async def grpc_remember(self, body: dict) -> None:
        await self.memories.Remember(pb.RememberRequest(content=body["content"], scope=pb.Scope(**body["scope"]),
                                                        mode=body["mode"]), metadata=self.metadata, timeout=60)

    async def http_health(self, _: object) -> None:
        (await self.http.get("/healthz")).raise_for_status()

    async def grpc_health(self, _: object) -> None:
        await self.health.Check(health_pb2.HealthCheckRequest(), timeout=60)

    async def aclose(self) -> None:
        await self.http.aclose()
        await self.channel.close()


async def compare(gw: Gateways, label: str, how: str, requests: list, clients: int,
                  grpc_requests: list | None = None) -> list[Series]:
    """HTTP over `requests` and gRPC over `grpc_requests` (the same ones unless given), each in
    two halves, in ABBA order."""
    grpc_requests = requests if grpc_requests is None else grpc_requests
    http, grpc_ = Series(label, "HTTP"), Series(label, "gRPC")
    send_http, send_grpc = getattr(gw, f"http_{how}"), getattr(gw, f"grpc_{how}")
    half = len(requests) // 2
    for series, send, part in ((http, send_http, requests[:half]), (grpc_, send_grpc, grpc_requests[:half]),
                               (grpc_, send_grpc, grpc_requests[half:]), (http, send_http, requests[half:])):
        await _run(series, part, send, clients)
    return [http, grpc_]


async def measure(svc: common.Service, grpc_port: int, *, n: int, clients: int, queries: list[str],
                  fresh: list[str]) -> list[Series]:
    gw = Gateways(svc, grpc_port, clients)
    try:
        scope = {"user_id": "bench-10k"}
        searches = [{"query": q, "scope": scope, "limit": 10} for q in queries]
        await compare(gw, "warm-up", "search", searches[:40], clients)
        rows = await compare(gw, "baseline: health round trip", "health", [None] * n, clients)
        rows += await compare(gw, f"search, limit 10, {clients} clients", "search", searches[:n], clients)
        remembers = [{"content": text, "scope": {"user_id": "bench-remember"}, "mode": "async"} for text in fresh]
        # Each text is remembered once, through one gateway: a repeat would be a duplicate, not a write.
        rows += await compare(gw, f"remember, mode=async, {clients} clients", "remember", remembers[:n], clients,
                              remembers[n:2 * n])
        return rows
    finally:
        await gw.aclose()


def report(rows: list[Series], *, memories: int, n: int, clients: int) -> str:
    table = common.md_table(["series", "gateway", "n", "p50", "p95", "p99", "max", "req/s", "errors"],
                            [r.row() for r in rows])
    verdicts = []
    for http, grpc_ in zip(rows[::2], rows[1::2]):
        h, g = common.percentiles(http.latencies_ms), common.percentiles(grpc_.latencies_ms)
        ratio = g["p95"] / h["p95"] if h["p95"] else float("nan")
        verdict = "PASS" if ratio <= P95_RATIO_TARGET else "FAIL"
        verdicts.append(f"- {http.label}: gRPC/HTTP p50 {g['p50'] / h['p50']:.2f}, p95 {ratio:.2f} "
                        f"({verdict}: p95 ratio <= {P95_RATIO_TARGET})")
    return "\n".join([
        f"{memories} memories in the search scope; {n} requests a series (each remembered text once), "
        f"from {clients} concurrent clients: HTTP/1.1 keep-alive connections (httpx), one HTTP/2 channel (grpc.aio). "
        "Order HTTP, gRPC, gRPC, HTTP; latency is the client's round trip.",
        "", table, "", "gRPC against HTTP:", *verdicts, ""])


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_vs_http", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 memories, 80 requests a series (a smoke run)")
    parser.add_argument("--memories", type=int, default=None, help="memories in the search scope (default 10000)")
    parser.add_argument("-n", type=int, default=None, help="requests a series (default 400)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    args = parser.parse_args(argv)
    memories = args.memories or (300 if args.quick else 10_000)
    n = args.n or (80 if args.quick else 400)
    started = time.time()
    texts = synthetic_memories(memories + 2 * n)
    queries = synthetic_queries(n + 40)
    grpc_port = free_port()
    with FakeLLMServer() as fake, common.data_dir() as data, common.service(
            "grpc-vs-http", data, {"ENGRAM_LLM_PROVIDER": "ollama", "ENGRAM_OLLAMA_URL": fake.url,
                                   "ENGRAM_GRPC_PORT": str(grpc_port)}) as svc:
        print(f"ingesting {memories} memories", flush=True)
        ingest(svc, texts[:memories], {"user_id": "bench-10k"}, 4)
        print("measuring", flush=True)
        rows = asyncio.run(measure(svc, grpc_port, n=n, clients=args.clients, queries=queries,
                                   fresh=texts[memories:]))
    body = report(rows, memories=memories, n=n, clients=args.clients)
    path = common.write_report("grpc-vs-http-quick" if args.quick else "grpc-vs-http",
                               "Engram: gRPC beside HTTP", body, started=started)
    print(body)
    print(f"\nreport: {path}")
    return path


if __name__ == "__main__":
    main()
