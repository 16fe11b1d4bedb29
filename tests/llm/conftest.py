"""The real local model (engram.inference.local_llm), opt-in: the tests marked `llm` run only
with `make test-llm`, or ENGRAM_TEST_LLM=1 and the model file `make llm` fetches; `make test`
and CI skip them. (test_wiring.py needs no model and always runs.)

One server for the whole session, started the way `engram up` starts it (worker.local_llm),
driven through the same provider chain the service builds. Every call's latency and answer
is recorded and printed at the end of the run ("local LLM calls").
"""

from __future__ import annotations

import importlib.util
import os
import time
from dataclasses import dataclass

import pytest

from engram.inference import local_llm
from engram.inference.providers import OpenAIProvider, build_provider_chain
from engram.settings import Settings
from worker.embedded import free_port
from worker.local_llm import LocalLLMServer

# Generous: a call takes ~10-15 s on 2 idle cores, and minutes when something else is busy.
# The latency is what this suite measures, not a limit it enforces.
CALL_TIMEOUT_S = 600.0


def _unavailable() -> str | None:
    """Why the suite cannot run here, or None."""
    if os.environ.get("ENGRAM_TEST_LLM") != "1":
        return "the real local model runs only with ENGRAM_TEST_LLM=1 (make test-llm)"
    if importlib.util.find_spec("xllamacpp") is None:
        return "xllamacpp is not installed: run `make llm`"
    path = local_llm.model_path(Settings())
    if not path.is_file():
        return f"no local model at {path}: run `make llm`"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    reason = _unavailable()
    if reason is None:
        return
    for item in items:
        if item.get_closest_marker("llm"):
            item.add_marker(pytest.mark.skip(reason=reason))


@dataclass
class Call:
    stage: str
    case: str
    seconds: float
    answer: str
    verdict: str = ""  # what the quality check made of the answer ("ok", or what was wrong)


CALLS = pytest.StashKey[list[Call]]()


def pytest_configure(config):
    config.stash[CALLS] = []


def pytest_terminal_summary(terminalreporter, config):
    calls = config.stash.get(CALLS, [])
    if not calls:
        return
    terminalreporter.section(f"local LLM calls ({local_llm.MODEL_NAME})")
    for call in calls:
        terminalreporter.write_line(f"{call.stage:7} {call.seconds:6.1f} s  {call.case}  "
                                  f"[{call.verdict or 'FAILED: see the test'}]")
        terminalreporter.write_line(f"        {call.answer}")
    for stage in sorted({c.stage for c in calls}):
        seconds = sorted(c.seconds for c in calls if c.stage == stage)
        good = sum(c.verdict == "ok" for c in calls if c.stage == stage)
        terminalreporter.write_line(
            f"{stage}: {len(seconds)} calls, mean {sum(seconds) / len(seconds):.1f} s, "
            f"min {seconds[0]:.1f} s, max {seconds[-1]:.1f} s; quality ok {good}/{len(seconds)}")


@pytest.fixture(scope="session")
def local_server(request, tmp_path_factory):
    """The model server on a free port, checked (SHA-256) and started once per session."""
    settings = Settings()
    path = local_llm.model_path(settings)
    local_llm.check(path)
    server = LocalLLMServer(path, free_port(), settings.local_llm_threads,
                            tmp_path_factory.mktemp("local-llm") / "local-llm.log")
    started = time.perf_counter()
    server.start()
    request.config.stash[CALLS].append(Call("load", "start to /health 200", time.perf_counter() - started,
                                            f"{path} on {settings.local_llm_threads} threads", "ok"))
    yield server
    server.stop()


@pytest.fixture
async def provider(local_server) -> OpenAIProvider:
    """The provider `ENGRAM_LLM_PROVIDER=local` makes, pointed at the session's server."""
    settings = Settings(llm_provider="local", llm_secondary="none", local_llm_port=local_server.port,
                        llm_timeout_s=CALL_TIMEOUT_S, local_only=True, provider_allowlist=[])
    (built,) = build_provider_chain(settings)
    yield built
    await built.aclose()


class Recorder:
    """Times one provider call and keeps its answer for the end-of-run report."""

    def __init__(self, calls: list[Call]) -> None:
        self.calls = calls

    async def __call__(self, stage: str, case: str, call):
        started = time.perf_counter()
        result = await call
        seconds = time.perf_counter() - started
        self.calls.append(Call(stage, case, seconds, _answer(result)))
        return result

    def verdict(self, verdict: str) -> None:
        """What the quality check made of the last answer."""
        self.calls[-1].verdict = verdict


def _answer(result) -> str:
    if hasattr(result, "decisions"):
        shown = [f"fact {d.fact}: {d.action} target {d.target} conf {d.confidence:g}"
                 + (f" {d.content!r}" if d.content else "") + f" ({d.reason})" for d in result.decisions]
    else:
        shown = [f"{f.type}: {f.content!r}" for f in result.facts]
    answer = "; ".join(shown) or "(nothing)"
    return f"{answer}  warnings: {result.warnings}" if result.warnings else answer


@pytest.fixture
def record(request) -> Recorder:
    return Recorder(request.config.stash[CALLS])
