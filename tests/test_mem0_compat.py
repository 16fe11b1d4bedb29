"""The mem0-compatible surface (api/mem0.py), driven by the real, unmodified mem0ai 2.2.1 client
against a running Engram on a loopback port: what a user who only changes `host` sees.

The sync `MemoryClient` blocks, and the server runs on this test's event loop, so its calls run
in a thread. mem0 reads MEM0_TELEMETRY and MEM0_DIR when it is imported: the `mem0` fixture sets
them first (telemetry off, its config in a temporary folder) and checks that they took.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import os
import uuid
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from tests.conftest import App, ollama_settings, serving
from tests.fakes.llm_server import FakeReply

REASON = "via the mem0-compatible API"
FACTS = {"facts": [{"content": "Alice hikes in the Alps", "type": "fact", "confidence": 0.9}],
         "entities": [], "category": "hobbies", "tags": ["hiking"]}


@pytest.fixture(scope="session")
def mem0(tmp_path_factory) -> SimpleNamespace:
    os.environ["MEM0_TELEMETRY"] = "False"
    os.environ["MEM0_DIR"] = str(tmp_path_factory.mktemp("mem0-home"))
    client = importlib.import_module("mem0.client.main")
    telemetry = importlib.import_module("mem0.memory.telemetry")
    assert telemetry.MEM0_TELEMETRY is False and telemetry.client_telemetry.posthog is None, "telemetry is on"
    assert importlib.metadata.version("mem0ai") == "2.2.1"
    return SimpleNamespace(MemoryClient=client.MemoryClient, AsyncMemoryClient=client.AsyncMemoryClient,
                           errors=importlib.import_module("mem0.exceptions"))


def call(fn, *args, **kwargs):
    """A blocking client call, off the loop the server runs on."""
    return asyncio.to_thread(fn, *args, **kwargs)


@pytest.fixture
async def host(app):
    async with serving(app) as url:
        yield url


@pytest.fixture
async def client(mem0, app, host):
    client = await call(mem0.MemoryClient, api_key=app.admin_key, host=host)
    yield client
    client.client.close()


async def add_raw(client, *texts: str, **entities) -> list[str]:
    answer = await call(client.add, [{"role": "user", "content": t} for t in texts], infer=False, **entities)
    assert [r["event"] for r in answer["results"]] == ["ADD"] * len(texts), answer
    return [r["id"] for r in answer["results"]]


async def engram_events(app: App, memory_id: str) -> list[dict]:
    response = await app.get(f"/api/memory/{memory_id}/history")
    assert response.status_code == 200, response.text
    return response.json()["events"]


async def deleted(app: App) -> int:
    return await app.count("SELECT count(*) FROM memories WHERE is_deleted")


async def test_the_client_connects_with_a_token_key_and_a_host_alone(mem0, app, host):
    client = await call(mem0.MemoryClient, api_key=app.admin_key, host=host + "/")
    try:
        assert client.org_id and client.project_id
        assert client.client.headers["Authorization"] == f"Token {app.admin_key}"
    finally:
        client.client.close()


async def test_add_stores_each_message_with_its_role_and_entities(client, app):
    answer = await call(client.add, [{"role": "user", "content": "I moved to Lisbon in May"},
                                     {"role": "assistant", "content": "Lisbon is lovely in spring", "name": "bot"},
                                     {"role": "system", "content": "you are a helpful assistant"}],
                        user_id="alice", run_id="chat-1", infer=False, metadata={"source": "chat"})
    assert [r["memory"] for r in answer["results"]] == ["I moved to Lisbon in May", "Lisbon is lovely in spring"]
    first, second = [await call(client.get, r["id"]) for r in answer["results"]]
    assert (first["memory"], first["user_id"], first["run_id"], first["agent_id"]) == (
        "I moved to Lisbon in May", "alice", "chat-1", None)
    assert first["metadata"] == {"role": "user", "source": "chat"}
    assert second["metadata"]["role"] == "assistant"
    assert (await app.get(f"/api/memory/{second['id']}")).json()["who"] == "bot"
    for result in answer["results"]:
        assert [(e["event"], e["path"]) for e in await engram_events(app, result["id"])] == [("ADD", "mem0")]
    assert await app.count("SELECT count(*) FROM memories") == 2, "the system message is not a memory"


async def test_add_extracts_by_default_and_not_with_infer_false(make_app, fake_llm, mem0):
    fake_llm.default = FakeReply.json(FACTS)
    async with make_app(**ollama_settings(fake_llm)) as app, serving(app) as host:
        client = await call(mem0.MemoryClient, api_key=app.admin_key, host=host)
        try:
            inferred = await call(client.add, "I love hiking in the Alps", user_id="alice")
            raw = await call(client.add, "I keep my boots in the hallway", user_id="alice", infer=False)
        finally:
            client.client.close()
        inferred_memory, raw_memory = [(await app.get(f"/api/memory/{a['results'][0]['id']}")).json()
                                       for a in (inferred, raw)]
    assert inferred["results"][0]["status"] == "processed"
    assert inferred_memory["extraction_status"] == "done"
    assert inferred_memory["extracted"]["facts"][0]["content"] == "Alice hikes in the Alps"
    assert raw_memory["extraction_status"] == "skipped"
    assert not any("boots in the hallway" in str(r.body) for r in fake_llm.chat_requests())


async def test_adding_a_known_text_again_answers_noop_with_the_memory_that_holds_it(client, app):
    (memory_id,) = await add_raw(client, "I am allergic to peanuts", user_id="alice")
    again = await call(client.add, [{"role": "user", "content": "I am allergic to peanuts"}], user_id="alice")
    assert [(r["event"], r["id"]) for r in again["results"]] == [("NOOP", memory_id)]
    assert await app.count("SELECT count(*) FROM memories") == 1


async def test_search_results_read_as_mem0_code_reads_them(client, app):
    tea, dog = await add_raw(client, "I drink green tea every morning", "My dog is called Rex", user_id="alice")
    await add_raw(client, "I drink black coffee every morning", user_id="bob")
    tagged = await app.remember("I cook vegetarian food", {"user_id": "alice"}, raw=True, tags=["food"])

    found = await call(client.search, "what does the user drink in the morning", filters={"user_id": "alice"},
                       top_k=5)
    results = found["results"]
    assert results[0]["id"] == tea and results[0]["memory"] == "I drink green tea every morning"
    assert {r["user_id"] for r in results} == {"alice"}, "bob's memory is in another scope"
    scores = [r["score"] for r in results]
    assert all(isinstance(s, float) for s in scores) and scores == sorted(scores, reverse=True)
    for r in results:
        assert datetime.fromisoformat(r["created_at"]) <= datetime.fromisoformat(r["updated_at"])
        assert isinstance(r["metadata"], dict) and isinstance(r["categories"], list)

    by_category = await call(client.search, "food", filters={"user_id": "alice", "categories": {"in": ["food"]}})
    assert [(r["id"], r["categories"]) for r in by_category["results"]] == [(tagged["memory_id"], ["food"])]
    top = await call(client.search, "my dog Rex", filters={"user_id": "alice"}, threshold=0.0)
    above = await call(client.search, "my dog Rex", filters={"user_id": "alice"}, threshold=top["results"][0]["score"])
    assert top["results"][0]["id"] == dog and [r["id"] for r in above["results"]] == [dog]
    fields = await call(client.search, "my dog Rex", filters={"user_id": "alice"}, fields=["id", "memory"])
    assert fields["results"][0] == {"id": dog, "memory": "My dog is called Rex"}


async def test_a_reranked_search_keeps_score_and_threshold_on_one_scale_and_adds_rerank_score(client, app):
    """As mem0 does: `score` is relevance before the rerank and `threshold` applies to it, so a
    cross-encoder logit (any real number) is never compared with it; the rerank orders the
    results and shows as `rerank_score`."""
    await add_raw(client, "Pia keeps bees in the garden", "Pia sells honey at the market",
                  "Pia's bees swarmed in May", "Quentin repairs bicycles", user_id="pia")
    plain = await call(client.search, "Pia's bees and honey", filters={"user_id": "pia"}, threshold=0.0)
    reranked = await call(client.search, "Pia's bees and honey", filters={"user_id": "pia"}, threshold=0.0,
                          rerank=True)
    by_id = {r["id"]: r["score"] for r in plain["results"]}
    assert {r["id"]: r["score"] for r in reranked["results"]} == by_id
    assert all("rerank_score" not in r for r in plain["results"])
    rerank_scores = [r["rerank_score"] for r in reranked["results"]]
    assert rerank_scores == sorted(rerank_scores, reverse=True)
    cut = sorted(by_id.values())[1]  # all but the least relevant
    above = await call(client.search, "Pia's bees and honey", filters={"user_id": "pia"}, threshold=cut, rerank=True)
    assert {r["id"] for r in above["results"]} == {i for i, score in by_id.items() if score >= cut}


async def test_the_threshold_leaves_memories_out_before_the_rerank_and_the_limit(client, app):
    """The rerank's favourite is below the threshold: with top_k 1 the answer is the best of
    those above it, not an empty list (the favourite taken, then dropped)."""
    await add_raw(client, "Rhea Rhea garden garden garden bees bees bees honey honey honey",
                  "Rhea keeps three hives at the bottom of her garden and sells their honey each autumn",
                  "Rhea's bees", "Honey from Rhea's garden bees", user_id="rhea")
    query = "does Rhea keep bees in her garden for honey?"
    plain = await call(client.search, query, filters={"user_id": "rhea"}, threshold=0.0)
    reranked = await call(client.search, query, filters={"user_id": "rhea"}, threshold=0.0, rerank=True)
    score = {r["id"]: r["score"] for r in plain["results"]}
    favourite = reranked["results"][0]["id"]
    above = [i for i in score if score[i] > score[favourite]]
    assert above, "the data must make the rerank favour a memory of lower relevance"
    threshold = min(score[i] for i in above)
    one = await call(client.search, query, filters={"user_id": "rhea"}, threshold=threshold, rerank=True, top_k=1)
    assert [r["id"] for r in one["results"]] == [next(r["id"] for r in reranked["results"] if r["id"] in above)]


async def test_get_all_selects_by_entity_and_pages(client):
    alice = await add_raw(client, *(f"alice's note number {i}" for i in range(5)), user_id="alice")
    with_bot = await add_raw(client, "alice told the bot her birthday", user_id="alice", agent_id="bot")
    await add_raw(client, "bob's note", user_id="bob")

    everything = await call(client.get_all, filters={"user_id": "alice"})
    assert everything["count"] == 6 and everything["next"] is None
    assert {m["id"] for m in everything["results"]} == set(alice + with_bot)
    both = await call(client.get_all, filters={"AND": [{"user_id": "alice"}, {"agent_id": "bot"}]})
    assert [m["id"] for m in both["results"]] == with_bot

    first = await call(client.get_all, filters={"user_id": "alice"}, page=1, page_size=4)
    second = await call(client.get_all, filters={"user_id": "alice"}, page=2, page_size=4)
    assert (len(first["results"]), first["next"] is not None, first["previous"]) == (4, True, None)
    assert (len(second["results"]), second["next"], second["count"]) == (2, None, 6)
    assert "page=1" in second["previous"]
    assert [m["id"] for m in first["results"] + second["results"]] == [m["id"] for m in everything["results"]]

    today = datetime.now(timezone.utc).date()
    since_yesterday = await call(client.get_all, filters={"user_id": "alice",
                                                          "created_at": {"gte": str(today - timedelta(days=1))}})
    from_tomorrow = await call(client.get_all, filters={"user_id": "alice",
                                                        "created_at": {"gte": str(today + timedelta(days=1))}})
    assert (len(since_yesterday["results"]), from_tomorrow["results"]) == (6, [])


async def test_get_returns_the_memory_and_an_unknown_id_is_not_found(client, mem0):
    (memory_id,) = await add_raw(client, "my locker is number 42", agent_id="gym-bot")
    memory = await call(client.get, memory_id)
    assert (memory["id"], memory["memory"], memory["agent_id"], memory["user_id"]) == (
        memory_id, "my locker is number 42", "gym-bot", None)
    for unknown in (str(uuid.uuid4()), "not-an-id"):
        with pytest.raises(mem0.errors.MemoryNotFoundError):
            await call(client.get, unknown)


async def test_update_changes_the_text_and_history_shows_the_mem0_reason_and_path(client, app):
    (memory_id,) = await add_raw(client, "I live in Paris", user_id="alice")
    updated = await call(client.update, memory_id, text="I live in Berlin")
    assert updated["memory"] == "I live in Berlin"
    assert (await call(client.get, memory_id))["memory"] == "I live in Berlin"
    found = await call(client.search, "where do I live", filters={"user_id": "alice"})
    assert [r["memory"] for r in found["results"]] == ["I live in Berlin"]
    await call(client.update, memory_id, metadata={"city": "Berlin"}, reason="the user said so")

    events = await engram_events(app, memory_id)
    assert [(e["event"], e["path"], e["reason"]) for e in events[1:]] == [
        ("UPDATE", "mem0", REASON), ("UPDATE", "mem0", "the user said so")]
    assert (events[1]["old_content"], events[1]["new_content"]) == ("I live in Paris", "I live in Berlin")
    assert (await call(client.get, memory_id))["metadata"] == {"city": "Berlin"}


async def test_delete_takes_the_memory_out_of_search_and_get(client, app, mem0):
    keep, gone = await add_raw(client, "the wifi password is hunter2", "the garage code is 4711", user_id="alice")
    answer = await call(client.delete, gone)
    assert "message" in answer
    found = await call(client.search, "garage code", filters={"user_id": "alice"})
    assert gone not in [r["id"] for r in found["results"]]
    with pytest.raises(mem0.errors.MemoryNotFoundError):
        await call(client.get, gone)
    with pytest.raises(mem0.errors.MemoryNotFoundError):
        await call(client.delete, gone)
    assert (await call(client.get, keep))["id"] == keep
    own = (await app.get(f"/api/memory/{gone}")).json()
    assert own["is_deleted"] and own["status"] == "deleted", "a soft delete, recoverable"
    assert [(e["event"], e["path"], e["reason"]) for e in await engram_events(app, gone)][-1] == (
        "DELETE", "mem0", REASON)


async def test_history_lists_each_change_with_old_and_new_text(client):
    (memory_id,) = await add_raw(client, "I play the violin", user_id="alice")
    await call(client.update, memory_id, text="I play the cello")
    await call(client.delete, memory_id)
    history = await call(client.history, memory_id)
    assert [(h["event"], h["old_memory"], h["new_memory"]) for h in history] == [
        ("ADD", None, "I play the violin"), ("UPDATE", "I play the violin", "I play the cello"),
        ("DELETE", "I play the cello", None)]
    assert {(h["memory_id"], h["user_id"], h["path"]) for h in history} == {(memory_id, "alice", "mem0")}
    assert [h["reason"] for h in history[1:]] == [REASON, REASON]


async def test_batch_update_changes_each_memory_and_a_missing_id_changes_none(client, app, mem0):
    a, b = await add_raw(client, "I like jazz", "I run on Sundays", user_id="alice")
    answer = await call(client.batch_update, [{"memory_id": a, "text": "I like blues"},
                                              {"memory_id": b, "metadata": {"sport": "running"}}])
    assert "message" in answer
    assert (await call(client.get, a))["memory"] == "I like blues"
    assert (await call(client.get, b))["metadata"] == {"sport": "running"}
    for memory_id in (a, b):
        assert [(e["event"], e["path"], e["reason"]) for e in await engram_events(app, memory_id)][-1] == (
            "UPDATE", "mem0", REASON)

    with pytest.raises(mem0.errors.MemoryNotFoundError):
        await call(client.batch_update, [{"memory_id": a, "text": "I like rock"},
                                         {"memory_id": str(uuid.uuid4()), "text": "nobody"}])
    assert (await call(client.get, a))["memory"] == "I like blues"


async def test_batch_delete_of_at_most_25_deletes_each_with_the_mem0_reason(client, app):
    ids = await add_raw(client, "note one", "note two", "note three", user_id="alice")
    answer = await call(client.batch_delete, [{"memory_id": m} for m in ids[:2]])
    assert "message" in answer
    assert {m["id"] for m in (await call(client.get_all, filters={"user_id": "alice"}))["results"]} == {ids[2]}
    for memory_id in ids[:2]:
        assert [(e["event"], e["path"], e["reason"]) for e in await engram_events(app, memory_id)][-1] == (
            "DELETE", "mem0", REASON)


async def test_a_batch_delete_above_the_threshold_previews_a_batch_forget_and_deletes_nothing(client, app, mem0):
    response = await app.post("/api/memory/remember/batch", {"items": [
        {"content": f"bulk note {i}", "scope": {"user_id": "alice"}, "raw": True} for i in range(26)]})
    assert response.status_code == 200, response.text
    ids = [r["memory_id"] for r in response.json()["results"]]
    with pytest.raises(mem0.errors.ValidationError) as refused:
        await call(client.batch_delete, [{"memory_id": m} for m in ids])
    assert refused.value.error_code == "HTTP_409" and "batch forget" in refused.value.message
    assert "nothing was deleted" in refused.value.message
    preview = refused.value.details["error"]["preview"]
    assert sorted(c["id"] for c in preview["candidates"]) == sorted(ids) and preview["needs_approval"] is True
    assert await deleted(app) == 0
    await call(client.batch_delete, [{"memory_id": m} for m in ids[:25]])
    assert await deleted(app) == 25


async def refusal(attempt, mem0) -> Exception:
    """The mem0 exception `attempt` (an awaitable) raises."""
    with pytest.raises(mem0.errors.MemoryError) as refused:
        await attempt
    return refused.value


async def test_deleting_entities_is_refused_and_deletes_nothing(client, app, mem0):
    await add_raw(client, "a memory alice keeps", user_id="alice")
    attempts = [(lambda: client.delete_users(user_id="alice"), "batch forget"),
                (client.reset, "listing entities is not offered")]
    for attempt, said in attempts:
        refused = await refusal(call(attempt), mem0)
        assert (refused.error_code, said in refused.message) == ("HTTP_501", True), refused.message
    assert await deleted(app) == 0 and await app.count("SELECT count(*) FROM memories") == 1


async def test_delete_all_previews_a_batch_forget_and_deletes_only_once_confirmed(client, app, mem0):
    await add_raw(client, "a memory alice keeps", user_id="alice")
    await add_raw(client, "another memory of alice", user_id="alice")
    await add_raw(client, "bob's own memory", user_id="bob")
    for attempt in (lambda: client.delete_all(user_id="alice"), lambda: client.delete_all(filters={"user_id": "alice"})):
        with pytest.raises(mem0.errors.ValidationError) as refused:
            await call(attempt)
        assert "nothing was deleted" in refused.value.message and refused.value.error_code == "HTTP_409"
    assert await deleted(app) == 0
    preview = refused.value.details["error"]["preview"]
    assert len(preview["candidates"]) == 2
    executed = await app.post(f"/api/memory/forget/{preview['operation_id']}/execute",
                              {"confirm_token": preview["confirm_token"]})
    assert executed.status_code == 200, executed.text
    deadline = asyncio.get_running_loop().time() + 30
    while await deleted(app) < 2:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.1)
    assert await app.count("SELECT count(*) FROM memories WHERE NOT is_deleted") == 1


async def test_a_memory_in_a_scope_the_key_may_not_touch_answers_as_a_missing_one(client, app, host, mem0):
    (alice,) = await add_raw(client, "alice's secret diary entry", user_id="alice")
    bob = await call(mem0.MemoryClient, api_key=await app.key("writer", ["user:bob"]), host=host)
    try:
        missing = str(uuid.uuid4())
        for attempt in (lambda m: bob.get(m), lambda m: bob.update(m, text="overwritten"), lambda m: bob.delete(m),
                        lambda m: bob.history(m), lambda m: bob.batch_delete([{"memory_id": m}])):
            foreign = await refusal(call(attempt, alice), mem0)
            unknown = await refusal(call(attempt, missing), mem0)
            assert type(foreign) is type(unknown) is mem0.errors.MemoryNotFoundError
            assert foreign.message.replace(alice, "<id>") == unknown.message.replace(missing, "<id>")
        searched = await refusal(call(bob.search, "diary", filters={"user_id": "alice"}), mem0)
        assert isinstance(searched, mem0.errors.AuthenticationError), "a 403: the key may not search there"
    finally:
        bob.client.close()
    assert (await call(client.get, alice))["memory"] == "alice's secret diary entry"
    assert [e["event"] for e in await engram_events(app, alice)] == ["ADD"]


async def test_a_bad_key_is_refused_at_connect_and_a_revoked_one_raises_authentication_error(app, host, mem0):
    with pytest.raises(ValueError, match="unknown or revoked API key"):
        await call(mem0.MemoryClient, api_key="engram_not-a-key", host=host)

    created = await app.post("/api/keys", {"name": "soon-revoked", "role": "writer", "scopes": ["*"]})
    assert created.status_code == 201, created.text
    client = await call(mem0.MemoryClient, api_key=created.json()["key"], host=host)
    reader = await call(mem0.MemoryClient, api_key=await app.key("reader"), host=host)
    try:
        await add_raw(client, "written before the revocation", user_id="alice")
        revoked = await app.http.delete(f"/api/keys/{created.json()['id']}",
                                        headers={"Authorization": f"Bearer {app.admin_key}"})
        assert revoked.status_code == 200, revoked.text
        with pytest.raises(mem0.errors.AuthenticationError, match="unknown or revoked API key"):
            await call(client.search, "revocation", filters={"user_id": "alice"})
        with pytest.raises(mem0.errors.AuthenticationError, match="may not remember"):
            await call(reader.add, "readers only read", user_id="alice")
    finally:
        client.client.close()
        reader.client.close()
    assert await app.count("SELECT count(*) FROM memories") == 1


async def test_unsupported_options_are_refused_by_name_and_store_nothing(client, app, mem0):
    (memory_id,) = await add_raw(client, "I prefer window seats", user_id="alice")
    refusals = [
        (lambda: client.add("from an app", app_id="my-app"), "app_id"),
        (lambda: client.search("seats", filters={"OR": [{"user_id": "alice"}, {"user_id": "bob"}]}), "OR"),
        (lambda: client.search("seats", filters={"agent_id": "x"}, metadata={"k": "v"}), "metadata"),
        (lambda: client.update(memory_id, expiration_date="2030-01-01"), "expiration_date"),
        (lambda: client.search("seats", filters={}), "user_id"),
    ]
    for attempt, named in refusals:
        refused = await refusal(call(attempt), mem0)
        assert isinstance(refused, mem0.errors.ValidationError) and named in refused.message, refused.message
    assert await app.count("SELECT count(*) FROM memories") == 1
    assert [e["event"] for e in await engram_events(app, memory_id)] == ["ADD"]


async def test_the_async_client_makes_a_round_trip(app, host, mem0):
    client = await call(mem0.AsyncMemoryClient, api_key=app.admin_key, host=host)
    try:
        added = await client.add([{"role": "user", "content": "my favourite colour is teal"}], user_id="carol",
                                 infer=False)
        (memory_id,) = [r["id"] for r in added["results"]]
        found = await client.search("favourite colour", filters={"user_id": "carol"})
        assert [r["id"] for r in found["results"]] == [memory_id]
        assert (await client.get(memory_id))["memory"] == "my favourite colour is teal"
        await client.delete(memory_id)
        with pytest.raises(mem0.errors.MemoryNotFoundError):
            await client.get(memory_id)
    finally:
        await client.async_client.aclose()
