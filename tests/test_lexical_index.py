"""The lexical index: BM25 candidates from sparse vectors in the vector engine, each scored exactly
from the vector the index returns. Its top equals the aggregation of every posting; a memory is
found before the index holds it, and by its new words (not its old point's) once changed; an
empty index is rebuilt from Postgres, and its points reweighed when BM25's parameters change;
points an earlier release wrote, and queries holding a term id two terms share, are scored in
Postgres; a changed analyzer re-indexes everything."""

from __future__ import annotations

import asyncio
import shutil
import uuid

import numpy as np
import pytest

from engram import lexical_steps
from engram.domain.auth import EVERYTHING
from engram.domain.filters import Filters
from engram.domain.models import Scope
from engram.domain.text import K1_DIM, LENGTH_DIM, NORM_DIM, bm25_terms, term_id
from engram.inference.embedding_spaces import index_point
from engram.recall import candidates
from engram.store import lexical_index
from engram.store import memories as repo

TEXTS = [
    "Caroline went to the LGBTQ support group on Tuesday", "Melanie painted a sunrise over the lake",
    "Caroline is researching adoption agencies", "Melanie ran a charity race for mental health",
    "The support group met again in May", "Caroline gave a talk at school about her journey",
    "Melanie's kids love the pottery class", "A lake trip with the family in June",
    "Caroline wants to become a counselor", "Melanie and Caroline talked about painting",
]
QUERIES = ["When did Caroline go to the support group?", "What did Melanie paint?", "lake family trip",
           "pottery class kids", "counselor career", "charity race"]


async def _bulk(app, scope: dict, texts: list[str]) -> None:
    items = [{"content": t, "scope": scope} for t in texts]
    response = await app.post("/api/memory/remember/batch", {"items": items})
    assert response.status_code == 200, response.text


async def _bm25_hits(app, query: str, scope: dict) -> dict[str, float]:
    """The hits BM25 scored, by id (the dense leg's depend on how far embedding has got)."""
    return {h["memory"]["id"]: round(h["components"]["bm25"], 6) for h in await app.search(query, scope=scope)
            if h["components"]["bm25"] > 0}


def _stop_indexer(app) -> None:
    """Cancel the lexical indexer: what the index holds stays as it is."""
    [indexer] = [t for t in app.runtime.tasks if t.get_name() == "index-sync"]
    indexer.cancel()


async def _change_content(app, memory_id, content: str) -> None:
    response = await app.http.patch(f"/api/memory/{memory_id}", json={"content": content, "reason": "r"},
                                    headers=app._auth(None))
    assert response.status_code == 200, response.text


async def _wait_indexed(app, timeout_s: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while await app.count("SELECT count(*) FROM memories WHERE NOT lexical_indexed OR lexical_reweigh"):
        assert asyncio.get_running_loop().time() < deadline, "the lexical indexer did not catch up"
        await asyncio.sleep(0.1)


async def test_the_lexical_index_top_equals_the_aggregation_of_every_posting(app):
    scope = {"user_id": "lex"}
    await _bulk(app, scope, [f"{t} (note {i})" for i in range(30) for t in TEXTS])  # 300 memories, many ties
    await _bulk(app, {"user_id": "lex", "agent_id": "a1"}, [f"{t}, said the agent" for t in TEXTS])
    await _bulk(app, {"user_id": "other"}, TEXTS)
    await _wait_indexed(app)
    s, filters = app.settings, Filters(EVERYTHING)
    for query in QUERIES:
        for depth in (5, 40):
            bm25 = candidates.Bm25(s, query, Scope(**scope), filters, app.runtime.lexical)
            async with app.pool.acquire() as conn:
                got = await bm25.top(conn, depth)
                want = await repo.bm25_scores(conn, Scope(**scope), filters, bm25_terms(query), k1=s.bm25_k1,
                                              b=s.bm25_b, limit=depth)
                others = [i for i in await repo.bm25_scores(conn, Scope(**scope), filters, bm25_terms(query),
                                                            k1=s.bm25_k1, b=s.bm25_b, limit=300) if i not in got]
                asked = others[:7] + [uuid.uuid4()]
                known, exact = await bm25.exact(conn, [*got][:2] + asked)
                assert set(known) >= set([*got][:2]) and set(exact.ids) <= set(asked), "nothing is scored twice"
                read = await repo.candidate_rows(conn, asked, Scope(**scope), filters, np.zeros(384), "none",
                                                 bm25=exact)
                more = {i: v for i, v in known.items() if i in asked} | {r.id: r.bm25 for r in read
                                                                          if r.bm25 is not None}
                want_more = await repo.bm25_scores(conn, Scope(**scope), filters, bm25_terms(query), k1=s.bm25_k1,
                                                   b=s.bm25_b, limit=300)
            # Scored from the points' vectors: the same arithmetic as Postgres's, summed in another order.
            assert sorted(got.values(), reverse=True) == pytest.approx(sorted(want.values(), reverse=True),
                                                                       rel=1e-12), (query, depth)
            assert more == pytest.approx({i: want_more[i] for i in others[:7]}, rel=1e-12)
            assert "postgres_ms" not in bm25.timings_ms  # every memory indexed: Postgres scored none
            assert await app.count("SELECT count(*) FROM memories WHERE id = ANY($1::uuid[]) AND user_id <> 'lex'",
                                   list(got)) == 0


async def test_a_memory_is_found_by_bm25_before_the_lexical_index_holds_it(app):
    scope = {"user_id": "fresh"}
    await _bulk(app, scope, TEXTS)
    await _wait_indexed(app)
    target = await app.pool.fetchval("SELECT id FROM memories WHERE content LIKE 'Melanie painted%'")
    await app.runtime.lexical.delete([target])  # as if just written: not in the index yet
    await app.pool.execute("UPDATE memories SET lexical_indexed = false WHERE id = $1", target)
    hits = await app.search("sunrise", scope=scope)
    by_bm25 = [h["memory"]["id"] for h in hits if h["components"]["bm25"] > 0]
    assert by_bm25 == [str(target)] and hits[0]["memory"]["id"] == str(target)
    await _wait_indexed(app)  # and the indexer puts it back
    assert await app.runtime.lexical.count() == len(TEXTS)
    assert set(app.runtime.served_indexes()) == {app.settings.embedding_model, "lexical"}  # what gets optimised
    ready = (await app.http.get("/readyz")).json()["components"]["lexical_index"]
    assert ready["ok"] and ready["points"] == len(TEXTS) and ready["to_index"] == ready["to_reweigh"] == 0, ready
    assert 0 <= ready["unoptimized"] <= len(TEXTS) and ready["optimising"] is False, ready
    dense = (await app.http.get("/readyz")).json()["components"]["vector_index"]
    assert 0 <= dense["unoptimized"] <= dense["points"] and dense["optimising"] is False, dense


async def test_a_growing_scope_keeps_every_point_weighed_with_one_average_length_near_its_own(app):
    scope = {"user_id": "growing"}
    await _bulk(app, scope, ["lake", "sunrise lake", "pottery"])  # short: an average length of 1.3 terms
    await _wait_indexed(app)
    long = [f"{t}, and then a long story about the family trip number {i} with many more words" for i, t in
            enumerate(TEXTS * 3)]
    await _bulk(app, scope, long)  # the average grows tenfold: the first points are reweighed
    await _wait_indexed(app)
    assert (await app.http.get("/readyz")).json()["components"]["lexical_index"]["to_reweigh"] == 0
    s = app.settings
    current = await app.pool.fetchval(
        "SELECT total_len::float8 / doc_count FROM bm25_scope_stats WHERE user_id = 'growing' AND agent_id IS NULL")
    lexical_avgdl = await app.pool.fetchval(
        "SELECT lexical_avgdl FROM bm25_scope_stats WHERE user_id = 'growing' AND agent_id IS NULL")
    assert abs(lexical_avgdl / current - 1) <= lexical_steps.REWEIGH_DRIFT <= 0.1
    hits = await app.runtime.lexical.search({term_id("lake"): 1.0, term_id("famili"): 1.0}, Scope(**scope),
                                            Filters(EVERYTHING), 100, with_vectors=True)
    assert len(hits) == 2 + len(long)  # every memory holding one of the terms
    for hit in hits:  # norm = k1·(1 − b + b·|d|/avgdl), solved for the avgdl it was weighed with
        length, norm = hit.vector[LENGTH_DIM], hit.vector[NORM_DIM]
        weighed_with = s.bm25_b * length / (norm / s.bm25_k1 - 1 + s.bm25_b)
        assert weighed_with == pytest.approx(lexical_avgdl, rel=1e-5)
    # The first, short memories were weighed when they were the whole scope: reweighed, the
    # index's top is BM25's, whichever of them it holds (by score: the copies tie).
    got, want, _ = await _scored_in_postgres(app, scope, "lake pottery")
    assert sorted(got.values()) == pytest.approx(sorted(want.values()), rel=1e-12)


async def _scored_in_postgres(app, scope: dict, query: str) -> tuple[dict, dict, candidates.Bm25]:
    s, filters = app.settings, Filters(EVERYTHING)
    bm25 = candidates.Bm25(s, query, Scope(**scope), filters, app.runtime.lexical)
    async with app.pool.acquire() as conn:
        got = await bm25.top(conn, 10)
        want = await repo.bm25_scores(conn, Scope(**scope), filters, bm25_terms(query), k1=s.bm25_k1, b=s.bm25_b,
                                      limit=10)
    return got, want, bm25


async def test_a_point_an_earlier_release_wrote_is_scored_in_postgres(app):
    scope = {"user_id": "old-points"}
    await _bulk(app, scope, TEXTS)
    await _wait_indexed(app)
    target = await app.pool.fetchrow("SELECT * FROM memories WHERE content LIKE 'Melanie painted%'")
    # Its weights without the dimensions that say how they were computed.
    await app.runtime.lexical.upsert([index_point(target, {term_id("sunris"): 1.0})])
    got, want, bm25 = await _scored_in_postgres(app, scope, "sunrise")
    assert list(got) == [target["id"]] and got == pytest.approx(want, rel=1e-12)
    assert "postgres_ms" in bm25.timings_ms


async def test_a_query_holding_a_term_id_two_terms_share_is_scored_in_postgres(app):
    scope = {"user_id": "collision"}
    await _bulk(app, scope, TEXTS)
    await _wait_indexed(app)
    # What registering a point holding another term with the id of "lake" records.
    await lexical_index.register_terms(app.pool, {"lake"})
    await app.pool.execute("UPDATE lexical_terms SET term = 'not-lake' WHERE term_id = $1", term_id("lake"))
    await lexical_index.register_terms(app.pool, {"lake"})
    assert await app.pool.fetchval("SELECT shared FROM lexical_terms WHERE term_id = $1", term_id("lake"))
    got, want, bm25 = await _scored_in_postgres(app, scope, "lake trip")
    assert got == pytest.approx(want, rel=1e-12) and len(got) == 2
    assert "postgres_ms" in bm25.timings_ms
    got, want, bm25 = await _scored_in_postgres(app, scope, "pottery class")  # other terms: from the index
    assert got == pytest.approx(want, rel=1e-12) and "postgres_ms" not in bm25.timings_ms


class _IndexedDuringTheSearch:
    """The lexical index, with the indexer's pass landing just after a search's index query: the
    race a fresh memory meets when the indexer wakes as it is searched for."""

    def __init__(self, app) -> None:
        self._app = app

    async def search(self, *args, **kwargs):
        hits = await self._app.runtime.lexical.search(*args, **kwargs)
        s = self._app.settings
        assert await lexical_steps.index_pending(self._app.pool, self._app.runtime.lexical, k1=s.bm25_k1, b=s.bm25_b,
                                                 limit=100) == 1
        return hits


async def test_a_memory_indexed_while_it_is_searched_for_is_found(app):
    scope = {"user_id": "race"}
    await _bulk(app, scope, TEXTS)
    await _wait_indexed(app)
    _stop_indexer(app)  # this test is the indexer: its pass lands where the race puts it
    target = await app.pool.fetchval("SELECT id FROM memories WHERE content LIKE 'Melanie painted%'")
    await app.runtime.lexical.delete([target])
    await app.pool.execute("UPDATE memories SET lexical_indexed = false WHERE id = $1", target)
    s = app.settings
    async with app.pool.acquire() as conn:
        got = await candidates.Bm25(s, "sunrise", Scope(**scope), Filters(EVERYTHING),
                                    _IndexedDuringTheSearch(app)).top(conn, 10)
    assert list(got) == [target]


async def test_an_empty_lexical_index_is_rebuilt_from_postgres_at_start(make_app, tmp_path):
    data_dir = tmp_path / "kept"
    async with make_app(data_dir=data_dir) as app:
        await _bulk(app, {"user_id": "r"}, TEXTS)
        await _wait_indexed(app)
        dsn = app.settings.postgres_dsn
        expected = await _bm25_hits(app, "Caroline support group", {"user_id": "r"})
    for shard in (data_dir / "qdrant").glob("*__lexical"):
        shutil.rmtree(shard)  # lost: a disk replaced, a directory deleted by hand
    async with make_app(postgres_dsn=dsn, data_dir=data_dir) as app:
        await _wait_indexed(app)  # start-up marked every memory to do before serving
        assert await app.runtime.lexical.count() == len(TEXTS)
        assert await _bm25_hits(app, "Caroline support group", {"user_id": "r"}) == expected


async def _weighed_with(app, scope: dict, query: str) -> set[tuple[float, float]]:
    """(k1, b) each point holding a term of `query` was weighed with: its norm is
    k1·(1 − b + b·|d|/avgdl), solved for b with the scope's `lexical_avgdl`."""
    avgdl = await app.pool.fetchval("SELECT lexical_avgdl FROM bm25_scope_stats WHERE user_id = $1"
                                    " AND agent_id IS NULL", scope["user_id"])
    hits = await app.runtime.lexical.search({term_id(t): 1.0 for t in bm25_terms(query)}, Scope(**scope),
                                            Filters(EVERYTHING), 100, with_vectors=True)
    assert hits
    found = set()
    for hit in hits:
        k1, length, norm = hit.vector[K1_DIM], hit.vector[LENGTH_DIM], hit.vector[NORM_DIM]
        if abs(length / avgdl - 1) > 0.1:  # b is all but lost in a norm near k1's
            found.add((round(k1, 4), round((norm / k1 - 1) / (length / avgdl - 1), 3)))
    return found


async def test_other_bm25_parameters_at_start_reweigh_every_point(make_app, tmp_path):
    scope, data_dir = {"user_id": "params"}, tmp_path / "kept"
    texts = [f"{t}, told again and again, time number {i}" if i % 2 else t for i, t in enumerate(TEXTS * 2)]
    async with make_app(data_dir=data_dir) as app:
        await _bulk(app, scope, texts)
        await _wait_indexed(app)
        dsn, s = app.settings.postgres_dsn, app.settings
        assert await _weighed_with(app, scope, "Caroline Melanie lake") == {(s.bm25_k1, s.bm25_b)}
    async with make_app(postgres_dsn=dsn, data_dir=data_dir, bm25_k1=0.9, bm25_b=0.3) as app:
        await _wait_indexed(app)  # start-up marked every point to reweigh before serving
        assert await _weighed_with(app, scope, "Caroline Melanie lake") == {(0.9, 0.3)}
        assert await app.pool.fetchval("SELECT point_weights FROM bm25_state") == "k1=0.9 b=0.3"
        got, want, _ = await _scored_in_postgres(app, scope, "Caroline Melanie lake")
        assert sorted(got.values()) == pytest.approx(sorted(want.values()), rel=1e-12)


@pytest.mark.parametrize("listed", [lexical_index.STALE_LISTED, 0], ids=["stale-listed", "too-many-to-list"])
async def test_a_memory_changed_before_the_index_holds_its_new_words_is_scored_by_them(app, monkeypatch, listed):
    monkeypatch.setattr(lexical_index, "STALE_LISTED", listed)
    scope = {"user_id": "changed"}
    await _bulk(app, scope, TEXTS)
    await _wait_indexed(app)
    _stop_indexer(app)  # its old point stays in the index: the window before the indexer's next pass
    target = await app.pool.fetchval("SELECT id FROM memories WHERE content LIKE 'Melanie painted%'")
    await _change_content(app, target, "Melanie baked bread")
    s, filters = app.settings, Filters(EVERYTHING)
    for query in ("sunrise over the lake", "Melanie baked"):
        bm25 = candidates.Bm25(s, query, Scope(**scope), filters, app.runtime.lexical)
        async with app.pool.acquire() as conn:
            got = await bm25.top(conn, 10)
            want = await repo.bm25_scores(conn, Scope(**scope), filters, bm25_terms(query), k1=s.bm25_k1, b=s.bm25_b,
                                          limit=10)
            known, exact = await bm25.exact(conn, [target])
            read = await repo.candidate_rows(conn, [target], Scope(**scope), filters, np.zeros(384), "none",
                                             bm25=exact)
        assert got == pytest.approx(want, rel=1e-12), query
        scored = known | {r.id: r.bm25 for r in read if r.bm25 is not None}
        assert scored.get(target, 0.0) == pytest.approx(want.get(target, 0.0), rel=1e-12), query
        assert ("postgres_ms" in bm25.timings_ms) == (listed == 0 or target in want), query
    assert str(target) not in await _bm25_hits(app, "sunrise over the lake", scope)  # and so through the API
    assert str(target) in await _bm25_hits(app, "baked bread", scope)


@pytest.mark.parametrize("listed", [lexical_index.STALE_LISTED, 0], ids=["stale-listed", "too-many-to-list"])
async def test_stale_points_at_the_top_of_the_index_take_no_place_in_bm25s_top(app, monkeypatch, listed):
    monkeypatch.setattr(lexical_index, "STALE_LISTED", listed)
    scope = {"user_id": "churn"}
    await _bulk(app, scope, [f"lake day {i}" for i in range(6)] +
                [f"a long lake trip with the whole family, number {i}" for i in range(6)])
    await _wait_indexed(app)
    _stop_indexer(app)
    changed = [r["id"] for r in await app.pool.fetch("SELECT id FROM memories WHERE content LIKE 'lake day%'")]
    for memory_id in changed:  # their points, the index's best for "lake", stay until the indexer's pass
        await _change_content(app, memory_id, f"bread {memory_id}")
    s, filters = app.settings, Filters(EVERYTHING)
    bm25 = candidates.Bm25(s, "lake", Scope(**scope), filters, app.runtime.lexical)
    async with app.pool.acquire() as conn:
        got = await bm25.top(conn, 4)
        want = await repo.bm25_scores(conn, Scope(**scope), filters, ["lake"], k1=s.bm25_k1, b=s.bm25_b, limit=4)
    assert not set(got) & set(changed) and len(got) == 4
    assert sorted(got.values()) == pytest.approx(sorted(want.values()), rel=1e-12)
