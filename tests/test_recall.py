"""Recall through the HTTP gateway: hybrid ranking, filters, scope isolation, reads and listing."""

from __future__ import annotations

import asyncio
import math
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from engram.access_counts import AccessCounts
from engram.store import memories as repo

CORPUS = [
    "Alice adopted a golden retriever puppy named Max",
    "Alice's favourite food is spicy ramen",
    "Alice is training for the Berlin marathon in September",
    "The quarterly budget review moved to Thursday",
    "Alice's sister lives in Toronto and works as a nurse",
    "Alice dislikes horror movies but loves documentaries",
]


async def _load(app, scope=None, **fields) -> list[str]:
    ids = []
    for text in CORPUS:
        ids.append((await app.remember(text, scope=scope or {"user_id": "alice"}, mode="sync", **fields))["memory_id"])
    return ids


async def test_hybrid_search_ranks_the_right_memory_first_with_score_components(app):
    ids = await _load(app)
    hits = await app.search("what pet does she have?", scope={"user_id": "alice"})
    assert hits[0]["memory"]["id"] == ids[0]  # meaning alone: no shared word with "dog"/"puppy"
    hits = await app.search("marathon", scope={"user_id": "alice"})
    assert hits[0]["memory"]["id"] == ids[2]
    top = hits[0]
    assert top["components"]["bm25"] > 0 and top["components"]["bm25_norm"] == 1.0
    assert 0 < top["components"]["vector"] <= 1
    s = app.settings
    expected = (s.rank_vector_weight * top["components"]["vector_norm"] + s.rank_bm25_weight * top["components"]["bm25_norm"]
                + s.rank_access_weight * top["components"]["access"])
    assert top["score"] == pytest.approx(expected)
    scores = [h["score"] for h in hits]
    assert scores == sorted(scores, reverse=True)


async def test_bm25_is_okapi_with_idf_over_the_scope(app):
    # "ramen" occurs in one memory of alice's scope, so its IDF is ln(1 + (N - 1 + .5) / 1.5).
    await _load(app)
    await _load(app, scope={"user_id": "other"})
    await app.remember("ramen ramen ramen noodles everywhere", scope={"user_id": "other"}, mode="sync")
    hit = (await app.search("ramen", scope={"user_id": "alice"}))[0]
    n, df, tf = len(CORPUS), 1, 1
    lengths = await app.pool.fetch("SELECT token_count FROM memories WHERE user_id = 'alice'")
    avgdl = sum(r["token_count"] for r in lengths) / len(lengths)
    doclen = await app.count("SELECT token_count FROM memories WHERE id = $1", uuid.UUID(hit["memory"]["id"]))
    k1, b = app.settings.bm25_k1, app.settings.bm25_b
    expected = math.log(1 + (n - df + 0.5) / (df + 0.5)) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * doclen / avgdl))
    assert hit["components"]["bm25"] == pytest.approx(expected, rel=1e-6)


async def test_search_never_returns_another_scopes_memories(app):
    await _load(app, scope={"user_id": "alice"})
    await app.remember("Bob's secret: the safe code is 4417", scope={"user_id": "bob"}, mode="sync")
    for query in ("safe code", "secret", "Bob"):
        hits = await app.search(query, scope={"user_id": "alice"}, limit=50)
        assert all(h["memory"]["user_id"] == "alice" for h in hits)
        assert not any("4417" in h["memory"]["content"] for h in hits)
    # A narrower scope sees only its own part.
    await app.remember("Alice told agent-x about the safe", scope={"user_id": "alice", "agent_id": "x"}, mode="sync")
    hits = await app.search("safe", scope={"user_id": "alice", "agent_id": "x"})
    assert [h["memory"]["agent_id"] for h in hits] == ["x"]


async def test_get_and_list_of_a_foreign_scope_look_like_missing(app):
    theirs = await app.remember("Bob's private note", scope={"user_id": "bob"}, mode="async")
    alice = await app.key("reader", ["user:alice"])
    hidden = await app.get(f"/api/memory/{theirs['memory_id']}", key=alice)
    missing = await app.get(f"/api/memory/{uuid.uuid4()}", key=alice)
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["error"]["type"] == missing.json()["error"]["type"] == "not_found"
    assert (await app.get(f"/api/memory/jobs/{theirs['job_id']}", key=alice)).status_code == 404
    assert (await app.get("/api/memory", key=alice, user_id="bob")).status_code == 403
    response = await app.post("/api/memory/search", {"query": "note", "scope": {"user_id": "bob"}}, key=alice)
    assert response.status_code == 403


async def test_deleted_memories_are_excluded_unless_asked_for(app):
    ids = await _load(app)
    await app.forget(ids[1])
    hits = await app.search("ramen", scope={"user_id": "alice"}, limit=50)
    assert ids[1] not in [h["memory"]["id"] for h in hits]
    hits = await app.search("ramen", scope={"user_id": "alice"}, include_deleted=True)
    assert hits[0]["memory"]["id"] == ids[1] and hits[0]["memory"]["is_deleted"]


async def test_filters_on_type_tags_who_and_source(app):
    scope = {"user_id": "f"}
    a = await app.remember("Prefers window seats on flights", scope=scope, type="preference", tags=["travel"],
                           who="user", source_type="chat", mode="sync")
    b = await app.remember("Booked a flight to Oslo", scope=scope, type="event", tags=["travel", "oslo"],
                           who="agent", source_type="calendar", mode="sync")
    for filters, expected in [({"type": "preference"}, [a]), ({"tags": ["oslo"]}, [b]), ({"who": "agent"}, [b]),
                              ({"source_type": "chat"}, [a]), ({"tags": ["travel"]}, [a, b])]:
        hits = await app.search("flight", scope=scope, filters=filters)
        assert sorted(h["memory"]["id"] for h in hits) == sorted(x["memory_id"] for x in expected), filters


async def test_time_phrases_filter_by_creation_time(app):
    scope = {"user_id": "t"}
    old = await app.remember("Went skiing in Zermatt", scope=scope, mode="sync")
    new = await app.remember("Went skiing in Chamonix", scope=scope, mode="sync")
    # As if written 200 days ago: the lexical index takes the memory again, with that time.
    await app.pool.execute("UPDATE memories SET created_at = $2, lexical_indexed = false WHERE id = $1",
                           uuid.UUID(old["memory_id"]), datetime.now(timezone.utc) - timedelta(days=200))
    recent = await app.search("skiing", scope=scope, filters={"time": "last 3 months"})
    assert [h["memory"]["id"] for h in recent] == [new["memory_id"]]
    older = await app.search("skiing", scope=scope, filters={"time": "older than 6 months"})
    assert [h["memory"]["id"] for h in older] == [old["memory_id"]]
    assert await app.search("skiing", scope=scope, filters={"time": "yesterday"}) == []


@pytest.mark.parametrize("body, status, fragment", [
    ({"query": "x", "scope": {"user_id": "u"}, "filters": {"time": "a while back"}}, 422, "time phrase"),
    ({"query": "", "scope": {"user_id": "u"}}, 422, "query"),
    ({"query": "x"}, 422, "scope"),
    ({"query": "x", "scope": {"user_id": "u"}, "limit": 0}, 422, "limit"),
    ({"query": "x", "scope": {"user_id": "u"}, "limit": 10_000}, 422, "less than or equal to 100"),
    ({"query": "x", "scope": {"user_id": "u"}, "filters": {"colour": "red"}}, 422, "colour"),
    ({"query": "x", "scope": {"user_id": "u"}, "rerank_everything": True}, 422, "rerank_everything"),
])
async def test_bad_search_input_is_a_clear_4xx(app, body, status, fragment):
    response = await app.post("/api/memory/search", body)
    assert response.status_code == status, response.text
    assert fragment in response.json()["error"]["detail"]


async def test_list_paginates_with_a_cursor_newest_first(app):
    ids = await _load(app)
    seen, cursor = [], None
    while True:
        params = {"user_id": "alice", "limit": 4} | ({"cursor": cursor} if cursor else {})
        page = (await app.get("/api/memory", **params)).json()
        seen += [m["id"] for m in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == list(reversed(ids))
    assert (await app.get("/api/memory", user_id="alice", cursor="garbage")).status_code == 422
    assert (await app.get("/api/memory")).status_code == 422


async def test_access_counts_are_added_up_off_the_hot_path_and_written_together(app):
    ids = await _load(app)
    for _ in range(3):
        await app.search("marathon", scope={"user_id": "alice"}, limit=1)
    marathon = uuid.UUID(ids[2])
    for _ in range(100):
        if await app.count("SELECT access_count FROM memory_access WHERE memory_id = $1", marathon) == 3:
            break
        await asyncio.sleep(0.05)
    row = await app.pool.fetchrow("SELECT access_count, last_accessed FROM memory_access WHERE memory_id = $1",
                                  marathon)
    assert row["access_count"] == 3 and row["last_accessed"] is not None
    assert await app.count("SELECT sum(access_count) FROM memory_access") == 3
    shown = (await app.get(f"/api/memory/{marathon}")).json()
    assert shown["access_count"] == 3 and shown["last_accessed"] is not None


async def test_counting_an_access_writes_no_new_version_of_the_memorys_row(app):
    """The count lives in `memory_access`: the memory's row (its version in the heap, `ctid` and
    `xmin`) is the same after its accesses are written, so its indexes gain nothing."""
    ids = [uuid.UUID(i) for i in await _load(app)]
    before = {r["id"]: (r["ctid"], r["xmin"]) for r in await app.pool.fetch(
        "SELECT id, ctid, xmin::text FROM memories WHERE id = ANY($1::uuid[])", ids)}
    counts = AccessCounts(app.pool, flush_s=3600)
    counts.add(ids)
    counts.add(ids[:1])
    await counts.aclose()
    after = {r["id"]: (r["ctid"], r["xmin"]) for r in await app.pool.fetch(
        "SELECT id, ctid, xmin::text FROM memories WHERE id = ANY($1::uuid[])", ids)}
    assert after == before
    got = {r["memory_id"]: r["access_count"] for r in await app.pool.fetch(
        "SELECT memory_id, access_count FROM memory_access WHERE memory_id = ANY($1::uuid[])", ids)}
    assert got == {ids[0]: 2, **{i: 1 for i in ids[1:]}}


async def test_access_counts_survive_a_failed_write_and_are_written_at_close(app, monkeypatch):
    ids = [uuid.UUID(i) for i in await _load(app)]
    counts = AccessCounts(app.pool, flush_s=0.05)
    real, written = repo.add_accesses, []

    async def unreachable_once(pool, tally):
        written.append({i: n for i, (n, _) in tally.items()})
        if len(written) == 1:
            counts.add(ids[1:3])  # a search while this write is out
            raise ConnectionRefusedError("Postgres is down")
        await real(pool, tally)
    monkeypatch.setattr(repo, "add_accesses", unreachable_once)

    counts.add(ids[:2])
    while not written:
        await asyncio.sleep(0.01)
    await counts.aclose()
    assert written == [{ids[0]: 1, ids[1]: 1}, {ids[0]: 1, ids[1]: 2, ids[2]: 1}], \
        "what failed is merged with what came meanwhile, and written at close at the latest"
    got = {r["id"]: r["access_count"] for r in await app.pool.fetch(
        f"SELECT m.id, {repo.ACCESS_COUNT} AS access_count FROM memories m WHERE m.id = ANY($1::uuid[])", ids)}
    assert got == {ids[0]: 1, ids[1]: 2, ids[2]: 1, **{i: 0 for i in ids[3:]}}


async def test_health_and_readiness_need_no_key(app):
    assert (await app.http.get("/healthz")).json() == {"status": "ok"}
    ready = await app.http.get("/readyz")
    assert ready.status_code == 200
    components = ready.json()["components"]
    assert {"postgres", "temporal", "vector_index", "embedder", "providers"} <= set(components)
    assert all(c["ok"] for c in components.values())


async def test_unknown_route_uses_the_error_contract(app):
    response = await app.get("/api/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found"


async def _assert_stats_match_a_recount(app) -> list:
    recount = await app.pool.fetch(
        "SELECT scope_key, count(*) AS n, sum(token_count) AS len FROM memories WHERE NOT is_deleted GROUP BY 1")
    stats = await app.pool.fetch("SELECT scope_key, doc_count AS n, total_len AS len FROM bm25_scope_stats")
    assert sorted(map(tuple, recount)) == sorted(map(tuple, stats))
    df_recount = await app.pool.fetch(
        "SELECT m.scope_key, t.term, count(*) AS df FROM memory_terms t JOIN memories m ON m.id = t.memory_id"
        " GROUP BY 1, 2")
    df_stats = await app.pool.fetch("SELECT scope_key, term, df FROM bm25_term_stats")
    assert sorted(map(tuple, df_recount)) == sorted(map(tuple, df_stats))
    return stats


async def test_bm25_statistics_are_kept_incrementally_by_the_write_path(app):
    await _load(app, scope={"user_id": "alice"})
    await _load(app, scope={"user_id": "alice", "agent_id": "x"})
    await app.remember(CORPUS[0], scope={"user_id": "alice"}, mode="async")  # a duplicate counts once
    stats = await _assert_stats_match_a_recount(app)
    # A user-wide search sums both exact scopes: N = 12, df("ramen") = 2.
    hit = (await app.search("ramen", scope={"user_id": "alice"}))[0]
    doclen = await app.count("SELECT token_count FROM memories WHERE id = $1", uuid.UUID(hit["memory"]["id"]))
    avgdl = sum(r["len"] for r in stats) / sum(r["n"] for r in stats)
    k1, b = app.settings.bm25_k1, app.settings.bm25_b
    expected = math.log(1 + (12 - 2 + 0.5) / 2.5) * (k1 + 1) / (1 + k1 * (1 - b + b * doclen / avgdl))
    assert hit["components"]["bm25"] == pytest.approx(expected, rel=1e-6)


async def test_a_bulk_import_writes_its_bm25_statistics_once_and_exactly(app):
    """A bulk remember adds its items' statistics in one write at its end: duplicates (in the
    batch and already stored), an item refused and a second scope leave them equal to a recount."""
    await _load(app, scope={"user_id": "alice"})
    items = [{"content": text, "scope": {"user_id": "alice"}} for text in CORPUS]  # all already stored
    items += [{"content": text, "scope": {"user_id": "bob"}} for text in CORPUS + CORPUS[:3]]
    items += [{"content": "", "scope": {"user_id": "bob"}}, {"content": "Bob grows tomatoes", "scope": {}}]
    response = await app.post("/api/memory/remember/batch", {"items": items})
    assert response.status_code == 200, response.text
    assert response.json()["failed"] == 2
    await _assert_stats_match_a_recount(app)
    assert await app.count("SELECT doc_count FROM bm25_scope_stats WHERE user_id = 'bob'") == len(CORPUS)


async def test_a_lone_match_scores_as_the_best_candidate_not_as_worthless(app):
    scope = {"user_id": "lone"}
    await app.remember("Maya keeps bees on the roof of her flat", scope=scope, mode="sync")
    hits = await app.search("bees on the roof", scope=scope)
    assert len(hits) == 1
    components = hits[0]["components"]
    assert components["vector_norm"] == 1.0 and components["bm25_norm"] == 1.0, components
    assert hits[0]["score"] >= components["fused"] == 1.0


def test_tied_scores_normalise_to_the_top_and_missing_ones_to_zero():
    from uuid import uuid4

    from engram.recall.fusion import minmax

    a, b, c, d = uuid4(), uuid4(), uuid4(), uuid4()
    assert minmax({a: 2.5, b: 2.5, c: None}) == {a: 1.0, b: 1.0, c: 0.0}
    assert minmax({a: 0.0, b: 0.0}) == {a: 0.0, b: 0.0}, "no evidence stays no evidence"
    assert minmax({a: 1.0, b: 3.0, c: 2.0, d: None}) == {a: 0.0, b: 1.0, c: 0.5, d: 0.0}


async def test_a_memory_keeps_its_embedding_in_its_row_not_in_the_toast_table(app):
    """Search reads ~170 candidates' embeddings per query: out of line, each was a second read."""
    answer = await app.remember("Priya keeps her embedding inline " + "and talks at some length " * 20, mode="sync")
    await app.wait_job(answer["job_id"])
    toasted = await app.pool.fetchval(
        "SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE relname = 'memories'")
    assert toasted == 0
    assert await app.pool.fetchval("SELECT embedding IS NOT NULL FROM memories WHERE id = $1",
                                   uuid.UUID(answer["memory_id"]))
