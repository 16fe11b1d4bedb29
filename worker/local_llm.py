"""The local model server as one of `engram up`'s supervised children, when the settings name
the `local` LLM provider (engram.inference.local_llm has the model, its check and its command).

It runs in a process of its own, in its own session (Ctrl-C reaches only `engram up`), at the
worker's CPU niceness: it does the worker's extractions and decisions, so it yields the CPU
to searches just as the worker does. Its log goes to `<data_dir>/local-llm.log`.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from engram.inference import local_llm
from engram.settings import Settings
from worker.embedded import _die_with_parent, _stop, wait_until_free

log = logging.getLogger(__name__)


class LocalLLMServer:
    """llama.cpp serving the local model on 127.0.0.1:`port` (`python -m
    engram.inference.local_llm serve`), ready once its /health answers 200."""

    def __init__(self, model: Path, port: int, threads: int, log_path: Path, *, niceness: int = 0) -> None:
        self.model = model
        self.port = port
        self.threads = threads
        self.log_path = log_path
        self.niceness = niceness
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0

    @property
    def url(self) -> str:
        return local_llm.base_url(self.port)

    def start(self, timeout_s: float = 120) -> None:
        """Start the server and wait until it has loaded the model (~4-8 s on 2 cores). Raises
        RuntimeError if it exits first or is not ready within `timeout_s`. The model file is
        not checked here: `local_llm_server` checks it once, before anything starts."""
        wait_until_free(self.port)
        niceness = self.niceness

        def in_child() -> None:
            os.nice(niceness)
            _die_with_parent(signal.SIGKILL)  # it holds nothing that needs a clean shutdown

        with self.log_path.open("ab") as log_file:
            self.proc = subprocess.Popen(local_llm.server_command(self.model, self.port, self.threads),
                                         stdout=log_file, stderr=log_file, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=in_child)
        self.started_at = time.monotonic()
        self._wait_healthy(timeout_s)
        log.info("local LLM ready", extra={"model": local_llm.MODEL_NAME, "url": self.url,
                                           "latency_ms": round((time.monotonic() - self.started_at) * 1000)})

    def _wait_healthy(self, timeout_s: float) -> None:
        health = f"http://127.0.0.1:{self.port}/health"
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2, trust_env=False) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the local LLM server exited with {self.proc.returncode} before it was "
                                       f"ready; see {self.log_path}")
                try:
                    if client.get(health).status_code == 200:
                        return
                except httpx.TransportError:
                    pass  # not listening yet
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the local LLM server was not ready within {timeout_s} s; see {self.log_path}")

    def stop(self, timeout_s: float = 10) -> None:
        _stop(self.proc, signal.SIGTERM, timeout_s)
        self.proc = None


def local_llm_server(settings: Settings) -> LocalLLMServer | None:
    """The server `engram up` must run, or None when neither LLM provider is `local`. Raises
    ConfigError (naming `make llm`) when xllamacpp or the model file is missing, and
    ModelFileMismatch when the file is not the pinned one."""
    if "local" not in (settings.llm_provider, settings.llm_secondary):
        return None
    path = local_llm.model_path(settings)
    local_llm.check(path)
    return LocalLLMServer(path, settings.local_llm_port, settings.local_llm_threads,
                          settings.data_dir / "local-llm.log", niceness=settings.worker_niceness)
