"""The embedding models a process holds, each with its vector index ("space"): the active one
serves search; while a re-embed runs, the target one is filled by every write too.

Which model is active lives in Postgres (`embedding_state`), so every process sees a switch:
searches re-read it at most every `refresh_s`, writers read it under a share lock in the
same transaction as their write, so a write can never land on the wrong side of a switch.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import asyncpg
import numpy as np

from engram.domain.errors import EmbeddingUnavailable
from engram.domain.models import Memory
from engram.inference.vector_index import IndexPoint, VectorIndex
from engram.store import embeddings
from engram.store import memories as repo


@dataclass(frozen=True)
class Space:
    embedder: object  # engram.inference.embedder.Embedder or a remote embedder: name, dim, embed, embed_query
    index: VectorIndex


def index_point(memory, vector: np.ndarray) -> IndexPoint:
    return IndexPoint(
        id=memory.id if isinstance(memory, Memory) else memory["id"], vector=vector.tolist(),
        user_id=_get(memory, "user_id"), agent_id=_get(memory, "agent_id"), run_id=_get(memory, "run_id"),
        type=_get(memory, "type"), tags=list(_get(memory, "tags")), who=_get(memory, "who"),
        source_type=_get(memory, "source_type"), created_at=_get(memory, "created_at"),
        deleted=_get(memory, "is_deleted"),
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

    async def embed_memory(self, memory: Memory) -> list[str]:
        """Embed `memory` with every model held, store each canonical vector where the state says
        (active: memories.embedding; target: memory_embeddings; any other: nowhere), then upsert
        the index points. Idempotent. Returns the models whose vectors were stored.

        Raises EmbeddingUnavailable for an outage (nothing stored), or with `permanent` after
        storing the other models' vectors when a model refuses this text."""
        vectors, refused = {}, []
        for model, space in self._spaces.items():
            try:
                vectors[model] = (await space.embedder.embed([memory.content]))[0]
            except EmbeddingUnavailable as err:
                if not err.permanent:
                    raise  # an outage: the caller retries the whole, idempotent step
                refused.append(err)  # this model refuses this text; the other models still store theirs
        stored = []
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                state = await embeddings.state(conn, lock="FOR SHARE")
                for model, vector in vectors.items():
                    if model == state.active:
                        await repo.store_embedding(conn, memory.id, vector, model)
                        stored.append(model)
                    elif model == state.target:
                        await embeddings.store_target(conn, [(memory.id, vector)], model)
                        stored.append(model)
        for model in stored:
            await self._spaces[model].index.upsert([index_point(memory, vectors[model])])
        if refused:
            raise EmbeddingUnavailable("; ".join(err.detail for err in refused), permanent=True)
        return stored

    async def close(self) -> None:
        for space in self._spaces.values():
            await space.index.close()
            if hasattr(space.embedder, "aclose"):
                await space.embedder.aclose()


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

