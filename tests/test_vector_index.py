"""One contract, both adapters, both kinds: the in-process Qdrant edge shard and qdrant-client
(its `:memory:` engine speaks the same client API as a Qdrant server), each holding dense
vectors of a model or the lexical index's sparse BM25 vectors."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from engram.domain.auth import EVERYTHING, Principal
from engram.domain.errors import ConfigError
from engram.domain.filters import Filters
from engram.domain.models import Scope
from engram.inference.vector_index import EdgeIndex, IndexPoint, QdrantServerIndex
from worker.index_maintenance import IndexOptimizer

DIM = 8
NOW = datetime(2025, 6, 1, tzinfo=timezone.utc)
ALL = Filters(EVERYTHING)  # every live point of the scope

# qdrant-client's :memory: engine warns that it ignores payload indexes and search params.
pytestmark = [pytest.mark.filterwarnings("ignore:Payload indexes have no effect:UserWarning"),
              pytest.mark.filterwarnings("ignore:Local mode performs exact:UserWarning")]


@pytest.fixture(params=["dense", "sparse"])
def kind(request) -> str:
    return request.param


@pytest.fixture(params=["edge", "client"])
async def index(request, kind, tmp_path):
    if request.param == "edge":
        idx = EdgeIndex(tmp_path / "shard")
    else:
        from qdrant_client import AsyncQdrantClient

        idx = QdrantServerIndex(AsyncQdrantClient(location=":memory:"), "contract")
    if kind == "dense":
        await idx.ensure(model="ollama:test-model:v1", dim=DIM)  # a name Qdrant would refuse as is
    else:
        await idx.ensure_sparse()
    yield idx
    await idx.close()


@pytest.fixture
def vec(kind):
    """Unit vectors of the index's kind. Sparse ones all share term 0, so every point is a hit
    for every query (as with dense vectors) and a point's own vector scores 1."""

    def make(seed: int):
        v = np.random.default_rng(seed).normal(size=DIM)
        v = v / np.linalg.norm(v)
        if kind == "dense":
            return v.tolist()
        terms = [0, *np.random.default_rng(seed + 1000).choice(np.arange(1, 64), size=DIM - 1, replace=False)]
        return {int(t): float(abs(w)) for t, w in zip(terms, v)}

    return make


@pytest.fixture
def point(vec):
    def make(seed: int, user: str | None = "u", **fields) -> IndexPoint:
        return _point(vec(seed), user, **fields)

    return make


def _point(vector, user: str | None = "u", **fields) -> IndexPoint:
    base = dict(id=uuid.uuid4(), vector=vector, user_id=user, agent_id=None, run_id=None, type="fact", tags=[],
                who=None, source_type=None, created_at=NOW)
    base.update(fields)
    return IndexPoint(**base)


async def test_nearest_first_with_cosine_scores(index, point, vec):
    points = [point(i) for i in range(5)]
    await index.upsert(points)
    hits = await index.search(points[3].vector, Scope(user_id="u"), ALL, 5)
    assert hits[0].id == points[3].id and hits[0].score == pytest.approx(1.0, abs=1e-4)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert await index.count() == 5


async def test_scope_is_always_enforced(index, point, vec):
    mine, theirs = point(1, "alice"), point(1, "bob")
    narrow = point(2, "alice", agent_id="a1")
    await index.upsert([mine, theirs, narrow])
    hits = await index.search(mine.vector, Scope(user_id="alice"), ALL, 10)
    assert {h.id for h in hits} == {mine.id, narrow.id}
    hits = await index.search(mine.vector, Scope(user_id="alice", agent_id="a1"), ALL, 10)
    assert [h.id for h in hits] == [narrow.id]


async def test_points_whose_whole_scope_is_not_granted_are_never_returned(index, point, vec):
    agent_only = point(1, user=None, agent_id="x")
    bobs = point(1, "bob", agent_id="x")
    in_r1 = point(2, user=None, agent_id="x", run_id="r1")
    in_r2 = point(3, user=None, agent_id="x", run_id="r2")
    await index.upsert([agent_only, bobs, in_r1, in_r2])

    async def seen_by(*grants: str) -> set:
        visible = Principal(id="key:t", name="t", role="reader", grants=grants).visibility
        hits = await index.search(agent_only.vector, Scope(agent_id="x"), Filters(visible), 10)
        return {h.id for h in hits}

    assert await seen_by("agent:x") == {agent_only.id}
    assert await seen_by("agent:x", "run:r1") == {agent_only.id, in_r1.id}
    assert await seen_by("agent:*", "run:*") == {agent_only.id, in_r1.id, in_r2.id}
    assert await seen_by("agent:x", "user:bob") == {agent_only.id, bobs.id}
    assert await seen_by("*") == {agent_only.id, bobs.id, in_r1.id, in_r2.id}


async def test_deleted_points_are_hidden_unless_asked_for(index, point, vec):
    point = point(1)
    await index.upsert([point])
    await index.set_deleted([point.id], True)
    assert await index.search(point.vector, Scope(user_id="u"), ALL, 10) == []
    hits = await index.search(point.vector, Scope(user_id="u"), Filters(EVERYTHING, include_deleted=True), 10)
    assert [h.id for h in hits] == [point.id]
    await index.set_deleted([point.id], False)
    assert len(await index.search(point.vector, Scope(user_id="u"), ALL, 10)) == 1


async def test_payload_filters_and_time_range(index, point, vec):
    a = point(1, type="preference", tags=["travel"], who="user", source_type="chat", created_at=NOW - timedelta(days=40))
    b = point(2, type="event", tags=["travel", "oslo"], who="agent", source_type="email", created_at=NOW)
    await index.upsert([a, b])
    scope = Scope(user_id="u")

    async def ids(**kw):
        return {h.id for h in await index.search(a.vector, scope, Filters(EVERYTHING, **kw), 10)}

    assert await ids(type="preference") == {a.id}
    assert await ids(tags=["oslo"]) == {b.id}
    assert await ids(tags=["travel"]) == {a.id, b.id}
    assert await ids(who="agent") == {b.id}
    assert await ids(source_type="chat") == {a.id}
    assert await ids(created_from=NOW - timedelta(days=7)) == {b.id}
    assert await ids(created_to=NOW - timedelta(days=7)) == {a.id}


async def test_upsert_replaces_and_delete_removes(index, point, vec):
    point = point(1)
    await index.upsert([point])
    moved = IndexPoint(**{**point.__dict__, "vector": vec(9)})
    await index.upsert([moved])
    assert await index.count() == 1
    hits = await index.search(vec(9), Scope(user_id="u"), ALL, 1)
    assert hits[0].id == point.id and hits[0].score == pytest.approx(1.0, abs=1e-4)
    await index.delete([point.id, uuid.uuid4()])
    assert await index.count() == 0


async def test_a_search_returns_its_hits_vectors_if_asked(index, point, vec, kind):
    points = [point(i) for i in range(5)]
    await index.upsert(points)
    hits = await index.search(points[0].vector, Scope(user_id="u"), ALL, 10, with_vectors=True)
    assert points[0].id in {h.id for h in hits}
    for hit in hits:
        stored = next(p.vector for p in points if p.id == hit.id)
        if kind == "sparse":
            assert hit.vector.keys() == stored.keys()
            stored, got = list(stored.values()), [hit.vector[k] for k in stored]
        else:
            got = hit.vector
        assert got == pytest.approx(stored, rel=1e-6)  # float32 in the engine
    assert all(h.vector is None for h in await index.search(points[0].vector, Scope(user_id="u"), ALL, 10))


async def test_a_sparse_query_scores_the_dot_product_and_misses_points_holding_none_of_its_terms(index, kind):
    if kind != "sparse":
        pytest.skip("a sparse index's own contract")
    a, b, c = _point({1: 0.5, 2: 1.0}), _point({2: 0.25, 3: 2.0}), _point({4: 1.0})
    await index.upsert([a, b, c])
    hits = await index.search({2: 2.0, 3: 0.1}, Scope(user_id="u"), ALL, 10)
    assert [(h.id, round(h.score, 4)) for h in hits] == [(a.id, 2.0), (b.id, 0.7)]


async def test_edge_shard_persists_across_reopen(tmp_path):
    first = EdgeIndex(tmp_path / "shard")
    await first.ensure(model="m", dim=DIM)
    point = _point([1.0] + [0.0] * (DIM - 1))
    await first.upsert([point])
    await first.close()
    again = EdgeIndex(tmp_path / "shard")
    await again.ensure(model="m", dim=DIM)
    hits = await again.search(point.vector, Scope(user_id="u"), ALL, 1)
    assert [h.id for h in hits] == [point.id]
    await again.close()


def _hnsw_links_by_field(path) -> dict[str, bool]:
    """Whether each payload index of the edge shard at `path` builds HNSW links per value."""
    import qdrant_edge as q

    shard = q.EdgeShard.load(str(path), q.EdgeConfig(vectors={"m": q.EdgeVectorParams(size=DIM,
                                                                                      distance=q.Distance.Cosine)}))
    try:
        return {name: held.params is None or held.params.enable_hnsw is not False
                for name, held in shard.info().payload_schema.items()}
    finally:
        shard.close()


async def test_an_edge_shard_links_its_graph_by_scope_only_and_one_made_before_is_changed_at_open(tmp_path):
    """Payload-aware HNSW links on every field tripled the optimiser's work and slowed a big
    scope's search 5x (vector_index._field_indexes): only the scope's parts get them. A shard
    an older release made with links on every field is changed at open, its points kept."""
    import qdrant_edge as q

    new = EdgeIndex(tmp_path / "new")
    await new.ensure(model="m", dim=DIM)
    await new.close()
    links = _hnsw_links_by_field(tmp_path / "new")
    assert {name for name, linked in links.items() if linked} == {"user_id", "agent_id", "run_id"}
    assert len(links) == 13

    old = q.EdgeShard.create(str(tmp_path / "old"), q.EdgeConfig(vectors={"m": q.EdgeVectorParams(
        size=DIM, distance=q.Distance.Cosine)}))
    for name in ("user_id", "agent_id", "run_id", "type", "tags", "who", "source_type", "trust", "memory_type"):
        old.update(q.UpdateOperation.create_field_index(name, q.KeywordIndexParams(
            is_tenant=name in ("user_id", "agent_id"))))
    old.update(q.UpdateOperation.create_field_index("deleted", q.PayloadSchemaType.Integer))
    for name in ("created_at", "confidence", "expires_at"):
        old.update(q.UpdateOperation.create_field_index(name, q.PayloadSchemaType.Float))
    point = _point([1.0] + [0.0] * (DIM - 1))
    old.update(q.UpdateOperation.upsert_points([q.Point(str(point.id), {"m": point.vector}, point.payload())]))
    old.close()
    assert all(_hnsw_links_by_field(tmp_path / "old").values())
    reopened = EdgeIndex(tmp_path / "old")
    await reopened.ensure(model="m", dim=DIM)
    hits = await reopened.search(point.vector, Scope(user_id="u"), Filters(EVERYTHING, now=NOW), 1)
    assert [h.id for h in hits] == [point.id]
    await reopened.close()
    assert _hnsw_links_by_field(tmp_path / "old") == links


class _Recording:
    """qdrant-client, recording each call's arguments by name: its :memory: engine keeps no
    payload index params (payload_schema stays empty) and ignores search params."""

    def __init__(self, client) -> None:
        self._client = client
        self.calls: list[tuple[str, dict]] = []

    def __getattr__(self, name: str):
        method = getattr(self._client, name)

        async def record(*args, **kwargs):
            self.calls.append((name, inspect.signature(method).bind(*args, **kwargs).arguments))
            return await method(*args, **kwargs)

        return record


async def _recorded_server(kind: str) -> tuple[QdrantServerIndex, _Recording]:
    from qdrant_client import AsyncQdrantClient

    client = _Recording(AsyncQdrantClient(location=":memory:"))
    index = QdrantServerIndex(client, "recorded")
    await (index.ensure(model="m", dim=DIM) if kind == "dense" else index.ensure_sparse())
    return index, client


async def test_a_qdrant_server_collection_gets_the_edge_shards_payload_indexes(tmp_path):
    """HNSW links by the scope's parts only, user and agent as tenants, as an edge shard's
    (vector_index._field_indexes); made once, with the collection."""
    from qdrant_client import models as m

    index, client = await _recorded_server("dense")
    made = {call["field_name"]: call["field_schema"] for name, call in client.calls if name == "create_payload_index"}

    def keyword(tenant: bool, linked: bool):
        return m.KeywordIndexParams(type="keyword", is_tenant=tenant, enable_hnsw=linked)

    assert made == {
        "user_id": keyword(True, True), "agent_id": keyword(True, True), "run_id": keyword(False, True),
        **{name: keyword(False, False) for name in ("type", "tags", "who", "source_type", "trust", "memory_type")},
        "deleted": m.IntegerIndexParams(type="integer", lookup=True, range=True, enable_hnsw=False),
        **{name: m.FloatIndexParams(type="float", enable_hnsw=False) for name in ("created_at", "confidence",
                                                                                  "expires_at")},
    }
    edge = EdgeIndex(tmp_path / "shard")
    await edge.ensure(model="m", dim=DIM)
    await edge.close()
    assert {name: params.enable_hnsw for name, params in made.items()} == _hnsw_links_by_field(tmp_path / "shard")
    calls = len(client.calls)
    await index.ensure(model="m", dim=DIM)
    assert [name for name, _ in client.calls[calls:]] == ["collection_exists"]
    await index.close()


class _ServerOfVersion:
    """qdrant-client's :memory: engine reporting another server version (it reports the client's)."""

    def __init__(self, client, version: str) -> None:
        self._client, self._version = client, version

    def __getattr__(self, name: str):
        return getattr(self._client, name)

    async def info(self):
        from qdrant_client import models as m

        return m.VersionInfo(title="qdrant - vector search engine", version=self._version)


@pytest.mark.parametrize("version, works", [("1.16.3", False), ("v1.9.0", False), ("", False), ("1.17.0", True),
                                            ("v1.19.0", True), ("2.0.0-rc1", True)])
async def test_a_qdrant_server_older_than_1_17_is_refused_by_name_before_any_collection_is_made(version, works):
    """1.17 is the first to take a payload index's enable_hnsw; an older one would refuse the
    first payload index with a 400 naming the field, after the collection was made."""
    from qdrant_client import AsyncQdrantClient

    client = AsyncQdrantClient(location=":memory:")
    index = QdrantServerIndex(_ServerOfVersion(client, version), "versioned")
    if works:
        await index.ensure(model="m", dim=DIM)
        assert await client.collection_exists("versioned")
    else:
        with pytest.raises(ConfigError, match="Engram needs 1.17 or newer"):
            await index.ensure(model="m", dim=DIM)
        assert not await client.collection_exists("versioned")
    await client.close()


async def test_a_qdrant_server_searches_dense_vectors_with_acorn_and_sparse_ones_without(kind, vec):
    """As EdgeIndex.search: a filter passing few points the graph walk meets looks past them."""
    from qdrant_client import models as m

    index, client = await _recorded_server(kind)
    await index.upsert([point := _point(vec(1))])
    assert [h.id for h in await index.search(point.vector, Scope(user_id="u"), ALL, 1)] == [point.id]
    [params] = [call.get("search_params") for name, call in client.calls if name == "query_points"]
    assert params == (m.SearchParams(acorn=m.AcornSearchParams(enable=True)) if kind == "dense" else None)
    await index.close()


@pytest.mark.parametrize("scope, filters", [
    (Scope(run_id="r0"), Filters(EVERYTHING, now=NOW)),
    (Scope(user_id="u"), Filters(EVERYTHING, now=NOW, type="event")),
], ids=["run-scope", "type-filter"])
async def test_an_optimised_edge_shard_finds_the_nearest_of_a_filtered_fifth_of_its_points(tmp_path, scope, filters):
    """Past Qdrant's full-scan threshold a filtered search walks the HNSW graph, which holds no
    links per value of most fields (vector_index._field_indexes): it must still find the
    nearest of the points passing."""
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(200, 384))
    vectors = centres[rng.integers(0, 200, 30_000)] + 0.5 * rng.normal(size=(30_000, 384))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    passing = np.arange(30_000) < 7_000
    by_run = scope.run_id is not None  # the type filter: memories with no run, as most are
    points = [_point(v.tolist(), "u", run_id=("r0" if p else f"r{1 + i % 50}") if by_run else None,
                     type="event" if p and not by_run else "fact")
              for i, (v, p) in enumerate(zip(vectors, passing))]
    index = EdgeIndex(tmp_path / "shard")
    await index.ensure(model="m", dim=384)
    for start in range(0, len(points), 2_000):
        await index.upsert(points[start:start + 2_000])
    await index.optimize()
    queries = centres[rng.integers(0, 200, 40)] + 0.5 * rng.normal(size=(40, 384))
    found = []
    for q in queries / np.linalg.norm(queries, axis=1, keepdims=True):
        exact = {points[i].id for i in np.flatnonzero(passing)[np.argsort(-(vectors[passing] @ q))[:30]]}
        found.append(len(exact & {h.id for h in await index.search(q.tolist(), scope, filters, 30)}) / 30)
    await index.close()
    assert np.mean(found) >= 0.95 and min(found) >= 0.8, sorted(found)[:5]


async def _filled_edge(path, n: int, dim: int = 384) -> tuple[EdgeIndex, list[IndexPoint]]:
    """An edge shard of `n` random points: at 384 dimensions, enough for the engine to build HNSW."""
    index = EdgeIndex(path)
    await index.ensure(model="m", dim=dim)
    vectors = np.random.default_rng(7).normal(size=(n, dim)).astype(np.float32)
    points = [_point(v.tolist()) for v in vectors]
    for start in range(0, n, 2_000):
        await index.upsert(points[start:start + 2_000])
    return index, points


async def test_edge_optimize_runs_in_a_child_process_and_keeps_every_write_made_meanwhile(tmp_path, caplog):
    caplog.set_level("INFO", logger="engram.inference.vector_index")
    index, points = await _filled_edge(tmp_path / "shard", 12_000)
    assert await index.unoptimized() == 12_000  # searched by brute force so far
    optimizer = IndexOptimizer(lambda: {"m": index}, after=10_000, check_s=60)
    optimizing = asyncio.create_task(optimizer.check_once())
    added, deleted, hidden = [], [], []
    await asyncio.sleep(0.05)
    assert optimizer.optimising == "m"  # what readiness reports while the child runs
    while not optimizing.done():  # searches and writes go on while the child optimises
        fresh = _point(np.random.default_rng(len(added)).normal(size=384).tolist())
        await index.upsert([fresh])
        added.append(fresh)
        gone, muted = points[len(deleted) * 2], points[len(deleted) * 2 + 1]
        await index.delete([gone.id])
        await index.set_deleted([muted.id], True)
        deleted.append(gone)
        hidden.append(muted)
        assert [h.id for h in await index.search(points[-1].vector, Scope(user_id="u"), ALL, 1)] == [points[-1].id]
        await asyncio.sleep(0.05)
    assert await optimizing == ["m"]
    assert optimizer.optimising is None
    assert await optimizer.check_once() == []  # not again until 10,000 more are waiting
    [swap] = [r for r in caplog.records if r.getMessage() == "vector index optimised"]
    assert swap.replayed_writes > 0, "no write landed while the child ran"

    async def check(idx: EdgeIndex) -> None:
        assert await idx.count() == 12_000 + len(added) - len(deleted)
        assert await idx.unoptimized() <= len(added)  # only what was written after the copy
        for p in (added[-1], points[-1]):
            assert [h.id for h in await idx.search(p.vector, Scope(user_id="u"), ALL, 1)] == [p.id]
        for p in (deleted[0], hidden[0]):
            assert p.id not in {h.id for h in await idx.search(p.vector, Scope(user_id="u"), ALL, 5)}

    await check(index)
    await index.close()
    again = EdgeIndex(tmp_path / "shard")
    await again.ensure(model="m", dim=384)
    await check(again)
    await again.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([swap.generation, "shard.current"])


_COUNT_SEARCH_POOL_THREADS = """
import asyncio, sys
from pathlib import Path
import numpy as np
from engram.domain.models import Scope
from engram.inference.vector_index import EdgeIndex
from tests.test_vector_index import ALL, _point

async def pool(expected: int) -> int:
    # Threads of this process's edge shards' search pools (qdrant-edge names them), once they
    # number `expected` or 5 s have passed: a dropped shard's threads end a little later.
    for _ in range(50):
        n = sum(1 for t in Path("/proc/self/task").iterdir() if (t / "comm").read_text().startswith("edge-search"))
        if n == expected:
            break
        await asyncio.sleep(0.1)
    return n

async def main(root: Path) -> None:
    counts = [await pool(0)]
    dense = EdgeIndex(root / "dense", search_threads=2)
    await dense.ensure(model="m", dim=8)
    points = [_point(v.tolist()) for v in np.random.default_rng(5).normal(size=(300, 8))]
    await dense.upsert(points)
    lexical = EdgeIndex(root / "lexical", search_threads=1)
    await lexical.ensure_sparse()
    counts.append(await pool(3))
    await dense.optimize()  # the generation swapped in; the one it replaced is dropped
    counts.append(await pool(3))
    hits = await dense.search(points[7].vector, Scope(user_id="u"), ALL, 1)
    counts.append(hits[0].id == points[7].id)
    await dense.close()
    await lexical.close()
    counts.append(await pool(0))
    print(counts)

asyncio.run(main(Path(sys.argv[1])))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread names from /proc")
def test_an_edge_shard_searches_on_the_threads_it_is_given_and_so_does_its_optimised_copy(tmp_path):
    """qdrant-edge's own pool is 8 threads on 2 CPUs, each spinning after every search
    (settings.index_search_threads): the setting holds for both kinds of shard and for the
    generation an optimisation swaps in (the engine keeps it in the shard's directory, which the
    copy takes along, and the swap passes it again). Counted in a process of its own, which
    holds no other shard."""
    done = subprocess.run([sys.executable, "-c", _COUNT_SEARCH_POOL_THREADS, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "[0, 3, 3, True, 0]"


async def test_a_failed_edge_optimize_leaves_the_shard_served_as_it_was(tmp_path, monkeypatch):
    index, points = await _filled_edge(tmp_path / "shard", 500, dim=DIM)
    monkeypatch.setattr(sys, "executable", "/bin/false")  # the child exits 1
    with pytest.raises(RuntimeError, match="the edge optimiser failed"):
        await index.optimize()
    await index.upsert([extra := _point([1.0] + [0.0] * (DIM - 1))])
    assert await index.count() == 501
    assert [h.id for h in await index.search(extra.vector, Scope(user_id="u"), ALL, 1)] == [extra.id]
    await index.close()
    assert [p.name for p in tmp_path.iterdir()] == ["shard"]  # the copy is gone, no pointer written
