"""Running `engram up` as a real child process for the tests that kill, restart or drive it by CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from worker.embedded import free_port

ENGRAM = str(Path(sys.executable).parent / "engram")

# For the tests that kill a worker: its workflows' next tasks, and its steps, go to the next
# worker after seconds rather than the production 10-20 s (the heartbeating steps beat every
# 5 s, so 8 s is the least; a re-embed batch of a test's few memories takes well under 5 s).
FAST_FAILOVER = dict(temporal_sticky_queue_timeout_s=2, ingest_heartbeat_timeout_s=8, drain_heartbeat_timeout_s=8,
                     forget_heartbeat_timeout_s=8, reembed_heartbeat_timeout_s=5)


class EngramProcess:
    def __init__(self, data_dir: Path, **settings) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.env = {**os.environ, "ENGRAM_DATA_DIR": str(data_dir), "ENGRAM_HTTP_PORT": str(self.port),
                    "ENGRAM_GRPC_PORT": str(free_port())}
        self.env.update({f"ENGRAM_{k.upper()}": str(v) for k, v in settings.items()})
        self.proc: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60) -> "EngramProcess":
        log = open(self.data_dir.parent / f"{self.data_dir.name}-engram.log", "ab")
        self.proc = subprocess.Popen([ENGRAM, "up"], env=self.env, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engram up exited with {self.proc.returncode}; see {log.name}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("engram up did not become ready")

    @property
    def key(self) -> str:
        return (self.data_dir / "api-key").read_text().strip()

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=30)

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 30) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout_s)

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        env = {**self.env, "ENGRAM_URL": self.url}
        return subprocess.run([ENGRAM, *args], env=env, capture_output=True, text=True, timeout=60)
