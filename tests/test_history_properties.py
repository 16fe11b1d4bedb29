"""Random sequences of remember, patch, delete, recover and roll back through the HTTP gateway
(a hypothesis state machine), checked after every step against what history, search and the
BM25 statistics promise:

- history replays to the row: the newest event's state is the row's, every event's state is
  the version the model kept, and folding the events' old/new values from ADD gives the row;
- versions grow by exactly one per change that changed something, with one event each (a
  no-op patch, rollback or repeated delete writes none), and every event links to the previous
  one's hash; `engram verify` finds every chain whole;
- search agrees with `is_deleted`: each memory holds a made-up word, and a search for a word
  finds every live memory holding it (with a BM25 score) and never a deleted one;
- the scope's BM25 statistics count exactly its live memories, and each memory's postings are
  its content's terms;
- the dense leg's top is the exact top over the live rows' canonical embeddings, whether or
  not the index owner has rewritten a changed memory's points yet.

The model also predicts every answer: 409s for a deleted, pinned, duplicate or stale-versioned
change, 422 for a rollback to the present, and each rollback's content.

Importance is drawn in thousandths: values with seven significant digits hit the bugs that
the `importance` tests at the end of this file pin down.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from engram.domain import chain
from engram.domain.auth import EVERYTHING
from engram.domain.filters import Filters
from engram.domain.models import Scope
from engram.domain.text import bm25_terms
from engram.recall import candidates
from engram.store import changes as change_store
from engram.store import memories as repo
from tests.conftest import App
from worker import index_sync

FIELDS = ("content", "type", "tags", "importance", "pinned", "metadata")
WORDS = ("apple", "river", "violin")  # few, so that contents recur and patches are often no-ops
MAX_NEW = 4  # memories remembered with a word of their own
MAX_ALL = 6  # and copies of another's content, remembered again after it was deleted
STEP_TIMEOUT_S = 120

TYPES = st.sampled_from(["fact", "preference", "event"])
TAGS = st.lists(st.sampled_from(["home", "work", "urgent"]), max_size=2)
IMPORTANCE = st.integers(0, 1000).map(lambda k: k / 1000)
JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(-(2 ** 40), 2 ** 40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=3),
)
METADATA = st.dictionaries(st.sampled_from(["k", "n", "x"]), st.one_of(JSON_LEAF, st.lists(JSON_LEAF, max_size=2)),
                           max_size=2)
SHOUT = st.booleans()  # the content in capitals: the same memory to the service (normalised)


def _float32(value: float) -> float:
    return float(np.float32(value))


def _json(value: Any) -> Any:
    """A JSON value as JSON compares it: 1e300 and 10**300, 1.0 and 1 are one number."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    return [_json(v) for v in value]


def _same(name: str, a: Any, b: Any) -> bool:
    """Whether two values of a field are one stored value (importance is a `real`)."""
    if name == "importance":
        return _float32(a) == _float32(b)
    if name == "metadata":
        return _json(a) == _json(b)
    return a == b


def _same_state(a: dict, b: dict) -> bool:
    return all(_same(name, a[name], b[name]) for name in (*FIELDS, "is_deleted"))


def _normal(content: str) -> str:
    return " ".join(content.split()).lower()


def _holds(content: str, word: str) -> bool:
    return word in content.lower().split()


@dataclass
class Model:
    """What one memory should be: its fields now, each version's state and its events."""

    id: str
    scope: str
    word: str  # the made-up word its first content holds
    fields: dict[str, Any]
    deleted: bool = False
    version: int = 1
    events: list[tuple[str, int | None]] = field(default_factory=lambda: [("ADD", None)])  # (event, rolled back to)
    states: dict[int, dict[str, Any]] = field(default_factory=dict)

    def state(self) -> dict[str, Any]:
        return {**self.fields, "is_deleted": self.deleted}

    def changed(self, event: str, target: int | None = None) -> None:
        self.version += 1
        self.events.append((event, target))
        self.states[self.version] = self.state()


class HistoryMachine(RuleBasedStateMachine):
    app: App  # bound by the test
    loop: asyncio.AbstractEventLoop

    def __init__(self) -> None:
        super().__init__()
        run = uuid.uuid4().hex[:10]
        self.scopes = (f"hp-{run}-a", f"hp-{run}-b")  # fresh per example: a clean slate in a shared database
        self.memories: list[Model] = []
        self.touched: set[str] = set(self.scopes)  # scopes whose search the invariant checks next
        self.query: np.ndarray | None = None  # the dense invariant's query vector

    # -- plumbing ---------------------------------------------------------------------------

    def call(self, coro):
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout=STEP_TIMEOUT_S)
        except TimeoutError:
            future.cancel()
            raise

    def send(self, method: str, path: str, body: dict | None = None, **params):
        headers = {"Authorization": f"Bearer {self.app.admin_key}"}
        return self.call(self.app.http.request(method, path, json=body, params=params or None, headers=headers))

    def pick(self, i: int) -> Model:
        return self.memories[i % len(self.memories)]

    def live_twin(self, memory: Model, content: str) -> Model | None:
        """Another live memory of `memory`'s scope holding `content` as the service sees it."""
        return next((m for m in self.memories if m is not memory and m.scope == memory.scope and not m.deleted
                     and _normal(m.fields["content"]) == _normal(content)), None)

    def expect(self, response, memory: Model, status: int, error: str | None = None) -> None:
        """The answer is `status` (with `error`'s type); on success, the memory as modelled."""
        assert response.status_code == status, (response.status_code, response.text)
        self.touched.add(memory.scope)
        if error is not None:
            assert response.json()["error"]["type"] == error, response.text
            return
        body = response.json()
        assert body["version"] == memory.version, (body["version"], memory.version)
        assert body["status"] == ("deleted" if memory.deleted else "active")
        assert _same_state({name: body[name] for name in (*FIELDS, "is_deleted")}, memory.state()), (body, memory)

    # -- rules ------------------------------------------------------------------------------

    def _remember(self, scope: str, content: str, word: str, fields: dict[str, Any]) -> None:
        twin = next((m for m in self.memories if m.scope == scope and not m.deleted
                     and _normal(m.fields["content"]) == _normal(content)), None)
        answer = self.call(self.app.remember(content, {"user_id": scope}, mode="async", raw=True, **fields))
        self.touched.add(scope)
        if twin is not None:  # the same memory: answered with it, nothing written
            assert answer["memory_id"] == twin.id, (answer, twin)
            return
        assert answer["memory_id"] not in {m.id for m in self.memories}, answer
        self.call(self.app.wait_job(answer["job_id"]))
        full = {"type": "fact", "tags": [], "importance": 0.5, "pinned": False, "metadata": {}, **fields,
                "content": content}
        memory = Model(id=answer["memory_id"], scope=scope, word=word, fields=full)
        memory.states[1] = memory.state()
        self.memories.append(memory)

    def _remember_new(self, scope, word, type_, tags, importance, pinned, metadata) -> None:
        own = f"qz{len(self.memories)}w"
        self._remember(self.scopes[scope], f"The {own} {word}", own,
                       {"type": type_, "tags": tags, "importance": importance, "pinned": pinned,
                        "metadata": metadata})

    remember_args = dict(scope=st.integers(0, 1), word=st.sampled_from(WORDS), type_=TYPES, tags=TAGS,
                         importance=IMPORTANCE, pinned=st.booleans(), metadata=METADATA)

    @initialize(**remember_args)
    def first_memory(self, **args) -> None:
        self._remember_new(**args)

    @precondition(lambda self: len(self.memories) < MAX_NEW)
    @rule(**remember_args)
    def remember(self, **args) -> None:
        self._remember_new(**args)

    @precondition(lambda self: len(self.memories) < MAX_ALL)
    @rule(i=st.integers(0, 5), shout=SHOUT)
    def remember_again(self, i: int, shout: bool) -> None:
        """Remember a memory's content again: its live holder if there is one, else a new memory."""
        source = self.pick(i)
        content = source.fields["content"].upper() if shout else source.fields["content"]
        self._remember(source.scope, content, source.word, {})

    patches = st.fixed_dictionaries({}, optional={
        "content": st.tuples(st.sampled_from(WORDS), SHOUT), "type": TYPES, "tags": TAGS, "importance": IMPORTANCE,
        "pinned": st.booleans(), "metadata": METADATA,
    }).filter(bool)

    @precondition(lambda self: self.memories)
    @rule(i=st.integers(0, 5), patch=patches, if_version=st.sampled_from([None, "current", "stale"]))
    def patch(self, i: int, patch: dict, if_version: str | None) -> None:
        memory = self.pick(i)
        if "content" in patch:
            word, shout = patch["content"]
            content = f"The {memory.word} {word}"
            patch = {**patch, "content": content.upper() if shout else content}
        self._patch(memory, patch, if_version)

    @precondition(lambda self: len(self.memories) > 1)
    @rule(i=st.integers(0, 5), j=st.integers(0, 5), shout=SHOUT)
    def patch_to_anothers_content(self, i: int, j: int, shout: bool) -> None:
        """Refused while the other is live in the same scope; allowed across scopes or once it is deleted."""
        memory, other = self.pick(i), self.pick(j)
        content = other.fields["content"].upper() if shout else other.fields["content"]
        self._patch(memory, {"content": content}, None)

    def _patch(self, memory: Model, patch: dict, if_version: str | None) -> None:
        body = {**patch, "reason": "property test"}
        stale = if_version == "stale"
        if if_version is not None:
            body["if_version"] = memory.version + (1 if memory.version == 1 else -1) if stale else memory.version
        response = self.send("PATCH", f"/api/memory/{memory.id}", body)
        changes = {name: value for name, value in patch.items() if not _same(name, memory.fields[name], value)}
        if stale:
            self.expect(response, memory, 409, "version_conflict")
            assert response.json()["error"]["current_version"] == memory.version, response.text
        else:
            self._expect_change(response, memory, changes, "UPDATE")

    def _expect_change(self, response, memory: Model, changes: dict, event: str, target: int | None = None) -> bool:
        """A patch or a rollback as the service answers it: refused (409) for a deleted memory or
        new content another live memory of its scope holds; else applied, as a new version only
        where something differs. Returns whether it was applied."""
        if memory.deleted or ("content" in changes and self.live_twin(memory, changes["content"]) is not None):
            self.expect(response, memory, 409, "conflict")
            return False
        if changes:
            memory.fields.update(changes)
            memory.changed(event, target)
        self.expect(response, memory, 200)
        return True

    @precondition(lambda self: self.memories)
    @rule(i=st.integers(0, 5), force=st.booleans())
    def delete(self, i: int, force: bool) -> None:
        memory = self.pick(i)
        response = self.send("DELETE", f"/api/memory/{memory.id}", reason="property test", force=str(force).lower())
        if memory.deleted:  # already so: nothing changes
            self.expect(response, memory, 200)
        elif memory.fields["pinned"] and not force:
            self.expect(response, memory, 409, "pinned")
        else:
            memory.deleted = True
            memory.changed("DELETE")
            self.expect(response, memory, 200)

    @precondition(lambda self: self.memories)
    @rule(i=st.integers(0, 5), a_deleted_one=st.booleans())
    def recover(self, i: int, a_deleted_one: bool) -> None:
        memory = self.pick(i)
        deleted = [m for m in self.memories if m.deleted]
        if a_deleted_one and deleted:
            memory = deleted[i % len(deleted)]
        response = self.send("POST", f"/api/memory/{memory.id}/recover", {"reason": "property test"})
        if not memory.deleted or self.live_twin(memory, memory.fields["content"]) is not None:
            self.expect(response, memory, 409, "conflict")
        else:
            memory.deleted = False
            memory.changed("RECOVER")
            self.expect(response, memory, 200)

    @precondition(lambda self: self.memories)
    @rule(i=st.integers(0, 5), back=st.integers(-1, 30))
    def rollback(self, i: int, back: int) -> None:
        """`back` versions back; 0 or less is the present or the future, which no rollback reaches."""
        memory = self.pick(i)
        if memory.version == 1 and back > 0:
            memory = next((m for m in self.memories if m.version > 1), memory)
        target = max(1, memory.version - back)
        response = self.send("POST", f"/api/memory/{memory.id}/rollback", {"version": target, "reason": "property test"})
        if target >= memory.version:
            self.expect(response, memory, 422, "validation_error")
            return
        wanted = {name: memory.states[target][name] for name in FIELDS}
        changes = {name: value for name, value in wanted.items() if not _same(name, memory.fields[name], value)}
        if self._expect_change(response, memory, changes, "ROLLBACK", target):
            assert response.json()["content"] == memory.states[target]["content"]

    @rule(hold=st.booleans())
    def hold_the_vector_rewrites(self, hold: bool) -> None:
        """While held, the index owner rewrites no vector point, so each change leaves its
        memory's point stale for the invariants to meet; let go, it catches up."""
        index_sync.sync_stale_points = _rewrite_nothing if hold else REWRITE
        if not hold:
            self.call(change_store.wake_index_sync(self.app.pool))

    def teardown(self) -> None:
        index_sync.sync_stale_points = REWRITE

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def history_replays_to_the_row(self) -> None:
        for memory in self.memories:
            response = self.send("GET", f"/api/memory/{memory.id}/history")
            assert response.status_code == 200, response.text
            row, events = response.json()["memory"], response.json()["events"]
            row_state = {name: row[name] for name in (*FIELDS, "is_deleted")}
            assert _same_state(row_state, memory.state()), (row_state, memory.state())
            assert (row["version"], row["status"]) == (memory.version, "deleted" if memory.deleted else "active")

            assert [e["event"] for e in events] == [kind for kind, _ in memory.events], events
            assert [e["version"] for e in events] == list(range(1, memory.version + 1)), events
            assert events[0]["prev_hash"] is None and all(e["hash"] for e in events)
            for before, after in zip(events, events[1:]):
                assert after["prev_hash"] == before["hash"], (before, after)
            for event, (_, target) in zip(events, memory.events):
                assert _same_state(event["state"], memory.states[event["version"]]), (event, memory)
                if target is not None:
                    assert event["new_metadata"]["rolled_back_to"] == target, event
            assert _same_state(events[-1]["state"], row_state), (events[-1], row)

            folded = dict(events[0]["state"])
            for event in events[1:]:
                folded = _fold(folded, event)
                assert _same_state(folded, event["state"]), (folded, event)
            assert _same_state(folded, row_state), (folded, row)

    @invariant()
    def chains_verify(self) -> None:
        # Once the sealer is idle: a verify that overlaps a commit reports breaks that are not
        # there (test_verify_finds_no_break_while_changes_commit, below).
        self.call(_sealed(self.app))
        response = self.send("GET", "/api/admin/verify")
        assert response.status_code == 200, response.text
        assert response.json()["ok"] is True and response.json()["breaks"] == [], response.json()

    @invariant()
    def search_agrees_with_deletion(self) -> None:
        for scope in sorted(self.touched):
            here = [m for m in self.memories if m.scope == scope]
            words = sorted({w for m in here for w in m.fields["content"].lower().split() if w.startswith("qz")})
            for word in words:
                response = self.send("POST", "/api/memory/search",
                                     {"query": word, "scope": {"user_id": scope}, "limit": 10, "rerank": False})
                assert response.status_code == 200, response.text
                hits = {h["memory"]["id"]: h for h in response.json()["results"]}
                live = {m.id for m in here if not m.deleted}
                assert set(hits) <= live, (word, set(hits) - live)
                for memory in here:
                    if not memory.deleted and _holds(memory.fields["content"], word):
                        assert memory.id in hits and hits[memory.id]["components"]["bm25"] > 0, (word, memory, hits)
                for hit in hits.values():
                    if not _holds(hit["memory"]["content"], word):
                        assert hit["components"]["bm25"] == 0, (word, hit)
        self.touched.clear()

    @invariant()
    def the_dense_top_is_the_exact_top_over_the_rows(self) -> None:
        if self.query is None:
            self.query = self.call(_query_vector(self.app, "a fruit by the river"))
        for scope in self.scopes:
            got, want = self.call(_dense_tops(self.app, scope, self.query))
            assert got == want, (scope, got, want)

    @invariant()
    def bm25_statistics_count_the_live_memories(self) -> None:
        for scope in self.scopes:
            stats, live, df, counted, postings = self.call(_bm25_state(self.app, scope))
            assert (stats["doc_count"], stats["total_len"]) == (live["n"], live["total"]), (scope, stats, live)
            assert {t: n for t, n in df.items() if n} == counted, (scope, df, counted)
            assert all(n >= 0 for n in df.values()), df
            for memory in self.memories:
                if memory.scope == scope:
                    terms = Counter(bm25_terms(memory.fields["content"], self.app.settings.bm25_stemmer))
                    assert postings.get(memory.id, ({}, 0)) == (dict(terms), sum(terms.values())), (memory, postings)


def _fold(state: dict[str, Any], event: dict) -> dict[str, Any]:
    """`state` with `event` applied from its old and new values (not its recorded state)."""
    state = dict(state)
    kind = event["event"]
    if kind == "DELETE":
        assert event["old_content"] == state["content"] and event["new_content"] is None, event
        return {**state, "is_deleted": True}
    if kind == "RECOVER":
        return {**state, "is_deleted": False}
    assert kind in ("UPDATE", "ROLLBACK"), event
    if event["new_content"] is not None:
        assert event["old_content"] == state["content"], event
        state["content"] = event["new_content"]
    changed = {k: v for k, v in (event["new_metadata"] or {}).items() if k != "rolled_back_to"}
    for name, old in (event["old_metadata"] or {}).items():
        assert _same(name, state[name], old), (name, state, event)
    return {**state, **changed}


async def _sealed(app: App, timeout_s: float = 30) -> None:
    """Until the chain sealer has chained every event into its scope's chain."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while await app.count("SELECT count(*) FROM memory_history WHERE scope_seq IS NULL AND hash IS NOT NULL"):
        assert asyncio.get_running_loop().time() < deadline, "the chain sealer left events unsealed"
        await asyncio.sleep(0.02)


REWRITE = index_sync.sync_stale_points


async def _rewrite_nothing(pool, spaces, limit: int) -> int:
    return 0


DENSE_DEPTH = 3  # of a scope's at most 6 memories: a stale point taking a place shows


async def _query_vector(app: App, query: str) -> np.ndarray:
    return await (await app.runtime.spaces.active())[1].embedder.embed_query(query)


async def _dense_tops(app: App, user_id: str, query: np.ndarray) -> tuple[list[float], list[float]]:
    """The similarities of the dense leg's top as a search makes it, whether or not the index
    owner has rewritten the points of the last change yet, and of the exact top over the live
    rows' canonical embeddings (rounded: the index scores in single precision; contents recur,
    so ties make ids a poor key)."""
    model, space = await app.runtime.spaces.active()
    scope, filters = Scope(user_id=user_id), Filters(visible=EVERYTHING)
    async with app.pool.acquire() as conn:
        stale = await repo.stale_dense(conn, scope, filters, model, candidates.STALE_DENSE_LISTED)
    hits = await candidates.dense(space.index, query, scope, filters, DENSE_DEPTH)
    got = await candidates.fresh_dense(space.index, query, scope, filters, DENSE_DEPTH, hits, stale)
    rows = await app.pool.fetch(
        "SELECT 1 - (embedding <=> $1) AS similarity FROM memories WHERE user_id = $2 AND NOT is_deleted"
        " AND status = 'active' AND embedding_model = $3 ORDER BY similarity DESC LIMIT $4",
        query, user_id, model, DENSE_DEPTH)
    return [round(v, 5) for v in got.values()], [round(r["similarity"], 5) for r in rows]


async def _bm25_state(app: App, user_id: str):
    """The scope's statistics, what its live memories add up to, each term's df next to the
    live memories holding it, and every memory's postings (with its token_count)."""
    async with app.pool.acquire() as conn:
        stats = await conn.fetchrow("SELECT doc_count, total_len FROM bm25_scope_stats"
                                    " WHERE scope_key = engram_scope_key($1, NULL, NULL)", user_id)
        live = await conn.fetchrow("SELECT count(*) AS n, coalesce(sum(token_count), 0) AS total FROM memories"
                                   " WHERE NOT is_deleted AND user_id = $1 AND agent_id IS NULL AND run_id IS NULL",
                                   user_id)
        df = await conn.fetch("SELECT term, df FROM bm25_term_stats WHERE scope_key = engram_scope_key($1, NULL, NULL)",
                              user_id)
        counted = await conn.fetch("SELECT t.term, count(*) AS n FROM memory_terms t JOIN memories m ON m.id = t.memory_id"
                                   " WHERE NOT m.is_deleted AND m.user_id = $1 AND m.agent_id IS NULL"
                                   " AND m.run_id IS NULL GROUP BY t.term", user_id)
        rows = await conn.fetch("SELECT m.id, m.token_count, t.term, t.tf FROM memories m"
                                " LEFT JOIN memory_terms t ON t.memory_id = m.id WHERE m.user_id = $1", user_id)
    postings: dict[str, tuple[dict[str, int], int]] = {}
    for r in rows:
        terms, _ = postings.get(str(r["id"]), ({}, 0))
        if r["term"] is not None:
            terms[r["term"]] = r["tf"]
        postings[str(r["id"])] = (terms, r["token_count"])
    stats = stats or {"doc_count": 0, "total_len": 0}
    return stats, live, {r["term"]: r["df"] for r in df}, {r["term"]: r["n"] for r in counted}, postings


SETTINGS = settings(
    max_examples=16, stateful_step_count=30, deadline=None, derandomize=True, database=None, print_blob=False,
    suppress_health_check=list(HealthCheck),
)


@pytest.mark.timeout(900)  # a failure's shrinking replays many sequences
async def test_random_changes_keep_history_search_and_statistics_in_step(app):
    bound = type("HistoryMachineOnApp", (HistoryMachine,), {"app": app, "loop": asyncio.get_running_loop()})
    await asyncio.to_thread(run_state_machine_as_test, bound, settings=SETTINGS)


# -- what the machine found -------------------------------------------------------------------

async def _patch(app: App, memory_id: str, body: dict):
    return await app.http.patch(f"/api/memory/{memory_id}", json={**body, "reason": "test"},
                                headers={"Authorization": f"Bearer {app.admin_key}"})


async def test_verify_finds_no_break_while_changes_commit(make_app):
    """verify reads rows, their events and the scope heads in one snapshot: a change or a seal
    committing while it runs is not a break."""
    async with make_app(change_rate_per_s=1e6, change_burst=10 ** 6) as app:
        ids = [(await app.remember(f"memory {n} under steady edits", mode="async", raw=True))["memory_id"]
               for n in range(4)]
        done = asyncio.Event()
        edits = Counter()

        async def edit(memory_id: str) -> None:
            n = 0
            while not done.is_set():
                n += 1
                response = await _patch(app, memory_id, {"tags": [f"t{n}"]})
                assert response.status_code == 200, response.text
                edits[memory_id] += 1

        editors = [asyncio.create_task(edit(i)) for i in ids]
        reports: list[dict] = []
        try:
            deadline = asyncio.get_running_loop().time() + 10
            while asyncio.get_running_loop().time() < deadline and (not reports or reports[-1]["ok"]):
                reports.append((await app.get("/api/admin/verify")).json())
        finally:
            done.set()
            await asyncio.gather(*editors)
        assert len(reports) >= 3 and sum(edits.values()) >= 3 * len(ids), (len(reports), edits)
        assert all(r["ok"] for r in reports), next(r for r in reports if not r["ok"])


async def test_a_memory_remembered_with_a_seven_digit_importance_is_not_quarantined(app):
    answer = await app.remember("a memory of seven-digit importance", mode="async", raw=True, importance=0.1234565)
    memory = (await app.get(f"/api/memory/{answer['memory_id']}")).json()
    assert memory["status"] == "active", memory
    events = (await app.get(f"/api/memory/{answer['memory_id']}/history")).json()["events"]
    assert [e["event"] for e in events] == ["ADD"], events


async def test_a_patch_repeating_an_importance_writes_no_version(app):
    answer = await app.remember("a memory patched twice alike", mode="async", raw=True)
    first = await _patch(app, answer["memory_id"], {"importance": 0.1234565})
    assert first.status_code == 200 and first.json()["version"] == 2, first.text
    again = await _patch(app, answer["memory_id"], {"importance": 0.1234565})
    assert again.status_code == 200, again.text
    assert again.json()["version"] == 2, again.json()


async def test_a_patch_to_an_importance_a_real_tells_apart_is_applied(app):
    answer = await app.remember("a memory nudged in importance", mode="async", raw=True, importance=0.5)
    changed = await _patch(app, answer["memory_id"], {"importance": 0.5000001})
    assert changed.status_code == 200, changed.text
    assert (changed.json()["version"], _float32(changed.json()["importance"])) == (2, _float32(0.5000001))


_KEYS = st.text(max_size=2) | st.integers(0, 2) | st.booleans() | st.sampled_from([0.0, -0.0, 1.0])
_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2) | st.text(max_size=3)
    | st.sampled_from([0.0, -0.0, 1.0, float("nan"), float("inf")]),
    lambda inner: st.lists(inner, max_size=3) | st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(_KEYS, inner, max_size=2),
    max_leaves=6)


_FAMILIES = ((0, 0.0, -0.0, False), (1, 1.0, True), (2, 2.0))  # equal in Python, of different types


def _retyped(value, rng):
    """`value` with parts swapped for equal ones of other types (1, 1.0 and True; a list and a
    tuple), in values and dict keys alike."""
    if isinstance(value, dict):
        return {_retyped(key, rng): _retyped(item, rng) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return rng.choice((list, tuple))([_retyped(item, rng) for item in value])
    family = next((f for f in _FAMILIES if not isinstance(value, str) and value in f), (value,))
    return rng.choice(family)


@given(_JSONISH, _JSONISH, st.randoms(use_true_random=False))
@settings(max_examples=500, deadline=None)
def test_a_state_field_compares_equal_exactly_when_its_canonical_encodings_do(row_value, other, rng):
    """chain._same_field's shortcut (values identical all the way down) says what comparing the
    canonical encodings would: True and 1, "1" and 1, [] and None stay apart; 1.0 and 1 match;
    so do {1: x} and {"1": x}, but not {1: x} and {1.0: x}, though Python finds those equal."""
    for recorded in (other, _retyped(row_value, rng)):
        for name in ("content", "tags", "metadata", "pinned"):
            encoded = chain.encode({"state": {name: row_value}}) == chain.encode({"state": {name: recorded}})
            assert chain._same_field(name, row_value, recorded) == encoded
            assert chain._same_field(name, row_value, row_value)
