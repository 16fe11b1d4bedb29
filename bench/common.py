"""What every benchmark shares: running `engram up` as a black box, talking to it over HTTP,
percentiles, and writing the markdown report.

The service is started exactly as an operator would start it (`.venv/bin/engram up` on a fresh
data directory and free ports) and measured only through its HTTP API, so the numbers include
everything a client pays for: HTTP, auth, Postgres, Temporal, the embedder and the vector index.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import asyncpg
import httpx
import numpy as np

from worker.embedded import free_port

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
REPORTS = BENCH_DIR / "reports"
OTHER_MACHINE_REPORTS = BENCH_DIR / "out" / "reports"  # bench/out/ is git-ignored
LOGS = BENCH_DIR / "out" / "logs"
REPLACE_ENV = "ENGRAM_BENCH_REPLACE"  # =1: replace a committed report measured on another CPU model
ENGRAM = Path(sys.executable).parent / "engram"  # the console script of the venv running the bench


# -- the service -------------------------------------------------------------------------------

@dataclass
class Service:
    """A running `engram up`. `client` is a keep-alive sync client with the admin key."""

    url: str
    key: str
    data_dir: Path
    log: Path
    proc: subprocess.Popen
    client: httpx.Client

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def async_client(self, **kwargs) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers=self.headers(), timeout=120, **kwargs)


@contextlib.contextmanager
def data_dir(keep: bool = False) -> Iterator[Path]:
    """A fresh ENGRAM_DATA_DIR, removed afterwards unless `keep`. Several `service()` runs may
    share one (a restart keeps the memories)."""
    path = Path(tempfile.mkdtemp(prefix="engram-bench-"))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def service(name: str, data: Path, env: dict[str, str] | None = None,
            ready_timeout_s: float = 180) -> Iterator[Service]:
    """Run `engram up` on `data` with `env` (ENGRAM_* overrides) until the block ends.

    Inherited ENGRAM_* variables are dropped so a run depends only on what the benchmark sets.
    The service's log goes to bench/out/logs/<name>.log. Stops it with SIGINT (what Ctrl-C
    sends) and waits for the whole tree to exit; raises RuntimeError if it never gets ready.
    """
    LOGS.mkdir(parents=True, exist_ok=True)
    log_path = LOGS / f"{name}.log"
    log_path.write_bytes(b"")
    for _ in range(3):
        proc, url, log_file = _launch(data, env, log_path)
        try:
            key = _wait_ready(url, proc, log_path, data, ready_timeout_s)
            break
        except PortTaken:
            # free_port() only finds a port that was free a moment ago; another process on this
            # shared machine took it first. Try again on new ports.
            _stop(proc)
            log_file.close()
            print(f"  {name}: a port was taken before engram up bound it; retrying", file=sys.stderr)
        except BaseException:
            _stop(proc)
            log_file.close()
            raise
    else:
        raise RuntimeError(f"engram up could not bind its ports in 3 attempts; see {log_path}")
    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120)
    try:
        yield Service(url=url, key=key, data_dir=data, log=log_path, proc=proc, client=client)
    finally:
        client.close()
        _stop(proc)
        log_file.close()


class PortTaken(RuntimeError):
    pass


def _launch(data: Path, env: dict[str, str] | None, log_path: Path):
    http_port = free_port()
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    child_env.update({
        "ENGRAM_DATA_DIR": str(data),
        "ENGRAM_HTTP_PORT": str(http_port),
        "ENGRAM_GRPC_PORT": str(free_port()),
        "ENGRAM_TEMPORAL_GRPC_PORT": str(free_port()),
        "ENGRAM_TEMPORAL_UI_PORT": str(free_port()),
        "ENGRAM_EMBEDDED_POSTGRES_PORT": str(free_port()),
    })
    # The service runs the code of the tree this benchmark lives in (which may be a snapshot of
    # the repository), ahead of whatever the venv's editable install points at.
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    child_env.update(env or {})
    log_file = open(log_path, "ab")
    log_file.write(f"--- engram up, {dt.datetime.now().isoformat()}\n".encode())
    log_file.flush()
    proc = subprocess.Popen([str(ENGRAM), "up"], env=child_env, cwd=str(REPO), stdout=log_file,
                            stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{http_port}", log_file


def _wait_ready(url: str, proc: subprocess.Popen, log_path: Path, data: Path, timeout_s: float) -> str:
    """Wait for `/readyz` = 200 from *our* process (an authenticated call with the key it wrote
    must succeed, so another server on a reused port cannot pass); return the admin key."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=url, timeout=5) as probe:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = _tail(log_path)
                if "address already in use" in tail or "is taken by another process" in tail:
                    raise PortTaken(tail)
                raise RuntimeError(f"engram up exited with {proc.returncode}; log tail:\n{tail}")
            with contextlib.suppress(httpx.HTTPError, OSError):
                if probe.get("/readyz").status_code == 200 and (data / "api-key").exists():
                    key = (data / "api-key").read_text().strip()
                    mine = probe.get("/api/memory", params={"user_id": "bench-probe"},
                                     headers={"Authorization": f"Bearer {key}"})
                    if mine.status_code == 200 and proc.poll() is None:
                        return key
            time.sleep(0.25)
    raise RuntimeError(f"engram up not ready after {timeout_s} s; log tail:\n{_tail(log_path)}")


@contextlib.contextmanager
def temporal_dev_server(data: Path, dynamic_config: list[str]) -> Iterator[str]:
    """A `temporal server start-dev` of our own, started the way `engram up` starts its embedded
    one but with `--dynamic-config-value` settings; yields its address for ENGRAM_TEMPORAL_ADDRESS.
    For A/B diagnostics of the embedded stack's Temporal settings."""
    from worker.embedded import EmbeddedTemporal, wait_for_port

    port = free_port()
    data.mkdir(parents=True, exist_ok=True)
    args = [EmbeddedTemporal.binary(), "server", "start-dev", "--db-filename", str(data / "temporal.db"),
            "--sqlite-pragma", "journal_mode=wal", "--ip", "127.0.0.1", "--port", str(port),
            "--log-level", "warn", "--headless"]
    for value in dynamic_config:
        args += ["--dynamic-config-value", value]
    with open(data / "temporal.log", "ab") as log_file:
        proc = subprocess.Popen(args, stdout=log_file, stderr=log_file)
        try:
            wait_for_port("127.0.0.1", port, 30, proc)
            yield f"127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _stop(proc: subprocess.Popen, timeout_s: float = 90) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        print(f"engram up (pid {proc.pid}) ignored SIGINT for {timeout_s} s; killing it", file=sys.stderr)
        proc.kill()  # its children get SIGTERM from the parent-death signal
        proc.wait()


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def index_points(svc: Service) -> int:
    """Points in the vector index, as `/readyz` reports them ("qdrant-edge, N points")."""
    detail = svc.client.get("/readyz").json()["components"]["vector_index"]["detail"]
    return int(detail.rsplit(",", 1)[1].split()[0])


def page_cache_share(path: Path) -> tuple[int, int] | None:
    """(bytes the OS page cache holds, bytes) of every file under `path`, by util-linux's
    `fincore`; None without it. A search that meets data outside the page cache reads the disk:
    at 1M memories (11.7 GB) with 4 GB of it cached, the first pass took 2x as long."""
    if shutil.which("fincore") is None:
        return None
    files = [str(f) for f in path.rglob("*") if f.is_file() and not f.is_symlink()]
    cached = total = 0
    for start in range(0, len(files), 500):
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES,SIZE",
                              *files[start:start + 500]], capture_output=True, text=True).stdout
        for line in out.splitlines():
            res, size = line.split()
            cached, total = cached + int(res), total + int(size)
    return cached, total


def page_cache_drops() -> int | None:
    """How many times the kernel's page cache was dropped since boot (/proc/vmstat drop_pagecache:
    a write to /proc/sys/vm/drop_caches); None where the kernel does not count them. Our machines
    drop it about once an hour: afterwards a search reads from the disk what Postgres's buffer
    cache does not hold (bench/reports/cold-cache.md)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/vmstat").read_text().splitlines():
            if line.startswith("drop_pagecache "):
                return int(line.split()[1])
    return None


def page_cache_drops_since(before: int | None) -> int | None:
    """The page-cache drops since `page_cache_drops()` returned `before`; None where uncounted."""
    after = page_cache_drops()
    return None if before is None or after is None else after - before


def wait_indexes_settled(svc: Service, timeout_s: float) -> tuple[float, tuple[int, int], bool, tuple[int, int]]:
    """Wait until the lexical index holds every memory with its current weights (`/readyz`:
    `to_index` and `to_reweigh` 0) and neither index is being optimised. Until then search scores
    the rest in Postgres, the index owner rewrites points, or an optimiser child process holds a
    core for up to a minute: searching is correct, but not at its steady speed. Returns the
    seconds waited, the (to_index, to_reweigh) seen first, whether an optimisation was running
    then, and the points (dense, lexical) left to brute force once settled."""
    started = time.monotonic()
    first = None
    while True:
        ready = svc.client.get("/readyz").json()["components"]
        lexical, dense = ready["lexical_index"], ready["vector_index"]
        backlog = (lexical["to_index"], lexical["to_reweigh"])
        optimising = lexical["optimising"] or dense["optimising"]
        first = first or (backlog, optimising)
        if backlog == (0, 0) and not optimising:
            return time.monotonic() - started, first[0], first[1], (dense["unoptimized"], lexical["unoptimized"])
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"the lexical index still has {backlog} to write, or an index is being optimised, "
                               f"after {timeout_s} s")
        time.sleep(0.25)


def wait_jobs_done(svc: Service, job_ids: list[str], *, timeout_s: float = 1800, concurrency: int = 4,
                   progress_every_s: float = 15.0) -> list[dict]:
    """Poll `GET /api/memory/jobs/:id` until every job is `done`; return the final job rows in
    the order given. Raises RuntimeError if a job dies or the timeout passes.

    Jobs finish roughly in submission order, so each worker walks its share of the list and
    waits on the first unfinished one: about one request per job, not one per job per pass.
    """
    return asyncio.run(_wait_jobs(svc, job_ids, timeout_s, concurrency, progress_every_s))


async def _wait_jobs(svc: Service, job_ids: list[str], timeout_s: float, concurrency: int,
                     progress_every_s: float) -> list[dict]:
    done: list[dict | None] = [None] * len(job_ids)
    deadline = time.monotonic() + timeout_s
    started = time.monotonic()
    next_note = started + progress_every_s

    async def walk(client: httpx.AsyncClient, offset: int) -> None:
        nonlocal next_note
        for i in range(offset, len(job_ids), concurrency):
            while True:
                response = await client.get(f"/api/memory/jobs/{job_ids[i]}")
                response.raise_for_status()
                job = response.json()
                if job["status"] == "done":
                    done[i] = job
                    break
                if job["status"] == "dead":
                    raise RuntimeError(f"job {job_ids[i]} died: {job}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"job {job_ids[i]} still {job['status']} after {timeout_s} s")
                if time.monotonic() > next_note:
                    next_note = time.monotonic() + progress_every_s
                    finished = sum(j is not None for j in done)
                    print(f"  jobs: {finished}/{len(job_ids)} confirmed done after "
                          f"{time.monotonic() - started:.0f} s", flush=True)
                await asyncio.sleep(0.25)

    async with svc.async_client() as client:
        await asyncio.gather(*(walk(client, k) for k in range(concurrency)))
    return done  # type: ignore[return-value]


def tree_cpu_seconds(root_pid: int) -> dict[str, float]:
    """CPU seconds (user + system, including reaped children) used so far by `root_pid` and its
    descendants, summed by command name: "engram" (API, worker, embedder: one Python process),
    "temporal", "postgres". Read from /proc; a process that exited unreaped is missed."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1:raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2:].split()
        ppid = int(fields[1])
        utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
        stats[int(entry.name)] = (ppid, comm, (utime + stime + cutime + cstime) / tick)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    totals: dict[str, float] = {}
    stack = [root_pid]
    while stack:
        pid = stack.pop()
        if pid not in stats:
            continue
        _, comm, seconds = stats[pid]
        name = "engram" if pid == root_pid else ("postgres" if comm.startswith("postgres") else comm)
        totals[name] = totals.get(name, 0.0) + seconds
        stack.extend(children.get(pid, []))
    return totals


def planner_stats(svc: Service) -> str:
    """When Postgres last analysed the tables the BM25 query reads. A diagnostic side channel
    (straight to the embedded Postgres whose DSN `engram up` prints), not the API: the BM25
    query's plan, and so search latency, depends on these statistics."""
    match = re.search(r"Postgres\s+(postgresql://\S+)", svc.log.read_text(errors="replace"))
    if not match:
        return "unknown (no DSN in the log)"

    async def fetch() -> str:
        conn = await asyncpg.connect(match.group(1))
        try:
            rows = await conn.fetch(
                "SELECT relname, n_live_tup, last_analyze, last_autoanalyze FROM pg_stat_user_tables"
                " WHERE relname IN ('memories', 'memory_terms') ORDER BY relname")
        finally:
            await conn.close()
        def when(ts) -> str:
            return ts.strftime("%H:%M:%S UTC") if ts else "never"

        return ", ".join(f"{r['relname']} ({r['n_live_tup']} rows) last analysed "
                         f"{when(r['last_autoanalyze'] or r['last_analyze'])}" for r in rows)

    try:
        return asyncio.run(fetch())
    except (OSError, asyncpg.PostgresError) as err:
        return f"unknown ({err})"


def service_embedder(svc: Service) -> str:
    """The embedding model the service runs, as `/readyz` names it."""
    detail = str(svc.client.get("/readyz").json()["components"]["embedder"]["detail"])
    return detail.split()[0].rstrip(",")


def open_embedder(model: str):
    """`engram.inference.embedder.Embedder` for a local model by its settings name (2 threads, as the service)."""
    from engram.inference import embedder as e

    files = e.model_files(model) if hasattr(e, "model_files") else e.minilm_files()
    if files.name != model:
        raise ValueError(f"this tree has no local files for {model!r}")
    return e.Embedder.open(files, threads=2)


def parse_ts(text: str) -> float:
    """A server timestamp (ISO 8601) as Unix seconds."""
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# -- numbers -----------------------------------------------------------------------------------

def percentiles(values_ms: Iterable[float]) -> dict[str, float]:
    """p50/p95/p99 (linear interpolation between closest ranks, numpy's default), mean, max, n."""
    arr = np.asarray(list(values_ms), dtype=float)
    if arr.size == 0:
        return {"n": 0, "p50": float("nan"), "p95": float("nan"), "p99": float("nan"),
                "mean": float("nan"), "max": float("nan")}
    p50, p95, p99 = np.percentile(arr, [50, 95, 99])
    return {"n": int(arr.size), "p50": float(p50), "p95": float(p95), "p99": float(p99),
            "mean": float(arr.mean()), "max": float(arr.max())}


MIN_BOOTSTRAP_BLOCKS = 10  # fewer, and a "90%" interval of two runs of one system often leaves out 1


def paired_ratio_interval(a_ms: Sequence[float], b_ms: Sequence[float], block: int, *, percentile: float,
                          level: float = 0.9, resamples: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """How far a's percentile over b's could move with the minutes a run happened to meet: the
    `level` interval of that ratio when the blocks of `block` consecutive measurements, which
    both took in turns, the i-th of a beside the i-th of b, are drawn again with replacement,
    the same blocks for both (a paired block bootstrap); a last, partial block is left out.
    None with fewer than MIN_BOOTSTRAP_BLOCKS blocks. Approximate: of 300 pairs of samples from
    one latency distribution (p95), the "90%" interval left out 1 for 14% at 10 blocks and 11%
    at 20. Raises ValueError unless a and b are as long (the pairs would not be the same searches)."""
    if len(a_ms) != len(b_ms):
        raise ValueError(f"{len(a_ms)} measurements against {len(b_ms)}: a paired interval needs the same searches")
    blocks = len(a_ms) // block
    if blocks < MIN_BOOTSTRAP_BLOCKS:
        return None
    a = np.asarray(a_ms[:blocks * block], dtype=float).reshape(blocks, block)
    b = np.asarray(b_ms[:blocks * block], dtype=float).reshape(blocks, block)
    drawn = np.random.default_rng(seed).integers(0, blocks, size=(resamples, blocks))
    ratios = (np.percentile(a[drawn].reshape(resamples, -1), percentile, axis=1)
              / np.percentile(b[drawn].reshape(resamples, -1), percentile, axis=1))
    low, high = np.percentile(ratios, [50 * (1 - level), 50 * (1 + level)])
    return float(low), float(high)


def ratio_intervals(a_ms: Sequence[float], b_ms: Sequence[float], block: int) -> str:
    """paired_ratio_interval of a over b at p50, p95 and p99, as a report says them."""
    spread = {k: paired_ratio_interval(a_ms, b_ms, block, percentile=q)
              for k, q in (("p50", 50), ("p95", 95), ("p99", 99))}
    if spread["p50"] is None:
        return f"none: fewer than {MIN_BOOTSTRAP_BLOCKS} blocks"
    return ", ".join(f"{k} {v[0]:.2f}-{v[1]:.2f}×" for k, v in spread.items())


def by_process(cpu_ms: dict[str, float]) -> str:
    """CPU ms by process, the busiest first, as a report says them."""
    return ", ".join(f"{name} {ms:.1f}" for name, ms in sorted(cpu_ms.items(), key=lambda kv: -kv[1]))


def critical_path(stages_ms: dict[str, list[float]]) -> np.ndarray:
    """Per search, from `explain`: the vector leg (embed_query + dense) and the BM25 leg run at
    once, so their longer one counts; every other stage follows them."""
    vector_leg = np.add(stages_ms["embed_query"], stages_ms["dense"])
    rest = np.sum([v for s, v in stages_ms.items() if s not in ("embed_query", "dense", "bm25")], axis=0)
    return np.maximum(vector_leg, stages_ms["bm25"]) + rest


def timed(fn, *args, **kwargs):
    """(result, elapsed milliseconds) of one call."""
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, (time.perf_counter() - started) * 1e3


def fmt_ms(value: float) -> str:
    return f"{value:.1f}"


# -- reports -----------------------------------------------------------------------------------

def md_table(headers: list[str], rows: list[list[object]]) -> str:
    def cell(v: object) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def cpu_model() -> str:
    """This machine's CPU model as /proc/cpuinfo names it ("unknown" elsewhere), and the widest
    8-bit dot-product instructions it has (int8_level). Two machines both named "AMD EPYC" ran
    our int8 ONNX models 2.2-2.4x apart (a rerank of 20 pairs: p50 310-344 ms in
    bench/reports/rerank-levers.md, 722-745 ms on one with AVX2 alone; the other's flags were not
    recorded, and AMD's Zen 4 EPYCs have AVX-512 VNNI where its Zen 3 ones have AVX2 alone)."""
    with contextlib.suppress(OSError):
        info = Path("/proc/cpuinfo").read_text().splitlines()
        name = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), None)
        flags = next((set(line.split(":", 1)[1].split()) for line in info if line.startswith("flags")), set())
        if name:
            return f"{name}, {int8_level(flags)}"
    return "unknown"


INT8_LEVELS = (("avx512_vnni", "AVX-512 VNNI"), ("avx_vnni", "AVX-VNNI"), ("avx512bw", "AVX-512"), ("avx2", "AVX2"))


def int8_level(flags: set[str]) -> str:
    """The widest of the instruction sets ONNX Runtime's int8 kernels pick between, by the
    /proc/cpuinfo flags that name them; "no AVX2" below them all."""
    return next((label for flag, label in INT8_LEVELS if flag in flags), "no AVX2")


def machine_facts() -> dict[str, str]:
    commit = _git("rev-parse", "--short", "HEAD")
    # Another report not committed yet leaves the code as the commit has it.
    dirty = _git("--no-optional-locks", "status", "--porcelain", "--", ".", ":(exclude)bench/reports")
    if commit == "unknown" and (REPO / "SNAPSHOT.txt").exists():
        commit, dirty = (REPO / "SNAPSHOT.txt").read_text().strip(), ""
    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "source": f"{commit}{' (working tree has uncommitted changes)' if dirty else ''}",
        "load average at report time": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def command_line() -> str:
    """The command that ran this benchmark, as it could be typed again from the repo root."""
    exe = Path(sys.executable)
    with contextlib.suppress(ValueError):
        exe = exe.relative_to(REPO)
    module = sys.modules["__main__"].__spec__
    target = ["-m", module.name] if module is not None else [sys.argv[0]]
    return shlex.join([str(exe), *target, *sys.argv[1:]])


def report_dir(name: str) -> Path:
    """Where report `name` and its plots go: bench/reports/, unless the report committed there was
    measured on another CPU (cpu_model: the model and its int8 instructions; a report from before
    they were named names the model alone, so it counts as another); then bench/out/reports/,
    unless ENGRAM_BENCH_REPLACE=1.

    Our machines differ by up to 2x in speed, and the notes compare a stop's numbers with the
    committed ones: a run on another kind of machine must not replace them by accident."""
    committed = _report_cpu(REPORTS / f"{name}.md")
    cpu = cpu_model()
    if committed is None or committed == cpu or os.environ.get(REPLACE_ENV) == "1":
        return REPORTS
    print(f"bench/reports/{name}.md was measured on {committed!r}, this machine is {cpu!r}: writing to "
          f"{OTHER_MACHINE_REPORTS.relative_to(REPO)}/ instead ({REPLACE_ENV}=1 replaces the committed one)",
          file=sys.stderr)
    return OTHER_MACHINE_REPORTS


def _report_cpu(path: Path) -> str | None:
    """The `- cpu:` of a report's header, or None if there is no such report or line."""
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            if line.startswith("- cpu: "):
                return line.removeprefix("- cpu: ").strip()
    return None


def write_report(name: str, title: str, body: str, *, started: float) -> Path:
    """Write <name>.md into report_dir(name) (overwriting): a header with the date, the machine
    and the exact command, then `body`. `started` is the time.time() the run began."""
    directory = report_dir(name)
    directory.mkdir(parents=True, exist_ok=True)
    facts = machine_facts()
    header = [
        f"# {title}",
        "",
        f"- date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- command: `{command_line()}` (from the repository root)",
        f"- run time: {time.time() - started:.0f} s",
        *(f"- {k}: {v}" for k, v in facts.items()),
        "- caveat: a shared machine; other engineers' test suites may have run at the same time, "
        "so latencies are as measured, not best case.",
        "",
    ]
    path = directory / f"{name}.md"
    path.write_text("\n".join(header) + "\n" + body.rstrip() + "\n")
    return path
