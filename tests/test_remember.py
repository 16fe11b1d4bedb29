"""Remember through the HTTP gateway: the three modes, degradation, dedupe, idempotency, bad input."""

from __future__ import annotations

import asyncio

import pytest

from engram import group_commit
from tests.conftest import DEFAULT_MODEL, closed_port_url, ollama_settings
from tests.test_bm25_analyzer import assert_stats_equal_recount
from tests.fakes.llm_server import FakeReply

FACTS = {"facts": [{"content": "Alice hikes in the Alps", "type": "fact", "confidence": 0.9}],
         "entities": [{"source": "Alice", "relationship": "hikes_in", "target": "Alps", "confidence": 0.8}],
         "category": "hobbies", "tags": ["hiking"]}


async def test_sync_mode_waits_for_extraction_and_records_it(make_app, fake_llm):
    fake_llm.default = FakeReply.json(FACTS)
    async with make_app(**ollama_settings(fake_llm)) as app:
        answer = await app.remember("I love hiking in the Alps", mode="sync")
        assert answer["status"] == "processed" and answer["warnings"] == []
        memory = (await app.get(f"/api/memory/{answer['memory_id']}")).json()
        assert memory["extraction_status"] == "done"
        assert memory["extracted"]["facts"][0]["content"] == "Alice hikes in the Alps"
        assert memory["category"] == "hobbies"
        assert memory["extraction_model"] == "llama3.2:3b"
        assert memory["embedding_model"] == DEFAULT_MODEL
        events = await app.pool.fetch(
            "SELECT event, actor_id, provider, model, prompt_version FROM memory_history WHERE memory_id = $1 ORDER BY id",
            __import__("uuid").UUID(answer["memory_id"]))
        assert [e["event"] for e in events] == ["ADD", "UPDATE"]
        assert events[1]["provider"] == "ollama" and events[1]["prompt_version"]
        job = await app.job(answer["job_id"])
        assert job["status"] == "done" and job["attempt_count"] == 1 and job["outcome"] == "processed"
        # The memory text reached the provider inside its delimited block.
        assert any("I love hiking in the Alps" in str(r.body) for r in fake_llm.chat_requests())


async def test_async_mode_answers_queued_at_once_and_processes_later(make_app, fake_llm):
    fake_llm.default = FakeReply.delay(1.0, FakeReply.json(FACTS))
    async with make_app(**ollama_settings(fake_llm)) as app:
        answer = await app.remember("Bob prefers green tea", mode="async")
        assert answer["status"] == "queued" and answer["job_id"]
        job = await app.wait_job(answer["job_id"], "done")
        assert job["outcome"] == "processed"
        assert (await app.search("green tea"))[0]["memory"]["id"] == answer["memory_id"]


async def test_auto_mode_degrades_to_queued_on_a_slow_provider(make_app, fake_llm):
    fake_llm.default = FakeReply.delay(2.0, FakeReply.json(FACTS))
    async with make_app(**ollama_settings(fake_llm)) as app:
        answer = await app.remember("Carol plays the cello", mode="auto", pipeline_timeout_ms=300)
        assert answer["status"] == "queued"
        assert any(w.startswith("pipeline_timeout") for w in answer["warnings"])
        job = await app.wait_job(answer["job_id"], "done")
        assert job["outcome"] == "processed" and job["attempt_count"] == 1


async def test_no_provider_configured_processes_without_extraction(app):
    answer = await app.remember("Dana owns a red bicycle", mode="sync")
    assert answer["status"] == "processed"
    memory = (await app.get(f"/api/memory/{answer['memory_id']}")).json()
    assert memory["extraction_status"] == "skipped"
    assert memory["embedding_model"] == DEFAULT_MODEL


async def test_provider_down_saves_raw_searchable_and_parks_the_extraction(make_app):
    async with make_app(llm_provider="ollama", ollama_url=closed_port_url(),
                        extraction_backoff_initial_s=30, extraction_backoff_max_s=60) as app:
        answer = await app.remember("Erin is allergic to peanuts", mode="auto")
        assert answer["status"] == "raw_saved"
        assert any(w.startswith("provider_unavailable") for w in answer["warnings"])
        memory = (await app.get(f"/api/memory/{answer['memory_id']}")).json()
        assert memory["extraction_status"] == "unprocessed"
        assert memory["embedding_model"] == DEFAULT_MODEL
        hits = await app.search("food allergy")
        assert hits[0]["memory"]["id"] == answer["memory_id"]
        job = await app.wait_job(answer["job_id"], "parked")
        # An outage uses up no attempt and sets no timer: the drain takes the job when the provider answers.
        assert job["attempt_count"] == 0 and job["next_attempt_at"] is None
        assert job["last_error_code"] == "ProviderUnavailable"
        assert "unreachable" in job["last_error"]


async def test_extraction_retries_on_backoff_until_the_provider_recovers(make_app, fake_llm):
    fake_llm.script(FakeReply.status(500), FakeReply.malformed("{not json"))
    fake_llm.default = FakeReply.json(FACTS)
    async with make_app(**ollama_settings(fake_llm)) as app:
        answer = await app.remember("Frank moved to Lisbon", mode="auto")
        assert answer["status"] == "raw_saved"
        job = await app.wait_job(answer["job_id"], "done")
        # The 500 was an outage (no attempt used); the malformed answer used one; the success one.
        assert job["attempt_count"] == 2 and job["outcome"] == "raw_saved"
        memory = (await app.get(f"/api/memory/{answer['memory_id']}")).json()
        assert memory["extraction_status"] == "done"
        assert await app.count("SELECT count(*) FROM memory_history WHERE event = 'UPDATE'") == 1


async def test_extraction_gives_up_after_max_attempts_and_keeps_the_memory(make_app, fake_llm):
    fake_llm.default = FakeReply.malformed("{never json")
    async with make_app(**ollama_settings(fake_llm), extraction_max_attempts=2, extraction_backoff_initial_s=0.2) as app:
        answer = await app.remember("Gina collects stamps", mode="async")
        job = await app.wait_job(answer["job_id"], "dead")
        assert job["attempt_count"] == 2
        memory = (await app.get(f"/api/memory/{answer['memory_id']}")).json()
        assert memory["extraction_status"] == "failed"
        assert (await app.search("stamp collection"))[0]["memory"]["id"] == answer["memory_id"]


async def test_concurrent_identical_remembers_leave_one_row(app):
    answers = await asyncio.gather(*[app.remember("Hank's birthday is May 3rd", mode="async") for _ in range(20)])
    assert len({a["memory_id"] for a in answers}) == 1
    assert await app.count("SELECT count(*) FROM memories") == 1
    assert await app.count("SELECT count(*) FROM memory_jobs") == 1
    assert sum("duplicate" in " ".join(a["warnings"]) for a in answers) == 19


async def test_exact_duplicates_collapse_per_scope_only(app):
    first = await app.remember("Likes   jazz ", scope={"user_id": "a"}, mode="async")
    same = await app.remember("likes jazz", scope={"user_id": "a"}, mode="async")
    other = await app.remember("likes jazz", scope={"user_id": "b"}, mode="async")
    assert same["memory_id"] == first["memory_id"]
    assert other["memory_id"] != first["memory_id"]


async def test_idempotent_replay_returns_the_same_answer_and_writes_nothing_twice(app):
    body = dict(mode="sync", idempotency_key="req-1")
    first = await app.remember("Ivy works at the bakery", **body)
    again = await app.remember("Ivy works at the bakery", **body)
    assert again == first
    assert await app.count("SELECT count(*) FROM memories") == 1
    assert await app.count("SELECT count(*) FROM memory_history") == 1
    concurrent = await asyncio.gather(*[app.remember("Jack sails on weekends", mode="async",
                                                     idempotency_key="req-2") for _ in range(10)])
    assert len({a["memory_id"] for a in concurrent}) == 1
    assert await app.count("SELECT count(*) FROM memories") == 2


async def test_idempotency_key_reused_for_another_request_is_a_conflict(app):
    await app.remember("Kim drinks coffee", idempotency_key="k", mode="async")
    response = await app.post("/api/memory/remember", {"content": "Kim drinks tea", "scope": {"user_id": "u1"},
                                                       "idempotency_key": "k"})
    assert response.status_code == 409
    assert response.json()["error"]["type"] == "conflict"
    assert await app.count("SELECT count(*) FROM memories") == 1


@pytest.mark.parametrize("body, fragment", [
    ({"content": "", "scope": {"user_id": "u"}}, "at least 1 character"),
    ({"content": "   \n ", "scope": {"user_id": "u"}}, "empty"),
    ({"content": "x" * 40_000, "scope": {"user_id": "u"}}, "at most 32000 characters"),
    ({"content": "hello"}, "scope"),
    ({"content": "hello", "scope": {}}, "at least one"),
    ({"content": "hello", "scope": {"user_id": "u"}, "colour": "red"}, "colour"),
    ({"content": "hello", "scope": {"user_id": "u", "tenant": "x"}}, "tenant"),
    ({"content": "hello", "scope": {"user_id": "u"}, "mode": "eventually"}, "mode"),
    ({"content": "hello", "scope": {"user_id": "u"}, "pipeline_timeout_ms": 10_000_000}, "less than or equal to 30000"),
    ({"content": "hello", "scope": {"user_id": "u"}, "importance": 7}, "importance"),
    ({"content": 42, "scope": {"user_id": "u"}}, "content"),
])
async def test_bad_remember_input_is_a_clear_422_and_writes_nothing(app, body, fragment):
    response = await app.post("/api/memory/remember", body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "validation_error"
    assert fragment in error["detail"]
    assert await app.count("SELECT count(*) FROM memories") == 0


async def test_malformed_json_body_is_a_422(app):
    response = await app.http.post("/api/memory/remember", content=b"{not json",
                                   headers={"Authorization": f"Bearer {app.admin_key}",
                                            "content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["error"]["type"] == "validation_error"


async def test_missing_or_unknown_key_is_401_and_foreign_scope_is_403(app):
    body = {"content": "secret", "scope": {"user_id": "alice"}}
    assert (await app.http.post("/api/memory/remember", json=body)).status_code == 401
    unknown = await app.http.post("/api/memory/remember", json=body, headers={"Authorization": "Bearer nope"})
    assert unknown.status_code == 401 and unknown.json()["error"]["type"] == "unauthenticated"
    bob = await app.key("writer", ["user:bob"])
    denied = await app.post("/api/memory/remember", body, key=bob)
    assert denied.status_code == 403 and denied.json()["error"]["type"] == "forbidden"
    reader = await app.key("reader", ["user:alice"])
    assert (await app.post("/api/memory/remember", body, key=reader)).status_code == 403
    assert await app.count("SELECT count(*) FROM memories") == 0
    allowed = await app.post("/api/memory/remember", {**body, "mode": "async"}, key=await app.key("writer", ["user:alice"]))
    assert allowed.status_code == 200


async def test_the_callers_request_id_is_echoed_and_recorded_on_the_add_event_and_one_is_made_up_otherwise(
        app, caplog):
    caplog.set_level("INFO", logger="engram.http")
    body = {"content": "Nadia repairs clocks", "scope": {"user_id": "u1"}, "mode": "async"}
    given = await app.http.post("/api/memory/remember", json=body,
                                headers={**app._auth(None), "X-Request-ID": "trace-7f3a"})
    assert given.status_code == 200 and given.headers["x-request-id"] == "trace-7f3a"
    made_up = await app.post("/api/memory/remember", {**body, "content": "Nadia repairs watches"})
    assert made_up.status_code == 200 and len(made_up.headers["x-request-id"]) == 36  # a UUID
    refused = await app.http.post("/api/memory/remember", json=body, headers={"X-Request-ID": "trace-401"})
    assert refused.status_code == 401 and refused.headers["x-request-id"] == "trace-401"

    recorded = await app.pool.fetch("SELECT m.content, h.request_id FROM memory_history h JOIN memories m"
                                    " ON m.id = h.memory_id WHERE h.event = 'ADD'")
    assert {r["content"]: r["request_id"] for r in recorded} == {
        "Nadia repairs clocks": "trace-7f3a", "Nadia repairs watches": made_up.headers["x-request-id"]}
    logged = {(r.request_id, r.status) for r in caplog.records if r.getMessage() == "request"}
    assert {("trace-7f3a", 200), ("trace-401", 401)} <= logged


async def _held_back(app, bodies: list[dict]) -> list:
    """`bodies` remembered at once while a lock keeps every group-commit lane waiting, so the
    ones beyond the lanes queue up and are written as one group when the lock goes."""
    group = app.runtime.service._group
    async with app.pool.acquire() as blocker:
        held = blocker.transaction()
        await held.start()
        await blocker.execute("LOCK TABLE memory_jobs IN EXCLUSIVE MODE")  # every remember writes a job
        calls = [asyncio.create_task(app.post("/api/memory/remember", body)) for body in bodies]
        async with asyncio.timeout(30):
            while group.waiting + group.in_flight < len(bodies):
                await asyncio.sleep(0.01)
        await held.rollback()
    return await asyncio.gather(*calls)


async def test_concurrent_remembers_share_a_transaction_and_keep_their_own_attribution(app):
    group = app.runtime.service._group
    before = group.groups
    bodies = [{"content": f"Note {i}: the meeting moved to room {i}", "scope": {"user_id": f"team-{i % 3}"},
               "mode": "async"} for i in range(24)]
    bodies.append(dict(bodies[5]))  # the same memory twice in one group: one row, the other a duplicate
    responses = await _held_back(app, bodies)
    assert [r.status_code for r in responses] == [200] * len(bodies), [r.text for r in responses]
    answers = [r.json() for r in responses]
    assert group.groups > before  # 25 writes, 4 lanes: at least one transaction wrote several
    assert answers[-1]["memory_id"] == answers[5]["memory_id"]
    assert sorted("duplicate" in " ".join(a["warnings"]) for a in (answers[5], answers[-1])) == [False, True]
    assert len({a["memory_id"] for a in answers}) == 24
    assert await app.count("SELECT count(*) FROM memories") == 24
    assert await app.count("SELECT count(*) FROM memory_jobs WHERE job_type = 'extract'") == 24
    # Each ADD event names the request that wrote it, though many shared one transaction.
    events = {str(r["memory_id"]): r["request_id"] for r in await app.pool.fetch(
        "SELECT memory_id, request_id FROM memory_history WHERE event = 'ADD'")}
    written_by = {events[a["memory_id"]] for a in answers}
    assert written_by <= {r.headers["x-request-id"] for r in responses} and len(written_by) == 24
    for response, answer in zip(responses, answers):
        if "duplicate" not in " ".join(answer["warnings"]):
            assert events[answer["memory_id"]] == response.headers["x-request-id"]
    await assert_stats_equal_recount(app.pool)
    for answer in answers[:24]:
        assert (await app.wait_job(answer["job_id"], "done"))["outcome"] == "processed"


async def test_a_remember_refused_inside_a_group_fails_alone_and_the_rest_are_stored(app):
    # One lane: while the first write waits for the lock, every other one queues behind it, the
    # two refused ones among them.
    group = app.runtime.service._group = group_commit.GroupCommit(app.pool, lanes=1)
    await app.remember("Kim drinks coffee", idempotency_key="taken", mode="async")
    bodies = [{"content": f"Fact {i} about the garden", "scope": {"user_id": "u1"}, "mode": "async"}
              for i in range(12)]
    bodies.insert(6, {"content": "Kim drinks tea", "scope": {"user_id": "u1"}, "idempotency_key": "taken"})
    # Refused after its idempotency key was claimed in the group's transaction: the key must not stay bound.
    bodies.insert(9, {"content": "The lease ends soon", "scope": {"user_id": "u1"}, "idempotency_key": "fresh",
                      "expires_at": "2001-01-01T00:00:00Z"})
    responses = await _held_back(app, bodies)
    statuses = [r.status_code for r in responses]
    assert statuses[6] == 409 and responses[6].json()["error"]["type"] == "conflict"
    assert statuses[9] == 422 and "has passed" in responses[9].json()["error"]["detail"]
    assert statuses.count(200) == 12
    assert group.retried_alone == 2 and group.groups >= 1  # each refused one alone, the rest together
    assert await app.count("SELECT count(*) FROM memories") == 13
    assert await app.count("SELECT count(*) FROM idempotency_keys WHERE key = 'fresh'") == 0
    again = await app.remember("The lease ends soon", idempotency_key="fresh", mode="async")
    assert again["status"] == "queued"
    await assert_stats_equal_recount(app.pool)
