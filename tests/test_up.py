"""`engram up` as a user runs it: the whole embedded stack in one process tree, the CLI
against it, a clean Ctrl-C, and a restart that finds every memory again."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import asyncpg
import httpx
import pytest

from tests.process import EngramProcess
from worker.embedded import EmbeddedPostgres, default_shared_buffers_mb, free_port


@pytest.fixture
def engram(tmp_path):
    process = EngramProcess(
        tmp_path / "data", embedded_postgres_port=free_port(), temporal_grpc_port=free_port(),
        temporal_ui_port=free_port(), llm_provider="none",
    )
    yield process
    if process.proc is not None and process.proc.poll() is None:
        process.stop()


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper (the sandbox's init may not reap)."""
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    return bool(state) and not state.startswith("Z")


def _children_of(pid: int) -> list[str]:
    out = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def _side_by_side(engram: EngramProcess, *commands: tuple[str, ...]) -> list[subprocess.CompletedProcess]:
    """`engram.cli(*command)` for each command, all at once; the results in the commands' order."""
    with ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(lambda command: engram.cli(*command), commands))


def test_up_serves_the_cli_and_keeps_everything_across_a_restart(engram):
    engram.env["ENGRAM_EMBEDDED_POSTGRES_STAT_STATEMENTS"] = "true"
    engram.start()
    key = engram.key
    assert key.startswith("engram_")
    children = _children_of(engram.proc.pid)
    assert any("postgres" in c for c in children) and any("temporal" in c for c in children)
    assert _fetchval(int(engram.env["ENGRAM_EMBEDDED_POSTGRES_PORT"]), SHARED_BUFFERS_MB) == (
        default_shared_buffers_mb())

    # Each CLI run is a process that spends most of a second importing: commands that do not
    # depend on each other's answers run side by side.
    stored = []
    texts = ("Olga grows tomatoes on her balcony", "Olga's cat is called Pixel", "Olga speaks Finnish")
    for out in _side_by_side(engram, *(("remember", text, "--user-id", "olga", "--mode", "sync") for text in texts)):
        assert out.returncode == 0, out.stderr
        answer = json.loads(out.stdout)
        assert answer["status"] == "processed"
        stored.append(answer)

    search, explained, got, job, status, bad, no_scope = _side_by_side(
        engram, ("search", "what pet does she have", "--user-id", "olga", "--json"),
        ("search", "what pet does she have", "--user-id", "olga", "--explain"), ("get", stored[0]["memory_id"]),
        ("jobs", stored[0]["job_id"]), ("status",), ("remember", "", "--user-id", "olga"), ("search", "x"))
    assert search.returncode == 0, search.stderr
    assert json.loads(search.stdout)["results"][0]["memory"]["id"] == stored[1]["memory_id"]
    assert explained.returncode == 0, explained.stderr
    lines = explained.stdout.splitlines()
    assert stored[1]["memory_id"] in lines[0]
    stages = {line.split()[0] for line in lines if line.split()[2:3] == ["ms"]}
    assert {"embed_query", "dense", "bm25", "fetch", "rows"} <= stages, explained.stdout
    assert "bge-small" in next(line for line in lines if line.startswith("embed_query"))
    # pg_stat_statements counted the searches' statements (the query's BM25 statistics), in its
    # view in the `postgres` database.
    assert _statements_on(int(engram.env["ENGRAM_EMBEDDED_POSTGRES_PORT"]), " AS idf, n.avgdl") >= 2
    assert json.loads(got.stdout)["content"] == "Olga grows tomatoes on her balcony"
    assert json.loads(job.stdout)["status"] == "done"
    assert status.returncode == 0 and json.loads(status.stdout)["ready"] is True
    assert bad.returncode != 0 and "422 validation_error" in bad.stderr
    assert no_scope.returncode != 0 and "--user-id" in no_scope.stderr

    assert engram.stop(signal.SIGINT) == 0
    for child in children:
        pid = int(child.split()[0])
        assert not _alive(pid), f"left running: {child}"

    engram.start()
    assert engram.key == key
    with engram.client() as http:
        for answer in stored:
            assert http.get(f"/api/memory/{answer['memory_id']}").status_code == 200
        hits = http.post("/api/memory/search", json={"query": "Finnish language", "scope": {"user_id": "olga"}}).json()
        assert hits["results"][0]["memory"]["id"] == stored[2]["memory_id"]
        assert hits["results"][0]["components"]["vector"] > 0.3  # the Qdrant shard came back too
        again = http.post("/api/memory/remember", json={"content": "Olga speaks Finnish", "scope": {"user_id": "olga"}})
        assert again.json()["memory_id"] == stored[2]["memory_id"]


def _fetchval(port: int, sql: str, *args, database: str = "engram"):
    """One value from the embedded Postgres listening on `port`."""
    async def fetch():
        conn = await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{port}/{database}")
        try:
            return await conn.fetchval(sql, *args)
        finally:
            await conn.close()

    return asyncio.run(fetch())


# pg_settings counts shared_buffers in 8 kB blocks
SHARED_BUFFERS_MB = "SELECT setting::int * 8 / 1024 FROM pg_settings WHERE name = 'shared_buffers'"
PRELOADED = "SHOW shared_preload_libraries"


def _statements_on(port: int, text: str) -> int:
    """Calls pg_stat_statements counted of `engram`'s statements that hold `text`."""
    return _fetchval(port, "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query LIKE '%' || $1 || '%'"
                           " AND dbid = (SELECT oid FROM pg_database WHERE datname = 'engram')",
                     text, database="postgres")


@pytest.mark.parametrize(("memory_mb", "buffers_mb"), [(512, 128), (2048, 256), (4096, 512), (24105, 1024)])
def test_the_embedded_postgres_caches_an_eighth_of_memory_from_postgres_default_up_to_1_gb(memory_mb, buffers_mb):
    assert default_shared_buffers_mb(memory_mb) == buffers_mb


def test_the_embedded_postgres_buffer_cache_can_be_set_and_overrides_its_config_file(tmp_path):
    server = EmbeddedPostgres(tmp_path / "pg", free_port(), fsync=False, shared_buffers_mb=160)
    server.start()
    try:
        subprocess.run([str(server.bin_dir / "psql"), server.dsn(), "-c", "ALTER SYSTEM SET shared_buffers = '64MB'"],
                       check=True, capture_output=True)
        server.stop()
        server.start()
        assert _fetchval(server.port, SHARED_BUFFERS_MB) == 160
        assert _fetchval(server.port, PRELOADED) == ""  # pg_stat_statements only when asked for
    finally:
        server.stop()


def _role_pid(parent: int, role: str) -> int | None:
    """The pid of `engram up`'s API or worker child."""
    for line in _children_of(parent):
        pid, args = line.split(None, 1)
        if args.endswith(f"worker.up {role}"):
            return int(pid)
    return None


def _environ(pid: int) -> dict[str, str]:
    """The environment process `pid` was started with."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [entry.decode().partition("=") for entry in f.read().split(b"\0") if entry]
    return {name: value for name, _, value in pairs}


def _restarted(parent: int, role: str, dead: int, timeout_s: float = 60) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = _role_pid(parent, role)
        if pid is not None and pid != dead:
            return pid
        time.sleep(0.2)
    raise AssertionError(f"engram up did not restart its {role} within {timeout_s} s")


def test_a_crashed_api_or_worker_is_restarted_and_up_killed_outright_takes_its_servers_with_it(engram):
    engram.start()
    assert _fetchval(int(engram.env["ENGRAM_EMBEDDED_POSTGRES_PORT"]), PRELOADED) == ""  # off by default
    with engram.client() as http:
        answer = http.post("/api/memory/remember", json={"content": "Petra runs a bakery", "scope": {"user_id": "p"},
                                                         "mode": "sync"}).json()
        # A crashed API or worker is restarted by engram up, and serves again; started, and
        # restarted, with glibc's malloc asking for huge pages (ENGRAM_MALLOC_HUGE_PAGES).
        for role in ("api", "worker"):
            dead = _role_pid(engram.proc.pid, role)
            assert "glibc.malloc.hugetlb=1" in _environ(dead).get("GLIBC_TUNABLES", "")
            os.kill(dead, signal.SIGKILL)
            assert "glibc.malloc.hugetlb=1" in _environ(_restarted(engram.proc.pid, role, dead))["GLIBC_TUNABLES"]
        deadline = time.monotonic() + 60
        while True:
            try:
                again = http.post("/api/memory/remember", json={"content": "Petra bakes rye bread",
                                                                "scope": {"user_id": "p"}, "mode": "sync"})
                if again.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the restarted API did not answer"
            time.sleep(0.1)
        assert again.json()["status"] == "processed"  # the restarted worker ran its pipeline
        assert http.get(f"/api/memory/{answer['memory_id']}").json()["content"] == "Petra runs a bakery"
    children = _children_of(engram.proc.pid)
    engram.stop(signal.SIGKILL)
    engram.start()
    for child in children:
        pid = int(child.split()[0])
        assert not _alive(pid), f"orphaned: {child}"
    with engram.client() as http:
        assert http.get(f"/api/memory/{answer['memory_id']}").json()["content"] == "Petra runs a bakery"


def test_a_new_temporal_waits_for_the_one_a_killed_engram_left_on_its_data(tmp_path):
    """That server lets go of its SQLite file only after it has closed its port; a new one that
    finds the file locked exits (SQLITE_BUSY: CI saw it restart after a SIGKILL under load)."""
    import sys
    import time
    from pathlib import Path

    from worker.embedded import EmbeddedTemporal

    temporal = EmbeddedTemporal(tmp_path / "temporal", free_port(), free_port(), headless=True)
    temporal.data_dir.mkdir(parents=True)
    db = str(temporal.data_dir / "temporal.db")
    # A stand-in for the predecessor: a process with our database on its command line, still
    # shutting down for a second.
    leaving = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)", db])
    while db.encode() not in Path(f"/proc/{leaving.pid}/cmdline").read_bytes():
        time.sleep(0.01)  # until its exec is done: a real predecessor has long been running
    (temporal.data_dir / "temporal.pid").write_text(str(leaving.pid))
    started = time.monotonic()
    temporal.start()
    try:
        assert leaving.poll() is not None and time.monotonic() - started >= 1.4
        assert (temporal.data_dir / "temporal.pid").read_text() == str(temporal.proc.pid)
    finally:
        temporal.stop()
    # A pid that now belongs to something else is not waited for (nor killed).
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    (temporal.data_dir / "temporal.pid").write_text(str(other.pid))
    try:
        temporal.start()
        assert _alive(other.pid)
    finally:
        temporal.stop()
        other.kill()
