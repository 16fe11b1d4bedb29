"""The corpus of `bench.scale` and its offline loader.

The corpus is 100 scopes (user_id `scale-000` ..) whose texts are the 1,676 LoCoMo dev turns:
each scope holds a seeded random sample of them, so the same texts recur across scopes. Each
distinct text is embedded once, in this process, with the service's model; the service would
compute the same vector. A scope holding more memories than there are turns (one big scope)
goes through the turns again in another order, each repeat with a tail naming its round
(`[round 2]`) so it is a memory of its own, and with its turn's vector: the tail is one more
BM25 term, and a vector changes little for it.

Remembering 100k memories through the API would take over an hour (every remember runs a
workflow), so `load` writes them offline, between service runs, with engram's own repository
functions: the rows a raw remember writes (memory, BM25 postings and statistics, ADD history
event) and what its pipeline then does with ENGRAM_LLM_PROVIDER=none (the canonical embedding
in Postgres, the point in the Qdrant edge shard, extraction `skipped`). No job rows: the outbox
dispatcher would start a workflow for each.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench import locomo_data
from engram import lexical_steps
from engram.domain.models import Memory, MemoryDraft, Scope
from engram.domain.text import normalize
from engram.inference.embedder import model_files
from engram.inference.embedding_spaces import index_point
from engram.settings import Settings
from engram.store import pool as pool_module
from engram.store import embeddings
from engram.store import memories as repo
from worker.embedded import EmbeddedPostgres, free_port
from worker.runtime import open_index, open_lexical_index

# What the service runs with while measured. The rerank series reorders the whole top 20 on
# every search: within its default budget the service would rerank fewer on a slow minute.
SERVICE_ENV = {"ENGRAM_LLM_PROVIDER": "none", "ENGRAM_RERANK_BUDGET_MS": "0"}
ACTOR = "bench:scale-loader"  # who wrote the memories loaded offline (no API key does)
BATCH = 500  # memories per transaction when loading


# -- the corpus --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """One pool text: a LoCoMo turn of conversation `sample_id`."""

    sample_id: str
    turn: locomo_data.Turn


@dataclass(frozen=True)
class Corpus:
    """The text pool, one vector per text (row i for entry i), and each scope's insertion order:
    seeded permutations of the pool, one after another, of which a corpus of N holds the first
    N / scopes (position p is round p // len(pool) + 1)."""

    model: str
    entries: list[Entry]
    vectors: np.ndarray
    order: list[list[int]]

    def scope(self, i: int) -> Scope:
        return Scope(user_id=f"scale-{i:03d}")


def build_corpus(conversations: list[locomo_data.Conversation], embedder, scopes: int, seed: int,
                 per_scope: int = 0) -> Corpus:
    """Every distinct turn (by normalised text), embedded once as the service embeds documents."""
    entries: dict[str, Entry] = {}
    for conv in conversations:
        for turn in conv.turns:
            entries.setdefault(normalize(turn.text), Entry(conv.sample_id, turn))
    pool = list(entries.values())
    started = time.time()
    vectors = embedder.embed_sync([e.turn.text for e in pool])
    print(f"  embedded {len(pool)} distinct turns in {time.time() - started:.0f} s", flush=True)
    rng = random.Random(seed)
    rounds = max(1, -(-per_scope // len(pool)))
    return Corpus(embedder.name, pool, vectors, [
        [entry for _ in range(rounds) for entry in rng.sample(range(len(pool)), len(pool))] for _ in range(scopes)])


def queries(conversations: list[locomo_data.Conversation], n: int, scopes: int, seed: int) -> list[tuple[str, int]]:
    """`n` (question, scope index) pairs: distinct LoCoMo questions (cycled if there are fewer),
    each with a seeded random scope."""
    texts = list(dict.fromkeys(q.question for conv in conversations for q in conv.questions))
    rng = random.Random(seed)
    rng.shuffle(texts)
    return [(texts[i % len(texts)], rng.randrange(scopes)) for i in range(n)]


# -- loading, offline --------------------------------------------------------------------------------

@dataclass
class LoadStep:
    added: int
    seconds: float  # writing rows and points
    vacuum_s: float


def service_settings(data: Path) -> Settings:
    """What `common.service(..., SERVICE_ENV)` runs with on `data`. It hides this process's
    ENGRAM_* variables from the service, so they are ignored here too (the prefix matches none)."""
    return Settings(_env_prefix="ENGRAM_SCALE_BENCH_IGNORES_", data_dir=data, llm_provider="none")


def load(data: Path, corpus: Corpus, start: int, stop: int) -> LoadStep:
    """Add each scope's entries `start:stop` (of its order) while no service runs on `data`.

    Starts the data directory's embedded Postgres on a free port and opens its edge shard (the
    service must have run once, to migrate and choose the active model), writes, runs
    VACUUM ANALYZE (what autovacuum would have done by the time a deployment holds this much),
    optimises the edge shard as the service would, and stops Postgres. Raises RuntimeError if
    the active model is not the corpus's or a text is already in its scope.
    """
    settings = service_settings(data)
    pg = EmbeddedPostgres(settings.data_dir / "postgres", free_port())
    pg.start()
    try:
        return asyncio.run(_load(settings, pg.dsn(), corpus, start, stop))
    finally:
        pg.stop()


async def _load(settings: Settings, dsn: str, corpus: Corpus, start: int, stop: int) -> LoadStep:
    pool = await pool_module.create_pool(dsn, min_size=1, max_size=1)
    index = open_index(settings, corpus.model)
    lexical = open_lexical_index(settings)
    try:
        state = await embeddings.state(pool)
        if state.active != corpus.model or state.target is not None:
            raise RuntimeError(f"the data directory serves {state.active} (target {state.target}), "
                               f"not {corpus.model}")
        await index.ensure(model=corpus.model, dim=corpus.vectors.shape[1])
        await lexical.ensure_sparse()
        todo = [(s, position) for s in range(len(corpus.order)) for position in range(start, stop)]
        started = time.time()
        for first in range(0, len(todo), BATCH):
            batch = todo[first:first + BATCH]
            async with pool.acquire() as conn:
                async with conn.transaction():
                    written = [await write_memory(conn, settings, corpus, s, position) for s, position in batch]
            await index.upsert([index_point(m, corpus.vectors[corpus.order[s][position]])
                                for m, (s, position) in zip(written, batch)])
            while await lexical_steps.index_pending(pool, lexical, k1=settings.bm25_k1, b=settings.bm25_b,
                                                    limit=BATCH):
                pass
            if (first // BATCH) % 20 == 19:
                print(f"  loaded {first + len(batch)}/{len(todo)}", flush=True)
        seconds = time.time() - started
        vacuum_started = time.time()
        await _settle(settings, pool, index)
        return LoadStep(len(todo), seconds, time.time() - vacuum_started)
    finally:
        await index.close()
        await lexical.close()
        await pool.close()


async def _settle(settings: Settings, pool, index) -> None:
    """VACUUM ANALYZE, and the dense shard optimised if INDEX_OPTIMIZE_AFTER points wait: what
    autovacuum and the service's index optimizer do within minutes of a load, so the store is
    measured as a deployment serves it, not in the minute after the load (when every rewritten
    row's old version is still read, and the newest points are searched by brute force)."""
    await pool.execute("VACUUM (ANALYZE)")
    if await index.unoptimized() >= settings.index_optimize_after:
        await index.optimize()


def settle(data: Path) -> None:
    """_settle on the store in `data` (its active model's shard), while no service runs on it."""
    settings = service_settings(data)
    pg = EmbeddedPostgres(settings.data_dir / "postgres", free_port())
    pg.start()
    try:
        asyncio.run(_settle_store(settings, pg.dsn()))
    finally:
        pg.stop()


async def _settle_store(settings: Settings, dsn: str) -> None:
    pool = await pool_module.create_pool(dsn, min_size=1, max_size=1)
    try:
        model = (await embeddings.state(pool)).active
        index = open_index(settings, model)
        try:
            await index.ensure(model=model, dim=model_files(model).dim)
            await _settle(settings, pool, index)
        finally:
            await index.close()
    finally:
        await pool.close()


async def write_memory(conn, settings: Settings, corpus: Corpus, scope_index: int, position: int) -> Memory:
    """What `MemoryService._write_memory` writes for a raw remember (`insert_raw`, minus the job
    row), then the canonical embedding the pipeline stores, with extraction `skipped` as the
    pipeline leaves it with no LLM provider. Returns the row as the pipeline reads it before
    indexing."""
    entry_index = corpus.order[scope_index][position]
    entry = corpus.entries[entry_index]
    round_ = position // len(corpus.entries) + 1
    draft = MemoryDraft(content=entry.turn.text if round_ == 1 else f"{entry.turn.text} [round {round_}]",
                        scope=corpus.scope(scope_index),
                        session_id=f"{entry.sample_id}:{entry.turn.session}",
                        metadata={"sample_id": entry.sample_id, "dia_id": entry.turn.dia_id})
    memory_id = uuid.uuid4()
    if not await repo.insert_raw(conn, draft, memory_id=memory_id, actor=ACTOR, stemmer=settings.bm25_stemmer,
                                 extraction_status="skipped"):
        raise RuntimeError(f"{draft.scope.user_id} already holds {draft.content!r}")
    await repo.store_embeddings(conn, [(memory_id, corpus.vectors[entry_index])], corpus.model)
    return await repo.get(conn, memory_id)
