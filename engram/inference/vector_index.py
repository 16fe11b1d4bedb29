"""The serving vector indexes: one interface, two adapters, two kinds.

`EdgeIndex` runs Qdrant's engine in-process (qdrant-edge-py; one process owns the directory).
`QdrantServerIndex` speaks to a Qdrant server (or `:memory:`) through qdrant-client.

An index holds either dense vectors of one embedding model (`ensure(model=, dim=)`), or the
sparse BM25 vectors of the lexical index (`ensure_sparse()`): a memory's {term id: weight},
searched with a query's {term id: IDF} (engram.domain.text's sparse vectors). Postgres holds the
canonical embeddings and the postings, so every index can be rebuilt from it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol
from uuid import UUID

from engram.domain.errors import ConfigError
from engram.domain.filters import Filters
from engram.domain.models import SCOPE_PARTS, Scope

log = logging.getLogger(__name__)

_KEYWORD_FIELDS = ("user_id", "agent_id", "run_id", "type", "tags", "who", "source_type", "trust",
                   "memory_type")
_FLOAT_FIELDS = ("created_at", "confidence", "expires_at")
_TENANT_FIELDS = ("user_id", "agent_id")  # Qdrant keeps each value's points together

# (field, kind, is_tenant, whether HNSW links are built per value) of every payload index, the
# one list both adapters make theirs from (_field_indexes says why only the scope is linked).
_PAYLOAD_INDEXES: tuple[tuple[str, str, bool, bool], ...] = (
    *((name, "keyword", name in _TENANT_FIELDS, name in SCOPE_PARTS) for name in _KEYWORD_FIELDS),
    ("deleted", "integer", False, False),
    *((name, "float", False, False) for name in _FLOAT_FIELDS),
)


def _index_params(models, kind: str, tenant: bool, linked: bool, **typed):
    """A payload index's params in `models`: qdrant_edge, or qdrant_client.models (which also
    wants `type=kind`); the two name them alike."""
    if kind == "keyword":
        return models.KeywordIndexParams(is_tenant=tenant, enable_hnsw=linked, **typed)
    if kind == "integer":
        return models.IntegerIndexParams(lookup=True, range=True, enable_hnsw=linked, **typed)
    return models.FloatIndexParams(enable_hnsw=linked, **typed)


def _field_indexes() -> list[tuple[str, object, bool]]:
    """(field, qdrant-edge index params, whether HNSW links are built per value) of every
    payload index of an edge shard (QdrantServerIndex makes the same from _PAYLOAD_INDEXES).

    Every search is inside a scope, so Qdrant's payload-aware HNSW links (a graph per value
    holding enough points) are built for the scope's parts only. On every field they made the
    optimiser's work 2.5-3.5x and a search of one 100k-point scope 5.7x slower (0.32 against
    1.82 ms p50; recall@30 against exact search .9988 against .9999), measured on synthetic
    384-d points. A filter on another field that passes few of the points is searched with
    ACORN instead (EdgeIndex.search): a walk past failing neighbours, where links of that
    field's values would have led."""
    import qdrant_edge as q

    return [(name, _index_params(q, kind, tenant, linked), linked) for name, kind, tenant, linked in _PAYLOAD_INDEXES]


SPARSE = "bm25"  # the lexical index's one vector: BM25 weights by term id
Vector = list[float] | dict[int, float]  # dense values, or sparse {term id: weight}


def vector_name(model: str) -> str:
    """A Qdrant vector name for an embedding model: Qdrant refuses ':' (and Ollama tags have one)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", model)


@dataclass(frozen=True)
class IndexPoint:
    id: UUID
    vector: Vector
    user_id: str | None
    agent_id: str | None
    run_id: str | None
    type: str
    tags: list[str]
    who: str | None
    source_type: str | None
    created_at: datetime
    deleted: bool = False
    kind: str = "raw"
    trust: str | None = None
    confidence: float | None = None
    expires_at: datetime | None = None
    memory_type: str | None = None

    def payload(self) -> dict:
        # Points written before trust and lifetimes existed lack those fields: each filter on
        # them admits a point without the field, and the re-read of its row decides (_optional).
        lifetime = {} if self.expires_at is None else {"expires_at": self.expires_at.timestamp()}
        return lifetime | {
            "trust": self.trust, "confidence": self.confidence, "memory_type": self.memory_type,
            # Points written before kinds existed have none: "raw" matches them as not "fact".
            "kind": self.kind,
            "user_id": self.user_id, "agent_id": self.agent_id, "run_id": self.run_id,
            "type": self.type, "tags": list(self.tags), "who": self.who,
            "source_type": self.source_type, "created_at": self.created_at.timestamp(),
            # An integer, not a bool: qdrant-edge 0.9 does not match boolean values.
            "deleted": int(self.deleted),
        }


def _conditions(scope: Scope, filters: Filters) -> list[tuple[str, object]]:
    """(field, value) equality conditions: the scope's parts, liveness, and the filters' labels."""
    conds: list[tuple[str, object]] = [(part, value) for part in SCOPE_PARTS
                                       if (value := getattr(scope, part)) is not None]
    if not filters.include_deleted:
        conds.append(("deleted", 0))
    for name in ("type", "who", "source_type"):
        if (value := getattr(filters, name)) is not None:
            conds.append((name, value))
    return conds


def _optional(filters: Filters) -> list[tuple[str, object]]:
    """(field, test) of the filters on fields that older points lack: ("trust", [levels]),
    ("memory_type", [types]), ("confidence", minimum), ("expires_at", after). A point without
    the field passes."""
    tests: list[tuple[str, object]] = []
    if filters.trust:
        tests.append(("trust", list(filters.trust)))
    if filters.memory_types:
        tests.append(("memory_type", list(filters.memory_types)))
    if filters.min_confidence is not None:
        tests.append(("confidence", filters.min_confidence))
    if not filters.include_expired and filters.now is not None:
        tests.append(("expires_at", filters.now.timestamp()))
    return tests


def _restricted_parts(filters: Filters) -> list[tuple[str, list[str]]]:
    """(part, values): the part must be null or one of the values (the caller's grants)."""
    return [(part, sorted(values)) for part, values in filters.visible.allowed]


@dataclass(frozen=True)
class VectorHit:
    id: UUID
    score: float
    vector: Vector | None = None  # the point's vector, when search(with_vectors=True)


class VectorIndex(Protocol):
    """Contract shared by both adapters (tests/test_vector_index.py runs it against each)."""

    name: str

    async def ensure(self, *, model: str, dim: int) -> None:
        """Create the collection and payload indexes for `model`'s vectors if missing. Idempotent."""

    async def ensure_sparse(self) -> None:
        """The same for the lexical index's sparse vectors. Idempotent."""

    async def upsert(self, points: list[IndexPoint]) -> None:
        """Insert or replace points by id."""

    async def set_deleted(self, ids: list[UUID], deleted: bool) -> None:
        """Flip the deleted flag so searches exclude (or include) these points."""

    async def delete(self, ids: list[UUID]) -> None:
        """Remove points; missing ids are ignored."""

    async def search(self, vector: Vector, scope: Scope, filters: Filters, limit: int, *,
                     with_vectors: bool = False) -> list[VectorHit]:
        """Nearest points inside `scope` passing `filters`, best first: cosine similarity as the
        score, or for a sparse query the dot product with each point's weights (points holding
        no query term are not hits); with their vectors if asked."""

    async def count(self) -> int: ...

    async def unoptimized(self) -> int:
        """Points searched by brute force until optimize() runs (0 where the engine indexes by itself)."""

    async def optimize(self) -> None:
        """Build the search structures of the points written so far, without stalling searches."""

    async def close(self) -> None: ...


class EdgeIndex:
    """Qdrant edge shard under `path`, one directory per collection.

    The engine is synchronous; calls run in a thread, writes serialised by a lock.

    The engine optimises (builds HNSW graphs, merges segments) only when asked, and holds the
    GIL while it does. optimize() therefore copies the shard, optimises the copy in a child
    process (engram.inference.edge_optimizer), replays the writes made meanwhile onto it and
    swaps it in: a generation directory `<path>@<n>`, named by the pointer file
    `<path>.current` (no pointer: `<path>` itself). A directory the pointer does not name is a
    leftover (a crash mid-optimize, a replaced generation) and is removed at open.

    Each shard searches its segments on a pool of `search_threads` threads, every generation
    swapped in too (None: as many as the shard last ran with, else the engine's default, 8 on 2
    CPUs; settings.index_search_threads says why we set it).
    """

    name = "qdrant-edge"

    def __init__(self, path: Path, *, search_threads: int | None = None) -> None:
        self._path = path
        self._dir = path  # the generation being served
        self._search_threads = search_threads
        self._config = None  # what the shard was opened with, for the generations swapped in
        self._shard = None
        self._vector_name = ""
        self._write_lock = threading.Lock()
        self._journal: list | None = None  # writes since the copy being optimised was taken
        self._optimizing = asyncio.Lock()

    async def ensure(self, *, model: str, dim: int) -> None:
        import qdrant_edge as q

        self._vector_name = name = vector_name(model)
        await asyncio.to_thread(self._open, q.EdgeConfig(
            vectors={name: q.EdgeVectorParams(size=dim, distance=q.Distance.Cosine)},
            max_search_threads=self._search_threads))

    async def ensure_sparse(self) -> None:
        import qdrant_edge as q

        self._vector_name = SPARSE
        await asyncio.to_thread(self._open, q.EdgeConfig(vectors={}, sparse_vectors={
            SPARSE: q.EdgeSparseVectorParams()}, max_search_threads=self._search_threads))

    def _pointer(self) -> Path:
        return self._path.with_name(self._path.name + ".current")

    def _generations(self) -> list[Path]:
        return [self._path, *self._path.parent.glob(self._path.name + "@*")]

    def _open(self, config) -> None:
        import qdrant_edge as q

        self._config = config
        pointer = self._pointer()
        self._dir = self._path.with_name(pointer.read_text().strip()) if pointer.exists() else self._path
        self._remove_leftovers()
        if self._dir.exists() and any(self._dir.iterdir()):
            self._shard = q.EdgeShard.load(str(self._dir), config)
        else:
            self._dir.mkdir(parents=True, exist_ok=True)
            self._shard = q.EdgeShard.create(str(self._dir), config)
        schema = self._shard.info().payload_schema
        for name, params, linked in _field_indexes():
            held = schema.get(name)
            if held is None or (held.params is None or held.params.enable_hnsw is not False) != linked:
                # Missing, or made otherwise by an earlier release: made as _field_indexes
                # says. Segments optimised from now on follow it; older ones keep their links.
                if held is not None:  # seconds per field at a million points
                    log.info("re-making the payload index %r of %s (HNSW links per value: %s)", name, self._dir,
                             "yes" if linked else "no")
                self._shard.update(q.UpdateOperation.create_field_index(name, params))

    def _write(self, operation) -> None:
        with self._write_lock:
            self._shard.update(operation)
            if self._journal is not None:
                self._journal.append(operation)

    async def upsert(self, points: list[IndexPoint]) -> None:
        import qdrant_edge as q

        op = q.UpdateOperation.upsert_points(
            [q.Point(str(p.id), {self._vector_name: _edge_vector(p.vector)}, p.payload()) for p in points]
        )
        await asyncio.to_thread(self._write, op)

    async def set_deleted(self, ids: list[UUID], deleted: bool) -> None:
        import qdrant_edge as q

        op = q.UpdateOperation.set_payload([str(i) for i in ids], {"deleted": int(deleted)})
        await asyncio.to_thread(self._write, op)

    async def delete(self, ids: list[UUID]) -> None:
        import qdrant_edge as q

        await asyncio.to_thread(self._write, q.UpdateOperation.delete_points([str(i) for i in ids]))

    async def search(self, vector: Vector, scope: Scope, filters: Filters, limit: int, *,
                     with_vectors: bool = False) -> list[VectorHit]:
        import qdrant_edge as q

        request = q.QueryRequest(
            limit=limit, query=q.Query.Nearest(_edge_vector(vector), using=self._vector_name),
            filter=_edge_filter(scope, filters), with_payload=False,
            with_vector=[self._vector_name] if with_vectors else False,
            # A filter passing few of the points the graph walk meets (a label, a time range;
            # no links per value of those: _field_indexes) looks past the neighbours that fail
            # it (ACORN), where Qdrant estimates it selective enough to need it.
            params=None if isinstance(vector, dict) else q.SearchParams(acorn=q.AcornSearchParams(enable=True)),
        )
        points = await asyncio.to_thread(self._shard.query, request)
        return [VectorHit(_point_id(p.id), float(p.score), _from_stored(p.vector[self._vector_name]) if with_vectors
                          else None) for p in points]

    async def count(self) -> int:
        import qdrant_edge as q

        return await asyncio.to_thread(self._shard.count, q.CountRequest(exact=True))

    async def unoptimized(self) -> int:
        info = await asyncio.to_thread(self._shard.info)
        return max(info.points_count - info.indexed_vectors_count, 0)

    async def optimize(self) -> None:
        """Optimise a copy of the shard in a child process and swap it in (the class says how).
        Searches and writes go on meanwhile; writes wait only while the copy is taken and
        while the writes made since are replayed onto it. Raises RuntimeError if the child
        fails (the shard served is untouched)."""
        async with self._optimizing:
            started = time.monotonic()
            target = self._path.with_name(f"{self._path.name}@{time.time_ns()}")
            await asyncio.to_thread(self._copy_to, target)
            try:
                child = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "engram.inference.edge_optimizer", str(target),
                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
                _, err = await child.communicate()
                if child.returncode != 0:
                    raise RuntimeError(f"the edge optimiser failed ({child.returncode}): {err.decode()[-2000:]}")
                replayed = await asyncio.to_thread(self._swap_to, target)
            except BaseException:
                self._journal = None
                if self._dir != target:  # never the generation being served
                    await asyncio.to_thread(shutil.rmtree, target, True)
                raise
            log.info("vector index optimised", extra={
                "index": self._path.name, "generation": target.name, "replayed_writes": replayed,
                "seconds": round(time.monotonic() - started, 1)})

    def _copy_to(self, target: Path) -> None:
        with self._write_lock:
            self._shard.flush()
            shutil.copytree(self._dir, target)
            self._journal = []

    def _swap_to(self, target: Path) -> int:
        import qdrant_edge as q

        with self._write_lock:
            shard = q.EdgeShard.load(str(target), self._config)
            journal, self._journal = self._journal or [], None
            for operation in journal:
                shard.update(operation)
            shard.flush()
            pointer = self._pointer()
            staged = pointer.with_name(pointer.name + ".tmp")
            staged.write_text(target.name)
            os.replace(staged, pointer)
            self._shard, self._dir = shard, target
        # A search may still hold the old shard: it is closed by the collector, unflushed (every
        # write it took is in the new one), and its directory removed at the next open or close.
        return len(journal)

    def _remove_leftovers(self) -> None:
        for path in self._generations():
            if path != self._dir and path.exists():
                shutil.rmtree(path, ignore_errors=True)

    async def close(self) -> None:
        if self._shard is not None:
            shard, self._shard = self._shard, None
            await asyncio.to_thread(self._close, shard)

    def _close(self, shard) -> None:
        with self._write_lock:
            shard.flush()
            shard.close()
            self._remove_leftovers()


class QdrantServerIndex:
    """A Qdrant server (or qdrant-client's `:memory:` engine, for contract tests only), of at
    least MIN_SERVER: the first release that takes a payload index's `enable_hnsw` (1.17; ACORN
    came in 1.16). An older server is refused when the collection is first ensured."""

    name = "qdrant-server"
    MIN_SERVER = (1, 17)

    def __init__(self, client, collection: str) -> None:
        self._client = client
        self._collection = collection
        self._vector_name = ""
        self._version_checked = False

    async def ensure(self, *, model: str, dim: int) -> None:
        from qdrant_client import models as m

        self._vector_name = name = vector_name(model)
        await self._create(vectors_config={name: m.VectorParams(size=dim, distance=m.Distance.COSINE)})

    async def ensure_sparse(self) -> None:
        from qdrant_client import models as m

        self._vector_name = SPARSE
        await self._create(vectors_config={}, sparse_vectors_config={SPARSE: m.SparseVectorParams()})

    async def _create(self, **config) -> None:
        from qdrant_client import models as m

        await self._check_version()
        if await self._client.collection_exists(self._collection):
            # A collection an earlier release made keeps its indexes (HNSW links on every
            # field), unlike an edge shard (EdgeIndex._open). Re-making those whose params
            # differ would read get_collection().payload_schema, which qdrant-client's :memory:
            # engine, the tests' only one, leaves empty; until a test has a server, an operator
            # re-makes them with create_payload_index (which replaces an index).
            return
        await self._client.create_collection(self._collection, **config)
        for name, kind, tenant, linked in _PAYLOAD_INDEXES:
            await self._client.create_payload_index(self._collection, name,
                                                    _index_params(m, kind, tenant, linked, type=kind))

    async def _check_version(self) -> None:
        """ConfigError unless the server says it is MIN_SERVER or newer. Without the check, an
        older server answers the first collection's payload index with a 400 that names a field
        (`enable_hnsw`), not the version to run."""
        if self._version_checked:
            return
        version = (await self._client.info()).version
        parts = re.match(r"v?(\d+)\.(\d+)", version or "")
        if parts is None or (int(parts[1]), int(parts[2])) < self.MIN_SERVER:
            wanted = ".".join(map(str, self.MIN_SERVER))
            raise ConfigError(f"the Qdrant server at ENGRAM_QDRANT_URL runs {version or 'an unknown version'}; "
                              f"Engram needs {wanted} or newer (per-field HNSW links, ACORN)")
        self._version_checked = True

    async def upsert(self, points: list[IndexPoint]) -> None:
        from qdrant_client import models as m

        await self._client.upsert(self._collection, points=[
            m.PointStruct(id=str(p.id), vector={self._vector_name: _server_vector(p.vector)}, payload=p.payload())
            for p in points
        ], wait=True)

    async def set_deleted(self, ids: list[UUID], deleted: bool) -> None:
        await self._client.set_payload(self._collection, {"deleted": int(deleted)}, points=[str(i) for i in ids], wait=True)

    async def delete(self, ids: list[UUID]) -> None:
        from qdrant_client import models as m

        await self._client.delete(self._collection, m.PointIdsList(points=[str(i) for i in ids]), wait=True)

    async def search(self, vector: Vector, scope: Scope, filters: Filters, limit: int, *,
                     with_vectors: bool = False) -> list[VectorHit]:
        from qdrant_client import models as m

        result = await self._client.query_points(
            self._collection, query=_server_vector(vector), using=self._vector_name,
            query_filter=_server_filter(scope, filters), limit=limit, with_payload=False,
            with_vectors=[self._vector_name] if with_vectors else False,
            # ACORN for a selective filter on an unlinked field, as EdgeIndex.search.
            search_params=None if isinstance(vector, dict) else m.SearchParams(acorn=m.AcornSearchParams(enable=True)),
        )
        return [VectorHit(_point_id(p.id), float(p.score), _from_stored(p.vector[self._vector_name]) if with_vectors
                          else None) for p in result.points]

    async def count(self) -> int:
        return (await self._client.count(self._collection, exact=True)).count

    async def unoptimized(self) -> int:
        return 0  # the server's own optimiser indexes in the background

    async def optimize(self) -> None:
        return None

    async def close(self) -> None:
        await self._client.close()


def _edge_vector(vector: Vector):
    import qdrant_edge as q

    if isinstance(vector, dict):
        return q.SparseVector(indices=list(vector), values=[float(v) for v in vector.values()])
    return list(vector)


def _server_vector(vector: Vector):
    from qdrant_client import models as m

    if isinstance(vector, dict):
        return m.SparseVector(indices=list(vector), values=[float(v) for v in vector.values()])
    return list(vector)


def _point_id(point_id) -> UUID:
    """A point's id as a UUID: qdrant-edge gives one already (parsing its text again cost about
    a third of a 125-hit query's time), a Qdrant server its text."""
    return point_id if isinstance(point_id, UUID) else UUID(str(point_id))


def _from_stored(vector) -> Vector:
    """A vector as either engine returns it: dense values, or a sparse vector as {index: value}."""
    if hasattr(vector, "indices"):
        return dict(zip(vector.indices, vector.values))
    return list(vector)


def _edge_filter(scope: Scope, filters: Filters):
    import qdrant_edge as q

    must = [q.FieldCondition(k, match=q.MatchValue(v)) for k, v in _conditions(scope, filters)]
    must_not = []
    if filters.kind == "fact":
        must.append(q.FieldCondition("kind", match=q.MatchValue("fact")))
    elif filters.kind == "raw":
        must_not.append(q.FieldCondition("kind", match=q.MatchValue("fact")))
    for part, values in _restricted_parts(filters):
        either = [q.IsNullCondition(part)] + ([q.FieldCondition(part, match=q.MatchAny(values))] if values else [])
        must.append(q.Filter(should=either))
    if filters.tags:
        must.append(q.FieldCondition("tags", match=q.MatchAny(list(filters.tags))))
    for name, test in _optional(filters):
        if name in ("trust", "memory_type"):
            passes = q.FieldCondition(name, match=q.MatchAny(test))
        elif name == "confidence":
            passes = q.FieldCondition(name, range=q.RangeFloat(gte=test))
        else:
            passes = q.FieldCondition(name, range=q.RangeFloat(gt=test))
        must.append(q.Filter(should=[q.IsEmptyCondition(name), passes]))
    if filters.created_from or filters.created_to:
        must.append(q.FieldCondition("created_at", range=q.RangeFloat(
            gte=filters.created_from.timestamp() if filters.created_from else None,
            lte=filters.created_to.timestamp() if filters.created_to else None,
        )))
    return q.Filter(must=must, must_not=must_not or None)


def _server_filter(scope: Scope, filters: Filters):
    from qdrant_client import models as m

    must: list = [m.FieldCondition(key=k, match=m.MatchValue(value=v)) for k, v in _conditions(scope, filters)]
    must_not: list = []
    if filters.kind == "fact":
        must.append(m.FieldCondition(key="kind", match=m.MatchValue(value="fact")))
    elif filters.kind == "raw":
        must_not.append(m.FieldCondition(key="kind", match=m.MatchValue(value="fact")))
    for part, values in _restricted_parts(filters):
        either: list = [m.IsNullCondition(is_null=m.PayloadField(key=part))]
        if values:
            either.append(m.FieldCondition(key=part, match=m.MatchAny(any=values)))
        must.append(m.Filter(should=either))
    if filters.tags:
        must.append(m.FieldCondition(key="tags", match=m.MatchAny(any=list(filters.tags))))
    for name, test in _optional(filters):
        if name in ("trust", "memory_type"):
            passes = m.FieldCondition(key=name, match=m.MatchAny(any=test))
        elif name == "confidence":
            passes = m.FieldCondition(key=name, range=m.Range(gte=test))
        else:
            passes = m.FieldCondition(key=name, range=m.Range(gt=test))
        must.append(m.Filter(should=[m.IsEmptyCondition(is_empty=m.PayloadField(key=name)), passes]))
    if filters.created_from or filters.created_to:
        must.append(m.FieldCondition(key="created_at", range=m.Range(
            gte=filters.created_from.timestamp() if filters.created_from else None,
            lte=filters.created_to.timestamp() if filters.created_to else None,
        )))
    return m.Filter(must=must, must_not=must_not or None)
