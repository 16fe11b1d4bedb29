"""Each recall stage's contract: explain, context expansion, cross-encoder rerank and its
timeout, and the pinned model files."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import threading
import traceback
import uuid

import asyncpg
import numpy as np
import pytest

from engram.domain.auth import EVERYTHING
from engram.domain.errors import ModelFileMismatch
from engram.domain.filters import Filters
from engram.domain.models import Scope
from engram.inference.embedder import Embedder, minilm_files
from engram.recall import candidates
from engram.recall import pipeline as pipeline_module
from engram.recall import rerank as rerank_module
from engram.recall.rerank import CrossEncoder, ms_marco_files, with_context
from engram.store import memories
from tests.conftest import DEFAULT_MODEL

STAGES = ["embed_query", "dense", "bm25", "fetch", "fusion", "expansion", "rows"]


async def test_explain_shows_every_stage_with_its_timing(app):
    await app.remember("Ruth bakes sourdough every Sunday", scope={"user_id": "r"}, mode="sync")
    response = await app.post("/api/memory/search", {"query": "bread baking", "scope": {"user_id": "r"},
                                                     "explain": True, "rerank": True})
    explain = response.json()["explain"]
    assert list(explain) == STAGES + ["verify", "rerank"]
    assert explain["verify"]["checked"] == 1
    assert all(stage["ms"] >= 0 for stage in explain.values())
    assert explain["embed_query"]["model"] == DEFAULT_MODEL
    assert explain["rerank"]["model"] == "ms-marco-MiniLM-L-12-v2" and explain["rerank"]["timed_out"] is False
    plain = await app.post("/api/memory/search", {"query": "bread", "scope": {"user_id": "r"}})
    assert plain.json()["explain"] is None


async def test_rerank_orders_the_top_n_by_the_cross_encoder(app):
    scope = {"user_id": "rr"}
    texts = ["Sam mentioned the weather was nice", "Sam's dog is a border collie named Pip",
             "Sam's neighbour has a cat", "Sam walks to work"]
    ids = [(await app.remember(t, scope=scope, mode="sync"))["memory_id"] for t in texts]
    hits = await app.search("What breed is Sam's dog?", scope=scope, rerank=True, rerank_top_n=3)
    assert hits[0]["memory"]["id"] == ids[1]
    scored = [h for h in hits if h["components"]["rerank"] is not None]
    assert len(scored) == 3
    assert [h["components"]["rerank"] for h in scored] == sorted((h["components"]["rerank"] for h in scored),
                                                                 reverse=True)
    assert all(h["components"]["rerank"] is None for h in hits[3:])


async def test_rerank_timeout_keeps_the_fused_order_and_warns(make_app):
    async with make_app(rerank_timeout_ms=0) as app:
        for text in ("Tom likes chess", "Tom plays chess on Fridays", "Tom's chess rating is 1800"):
            await app.remember(text, scope={"user_id": "t"}, mode="sync")
        fused = await app.search("chess", scope={"user_id": "t"})
        response = await app.post("/api/memory/search", {"query": "chess", "scope": {"user_id": "t"}, "rerank": True})
        body = response.json()
        assert response.status_code == 200
        assert any(w.startswith("rerank_timeout") for w in body["warnings"])
        assert [h["memory"]["id"] for h in body["results"]] == [h["memory"]["id"] for h in fused]
        assert all(h["components"]["rerank"] is None for h in body["results"])


async def test_past_its_budget_the_rerank_reorders_the_fused_top_it_could_score_and_says_so(make_app):
    """A budget too short for more than one pair: the fused first is scored, the rest of the
    top N follow in their fused order, and the answer and explain say how many were reranked."""
    async with make_app(rerank_budget_ms=1) as app:
        scope = {"user_id": "budget"}
        for text in ("Ola sails a dinghy", "Ola's dinghy is called Wren", "Ola sails on the lake each summer",
                     "Ola races the dinghy in June", "Ola keeps the sails in the shed"):
            await app.remember(text, scope=scope, mode="sync")
        fused = [h["memory"]["id"] for h in await app.search("Ola sailing her dinghy", scope=scope)]
        response = await app.post("/api/memory/search", {"query": "Ola sailing her dinghy", "scope": scope,
                                                         "rerank": True, "rerank_top_n": 4, "explain": True})
        body = response.json()
        assert [h["memory"]["id"] for h in body["results"]] == fused
        assert [h["components"]["rerank"] is not None for h in body["results"]] == [True, False, False, False, False]
        assert body["explain"]["rerank"]["reranked"] == 1 and body["explain"]["rerank"]["top_n"] == 4
        assert body["warnings"] == ["rerank_partial: reranked the fused top 1 of 4, as many as this server "
                                    "expected to score within ENGRAM_RERANK_BUDGET_MS (1 ms) of the search's start"]


async def test_the_rerank_budget_runs_from_the_searchs_start(make_app, monkeypatch):
    """A budget the rerank alone would fit in, all spent by the stages before it: the rerank
    gets none of it, scores the fused first alone and says so, so the budget bounds the whole
    search. Explain shows what was left."""
    async with make_app(rerank_budget_ms=5_000) as app:
        scope = {"user_id": "spent"}
        for text in ("Ola sails a dinghy", "Ola's dinghy is called Wren", "Ola sails on the lake each summer"):
            await app.remember(text, scope=scope, mode="sync")
        ask = {"query": "Ola sailing her dinghy", "scope": scope, "rerank": True, "rerank_top_n": 3, "explain": True}
        whole = (await app.post("/api/memory/search", ask)).json()
        assert whole["warnings"] == [] and whole["explain"]["rerank"]["reranked"] == 3
        assert 0 < whole["explain"]["rerank"]["budget_left_ms"] <= 5_000
        clock = iter([0.0, 5.0])  # the search's start, then the rerank's: the stages took it all
        monkeypatch.setattr(pipeline_module, "monotonic", lambda: next(clock))
        body = (await app.post("/api/memory/search", ask)).json()
        assert body["explain"]["rerank"]["budget_left_ms"] == 0 and body["explain"]["rerank"]["reranked"] == 1
        assert body["warnings"][0].startswith("rerank_partial: reranked the fused top 1 of 3")


def test_the_cross_encoder_scores_the_longest_prefix_its_prices_fit_in_the_time_left(reranker, monkeypatch):
    monkeypatch.setattr(reranker, "lanes", 1)  # one model run at a time
    monkeypatch.setattr(reranker, "s_per_token", [0.001] * 513)  # 1 ms per padded token at any width
    monkeypatch.setattr(reranker, "speed", 1.0)
    # Runs of up to 4 texts sorted by length, each padded to its longest: the first 5 texts
    # (10, 50, 20, 40, 30 tokens) are the runs [10, 20, 30, 40] and [50]: 4 * 40 + 50 = 210 ms.
    lengths = [10, 50, 20, 40, 30, 60]
    assert reranker._runs(lengths[:5]) == [[0, 2, 4, 3], [1]]
    assert reranker.affordable(lengths, 0.2101) == 5
    assert reranker.affordable(lengths, 0.2099) == 4  # [10, 20, 40, 50]: 4 * 50 = 200 ms
    assert reranker.affordable(lengths, 0.199) == 3  # [10, 20, 50]: 3 * 50 = 150 ms
    assert reranker.affordable(lengths, 10.0) == 6
    assert reranker.affordable(lengths, -1.0) == 1  # the time is up already (queued): the first alone
    # A longer prefix can cost less: [100, 100, 100, 400] is one run of 1.6 s; one more 100 makes
    # the runs [100, 100, 100, 100] and [400], 0.8 s.
    assert reranker.affordable([100, 100, 100, 400, 100], 1.55) == 5
    monkeypatch.setattr(reranker, "speed", 2.0)  # recent runs went at half the measured speed
    assert reranker.affordable(lengths, 0.2101) == 2  # [10, 50]: 2 * 2 * 50 = 200 ms
    monkeypatch.setattr(reranker, "s_per_token", None)
    assert reranker.affordable(lengths, 0.0) == 6  # nothing measured yet: all of them


def test_a_wide_run_is_priced_at_its_own_widths_cost_per_token(reranker, monkeypatch):
    """Attention grows with a run's width: 4 texts of 400 tokens cost more per token than 16 of
    100, and are priced so."""
    wider = [0.001 * (1 + (w - 128) / 128) for w in range(129, 513)]  # 1 ms per token up to 128 wide
    monkeypatch.setattr(reranker, "lanes", 1)
    monkeypatch.setattr(reranker, "s_per_token", [0.001] * 129 + wider)
    monkeypatch.setattr(reranker, "speed", 1.0)
    assert reranker.affordable([100] * 16, 1.6) == 16  # 1,600 tokens at 1 ms
    assert reranker.affordable([400] * 4, 1.6) == 1  # 400 tokens at 3.125 ms: 1.25 s alone, 5 s for 4


@pytest.mark.parametrize("ratio, moved_to", [(3.0, 2.2), (100.0, 3.2)])  # 2 + 0.2 * (min(ratio, 4 * 2) - 2)
def test_each_run_moves_the_speed_a_fifth_of_the_way_to_its_own_at_most_4x(reranker, monkeypatch, ratio, moved_to):
    """A run that took `ratio` times its price at speed 1 moves the speed (2, runs went at half
    the measured speed) a fifth of the way to `ratio`; a stalled one counts as 4x the speed."""
    monkeypatch.setattr(reranker, "lanes", 1)
    monkeypatch.setattr(reranker, "s_per_token", [1e-3] * 513)
    monkeypatch.setattr(reranker, "speed", 2.0)
    texts = ["a memory about boats"] * 4  # one run of 4
    width = max(len(e.ids) for e in reranker._tokenizer.encode_batch([("boats", t) for t in texts]))
    ticks = iter([0.0, ratio * 4 * width * 1e-3])  # the run's start and end
    monkeypatch.setattr(rerank_module, "perf_counter", lambda: next(ticks))
    reranker._score_all("boats", texts, threading.Event())
    assert reranker.speed == pytest.approx(moved_to)


@pytest.mark.parametrize("lanes, prefix", [(1, 4), (2, 3)])
def test_a_run_the_time_left_cannot_pay_for_is_not_started_and_the_scored_prefix_is_the_answer(reranker, monkeypatch,
                                                                                             lanes, prefix):
    """The budget admits all 12 texts; by the time the second run (past the one holding the
    best-placed text, though not the shortest texts) is to start, the time is up, and neither it
    nor any later run starts. The answer is the fused prefix the first run scored, each score as
    a full rerank gives it. One lane: runs of 4, texts 3-0, 7-4, 11-8; two lanes: 4 runs of 3,
    texts 2-0 first, the second run beside it."""
    monkeypatch.setattr(reranker, "lanes", lanes)
    texts = [f"memory {i}: " + " ".join(["boats and harbours"] * (12 - i)) for i in range(12)]  # first longest
    everything = reranker._score_all("boats", texts, threading.Event())
    monkeypatch.setattr(reranker, "s_per_token", [1e-6] * 513)
    monkeypatch.setattr(reranker, "speed", 1.0)
    clock = iter([0.0])  # the budget's check; then every run's, past the deadline
    monkeypatch.setattr(rerank_module, "monotonic", lambda: next(clock, 2.0))
    scored = reranker._score_all("boats", texts, threading.Event(), deadline=1.0)
    assert scored == pytest.approx(everything[:prefix], abs=1e-4)


def test_runs_go_side_by_side_on_the_lanes_and_are_priced_so(reranker, monkeypatch):
    """On 2 lanes, 20 texts go in 6 runs of 4, 4, 3, 3, 3, 3 (3 rounds on each lane), not 5 of 4;
    each run starts on the lane free first, so the price is the later lane's end; the model runs
    overlap, on two threads."""
    assert reranker.lanes == 2
    assert reranker._sizes(20) == [4, 4, 3, 3, 3, 3] and reranker._sizes(3) == [2, 1] and reranker._sizes(0) == []
    monkeypatch.setattr(reranker, "s_per_token", [0.001] * 513)
    monkeypatch.setattr(reranker, "speed", 1.0)
    # Runs of 0.4, 0.4, 0.3, 0.3, 0.3, 0.3 s: one lane 0.4 + 0.3 + 0.3, the other the same.
    assert reranker._cost([100] * 20) == pytest.approx(1.0)
    # 19 texts: runs of 4, 3, 3, 3, 3, 3: 0.4 + 0.3 + 0.3 on one lane; 18: 6 runs of 3, 0.9 s.
    assert reranker.affordable([100] * 20, 0.99) == 18
    monkeypatch.setattr(reranker, "lanes", 1)
    assert reranker._cost([100] * 20) == pytest.approx(2.0)

    lanes: list[str] = []
    session = reranker._session
    # Each run waits for the other to begin: one after the other, the first would wait in vain.
    together = threading.Barrier(2, timeout=30)

    class Recorded:
        def run(self, *args):
            lanes.append(threading.current_thread().name)
            together.wait()
            return session.run(*args)

    monkeypatch.setattr(reranker, "lanes", 2)
    monkeypatch.setattr(reranker, "_session", Recorded())
    assert len(reranker._score_all("boats", ["a memory about boats and harbours"] * 8, threading.Event())) == 8
    assert len(set(lanes)) == 2 and all(name.startswith("rerank-lane") for name in lanes)


def test_opening_the_cross_encoder_prices_each_run_width(reranker):
    assert len(reranker.s_per_token) == reranker.max_tokens + 1
    assert all(price > 0 for price in reranker.s_per_token[1:])


def test_pricing_runs_hold_at_most_512_tokens_on_every_lane_at_once(reranker, monkeypatch):
    """Two rounds per width, each a run on both lanes; a wide width's run holds fewer rows (at
    least one), so the 512 width costs what the 128 width does, not four times it."""
    shapes: list[tuple[int, int]] = []
    session = reranker._session

    class Recorded:
        def run(self, names, feeds):
            shapes.append(feeds["input_ids"].shape)
            return session.run(names, feeds)

    monkeypatch.setattr(reranker, "_session", Recorded())
    monkeypatch.setattr(reranker, "s_per_token", reranker.s_per_token)  # both restored afterwards
    monkeypatch.setattr(reranker, "speed", reranker.speed)
    reranker._price()
    assert shapes == [(4, 32)] * 4 + [(4, 128)] * 4 + [(2, 256)] * 4 + [(1, 512)] * 4
    assert all(price > 0 for price in reranker.s_per_token[1:])


async def test_time_queued_behind_other_reranks_is_spent_from_the_budget(reranker):
    """A budget that scores all 20 alone scores only the first after waiting longer than it
    behind other work of the reranker's one thread."""
    texts = [f"memory {i} about boats and harbours and the sea, told at some length" for i in range(20)]
    assert len(await reranker.scores("boats", texts, timeout_s=30, budget_s=1.0)) == 20
    gate = threading.Event()
    busy = asyncio.get_running_loop().run_in_executor(reranker._executor, gate.wait)  # a rerank before it
    queued = asyncio.ensure_future(reranker.scores("boats", texts, timeout_s=30, budget_s=1.0))
    await asyncio.sleep(1.2)
    gate.set()
    await busy
    assert len(await queued) == 1


async def test_expansion_lifts_session_neighbours_within_the_scope_only(app):
    scope = {"user_id": "e"}
    q = await app.remember("Uma: what should I cook for the party?", scope=scope, session_id="s1", mode="sync")
    a = await app.remember("Vic: lasagne, everyone loves it", scope=scope, session_id="s1", mode="sync")
    lone = await app.remember("Vic: lasagne recipe from grandma", scope=scope, mode="sync")
    # The same session id in another scope is another conversation.
    await app.remember("Uma: cook something for the party", scope={"user_id": "other"}, session_id="s1", mode="sync")
    hits = {h["memory"]["id"]: h["components"] for h in await app.search("party cooking", scope=scope)}
    assert hits[a["memory_id"]]["expansion"] == pytest.approx(0.1 * hits[q["memory_id"]]["fused"])
    assert hits[q["memory_id"]]["expansion"] == pytest.approx(0.1 * hits[a["memory_id"]]["fused"])
    assert hits[lone["memory_id"]]["expansion"] == 0
    # A deleted neighbour lifts nobody and is not brought back.
    await app.forget(q["memory_id"])
    hits = {h["memory"]["id"]: h["components"] for h in await app.search("party cooking", scope=scope)}
    assert q["memory_id"] not in hits and hits[a["memory_id"]]["expansion"] == 0


async def test_each_candidates_neighbours_are_the_live_memories_around_it_in_its_session(app):
    """The neighbours read with the candidates' rows are the live memories just before and after
    each in its scope and session, by (created_at, id), whatever else is deleted, superseded,
    quarantined, filtered out or left out of the candidates, and whether or not the candidate
    itself is live; of those, recall keeps the ones among its candidates (only they can lift
    it), however many statements read them. The asked
    scope (user n1) spans two scopes that share session ids: neither's turns neighbour the other's."""
    rng = random.Random(5)
    for batch in range(3):  # one batch shares a write time: ties ordered by id
        for scope in ({"user_id": "n1"}, {"user_id": "n1", "agent_id": "a1"}, {"user_id": "n2"}):  # interleaved
            items = [{"content": f"turn {batch}-{i} of {'/'.join(scope.values())}", "scope": scope, "raw": True,
                      "session_id": rng.choice(["s1", "s2", "s3"]), "type": rng.choice(["note", "fact"])}
                     for i in range(rng.randint(8, 20))]
            assert (await app.post("/api/memory/remember/batch", {"items": items})).status_code == 200
    rows = await app.pool.fetch("SELECT id FROM memories WHERE user_id IN ('n1', 'n2')")
    for row in rng.sample(rows, 25):  # the states a neighbour must skip, set directly
        is_deleted, status = rng.choice([(True, "deleted"), (False, "superseded"), (False, "quarantined")])
        await app.pool.execute("UPDATE memories SET is_deleted = $2, status = $3 WHERE id = $1",
                               row["id"], is_deleted, status)
    table = await app.pool.fetch("SELECT id, scope_key, session_id, created_at, is_deleted, status, type"
                                 " FROM memories WHERE user_id IN ('n1', 'n2')")
    by_id = {r["id"]: r for r in table}
    n1 = {r["scope_key"] for r in await app.pool.fetch("SELECT scope_key FROM memories WHERE user_id = 'n1'")}
    assert len(n1) == 2

    def neighbour(c, before: bool):
        live = [r for r in table if (r["scope_key"], r["session_id"]) == (c["scope_key"], c["session_id"])
                and not r["is_deleted"] and r["status"] == "active"
                and ((r["created_at"], r["id"]) < (c["created_at"], c["id"])) == before and r["id"] != c["id"]]
        key = lambda r: (r["created_at"], r["id"])  # noqa: E731
        return (max(live, key=key) if before else min(live, key=key))["id"] if live else None

    for trial in range(40):
        asked = rng.sample([r["id"] for r in table], rng.randint(1, len(table))) + [uuid.uuid4()]
        filters = Filters(EVERYTHING, include_deleted=rng.random() < 0.5, type=rng.choice([None, None, "note"]))
        async with app.pool.acquire() as conn:
            read = await memories.candidate_rows(conn, asked, Scope(user_id="n1"), filters, np.zeros(384), "none",
                                                 neighbours=True)
        assert {r.id for r in read} == {i for i in asked if i in by_id and by_id[i]["scope_key"] in n1
                                        and (filters.include_deleted or not by_id[i]["is_deleted"])
                                        and by_id[i]["status"] != "quarantined"
                                        and (filters.type is None or by_id[i]["type"] == filters.type)}
        for r in read:
            c = by_id[r.id]
            assert (r.before, r.after) == (neighbour(c, True), neighbour(c, False)), (trial, r.id)
        # Read in two statements (as recall's legs read theirs), the candidates get the same
        # neighbours as read in one, and keep those that are candidates.
        returned = {r.id for r in read}
        half = len(asked) // 2
        async with app.pool.acquire() as conn:
            split = [r for part in (asked[:half], asked[half:]) for r in await memories.candidate_rows(
                conn, part, Scope(user_id="n1"), filters, np.zeros(384), "none", neighbours=True)]
        for c in candidates.from_rows(split, {}):
            want = tuple(n for n in (neighbour(by_id[c.id], True), neighbour(by_id[c.id], False)) if n in returned)
            assert c.around == want, (trial, c.id)


async def test_expansion_weight_zero_turns_it_off(make_app):
    async with make_app(expansion_weight=0) as app:
        for text in ("Wes: any plans?", "Xia: hiking on Saturday"):
            await app.remember(text, scope={"user_id": "w"}, session_id="s", mode="sync")
        hits = await app.search("weekend plans", scope={"user_id": "w"})
        assert all(h["components"]["expansion"] == 0 for h in hits)


@pytest.mark.parametrize("extra, fragment", [
    ({"rerank": "maybe"}, "rerank"),
    ({"rerank_top_n": 0}, "rerank_top_n"),
    ({"rerank_top_n": 500}, "less than or equal to 100"),
    ({"limit": -1}, "limit"),
    ({"explain": "please"}, "explain"),
])
async def test_bad_rerank_and_limit_values_are_422(app, extra, fragment):
    response = await app.post("/api/memory/search", {"query": "x", "scope": {"user_id": "u"}, **extra})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["type"] == "validation_error"
    assert fragment in response.json()["error"]["detail"]


async def test_rerank_asked_of_a_server_without_a_reranker_is_a_clear_422(make_app):
    async with make_app(rerank_model="none") as app:
        response = await app.post("/api/memory/search", {"query": "x", "scope": {"user_id": "u"}, "rerank": True})
        assert response.status_code == 422
        assert "ENGRAM_RERANK_MODEL" in response.json()["error"]["detail"]


def test_a_model_file_with_the_wrong_hash_stops_start_up_with_a_clear_message():
    with pytest.raises(ModelFileMismatch, match="all-MiniLM-L6-v2 .* has SHA-256 .*expected 0000"):
        Embedder.open(dataclasses.replace(minilm_files(), sha256="0" * 64))
    with pytest.raises(ModelFileMismatch, match="ms-marco-MiniLM-L-12-v2"):
        CrossEncoder.open(dataclasses.replace(ms_marco_files(), sha256="f" * 64))



async def test_a_dense_hit_outside_bm25s_top_candidates_keeps_its_true_bm25_score(make_app):
    """BM25 runs beside the query embedding, so it cannot know the dense hits: those outside its
    top `search_candidates` are scored in a second, narrow query, not left at 0."""
    async with make_app(search_candidates=2) as app:
        scope = {"user_id": "g"}
        texts = ["garden garden garden gnome", "garden gardens garden shed", "garden hose for the garden",
                 "Lena planted tomatoes, carrots and lettuce in her small garden this spring"]
        for text in texts:
            await app.remember(text, scope=scope, mode="sync", raw=True)
        query = "Which vegetables are growing in the garden?"
        full = {h["memory"]["content"]: h["components"]["bm25"] for h in await app.search(query, scope=scope, limit=10)}
        bm25_top2 = sorted(full, key=full.get, reverse=True)[:2]

        narrow = await app.search(query, scope=scope, limit=2)

        assert any(h["memory"]["content"] not in bm25_top2 for h in narrow), "no dense-only hit: the test proves nothing"
        for hit in narrow:
            assert hit["components"]["bm25"] == pytest.approx(full[hit["memory"]["content"]])


async def test_a_search_that_reranks_fuses_rerank_candidates_from_each_leg_and_one_that_does_not_fewer(make_app):
    async with make_app(search_candidates=2, rerank_candidates=4) as app:
        scope = {"user_id": "depth"}
        for text in ("Ada keeps bees", "Ada sells honey", "Ada's hives are blue", "Ada reads about bees",
                     "Ada's bees swarmed in May", "Ada wants more hives"):
            await app.remember(text, scope=scope, mode="sync", raw=True)
        depth = {}
        for rerank in (False, True):
            response = await app.post("/api/memory/search", {"query": "Ada bees hives honey", "scope": scope,
                                                             "limit": 1, "rerank": rerank, "rerank_top_n": 1,
                                                             "explain": True})
            assert response.status_code == 200, response.text
            explain = response.json()["explain"]
            depth[rerank] = (explain["dense"]["hits"], explain["fetch"]["lexical_hits"])
        assert depth == {False: (2, 2), True: (4, 4)}


@pytest.mark.parametrize("text, previous, seen", [
    ("Vic: yes, a dog", None, "Vic: yes, a dog"),
    ("Vic: yes, a dog", "Uma: any pets?", "Vic: yes, a dog (after: Uma: any pets?)"),
    # A shared header says nothing new; the cut falls on a word boundary.
    ("[8 May] Vic: yes", "[8 May] Val: pets?", "[8 May] Vic: yes (after: Val: pets?)"),
    ("[8 May] Vic: yes", "[8 May] ", "[8 May] Vic: yes"),
    ("same", "same", "same"),
    ("Vic: yes", "Uma: " + "very " * 200 + "long", "Vic: yes (after: Uma: " + ("very " * 200)[:495].strip() + ")"),
])
def test_the_reranker_reads_a_memory_after_the_one_it_answers(text, previous, seen):
    assert with_context(text, previous) == seen


async def test_concurrent_searches_cannot_exhaust_a_small_pool(make_app):
    """A search holds one pooled connection at a time, and reads the serving model's state
    without holding one: more searches than connections all finish."""
    async with make_app(postgres_pool_min=1, postgres_pool_max=2) as app:
        await app.remember("Quinn rows on the river at dawn", scope={"user_id": "pool"}, mode="sync")
        await asyncio.sleep(0.6)  # past the serving model's state refresh interval
        results = await asyncio.wait_for(asyncio.gather(*(
            app.search("rowing", scope={"user_id": "pool"}) for _ in range(8))), 30)
        assert all(len(hits) == 1 for hits in results)


async def test_a_search_takes_a_connection_per_leg_and_reads_its_results_on_the_dense_legs(app, monkeypatch):
    """Giving a connection back costs a round trip (engram.store.pool): the stale points and
    BM25's top are read on one connection, given back while the query is embedded, and one more
    reads BM25's candidates' rows; the dense hits' rows are read on a third, which reads the
    results too once the other leg is done. Here the embedding and the dense search are slowed,
    so each of those waits happens: three connections in all, the results taking none."""
    from engram.recall import candidates as candidates_module

    scope = {"user_id": "two-conns"}
    for text in ("Zane repairs old radios", "Zane's radio workshop is in the garage", "Zane collects valves"):
        await app.remember(text, scope=scope, mode="sync")
    embedder = app.runtime.spaces.space(app.settings.embedding_model).embedder
    embed, fresh = embedder.embed_query, candidates_module.fresh_dense

    async def slow_embedding(query):
        await asyncio.sleep(0.3)
        return await embed(query)

    async def slow_dense(*args):
        await asyncio.sleep(0.3)
        return await fresh(*args)

    taken = []
    acquire = asyncpg.Pool.acquire

    def counted(pool, *args, **kwargs):  # a Pool's attributes are slots: the class is patched
        files = [frame.filename for frame in traceback.extract_stack()]
        if (any(os.path.join("engram", "recall", "") in f for f in files)
                and not any(f.endswith("embedding_spaces.py") for f in files)):  # a due refresh of the model's state
            taken.append(traceback.extract_stack()[-2].name)
        return acquire(pool, *args, **kwargs)

    monkeypatch.setattr(embedder, "embed_query", slow_embedding)
    monkeypatch.setattr(candidates_module, "fresh_dense", slow_dense)
    monkeypatch.setattr(asyncpg.Pool, "acquire", counted)
    response = await app.post("/api/memory/search", {"query": "radio", "scope": scope, "explain": True})
    assert len(response.json()["results"]) == 3
    # Two hold the term: the third is a dense hit outside BM25's top.
    assert response.json()["explain"]["fetch"]["lexical_hits"] == 2
    assert taken == ["lexical_leg", "lexical_leg", "vector_leg"]


async def test_searches_queued_for_a_full_pool_all_finish_when_the_serving_model_is_due_for_a_re_read(make_app):
    """The serving model's state is re-read through the pool: a search must not hold a
    connection while it waits for that read, or a full pool deadlocks."""
    async with make_app(postgres_pool_min=2, postgres_pool_max=2) as app:
        scope = {"user_id": "pool"}
        await app.remember("Quinn rows on the river at dawn", scope=scope, mode="sync")
        await app.search("rowing", scope=scope)  # the key's lookup is reused for a second from here
        await asyncio.sleep(0.6)  # past the serving model's state refresh interval
        first, second = await app.pool.acquire(), await app.pool.acquire()
        searches = asyncio.gather(*(app.search("rowing", scope=scope) for _ in range(2)))
        await asyncio.sleep(0.1)
        await app.pool.release(first)
        await asyncio.sleep(0.1)
        await app.pool.release(second)
        results = await asyncio.wait_for(searches, 20)
        assert all(len(hits) == 1 for hits in results)


async def test_one_search_on_a_pool_of_one_finishes_when_the_serving_model_is_due_for_a_re_read(make_app):
    async with make_app(postgres_pool_min=1, postgres_pool_max=1) as app:
        scope = {"user_id": "pool"}
        await app.remember("Quinn rows on the river at dawn", scope=scope, mode="sync")
        await asyncio.sleep(0.6)
        assert len(await asyncio.wait_for(app.search("rowing", scope=scope), 20)) == 1


async def test_many_searches_on_a_pool_of_two_all_finish_while_each_reads_both_legs_rows(make_app):
    """Each leg reads its candidates' rows on a connection of its own, and the dense leg's is kept
    for the results only once the other leg is done: a leg holding one while the other waits for
    one would deadlock a full pool."""
    async with make_app(postgres_pool_min=2, postgres_pool_max=2) as app:
        scope = {"user_id": "pool2"}
        for text in ("Quinn rows on the river at dawn", "Quinn's rowing club meets on Sundays",
                     "The boathouse smells of varnish", "Oars hang above the lockers",
                     "A heron watches from the far bank", "The coach shouts split times"):
            await app.remember(text, scope=scope, mode="sync")
        queries = ["rowing", "river at dawn", "coach", "heron", "Quinn rows", "varnish"] * 3
        explained = [app.post("/api/memory/search", {"query": q, "scope": scope, "limit": 10, "explain": True})
                     for q in queries]
        answers = await asyncio.wait_for(asyncio.gather(*explained), 60)
        assert all(a.status_code == 200 and len(a.json()["results"]) == 6 for a in answers)
        # Both legs read rows: BM25's top and the dense hits outside it.
        assert all(a.json()["explain"]["fetch"]["lexical_hits"] > 0 and a.json()["explain"]["fetch"]["dense_hits"] == 6
                   for a in answers)


async def test_searches_waiting_on_a_slow_embedder_leave_the_pool_to_others(make_app, monkeypatch):
    async with make_app(postgres_pool_min=2, postgres_pool_max=2) as app:
        scope = {"user_id": "slow"}
        await app.remember("Quinn rows on the river at dawn", scope=scope, mode="sync")
        embedder = app.runtime.spaces.space(app.settings.embedding_model).embedder
        fast = embedder.embed_query

        async def slow(query):
            await asyncio.sleep(3)
            return await fast(query)

        monkeypatch.setattr(embedder, "embed_query", slow)
        searches = asyncio.gather(*(app.search("rowing", scope=scope) for _ in range(2)))
        await asyncio.sleep(0.5)
        assert await asyncio.wait_for(app.pool.fetchval("SELECT 1"), 1) == 1
        assert all(len(hits) == 1 for hits in await searches)


async def test_a_connection_lost_while_the_candidates_are_read_is_a_503_and_the_next_search_answers(app, monkeypatch):
    """The candidates' rows are read beside the BM25 scores of other hits: Postgres dropping
    that connection is still the 503 a client may retry, with the error body, not a 500."""
    from engram.store import memories

    stored = await app.remember("Yara keeps bees on the roof", scope={"user_id": "y"}, mode="sync")
    read = memories.candidate_rows

    async def dropped(conn, *args, **kwargs):
        await conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")  # the server ends this session
        return await read(conn, *args, **kwargs)

    monkeypatch.setattr(memories, "candidate_rows", dropped)
    response = await app.post("/api/memory/search", {"query": "bees", "scope": {"user_id": "y"}})
    assert response.status_code == 503, response.text
    assert response.json()["error"]["type"] == "database_unavailable"
    monkeypatch.undo()
    assert [h["memory"]["id"] for h in await app.search("bees", scope={"user_id": "y"})] == [stored["memory_id"]]
