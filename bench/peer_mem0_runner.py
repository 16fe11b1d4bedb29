"""mem0 (the open-source `Memory` class) in its own virtualenv, driven by bench/peer_mem0.py.

Run with that virtualenv's interpreter, never with Engram's:

    bench/out/mem0-venv/bin/python -P bench/peer_mem0_runner.py '<mem0 config as JSON>'

It builds `Memory.from_config(config)` and then answers one JSON line on stdout for each JSON
line it reads on stdin, until stdin closes:

    {"op": "info"}                              -> {"mem0": version, "psycopg": version, ...}
    {"op": "add", "user_id", "texts": [...]}    -> {"added": n}    one `add(text, infer=False)` per text
    {"op": "load", "user_id", "texts": [...]}   -> {"loaded": n}   the fast path for large corpora
    {"op": "search", "user_id", "query", "limit"} -> {"hits": n, "ms": time inside this process}
    {"op": "count"}                             -> {"count": rows in the collection's table}

Every answer also carries "ok": true, or "ok": false and "error" when the command raised. mem0 and
what it loads may print: their stdout goes to stderr, so stdout carries only the answers.
"""

from __future__ import annotations

import os

# Before mem0 is imported: mem0 reads it at import time and otherwise reports usage to PostHog.
os.environ["MEM0_TELEMETRY"] = "False"

import datetime as dt  # noqa: E402
import hashlib  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import uuid  # noqa: E402

from mem0 import Memory  # noqa: E402
from mem0.memory import telemetry  # noqa: E402
from mem0.utils.spacy_models import get_nlp_lemma  # noqa: E402
from mem0.vector_stores.base import VectorStoreBase  # noqa: E402
from mem0.utils.lemmatization import lemmatize_for_bm25  # noqa: E402


def add(memory: Memory, cmd: dict) -> dict:
    """The public API, one memory per call, no LLM (`infer=False`): mem0 embeds the text (one
    embedding request), inserts the row into pgvector and writes its SQLite history."""
    for text in cmd["texts"]:
        memory.add(text, user_id=cmd["user_id"], infer=False)
    return {"added": len(cmd["texts"])}


def load(memory: Memory, cmd: dict) -> dict:
    """What `add(..., infer=False)` stores, written in batches: the texts embedded through mem0's
    own embedder in one `embed_batch` (requests of 100), the rows inserted with one
    `vector_store.insert` (the batch persist mem0's LLM pipeline uses), the history with one
    `batch_add_history`. The payload is the one `Memory._create_memory` writes."""
    texts = cmd["texts"]
    vectors = memory.embedding_model.embed_batch(texts, "add")
    now = dt.datetime.now(dt.timezone.utc).isoformat()
    ids = [str(uuid.uuid4()) for _ in texts]
    payloads = [{"user_id": cmd["user_id"], "role": "user", "data": text,
                 "hash": hashlib.md5(text.encode()).hexdigest(), "created_at": now, "updated_at": now,
                 "text_lemmatized": lemmatize_for_bm25(text)} for text in texts]
    memory.vector_store.insert(vectors=vectors, ids=ids, payloads=payloads)
    memory.db.batch_add_history([{"memory_id": i, "old_memory": None, "new_memory": t, "event": "ADD",
                                  "created_at": now, "updated_at": now, "role": "user"}
                                 for i, t in zip(ids, texts)])
    return {"loaded": len(texts)}


def search(memory: Memory, cmd: dict) -> dict:
    # 2.2.1 rejects a top-level user_id in search(): the scope goes in `filters`, the limit is `top_k`.
    started = time.perf_counter()
    found = memory.search(cmd["query"], filters={"user_id": cmd["user_id"]}, top_k=cmd["limit"])
    return {"hits": len(found["results"]), "ms": (time.perf_counter() - started) * 1e3}


def info(memory: Memory, cmd: dict) -> dict:
    store = memory.vector_store
    return {"mem0": importlib.metadata.version("mem0ai"), "psycopg": importlib.metadata.version("psycopg"),
            "telemetry": telemetry.MEM0_TELEMETRY, "vector_store": type(store).__name__,
            "hnsw": store.use_hnsw, "diskann": store.use_diskann,
            "keyword_search": type(store).keyword_search is not VectorStoreBase.keyword_search,
            "spacy_lemmatizer": get_nlp_lemma() is not None,
            "embedder": type(memory.embedding_model).__name__, "reranker": memory.reranker is not None}


def count(memory: Memory, cmd: dict) -> dict:
    return {"count": memory.vector_store.col_info()["count"]}


OPS = {"add": add, "load": load, "search": search, "info": info, "count": count}


def main() -> None:
    answers = sys.stdout
    sys.stdout = sys.stderr
    memory = Memory.from_config(json.loads(sys.argv[1]))
    answers.write(json.dumps({"ok": True, "ready": True}) + "\n")
    answers.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            answer = {"ok": True, **OPS[cmd["op"]](memory, cmd)}
        except Exception as err:  # the driver decides; it gets the error and the traceback
            traceback.print_exc()
            answer = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
