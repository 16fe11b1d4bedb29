"""Scope isolation through the HTTP gateway.

One visibility rule for every read path: a caller sees a memory only if every set part of the
memory's scope is granted to its key (by `*`, `<part>:*` or `<part>:<value>`); null parts need no
grant. List and search return, of the memories whose scope contains the requested parts, those
the caller sees; get and job answer 404 for the rest. And distinct scopes never share a dedupe
key, whatever characters their ids hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import uuid
from dataclasses import dataclass

import pytest

from tests.conftest import App, app_settings, new_database, running_app

# -- the rule, written here independently of engram.domain.auth ------------------------------------------

PARTS = (("user_id", "user"), ("agent_id", "agent"), ("run_id", "run"))

ScopeParts = tuple[str | None, str | None, str | None]  # (user_id, agent_id, run_id)


def grants_cover(grants: list[str], scope: ScopeParts) -> bool:
    """Every set part of `scope` is granted: by `*`, `<part>:*` or `<part>:<that value>`."""
    if "*" in grants:
        return True
    return all(value is None or f"{prefix}:*" in grants or f"{prefix}:{value}" in grants
               for (_, prefix), value in zip(PARTS, scope))


def contains(request: ScopeParts, memory: ScopeParts) -> bool:
    """The memory's scope holds every part the request sets, with the same value."""
    return all(wanted is None or wanted == held for wanted, held in zip(request, memory))


def as_dict(scope: ScopeParts) -> dict[str, str]:
    return {part: value for (part, _), value in zip(PARTS, scope) if value is not None}


def label(scope: ScopeParts) -> str:
    return "{" + ", ".join(f"{p}={v}" for p, v in as_dict(scope).items()) + "}"


def exact_grants(scope: dict[str, str]) -> list[str]:
    """The grants of a key that may touch exactly `scope`'s values and nothing wider."""
    return [f"{prefix}:{scope[part]}" for part, prefix in PARTS if part in scope]


# -- the world: every scope shape, values matching and not matching the grants ---------------------

USERS, AGENTS, RUNS = (None, "alice", "bob"), (None, "x", "y"), (None, "r1", "r2")
# All 26 non-empty scopes: user, agent or run alone, every pair, all three; used both as the
# memories' scopes and as the scopes the keys request.
SCOPES: list[ScopeParts] = [s for s in itertools.product(USERS, AGENTS, RUNS) if any(s)]
# Forgotten memories, to show that asking for deleted ones widens nothing.
DELETED_SCOPES: list[ScopeParts] = [("bob", "x", None), ("alice", None, None), (None, "y", "r1")]

QUERY_WORD = "zebra"  # in every memory's text, so BM25 alone finds every memory a search may see
UNRELATED_QUERY = "quantum chromodynamics lattice"  # shares no word with any memory: only the dense leg finds any

GRANTS = [
    ["user:alice"], ["agent:x"], ["run:r1"], ["user:*"], ["agent:*"], ["run:*"],
    ["user:alice", "agent:x"], ["user:alice", "agent:*"], ["agent:x", "run:r1"], ["user:*", "agent:x"],
    ["user:alice", "user:bob"], ["user:alice", "agent:x", "run:r1"], ["*"],
]
by_grants = pytest.mark.parametrize("grants", GRANTS, ids=["+".join(g) for g in GRANTS])


@dataclass(frozen=True)
class Stored:
    scope: ScopeParts
    memory_id: str
    job_id: str
    deleted: bool


@dataclass
class World:
    app: App
    memories: list[Stored]

    def expected(self, grants: list[str], request: ScopeParts, *, include_deleted: bool = False) -> set[str] | None:
        """The ids list and search must return; None when the key may not request that scope (403)."""
        if not grants_cover(grants, request):
            return None
        return {m.memory_id for m in self.memories
                if contains(request, m.scope) and grants_cover(grants, m.scope) and (include_deleted or not m.deleted)}

    def names(self, ids: set[str]) -> list[str]:
        scope_of = {m.memory_id: label(m.scope) + (" (deleted)" if m.deleted else "") for m in self.memories}
        return sorted(scope_of.get(i, i) for i in ids)

    def id_of(self, scope: ScopeParts) -> str:
        return next(m.memory_id for m in self.memories if m.scope == scope and not m.deleted)


@contextlib.asynccontextmanager
async def _module_app(postgres, temporal, embedder, reranker, tmp_path_factory):
    """An app shared by a module's tests: one start-up instead of one per test."""
    dsn = await new_database(postgres)
    settings = app_settings(tmp_path_factory.mktemp("isolation"), dsn, temporal_address=temporal.address)
    async with running_app(settings, embedder, reranker) as app:
        yield app


@pytest.fixture(scope="module")
async def world(postgres, temporal, embedder, reranker, tmp_path_factory):
    async with _module_app(postgres, temporal, embedder, reranker, tmp_path_factory) as app:
        async def store(n: int, scope: ScopeParts, deleted: bool) -> Stored:
            text = f"{QUERY_WORD} sighting number {n}" + (" since forgotten" if deleted else "")
            answer = await app.remember(text, scope=as_dict(scope), mode="sync")
            assert answer["status"] == "processed", answer
            return Stored(scope, answer["memory_id"], answer["job_id"], deleted)

        memories = await asyncio.gather(*[store(n, scope, False) for n, scope in enumerate(SCOPES)],
                                        *[store(100 + n, scope, True) for n, scope in enumerate(DELETED_SCOPES)])
        for m in memories:
            if m.deleted:
                await app.forget(m.memory_id)
        assert await app.count("SELECT count(*) FROM memories WHERE NOT is_deleted") == len(SCOPES)
        yield World(app, list(memories))


def _compare(world: World, request: ScopeParts, response, expected: set[str] | None, ids_of) -> list[str]:
    """What is wrong with `response` to a read of `request`, in words; [] when it is right."""
    where = f"request {label(request)}"
    if expected is None:
        if response.status_code != 403 or response.json()["error"]["type"] != "forbidden":
            return [f"{where}: expected 403 forbidden, got {response.status_code} {response.text[:200]}"]
        return []
    if response.status_code != 200:
        return [f"{where}: expected 200, got {response.status_code} {response.text[:200]}"]
    got = ids_of(response.json())
    if got == expected:
        return []
    return [f"{where}: shows memories it may not see {world.names(got - expected)}; "
            f"misses visible {world.names(expected - got)}"]


def _listed(page: dict) -> set[str]:
    return {m["id"] for m in page["items"]}


def _found(answer: dict) -> set[str]:
    return {h["memory"]["id"] for h in answer["results"]}


async def _list(app: App, key: str, request: ScopeParts, **params):
    return await app.get("/api/memory", key=key, limit=100, **as_dict(request), **params)


async def _search(app: App, key: str, request: ScopeParts, query: str = QUERY_WORD, **fields):
    return await app.post("/api/memory/search", {"query": query, "scope": as_dict(request), "limit": 100,
                                                 "rerank": False, **fields}, key=key)


# -- 1. one visibility rule for every read path ---------------------------------------------------

@by_grants
async def test_list_shows_exactly_the_memories_whose_every_scope_part_is_granted(world, grants):
    key = await world.app.key("reader", grants)
    wrong = []
    for request in SCOPES:
        response = await _list(world.app, key, request)
        wrong += _compare(world, request, response, world.expected(grants, request), _listed)
    assert not wrong, "\n".join(wrong)


@by_grants
async def test_search_finds_exactly_the_memories_whose_every_scope_part_is_granted(world, grants):
    key = await world.app.key("reader", grants)
    wrong = []
    for request in SCOPES:
        response = await _search(world.app, key, request)
        wrong += _compare(world, request, response, world.expected(grants, request), _found)
    assert not wrong, "\n".join(wrong)


@by_grants
async def test_including_deleted_memories_widens_no_grant(world, grants):
    key = await world.app.key("reader", grants)
    wrong = []
    for request in SCOPES:
        expected = world.expected(grants, request, include_deleted=True)
        response = await _search(world.app, key, request, include_deleted=True)
        wrong += _compare(world, request, response, expected, _found)
        response = await _list(world.app, key, request, include_deleted="true")
        wrong += [f"list {w}" for w in _compare(world, request, response, expected, _listed)]
    assert not wrong, "\n".join(wrong)


@by_grants
async def test_the_dense_leg_finds_no_memory_the_key_may_not_see(world, grants):
    key = await world.app.key("reader", grants)
    wrong = []
    for request in SCOPES:
        visible_live = world.expected(grants, request)
        if visible_live is None:
            continue  # 403: the list and search tests check it
        # The index learns of a delete when the index sync rewrites its point: a deleted visible memory may count.
        visible_any = world.expected(grants, request, include_deleted=True)
        response = await _search(world.app, key, request, query=UNRELATED_QUERY, explain=True)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["explain"]["bm25"]["hits"] == 0, "the query must share no word with any memory"
        hits = answer["explain"]["dense"]["hits"]
        if not len(visible_live) <= hits <= len(visible_any):
            wrong.append(f"request {label(request)}: the index returned {hits} hits; "
                         f"{len(visible_live)} live memories ({len(visible_any)} with deleted ones) are visible")
        if leaked := _found(answer) - visible_live:
            wrong.append(f"request {label(request)}: results hold memories it may not see {world.names(leaked)}")
    assert not wrong, "\n".join(wrong)


@by_grants
async def test_get_and_job_answer_404_for_exactly_the_memories_the_key_may_not_see(world, grants):
    key = await world.app.key("reader", grants)
    wrong = []
    for memory in (m for m in world.memories if not m.deleted):
        want = 200 if grants_cover(grants, memory.scope) else 404
        for path in (f"/api/memory/{memory.memory_id}", f"/api/memory/jobs/{memory.job_id}"):
            response = await world.app.get(path, key=key)
            if response.status_code != want or (want == 404 and response.json()["error"]["type"] != "not_found"):
                wrong.append(f"{path} of {label(memory.scope)}: expected {want}, got {response.status_code}")
    assert not wrong, "\n".join(wrong)


# The bugs as they were reported, by name; the matrix above covers them too.

async def test_agent_grant_does_not_list_or_find_a_users_memory_with_that_agent(world):
    key = await world.app.key("reader", ["agent:x"])
    bobs, agents_own = world.id_of(("bob", "x", None)), world.id_of((None, "x", None))
    listed = _listed((await _list(world.app, key, (None, "x", None))).json())
    found = _found((await _search(world.app, key, (None, "x", None))).json())
    assert agents_own in listed and agents_own in found
    assert bobs not in listed and bobs not in found


@pytest.mark.parametrize("grant", ["run:r1", "run:*"])
async def test_run_grant_does_not_read_a_users_memory_in_that_run(world, grant):
    key = await world.app.key("reader", [grant])
    bobs, runs_own = world.id_of(("bob", None, "r1")), world.id_of((None, None, "r1"))
    listed = _listed((await _list(world.app, key, (None, None, "r1"))).json())
    found = _found((await _search(world.app, key, (None, None, "r1"))).json())
    assert runs_own in listed and runs_own in found
    assert bobs not in listed and bobs not in found


async def test_user_grant_does_not_read_that_users_memory_with_an_agent(world):
    key = await world.app.key("reader", ["user:alice"])
    with_agent, alices_own = world.id_of(("alice", "x", None)), world.id_of(("alice", None, None))
    listed = _listed((await _list(world.app, key, ("alice", None, None))).json())
    found = _found((await _search(world.app, key, ("alice", None, None))).json())
    assert alices_own in listed and alices_own in found
    assert with_agent not in listed and with_agent not in found


# -- 2. distinct scopes never share a dedupe key ----------------------------------------------------

A = {"user_id": "v|a:g"}
B = {"user_id": "v", "agent_id": "g|a:"}  # with the unescaped key `u:..|a:..|r:..`, both were `u:v|a:g|a:|r:`

SCOPE_PAIRS = [
    pytest.param(A, B, id="user-holds-the-agent-separator"),
    pytest.param({"agent_id": "g|r:h"}, {"agent_id": "g", "run_id": "h|r:"}, id="agent-holds-the-run-separator"),
    pytest.param({"user_id": "v|a:|r:h"}, {"user_id": "v", "run_id": "h|a:|r:"}, id="user-holds-both-separators"),
    pytest.param({"user_id": "|a:"}, {"agent_id": "|a:"}, id="bare-agent-separator-as-user-or-agent"),
    pytest.param({"agent_id": "|r:"}, {"run_id": "|r:"}, id="bare-run-separator-as-agent-or-run"),
    pytest.param({"user_id": "|a:|r:"}, {"run_id": "|a:|r:"}, id="both-separators-as-user-or-run"),
    pytest.param({"user_id": "u:"}, {"agent_id": "u:"}, id="user-prefix-as-user-or-agent"),
    pytest.param({"user_id": "a:"}, {"agent_id": "r:"}, id="prefixes-alone"),
    pytest.param({"user_id": ":"}, {"run_id": ":"}, id="colon"),
    pytest.param({"user_id": "|"}, {"agent_id": "|"}, id="pipe"),
    pytest.param({"user_id": "v\\", "agent_id": "g"}, {"user_id": "v\\|a:g"}, id="trailing-backslash"),
    pytest.param({"user_id": "v\\|a:g"}, {"user_id": "v|a:g"}, id="escaped-looking-pipe"),
    pytest.param({"user_id": "\\"}, {"agent_id": "\\"}, id="backslash-alone"),
    pytest.param({"user_id": "None"}, {"agent_id": "None"}, id="none-spelled-out"),
    pytest.param({"user_id": "ü"}, {"user_id": "u\u0308"}, id="composed-and-decomposed-u-umlaut"),
    pytest.param({"user_id": "用户|a:代理"}, {"user_id": "用户", "agent_id": "代理|a:"}, id="cjk-with-separator"),
    pytest.param({"user_id": "🦓|a:🐴"}, {"user_id": "🦓", "agent_id": "🐴|a:"}, id="emoji-with-separator"),
    pytest.param({"user_id": "ab"}, {"user_id": "a", "agent_id": "b"}, id="split-across-parts"),
    pytest.param({"user_id": "a"}, {"user_id": "a", "agent_id": "a"}, id="prefix-scope"),
    pytest.param({"user_id": "a", "agent_id": "b"}, {"user_id": "a", "agent_id": "b", "run_id": "c"},
                 id="suffix-scope"),
    pytest.param({"user_id": "Alice"}, {"user_id": "alice"}, id="case"),
]


@pytest.fixture(scope="module")
async def shelf(postgres, temporal, embedder, reranker, tmp_path_factory):
    """One app for the pair tests: each test writes a text of its own, so they do not interfere."""
    async with _module_app(postgres, temporal, embedder, reranker, tmp_path_factory) as app:
        yield app


def _own_text(what: str) -> str:
    """A text no other test on the shelf writes."""
    return f"{what} {uuid.uuid4().hex}"


async def _scope_of(app: App, memory_id: str, key: str) -> dict[str, str]:
    response = await app.get(f"/api/memory/{memory_id}", key=key)
    assert response.status_code == 200, f"the caller cannot read the memory it was answered: {response.text}"
    memory = response.json()
    return {part: memory[part] for part, _ in PARTS if memory[part] is not None}


@pytest.mark.parametrize("first, second", SCOPE_PAIRS)
async def test_the_same_text_in_two_distinct_scopes_is_stored_twice(shelf, first, second):
    text = _own_text("the same words")
    one = await shelf.remember(text, scope=first, mode="async")
    two = await shelf.remember(text, scope=second, mode="async")
    assert two["warnings"] == [], f"the second scope was taken for the first: {two}"
    assert one["memory_id"] != two["memory_id"]
    assert await shelf.count("SELECT count(*) FROM memories WHERE content = $1", text) == 2
    assert await _scope_of(shelf, one["memory_id"], shelf.admin_key) == first
    assert await _scope_of(shelf, two["memory_id"], shelf.admin_key) == second


@pytest.mark.parametrize("first, second", SCOPE_PAIRS)
async def test_a_duplicate_answer_never_points_into_another_scope(shelf, first, second):
    text = _own_text("already remembered elsewhere")
    await shelf.remember(text, scope=first, mode="async")
    key = await shelf.key("writer", exact_grants(second))
    response = await shelf.post("/api/memory/remember", {"content": text, "scope": second, "mode": "async"}, key=key)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert not any(w.startswith("duplicate") for w in answer["warnings"]), answer
    assert await _scope_of(shelf, answer["memory_id"], key) == second
    job = await shelf.get(f"/api/memory/jobs/{answer['job_id']}", key=key)
    assert job.status_code == 200 and job.json()["memory_id"] == answer["memory_id"], job.text


@pytest.mark.parametrize("first, second", SCOPE_PAIRS)
async def test_a_true_duplicate_in_the_same_scope_still_collapses_into_it(shelf, first, second):
    text = _own_text("said twice")
    key = await shelf.key("writer", exact_grants(second))
    answers = []
    for _ in range(2):
        response = await shelf.post("/api/memory/remember", {"content": text, "scope": second, "mode": "async"},
                                    key=key)
        assert response.status_code == 200, response.text
        answers.append(response.json())
    assert answers[1]["memory_id"] == answers[0]["memory_id"]
    assert answers[1]["warnings"] and answers[1]["warnings"][0].startswith("duplicate"), answers[1]
    assert await shelf.count("SELECT count(*) FROM memories WHERE content = $1", text) == 1
    assert await _scope_of(shelf, answers[1]["memory_id"], key) == second


async def test_the_colliding_pair_is_stored_twice_and_each_caller_reads_its_own(app):
    key_a, key_b = await app.key("writer", exact_grants(A)), await app.key("writer", exact_grants(B))
    answers = {}
    for scope, key in ((A, key_a), (B, key_b)):
        response = await app.post("/api/memory/remember", {"content": "Meet at the old mill", "scope": scope,
                                                           "mode": "async"}, key=key)
        assert response.status_code == 200, response.text
        answers[key] = response.json()
    assert answers[key_b]["warnings"] == [], f"B's memory was taken for A's: {answers[key_b]}"
    assert answers[key_a]["memory_id"] != answers[key_b]["memory_id"]
    assert answers[key_a]["job_id"] != answers[key_b]["job_id"]
    assert await app.count("SELECT count(*) FROM memories") == 2
    for key, scope in ((key_a, A), (key_b, B)):
        assert await _scope_of(app, answers[key]["memory_id"], key) == scope
    # Neither key sees the other's memory.
    assert (await app.get(f"/api/memory/{answers[key_b]['memory_id']}", key=key_a)).status_code == 404
    assert (await app.get(f"/api/memory/{answers[key_a]['memory_id']}", key=key_b)).status_code == 404


async def test_bm25_statistics_of_colliding_scopes_stay_apart(app):
    # One memory per exact scope, the query word once in it: N = df = tf = 1 and the length is
    # the average, so its BM25 is ln(1 + 0.5 / 1.5). Statistics pooled across A and B would
    # give N = df = 2 and ln(1 + 0.5 / 2.5) instead.
    ids = {}
    for name, scope in (("A", A), ("B", B)):
        ids[name] = (await app.remember("the lighthouse keeper waved", scope=scope, mode="sync"))["memory_id"]
    for name, scope in (("A", A), ("B", B)):
        key = await app.key("reader", exact_grants(scope))
        response = await app.post("/api/memory/search", {"query": "lighthouse", "scope": scope}, key=key)
        assert response.status_code == 200, response.text
        hits = response.json()["results"]
        assert [h["memory"]["id"] for h in hits] == [ids[name]], f"scope {name}: {hits}"
        assert hits[0]["components"]["bm25"] == pytest.approx(math.log(1 + 0.5 / 1.5), rel=1e-6), name


# -- 3. the bulk endpoint writes by the same rules ----------------------------------------------

@pytest.mark.parametrize("first, second", SCOPE_PAIRS)
async def test_a_bulk_import_keeps_colliding_scopes_apart_and_collapses_only_true_duplicates(shelf, first, second):
    text = _own_text("imported")
    items = [{"content": text, "scope": scope} for scope in (first, second, second, first)]
    response = await shelf.post("/api/memory/remember/batch", {"items": items})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert all(r["error"] is None for r in results), results
    assert results[0]["memory_id"] != results[1]["memory_id"]
    assert results[2]["memory_id"] == results[1]["memory_id"] and results[2]["warnings"][0].startswith("duplicate")
    assert results[3]["memory_id"] == results[0]["memory_id"] and results[3]["warnings"][0].startswith("duplicate")
    assert await shelf.count("SELECT count(*) FROM memories WHERE content = $1", text) == 2
    assert await _scope_of(shelf, results[0]["memory_id"], shelf.admin_key) == first
    assert await _scope_of(shelf, results[1]["memory_id"], shelf.admin_key) == second


@by_grants
async def test_a_bulk_import_stores_exactly_the_items_whose_scope_the_key_may_write(shelf, grants):
    key = await shelf.key("writer", grants)
    text = _own_text("bulk grant")
    items = [{"content": f"{text} {n}", "scope": as_dict(scope)} for n, scope in enumerate(SCOPES)]
    response = await shelf.post("/api/memory/remember/batch", {"items": items}, key=key)
    assert response.status_code == 200, response.text
    wrong = []
    for scope, result in zip(SCOPES, response.json()["results"]):
        allowed = grants_cover(grants, scope)
        if allowed and (result["error"] or await _scope_of(shelf, result["memory_id"], key) != as_dict(scope)):
            wrong.append(f"{label(scope)}: not stored in its scope: {result}")
        if not allowed and (result["error"] or {}).get("type") != "forbidden":
            wrong.append(f"{label(scope)}: expected forbidden, got {result}")
    stored = await shelf.count("SELECT count(*) FROM memories WHERE content LIKE $1", f"{text} %")
    assert not wrong and stored == sum(grants_cover(grants, s) for s in SCOPES), "\n".join(wrong)


# -- 4. the approval queue: writes waiting for a person, by the same rule --------------------------

@pytest.fixture(scope="module")
async def waiting(postgres, temporal, embedder, reranker, tmp_path_factory):
    """One write waiting for approval (a FACT from an UNTRUSTED source) in each scope."""
    async with _module_app(postgres, temporal, embedder, reranker, tmp_path_factory) as app:
        held = {}
        for n, scope in enumerate(SCOPES):
            answer = await app.remember(f"{QUERY_WORD} rumour number {n}", scope=as_dict(scope), source_type="web",
                                        mode="async")
            assert answer["status"] == "pending_approval", answer
            held[scope] = answer["approval_id"]
        yield app, held


@by_grants
async def test_the_approval_queue_shows_and_decides_exactly_the_writes_the_key_may_see(waiting, grants):
    app, held = waiting
    key = await app.key("operator", grants)
    listed = (await app.get("/api/memory/approvals", key=key, limit=100)).json()["items"]
    wrong = []
    if {a["id"] for a in listed} != {held[s] for s in SCOPES if grants_cover(grants, s)}:
        wrong.append(f"the queue shows "
                     f"{len(listed)} items, not the {sum(grants_cover(grants, s) for s in SCOPES)} it may see")
    for scope in SCOPES:
        if grants_cover(grants, scope):
            continue
        approval_id = held[scope]
        for response in (await app.get(f"/api/memory/approvals/{approval_id}", key=key),
                         await app.post(f"/api/memory/approvals/{approval_id}/decide",
                                        {"decision": "approve", "reason": "not mine to decide"}, key=key)):
            if response.status_code != 404 or response.json()["error"]["type"] != "not_found":
                wrong.append(f"{label(scope)}: expected 404, got {response.status_code} {response.text[:120]}")
    assert not wrong, "\n".join(wrong)
    # No decision above changed anything.
    assert await app.count("SELECT count(*) FROM memory_approvals WHERE status = 'pending'") == len(SCOPES)
