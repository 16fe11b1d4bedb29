"""Provenance, trust and lifetimes through the HTTP and mem0 gateways: every memory records how
far its source is trusted (its source type's class, the lower of a relayed one's origin), who
wrote it and through which agents; an UNTRUSTED memory's confidence is capped at 0.5, and a fact
is as trusted as the least trusted memory that says it. Types give lifetimes: an expired memory
leaves default recall, is never deleted for it, and `include_expired` still finds it. The clock
the service reads is moved, not waited for. Real Postgres, Temporal and index; the model is the
scripted fake where the write pipeline runs.

(Writes that wait for approval, a FACT from an UNTRUSTED source and any LEARNED, are
tests/test_approvals.py's: an UNTRUSTED memory here is a preference, which does not wait.)"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from engram.domain import auth
from tests.conftest import ollama_settings
from tests.fakes.llm_server import FakeReply
from tests.test_write_pipeline import facts_of, remembered

KIM = {"user_id": "kim"}
LEE = {"user_id": "lee"}
HOUR, DAY, MINUTE = timedelta(hours=1), timedelta(days=1), timedelta(minutes=1)
OAT_MILK = "User drinks oat milk"


@pytest.fixture
async def pipeline(make_app, fake_llm):
    async with make_app(**ollama_settings(fake_llm)) as app:
        yield app


async def memory(app, memory_id) -> dict:
    response = await app.get(f"/api/memory/{memory_id}")
    assert response.status_code == 200, response.text
    return response.json()


async def key_id(app, key: str) -> str:
    """The principal id a key's writes record: key:<its uuid>."""
    return f"key:{await app.pool.fetchval('SELECT id FROM api_keys WHERE key_hash = $1', auth.hash_key(key))}"


def move_clock(app, by: timedelta) -> None:
    """The service's "now" is `by` from the real one (lifetimes are computed and compared with it)."""
    app.runtime.service.clock = lambda: datetime.now(timezone.utc) + by


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def refused(response, status: int = 422) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"type", "detail"}, error
    return error


async def listed(app, scope: dict = KIM, **params) -> set[str]:
    response = await app.get("/api/memory", **scope, limit=100, **params)
    assert response.status_code == 200, response.text
    return {m["id"] for m in response.json()["items"]}


async def found(app, query: str, scope: dict = KIM, **fields) -> set[str]:
    return {h["memory"]["id"] for h in await app.search(query, scope=scope, limit=50, **fields)}


async def mem0_found(app, query: str, user_id: str = "kim", **body) -> set[str]:
    response = await app.post("/v3/memories/search/", {"query": query, "user_id": user_id, "top_k": 50, **body})
    assert response.status_code == 200, response.text
    return {r["id"] for r in response.json()["results"]}


async def mem0_all(app, user_id: str = "kim", **body) -> dict[str, dict]:
    response = await app.post("/v3/memories/", {"user_id": user_id, **body})
    assert response.status_code == 200, response.text
    return {r["id"]: r for r in response.json()["results"]}


# -- trust and provenance on write --------------------------------------------------------------

async def test_trust_is_the_source_types_class_and_an_origin_can_only_lower_it(app):
    writer = await app.key("writer")
    cases = [  # (source_type, origin's source_type, trust)
        ("user", None, "TRUSTED"), ("operator", None, "TRUSTED"),
        ("agent", None, "SEMI_TRUSTED"), ("tool", None, "SEMI_TRUSTED"),
        ("web", None, "UNTRUSTED"), ("email", None, "UNTRUSTED"),
        ("crm", None, "SEMI_TRUSTED"), (None, None, "SEMI_TRUSTED"),  # unlisted, and none: the default
        ("agent", "web", "UNTRUSTED"), ("user", "agent", "SEMI_TRUSTED"),
        ("web", "user", "UNTRUSTED"),  # a trusted origin does not raise a relay's trust
    ]
    written = []
    for n, (source_type, origin_type, _) in enumerate(cases):
        fields = {"type": "preference", "mode": "async"}
        if source_type is not None:
            fields["source_type"] = source_type
        if origin_type is not None:
            fields["origin"] = {"source_type": origin_type, "source_id": f"https://example.org/{n}"}
        response = await app.post("/api/memory/remember", {"content": f"Kim likes colour number {n}", "scope": KIM,
                                                           **fields}, key=writer)
        assert response.status_code == 200, response.text
        written.append(response.json()["memory_id"])
    got = [(m["source_type"], (m["origin"] or {}).get("source_type"), m["trust"])
           for m in [await memory(app, i) for i in written]]
    assert got == cases


async def test_a_memory_records_its_writer_its_agents_and_its_origin(app):
    writer = await app.key("writer")
    response = await app.post("/api/memory/remember", {
        "content": "The vendor's status page says the API is deprecated in June", "scope": KIM, "type": "context",
        "source_type": "agent", "origin": {"source_type": "web", "source_id": "https://status.example.com"},
        "agent_chain": ["planner", "researcher"], "mode": "async"}, key=writer)
    assert response.status_code == 200, response.text
    m = await memory(app, response.json()["memory_id"])
    writer_id = await key_id(app, writer)
    assert m["created_by"] == writer_id
    assert m["agent_chain"] == ["planner", "researcher", writer_id]
    assert m["origin"] == {"source_type": "web", "source_id": "https://status.example.com"}
    assert (m["trust"], m["memory_type"], m["approval"]) == ("UNTRUSTED", "CONTEXT", None)
    # With no chain and no origin: the writing key alone, and no origin.
    plain = await memory(app, (await app.remember("Kim uses a standing desk", scope=KIM, mode="async"))["memory_id"])
    assert plain["agent_chain"] == [plain["created_by"]] and plain["created_by"].startswith("key:")
    assert plain["origin"] is None


async def test_the_trust_sources_setting_replaces_the_default_classes(make_app):
    async with make_app(trust_sources={"crm": "TRUSTED", "scraper": "UNTRUSTED"}) as app:
        trust = {}
        for source_type in ("crm", "scraper", "web", "user"):
            answer = await app.remember(f"Kim's account note from {source_type}", scope=KIM, type="preference",
                                        source_type=source_type, mode="async")
            trust[source_type] = (await memory(app, answer["memory_id"]))["trust"]
    # web and user are no longer listed: they take trust_default.
    assert trust == {"crm": "TRUSTED", "scraper": "UNTRUSTED", "web": "SEMI_TRUSTED", "user": "SEMI_TRUSTED"}


async def test_memory_type_is_asked_for_or_named_by_the_type_label(app):
    cases = [  # (type label, memory_type asked, memory_type stored)
        ("preference", None, "PREFERENCE"), ("pattern", None, "PATTERN"), ("context", None, "CONTEXT"),
        ("state", None, "STATE"), ("decision", None, "DECISION"), ("plan", None, "DECISION"),
        ("note", None, "FACT"), ("fact", None, "FACT"), ("note", "PREFERENCE", "PREFERENCE"),
    ]
    stored = []
    for n, (label, asked, _) in enumerate(cases):
        fields = {"memory_type": asked} if asked else {}
        answer = await app.remember(f"Kim's typed note number {n}", scope=KIM, type=label, mode="async", **fields)
        stored.append((await memory(app, answer["memory_id"]))["memory_type"])
    assert stored == [expected for _, _, expected in cases]


# -- confidence -------------------------------------------------------------------------------

async def test_untrusted_confidence_is_capped_at_half_on_write_and_on_each_fact_taken_from_it(pipeline, fake_llm):
    web = await pipeline.remember("Kim likes dark mode", scope=KIM, source_type="web", type="preference",
                                  confidence=0.9, raw=True, mode="async")
    user = await pipeline.remember("Kim likes light mode", scope=KIM, source_type="user", type="preference",
                                   confidence=0.9, raw=True, mode="async")
    assert (await memory(pipeline, web["memory_id"]))["confidence"] == 0.5
    assert (await memory(pipeline, user["memory_id"]))["confidence"] == pytest.approx(0.9)

    source = await remembered(pipeline, fake_llm, "forum post: Kim reads sci-fi and plays chess",
                              "User reads science fiction", "User plays chess", scope=KIM, source_type="web",
                              type="preference", origin={"source_type": "web", "source_id": "forum-77"},
                              agent_chain=["crawler"])
    facts = [await memory(pipeline, f["id"]) for f in await facts_of(pipeline, source["memory_id"])]
    assert sorted(f["content"] for f in facts) == ["User plays chess", "User reads science fiction"]
    raw = await memory(pipeline, source["memory_id"])
    for fact in facts:  # the extraction said 0.9 for each
        assert (fact["trust"], fact["confidence"], fact["status"]) == ("UNTRUSTED", 0.5, "active")
        assert fact["origin"] == {"source_type": "web", "source_id": "forum-77"}
        assert fact["agent_chain"] == [*raw["agent_chain"], "system:pipeline"]
        assert fact["agent_chain"][0] == "crawler"
        # An UNTRUSTED source nobody approved gives its facts its own type: none of them is a FACT
        # that skipped approval. A PREFERENCE passes on no lifetime.
        assert (fact["memory_type"], fact["expires_at"]) == ("PREFERENCE", None)


async def test_facts_of_a_passing_memory_share_its_type_and_lifetime(pipeline, fake_llm):
    source = await remembered(pipeline, fake_llm, "Kim usually reviews pull requests after lunch",
                              "User reviews pull requests after lunch", scope=KIM, source_type="agent",
                              type="pattern")
    raw = await memory(pipeline, source["memory_id"])
    [fact] = [await memory(pipeline, f["id"]) for f in await facts_of(pipeline, source["memory_id"])]
    assert (fact["memory_type"], fact["trust"], fact["confidence"]) == ("PATTERN", "SEMI_TRUSTED", pytest.approx(0.9))
    assert raw["expires_at"] is not None and fact["expires_at"] == raw["expires_at"]


# -- the lowest trust of a fact's sources --------------------------------------------------------

async def test_a_fact_takes_the_lowest_trust_of_every_memory_that_restates_it(pipeline, fake_llm):
    async def restated(text: str, **fields) -> dict:
        await remembered(pipeline, fake_llm, text, OAT_MILK, scope=KIM, **fields)
        rows = await pipeline.pool.fetch("SELECT id FROM memories WHERE kind = 'fact'")
        assert len(rows) == 1, "a restatement must merge onto the fact, not add another"
        return await memory(pipeline, rows[0]["id"])

    fact = await restated("I drink oat milk in my coffee", source_type="user")
    assert (fact["trust"], fact["confidence"]) == ("TRUSTED", pytest.approx(0.9))
    trusted_only = await found(pipeline, "oat milk", filters={"kind": "fact", "trust": ["TRUSTED"]})
    assert trusted_only == {fact["id"]}

    fact = await restated("the assistant noted: Kim takes oat milk", source_type="agent")
    assert (fact["trust"], fact["confidence"]) == ("SEMI_TRUSTED", pytest.approx(0.9))

    fact = await restated("a blog says Kim only drinks oat milk", source_type="web", type="preference")
    assert (fact["trust"], fact["confidence"]) == ("UNTRUSTED", 0.5)

    fact = await restated("Kim again: yes, oat milk please", source_type="user")
    assert (fact["trust"], fact["confidence"]) == ("UNTRUSTED", 0.5), "a trusted source must not raise it back"
    assert len(fact["derived_from"]) == 4
    assert fake_llm.decision_requests() == [], "a near-duplicate is merged without asking the model"
    # Recall sees the lowered trust: the fact left the TRUSTED filter and meets the UNTRUSTED one.
    assert fact["id"] not in await found(pipeline, "oat milk", filters={"kind": "fact", "trust": ["TRUSTED"]})
    assert fact["id"] in await found(pipeline, "oat milk", filters={"kind": "fact", "trust": ["UNTRUSTED"]})


async def test_an_untrusted_sources_update_of_a_trusted_fact_becomes_a_review(pipeline, fake_llm):
    paris = await remembered(pipeline, fake_llm, "I live in Paris", "User lives in Paris", scope=KIM,
                             source_type="user")
    [lives] = await facts_of(pipeline, paris["memory_id"])
    berlin = await remembered(pipeline, fake_llm, "scraped profile: Kim moved to Berlin", "User lives in Berlin",
                              scope=KIM, source_type="web", type="preference", decisions=FakeReply.decisions(
                                  {"action": "UPDATE", "target": 1, "content": "User lives in Berlin",
                                   "confidence": 0.95, "reason": "the user moved"}))
    assert fake_llm.decision_requests(), "the model was asked, and answered UPDATE"
    kept = await memory(pipeline, lives["id"])
    assert (kept["content"], kept["version"], kept["trust"], kept["confidence"]) == (
        "User lives in Paris", 1, "TRUSTED", pytest.approx(0.9))
    assert kept["derived_from"] == [paris["memory_id"]]
    [review] = (await pipeline.get("/api/reviews")).json()["items"]
    assert review["existing"]["id"] == str(lives["id"]) and review["new"]["content"] == "User lives in Berlin"
    assert "UNTRUSTED source" in review["reason"]
    [new] = await facts_of(pipeline, berlin["memory_id"])
    assert (await memory(pipeline, new["id"]))["trust"] == "UNTRUSTED"
    last = await pipeline.pool.fetchrow("SELECT action, outcome FROM memory_decisions ORDER BY id DESC LIMIT 1")
    assert (last["action"], last["outcome"]) == ("CONTRADICT", "review_needed")


# -- filters ----------------------------------------------------------------------------------

async def test_trust_confidence_and_type_filters_on_search_list_and_mem0(app):
    async def teal(content: str, **fields) -> str:
        return (await app.remember(content, scope=KIM, mode="sync", **fields))["memory_id"]

    trusted = await teal("Kim's favourite colour is teal", source_type="user", type="preference", confidence=0.9)
    semi = await teal("Kim decided to paint the office teal", source_type="agent", memory_type="DECISION",
                      confidence=0.7)
    untrusted = await teal("Kim's teal car was featured online", source_type="web", type="preference",
                           confidence=0.9)  # capped: 0.5
    unsure = await teal("Kim owns a teal bicycle", source_type="user", confidence=0.4)
    everything = {trusted, semi, untrusted, unsure}
    assert await found(app, "teal") == everything

    async def searched(**filters) -> set[str]:
        return await found(app, "teal", filters=filters)

    assert await searched(trust=["TRUSTED"]) == {trusted, unsure}
    assert await searched(trust=["SEMI_TRUSTED", "UNTRUSTED"]) == {semi, untrusted}
    assert await searched(min_confidence=0.6) == {trusted, semi}
    assert await searched(trust=["TRUSTED"], min_confidence=0.6) == {trusted}
    assert await searched(memory_type=["DECISION"]) == {semi}
    assert await searched(memory_type=["PREFERENCE", "FACT"]) == {trusted, untrusted, unsure}

    assert await listed(app) == everything
    assert await listed(app, trust=["SEMI_TRUSTED", "UNTRUSTED"]) == {semi, untrusted}
    assert await listed(app, min_confidence=0.6) == {trusted, semi}
    assert await listed(app, trust="TRUSTED", min_confidence=0.6) == {trusted}
    assert await listed(app, memory_type="DECISION") == {semi}

    assert await mem0_found(app, "teal", filters={"trust": "TRUSTED"}) == {trusted, unsure}
    assert await mem0_found(app, "teal", filters={"trust": ["SEMI_TRUSTED", "UNTRUSTED"]}) == {semi, untrusted}
    assert await mem0_found(app, "teal", filters={"trust": {"in": ["UNTRUSTED"]}}) == {untrusted}
    assert await mem0_found(app, "teal", filters={"confidence": {"gte": 0.6}}) == {trusted, semi}
    assert set(await mem0_all(app)) == everything
    assert set(await mem0_all(app, filters={"trust": "TRUSTED", "confidence": {"gte": 0.6}})) == {trusted}
    assert set(await mem0_all(app, filters={"AND": [{"user_id": "kim"}, {"trust": {"in": ["UNTRUSTED"]}}]})) == {
        untrusted}


async def test_bad_trust_confidence_and_type_filters_are_refused(app):
    await app.remember("Kim's favourite colour is teal", scope=KIM, mode="async")
    search = "/api/memory/search"
    for response in [
        await app.post(search, {"query": "teal", "scope": KIM, "filters": {"trust": ["SORT_OF_TRUSTED"]}}),
        await app.post(search, {"query": "teal", "scope": KIM, "filters": {"trust": []}}),
        await app.post(search, {"query": "teal", "scope": KIM, "filters": {"min_confidence": 2}}),
        await app.post(search, {"query": "teal", "scope": KIM, "filters": {"min_confidence": -0.1}}),
        await app.post(search, {"query": "teal", "scope": KIM, "filters": {"memory_type": ["OPINION"]}}),
        await app.get("/api/memory", **KIM, trust="SORT_OF_TRUSTED"),
        await app.get("/api/memory", **KIM, min_confidence=2),
        await app.get("/api/memory", **KIM, memory_type="OPINION"),
        await app.post("/v3/memories/search/", {"query": "teal", "user_id": "kim",
                                                "filters": {"trust": "SORT_OF_TRUSTED"}}),
        await app.post("/v3/memories/search/", {"query": "teal", "user_id": "kim",
                                                "filters": {"confidence": {"gte": 2}}}),
        await app.post("/v3/memories/", {"user_id": "kim", "filters": {"confidence": {"lt": 0.5}}}),
        await app.post("/v3/memories/", {"user_id": "kim", "filters": {"trust": 3}}),
    ]:
        refused(response)


async def test_min_confidence_includes_a_memory_of_exactly_that_confidence(app):
    memory_id = (await app.remember("Kim's lucky number is seven", scope=KIM, confidence=0.7,
                                    mode="sync"))["memory_id"]
    assert await listed(app, min_confidence=0.7) == {memory_id}
    assert await found(app, "lucky number", filters={"min_confidence": 0.7}) == {memory_id}
    assert await mem0_found(app, "lucky number", filters={"confidence": {"gte": 0.7}}) == {memory_id}


# -- lifetimes --------------------------------------------------------------------------------

async def test_each_type_lasts_its_default_lifetime(app):
    ids = {}
    for memory_type in ("PATTERN", "CONTEXT", "STATE", "PREFERENCE", "FACT", "DECISION"):
        answer = await app.remember(f"Kim's {memory_type.lower()} memory about the garden", scope=KIM,
                                    source_type="user", memory_type=memory_type, mode="async")
        ids[memory_type] = answer["memory_id"]
    learned = await app.remember("Always water the garden before nine", scope=KIM, source_type="user",
                                 memory_type="LEARNED", mode="async")
    assert learned["status"] == "pending_approval"
    rows = {t: await memory(app, i) for t, i in ids.items()}
    lifetimes = {t: at(m["expires_at"]) - at(m["created_at"]) if m["expires_at"] else None for t, m in rows.items()}
    learned_row = await memory(app, learned["memory_id"])
    lifetimes["LEARNED"] = at(learned_row["expires_at"]) - at(learned_row["created_at"])
    expected = {"PATTERN": 90 * DAY, "CONTEXT": DAY, "STATE": DAY, "LEARNED": 30 * DAY}
    for memory_type, lifetime in lifetimes.items():
        if memory_type in expected:
            assert abs(lifetime - expected[memory_type]) < MINUTE, (memory_type, lifetime)
        else:
            assert lifetime is None, memory_type

    permanent = {ids["PREFERENCE"], ids["FACT"], ids["DECISION"]}
    for moved, live in [
        (DAY - MINUTE, set(ids.values())),
        (DAY + MINUTE, permanent | {ids["PATTERN"]}),
        (90 * DAY - MINUTE, permanent | {ids["PATTERN"]}),
        (90 * DAY + MINUTE, permanent),
        (3650 * DAY, permanent),
    ]:
        move_clock(app, moved)
        assert await listed(app) == live, moved


async def test_a_state_ends_when_the_scopes_next_session_begins(app):
    state = await app.remember("Kim is debugging the login page", scope=KIM, memory_type="STATE",
                               session_id="s1", mode="async")
    elsewhere = await app.remember("Lee is debugging the login page", scope=LEE, memory_type="STATE",
                                   session_id="s1", mode="async")
    await app.remember("Kim found the failing check", scope=KIM, session_id="s1", mode="async")
    await app.remember("Kim added a note without a session", scope=KIM, mode="async")
    assert state["memory_id"] in await listed(app), "a write in the same session keeps the state"

    await app.remember("Kim is back the next morning", scope=KIM, session_id="s2", mode="async")
    assert state["memory_id"] not in await listed(app)
    assert state["memory_id"] in await listed(app, include_expired="true")
    ended = await memory(app, state["memory_id"])
    assert at(ended["expires_at"]) <= datetime.now(timezone.utc) and ended["is_deleted"] is False
    assert elsewhere["memory_id"] in await listed(app, LEE), "another scope's session goes on"


async def test_a_bulk_import_ends_sessions_as_its_items_come_in_order(app):
    first = await app.remember("Kim is on call this week", scope=KIM, memory_type="STATE", session_id="s1",
                               mode="async")
    response = await app.post("/api/memory/remember/batch", {"items": [
        {"content": "Kim is reviewing the budget", "scope": KIM, "memory_type": "STATE", "session_id": "s2"},
        {"content": "Kim is drafting the roadmap", "scope": KIM, "memory_type": "STATE", "session_id": "s3"},
    ]})
    assert response.status_code == 200, response.text
    budget, roadmap = (r["memory_id"] for r in response.json()["results"])
    live = await listed(app)
    assert roadmap in live and first["memory_id"] not in live and budget not in live, \
        "the import's last session is the scope's current one"


async def test_a_requests_own_expiry_replaces_the_types_and_a_past_one_is_refused(app):
    soon = datetime.now(timezone.utc) + 2 * HOUR
    answer = await app.remember("Kim's parking spot today is B12", scope=KIM, type="pattern",
                                expires_at=soon.isoformat(), mode="async")
    assert at((await memory(app, answer["memory_id"]))["expires_at"]) == soon
    move_clock(app, 2 * HOUR - MINUTE)
    assert answer["memory_id"] in await listed(app)
    move_clock(app, 2 * HOUR + MINUTE)
    assert answer["memory_id"] not in await listed(app), "a PATTERN's 90 days gave way to the request's expiry"

    move_clock(app, timedelta(0))
    for expires_at in [(datetime.now(timezone.utc) - MINUTE).isoformat(),  # passed
                       (datetime.now(timezone.utc) + HOUR).replace(tzinfo=None).isoformat()]:  # no time zone
        refused(await app.post("/api/memory/remember", {"content": "Kim's spot yesterday was A3", "scope": KIM,
                                                        "expires_at": expires_at}))
    assert await app.count("SELECT count(*) FROM memories WHERE content = 'Kim''s spot yesterday was A3'") == 0


def unsealed(events: list[dict]) -> list[dict]:
    """The events without their place in the scope's chain: the sealer fills `scope_seq` in on its
    own schedule, which chains an event and changes nothing about it."""
    return [{k: v for k, v in e.items() if k != "scope_seq"} for e in events]


async def test_expiry_leaves_default_recall_but_is_never_a_delete(app):
    offsite = (await app.remember("Kim is at the Lisbon offsite this week", scope=KIM, type="context",
                                  mode="sync"))["memory_id"]
    lasting = (await app.remember("Kim has been to Lisbon twice", scope=KIM, mode="sync"))["memory_id"]
    history_before = unsealed((await app.get(f"/api/memory/{offsite}/history")).json()["events"])
    assert await found(app, "Lisbon") == {offsite, lasting}

    move_clock(app, DAY + HOUR)
    assert await found(app, "Lisbon") == {lasting}
    assert await listed(app) == {lasting}
    assert await mem0_found(app, "Lisbon") == {lasting}
    assert set(await mem0_all(app)) == {lasting}

    assert await found(app, "Lisbon", include_expired=True) == {offsite, lasting}
    assert await listed(app, include_expired="true") == {offsite, lasting}
    assert await mem0_found(app, "Lisbon", show_expired=True) == {offsite, lasting}
    assert set(await mem0_all(app, show_expired=True)) == {offsite, lasting}

    expired = await memory(app, offsite)
    assert (expired["is_deleted"], expired["status"]) == (False, "active")
    assert at(expired["expires_at"]) < app.runtime.service.clock()
    history = (await app.get(f"/api/memory/{offsite}/history")).json()
    assert unsealed(history["events"]) == history_before, "expiry writes no event: it is not a change"
    assert "DELETE" not in {e["event"] for e in history["events"]}
    assert await app.count("SELECT count(*) FROM memories WHERE id = $1 AND NOT is_deleted", uuid.UUID(offsite)) == 1


# -- the mem0 surface -------------------------------------------------------------------------

async def mem0_add(app, content: str, **body):
    return await app.post("/v3/memories/add/", {"messages": [{"role": "user", "content": content}],
                                                "user_id": "kim", "async_mode": False, **body})


async def test_a_mem0_add_with_an_expiration_date_expires_after_that_utc_day(app):
    last_day = datetime.now(timezone.utc).date() + timedelta(days=3)
    response = await mem0_add(app, "Kim is on call until Friday", expiration_date=last_day.isoformat())
    assert response.status_code == 200, response.text
    [added] = response.json()["results"]
    stored = await memory(app, added["id"])
    end_of_day = datetime.combine(last_day + timedelta(days=1), datetime.min.time(), timezone.utc)
    assert at(stored["expires_at"]) == end_of_day

    shown = (await mem0_all(app))[added["id"]]
    assert (shown["trust"], shown["confidence"], shown["memory_type"]) == ("SEMI_TRUSTED", 1.0, "FACT")
    assert shown["expiration_date"] == last_day.isoformat(), "the last day it is in recall, as it was added"
    assert (await app.get(f"/v1/memories/{added['id']}/")).json()["expiration_date"] == last_day.isoformat()

    move_clock(app, end_of_day - datetime.now(timezone.utc) - MINUTE)
    assert added["id"] in await mem0_all(app)
    move_clock(app, end_of_day - datetime.now(timezone.utc) + MINUTE)
    assert added["id"] not in await mem0_all(app)
    assert added["id"] in await mem0_all(app, show_expired=True)

    move_clock(app, timedelta(0))
    yesterday = datetime.now(timezone.utc).date() - timedelta(days=1)
    refused(await mem0_add(app, "Kim was on call last week", expiration_date=yesterday.isoformat()))
    refused(await mem0_add(app, "Kim was on call last month", expiration_date="next friday"))
    assert await app.count("SELECT count(*) FROM memories WHERE content LIKE 'Kim was on call%'") == 0
    # A memory with no lifetime shows none.
    lasting = await mem0_add(app, "Kim's on-call phone is the blue one")
    assert (await mem0_all(app))[lasting.json()["results"][0]["id"]]["expiration_date"] is None


async def test_said_again_after_it_expired_a_memory_lives_again(app):
    first = await app.remember("Kim is in the Lisbon office", scope=KIM, type="context", mode="async")
    move_clock(app, DAY + HOUR)
    assert first["memory_id"] not in await listed(app)
    again = await app.remember("Kim is in the Lisbon office", scope=KIM, type="context", mode="async")
    assert again["memory_id"] == first["memory_id"]
    assert first["memory_id"] in await listed(app), "the write said again was lost to the expired one"
    move_clock(app, 2 * DAY + 2 * HOUR)
    assert first["memory_id"] not in await listed(app), "it lives as long as the new write would"
