"""The embedding models a process holds, each with its vector index ("space"): the active one
serves search; while a re-embed runs, the target one is filled by every write too.

Which model is active lives in Postgres (`embedding_state`), so every process sees a switch:
searches re-read it at most every `refresh_s`, writers read it under a share lock in the
same transaction as their write, so a write can never land on the wrong side of a switch.

Embedding and indexing are separate steps: the canonical vectors go to Postgres first
(`embed_and_store`, in any process holding the models), then the index points are written from
them (`index`) by the process that owns the index. The in-process Qdrant shard has one owner,
the API process under `engram up`; a Qdrant server can be written by any process.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from uuid import UUID

import asyncpg
import numpy as np

from engram.domain.errors import EmbeddingUnavailable
from engram.domain.models import Memory
from engram.inference.vector_index import IndexPoint, Vector, VectorIndex
from engram.store import changes, embeddings
from engram.store import memories as repo


@dataclass(frozen=True)
class Space:
    embedder: object  # engram.inference.embedder.Embedder or a remote embedder: name, dim, embed, embed_query
    index: VectorIndex | None  # None in a process that does not own the index


@dataclass(frozen=True)
class Stored:
    """What `embed_and_store` stored: the memories with at least one vector stored, and why a
    model refused a memory's text (a remote embedder's 400), by memory."""

    ids: list[UUID]
    refusals: dict[UUID, str]


def index_point(memory, vector: np.ndarray | Vector) -> IndexPoint:
    """The index point of a memory (a Memory or a row with its columns) with `vector`: dense
    (numpy) or the lexical index's sparse {term id: weight}."""
    return IndexPoint(
        id=memory.id if isinstance(memory, Memory) else memory["id"],
        vector=vector.tolist() if isinstance(vector, np.ndarray) else vector,
        user_id=_get(memory, "user_id"), agent_id=_get(memory, "agent_id"), run_id=_get(memory, "run_id"),
        type=_get(memory, "type"), tags=list(_get(memory, "tags")), who=_get(memory, "who"),
        source_type=_get(memory, "source_type"), created_at=_get(memory, "created_at"),
        deleted=_get(memory, "is_deleted"), kind=_get(memory, "kind"), trust=_get(memory, "trust"),
        confidence=_get(memory, "confidence"), expires_at=_get(memory, "expires_at"),
        memory_type=_get(memory, "memory_type"),
    )


def _get(memory, field: str):
    return getattr(memory, field) if isinstance(memory, Memory) else memory[field]


class EmbeddingSpaces:
    def __init__(self, pool: asyncpg.Pool, spaces: dict[str, Space], active: str, refresh_s: float = 0.5) -> None:
        self._pool = pool
        self._spaces = spaces
        self._active = active
        self._refresh_s = refresh_s
        self._checked = time.monotonic()
        self._refreshing = asyncio.Lock()  # one state read at a time, however many searches wait

    @property
    def models(self) -> list[str]:
        return list(self._spaces)

    def space(self, model: str) -> Space:
        return self._spaces[model]

    async def active(self) -> tuple[str, Space]:
        """The model that serves search now, and its space. Call it holding no pooled connection:
        a refresh takes one."""
        if time.monotonic() - self._checked > self._refresh_s:
            async with self._refreshing:
                if time.monotonic() - self._checked > self._refresh_s:
                    self._active = (await embeddings.state(self._pool)).active
                    self._checked = time.monotonic()
        if self._active not in self._spaces:
            raise EmbeddingUnavailable(f"the active embedding model {self._active} is not loaded in this process; "
                                   "restart it with ENGRAM_EMBEDDING_MODEL set to that model")
        return self._active, self._spaces[self._active]

    async def embed_and_store(self, memories: list[Memory]) -> Stored:
        """Embed `memories` with every model held (in batches) and store each canonical vector
        where the state says (active: memories.embedding; target: memory_embeddings; any other:
        nowhere). Idempotent. Raises EmbeddingUnavailable for an outage (nothing stored); a model
        that refuses one text leaves that text without its vector and says so in `refusals`."""
        vectors: dict[str, dict[UUID, np.ndarray]] = {}
        refusals: dict[UUID, str] = {}
        for model, space in self._spaces.items():
            vectors[model] = await _embed_each_possible(space.embedder, memories, refusals)
        stored: set[UUID] = set()
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                state = await embeddings.state(conn, lock="FOR SHARE")
                for model, found in vectors.items():
                    rows = list(found.items())
                    if model == state.active:
                        await repo.store_embeddings(conn, rows, model)
                    elif model == state.target:
                        await embeddings.store_target(conn, rows, model)
                    else:
                        continue
                    stored.update(found)
        return Stored(ids=[m.id for m in memories if m.id in stored], refusals=refusals)

    async def embed_text(self, text: str) -> dict[str, np.ndarray]:
        """`text`'s vector from every model held (a memory's new content). Raises
        EmbeddingUnavailable; with `permanent` when a model refuses the text."""
        return {model: _array((await space.embedder.embed([text]))[0]) for model, space in self._spaces.items()}

    async def embed_texts(self, texts: list[str]) -> list[dict[str, np.ndarray]]:
        """`embed_text` of each of `texts`, a batch per model."""
        out: list[dict[str, np.ndarray]] = [{} for _ in texts]
        for model, space in self._spaces.items():
            for i, vector in enumerate(await space.embedder.embed(texts)):
                out[i][model] = _array(vector)
        return out

    async def store_text_vectors(self, conn: asyncpg.Connection, memory_id: UUID,
                                 vectors: dict[str, np.ndarray]) -> None:
        """Store a changed memory's `embed_text` vectors in the caller's transaction, where
        `embed_and_store` would. A model the state names and `vectors` lacks loses the old
        content's vector: the active one leaves the memory to BM25 until it is embedded
        again, the target one is made again by the re-embed."""
        state = await embeddings.state(conn, lock="FOR SHARE")
        if state.active is not None:
            vector = vectors.get(state.active)
            await changes.store_vector(conn, memory_id, vector, state.active if vector is not None else None)
        if state.target is not None:
            if state.target in vectors:
                await embeddings.store_target(conn, [(memory_id, vectors[state.target])], state.target)
            else:
                await changes.drop_target_vector(conn, memory_id, state.target)

    async def index(self, memory_ids: list[UUID], *, drop_missing: bool = False) -> int:
        """Write the index points of `memory_ids` from their canonical vectors, in every space
        whose index this process owns. With `drop_missing`, a memory without a canonical vector
        in a space (a change left it none) loses its point there. Idempotent. Returns how many
        points it wrote."""
        state = await embeddings.state(self._pool)
        written = 0
        for model, space in self._spaces.items():
            if space.index is None or model not in (state.active, state.target):
                continue
            rows = await embeddings.canonical(self._pool, memory_ids, model, active=model == state.active)
            if rows:
                await space.index.upsert([index_point(r, _array(r["embedding"])) for r in rows])
                written += len(rows)
            if drop_missing and len(rows) < len(memory_ids):
                held = {r["id"] for r in rows}
                await space.index.delete([i for i in memory_ids if i not in held])
        return written

    async def embed_memory(self, memory: Memory) -> None:
        """`embed_and_store` for one memory, then its index points where this process owns the
        index. Raises EmbeddingUnavailable for an outage (nothing stored), or with `permanent`
        after storing the other models' vectors when a model refuses this text."""
        stored = await self.embed_and_store([memory])
        if stored.ids:
            await self.index(stored.ids)
        if stored.refusals:
            raise EmbeddingUnavailable("; ".join(stored.refusals.values()), permanent=True)

    async def close(self) -> None:
        for space in self._spaces.values():
            if space.index is not None:
                await space.index.close()
            if hasattr(space.embedder, "aclose"):
                await space.embedder.aclose()


def _array(vector) -> np.ndarray:
    """A stored vector as numpy (pgvector's codec gives a numpy array or a `Vector`)."""
    return np.asarray(vector.to_numpy() if hasattr(vector, "to_numpy") else vector, dtype=np.float32)


async def _embed_each_possible(embedder, memories: list[Memory], refusals: dict[UUID, str]
                               ) -> dict[UUID, np.ndarray]:
    """Vectors for the memories' texts in one batch; if the embedder refuses the batch for a
    text in it, text by text, so one refused text costs only its own vector."""
    if len(memories) > 1:
        try:
            found = await embedder.embed([m.content for m in memories])
            return {m.id: v for m, v in zip(memories, found)}
        except EmbeddingUnavailable as err:
            if not err.permanent:
                raise
    vectors = {}
    for memory in memories:
        try:
            vectors[memory.id] = (await embedder.embed([memory.content]))[0]
        except EmbeddingUnavailable as err:
            if not err.permanent:
                raise
            refusals[memory.id] = "; ".join(filter(None, (refusals.get(memory.id), err.detail)))
    return vectors


async def reembed_batch(pool: asyncpg.Pool, space: Space, model: str, limit: int) -> int:
    """Embed up to `limit` memories that have no `model` vector yet into the target space.
    Returns how many it embedded (0: none left)."""
    rows = await embeddings.next_to_reembed(pool, model, limit)
    if not rows:
        return 0
    vectors = await space.embedder.embed([r["content"] for r in rows])
    async with pool.acquire() as conn:
        await embeddings.store_target(conn, [(r["id"], v) for r, v in zip(rows, vectors)], model)
    await space.index.upsert([index_point(r, v) for r, v in zip(rows, vectors)])
    return len(rows)


async def try_switch(pool: asyncpg.Pool, model: str) -> bool:
    """Make `model` active if every memory has its vector; False (nothing changed) otherwise."""
    async with pool.acquire() as conn:
        async with conn.transaction():
            state = await embeddings.state(conn, lock="FOR UPDATE")
            if state.active == model:
                return True  # an earlier run of this step already switched
            done, total = await embeddings.progress(conn, model)
            if done < total:
                return False
            await embeddings.switch(conn, model)
            return True

