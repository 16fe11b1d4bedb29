"""The policy around changing memories by id, as a demanding user meets it over HTTP: who may do
what (the role matrix, written here independently of engram.domain.auth), what a key outside a
memory's scope sees (exactly what it sees for a memory that does not exist), idempotent replays,
bad input, batches with mixed outcomes, the recovery window, pinned memories, a person's lock
against an agent's edits, rate limits, and the list's status filter.

Every refused request is checked to have changed nothing: the memory's row (its version and
fields) and the number of its history events are read before and after.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from tests.conftest import App

ROLES = ("reader", "agent", "writer", "operator", "admin")

# What each role may do, as the product promises it: reader: search, read; agent: + remember,
# modify, forget; writer: + recover, rollback; operator: + force_delete, approve, maintenance;
# admin: + admin. Spelled out in full, so that a change to the code's table shows here.
MATRIX: dict[str, set[str]] = {
    "reader": {"search", "read"},
    "agent": {"search", "read", "remember", "modify", "forget"},
    "writer": {"search", "read", "remember", "modify", "forget", "recover", "rollback"},
    "operator": {"search", "read", "remember", "modify", "forget", "recover", "rollback", "force_delete", "approve",
                 "maintenance"},
    "admin": {"search", "read", "remember", "modify", "forget", "recover", "rollback", "force_delete", "approve",
              "maintenance", "admin"},
}
ACTIONS = ("search", "read", "remember", "modify", "forget", "recover", "rollback", "force_delete", "approve",
           "maintenance", "admin")

# What a memory's row holds that a change may touch, and how many history events it has.
ROW = """
    SELECT version, content, type, tags, importance, pinned, metadata, is_deleted, deleted_at, status,
           manual_override_until, updated_at, updated_by, chain_hash, content_hash,
           (SELECT count(*) FROM memory_history h WHERE h.memory_id = m.id) AS events
    FROM memories m WHERE id = $1
"""


@dataclass(frozen=True)
class Key:
    secret: str
    id: str
    role: str

    @property
    def actor(self) -> str:
        return f"key:{self.id}"


async def _key(app: App, role: str, scopes: list[str] | None = None) -> Key:
    """A key made the way an admin makes one (POST /api/keys), so its id is known."""
    response = await app.post("/api/keys", {"name": f"{role}-{uuid.uuid4().hex[:8]}", "role": role,
                                            "scopes": scopes or ["*"]})
    assert response.status_code == 201, response.text
    body = response.json()
    return Key(secret=body["key"], id=body["id"], role=role)


async def _call(app: App, method: str, path: str, key: Key | str | None = None, *, body=None, params=None,
                headers: dict | None = None, content: bytes | None = None) -> httpx.Response:
    """One request as `key` (default: the admin key); `content` sends raw bytes as the JSON body."""
    secret = key.secret if isinstance(key, Key) else key or app.admin_key
    request_headers = {"Authorization": f"Bearer {secret}", **(headers or {})}
    if content is not None:
        return await app.http.request(method, path, params=params, content=content,
                                      headers={**request_headers, "Content-Type": "application/json"})
    return await app.http.request(method, path, params=params, json=body, headers=request_headers)


async def _raw(app: App, content: str, scope: dict | None = None, **fields) -> dict:
    """A settled memory, stored as given (no pipeline), remembered by the admin key."""
    answer = await app.remember(content, scope, mode="async", raw=True, **fields)
    await app.wait_job(answer["job_id"])
    memory = await app.get(f"/api/memory/{answer['memory_id']}")
    assert memory.status_code == 200, memory.text
    return memory.json()


async def _edited(app: App, content: str, scope: dict | None = None, **fields) -> dict:
    """A settled memory at version 2 (the admin retagged it once)."""
    memory = await _raw(app, content, scope, **fields)
    response = await _call(app, "PATCH", f"/api/memory/{memory['id']}", body={"tags": ["v2"], "reason": "setup"})
    assert response.status_code == 200, response.text
    return response.json()


async def _deleted(app: App, content: str, scope: dict | None = None) -> dict:
    memory = await _raw(app, content, scope)
    response = await _call(app, "DELETE", f"/api/memory/{memory['id']}", params={"reason": "setup"})
    assert response.status_code == 200, response.text
    return response.json()


async def _quarantined(app: App, content: str, scope: dict | None = None) -> dict:
    """A memory whose row was edited behind the service's back: the fault is injected in the
    database, the only place it can happen; the service finds it out on the next read."""
    memory = await _raw(app, content, scope)
    await app.pool.execute("UPDATE memories SET tags = '{edited-by-hand}' WHERE id = $1", uuid.UUID(memory["id"]))
    read = await app.get(f"/api/memory/{memory['id']}")
    assert read.json()["status"] == "quarantined", read.text
    return read.json()


async def _row(app: App, memory_id) -> dict:
    row = await app.pool.fetchrow(ROW, uuid.UUID(str(memory_id)))
    assert row is not None, memory_id
    return dict(row)


async def _events(app: App, memory_id) -> list[dict]:
    response = await app.get(f"/api/memory/{memory_id}/history")
    assert response.status_code == 200, response.text
    return response.json()["events"]


def _error(response: httpx.Response, status: int, kind: str) -> dict:
    """The error body, checked to be exactly `{"error": {"type", "detail"}}` (plus
    `current_version` on a version conflict) with this status and type."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"}, body
    extra = {"current_version"} if kind == "version_conflict" else set()
    assert set(body["error"]) == {"type", "detail"} | extra, body
    assert body["error"]["type"] == kind, body
    assert isinstance(body["error"]["detail"], str) and body["error"]["detail"].strip(), body
    return body["error"]


def _moved_clock(app: App, by: timedelta) -> None:
    """The service's clock for windows and locks, `by` ahead of the real one from now on."""
    app.runtime.changes.clock = lambda: datetime.now(timezone.utc) + by


# -- 1. the role matrix -------------------------------------------------------------------------------------


async def _change_probe(app: App, key: Key, memory_id: str, event: str, send, path: str = "http") -> bool:
    """Send a change as `key`: refused, it is a 403 and the memory is as it was; allowed, the
    memory is at its next version with one more event, which names the key and its role."""
    before = await _row(app, memory_id)
    response = await send()
    if response.status_code == 403:
        _error(response, 403, "forbidden")
        assert await _row(app, memory_id) == before, f"{key.role}: a refused {event} changed the memory"
        return False
    assert response.status_code == 200, (key.role, event, response.text)
    after = await _row(app, memory_id)
    assert (after["version"], after["events"]) == (before["version"] + 1, before["events"] + 1), (key.role, event)
    assert after["updated_by"] == key.actor
    last = (await _events(app, memory_id))[-1]
    assert (last["event"], last["version"], last["actor_id"], last["actor_type"], last["path"]) == (
        event, after["version"], key.actor, key.role, path), last
    assert last["reason"] == f"{key.role} tries {event}"
    return True


async def _read_probe(app: App, key: Key, memory: dict, scope: dict) -> bool:
    answers = [await _call(app, "GET", f"/api/memory/{memory['id']}", key),
               await _call(app, "GET", f"/api/memory/{memory['id']}/history", key),
               await _call(app, "GET", "/api/memory", key, params=scope)]
    statuses = [a.status_code for a in answers]
    if statuses == [403] * 3:
        return False
    assert statuses == [200] * 3, [a.text for a in answers]
    assert answers[0].json()["id"] == memory["id"]
    assert answers[1].json()["memory"]["id"] == memory["id"]
    assert memory["id"] in [m["id"] for m in answers[2].json()["items"]]
    return True


async def _search_probe(app: App, key: Key, scope: dict) -> bool:
    response = await _call(app, "POST", "/api/memory/search", key, body={"query": "matrix probe", "scope": scope})
    if response.status_code == 403:
        _error(response, 403, "forbidden")
        return False
    assert response.status_code == 200, response.text
    assert isinstance(response.json()["results"], list)
    return True


async def _remember_probe(app: App, key: Key, scope: dict) -> bool:
    content = f"{key.role} remembers a matrix fact"
    response = await _call(app, "POST", "/api/memory/remember", key,
                           body={"content": content, "scope": scope, "mode": "async", "raw": True})
    stored = await app.count("SELECT count(*) FROM memories WHERE user_id = $1 AND content = $2",
                             scope["user_id"], content)
    if response.status_code == 403:
        _error(response, 403, "forbidden")
        assert stored == 0
        return False
    assert response.status_code == 200, response.text
    await app.wait_job(response.json()["job_id"])
    events = await _events(app, response.json()["memory_id"])
    assert (stored, [(e["event"], e["actor_id"], e["actor_type"]) for e in events]) == (
        1, [("ADD", key.actor, key.role)])
    return True


async def _plain_probe(app: App, key: Key, path: str) -> bool:
    response = await _call(app, "GET", path, key)
    if response.status_code == 403:
        _error(response, 403, "forbidden")
        return False
    assert response.status_code == 200, (path, response.text)
    return True


async def test_every_role_may_do_exactly_what_the_matrix_grants_and_is_named_on_what_it_did(app):
    keys = {role: await _key(app, role) for role in ROLES}
    observed: dict[str, set[str]] = {}
    for role, key in keys.items():
        scope = {"user_id": f"matrix-{role}"}
        (plain, to_modify, to_forget, to_recover, to_roll_back, pinned, quarantined) = await asyncio.gather(
            _raw(app, "matrix probe memory to read", scope),
            _raw(app, "a memory to retag", scope),
            _raw(app, "a memory to forget", scope),
            _deleted(app, "a memory to recover", scope),
            _edited(app, "a memory to roll back", scope),
            _raw(app, "a pinned memory", scope, pinned=True),
            _quarantined(app, "a memory edited by hand", scope),
        )
        allowed = set()
        if await _search_probe(app, key, scope):
            allowed.add("search")
        if await _read_probe(app, key, plain, scope):
            allowed.add("read")
        if await _remember_probe(app, key, scope):
            allowed.add("remember")
        url = "/api/memory/{}".format
        reason = f"{role} tries {{}}".format
        if await _change_probe(app, key, to_modify["id"], "UPDATE", lambda: _call(
                app, "PATCH", url(to_modify["id"]), key, body={"tags": ["retagged"], "reason": reason("UPDATE")},
                headers={"X-Engram-Client": "cli"}), path="cli"):
            allowed.add("modify")
        if await _change_probe(app, key, to_forget["id"], "DELETE", lambda: _call(
                app, "DELETE", url(to_forget["id"]), key, params={"reason": reason("DELETE")})):
            allowed.add("forget")
        if await _change_probe(app, key, to_recover["id"], "RECOVER", lambda: _call(
                app, "POST", url(to_recover["id"]) + "/recover", key, body={"reason": reason("RECOVER")})):
            allowed.add("recover")
        if await _change_probe(app, key, to_roll_back["id"], "ROLLBACK", lambda: _call(
                app, "POST", url(to_roll_back["id"]) + "/rollback", key,
                body={"version": 1, "reason": reason("ROLLBACK")})):
            allowed.add("rollback")
        if await _change_probe(app, key, pinned["id"], "DELETE", lambda: _call(
                app, "DELETE", url(pinned["id"]), key, params={"reason": reason("DELETE"), "force": "true"})):
            allowed.add("force_delete")
        confirmed = await _change_probe(app, key, quarantined["id"], "CONFIRM", lambda: _call(
            app, "POST", url(quarantined["id"]) + "/confirm", key, body={"reason": reason("CONFIRM")}))
        verified = await _plain_probe(app, key, "/api/admin/verify")
        assert confirmed == verified, f"{role}: confirm and verify are both maintenance"
        if confirmed:
            allowed.add("maintenance")
            assert (await _row(app, quarantined["id"]))["status"] == "active"
        if await _plain_probe(app, key, "/api/approvals"):
            allowed.add("approve")
        if await _plain_probe(app, key, "/api/keys"):
            allowed.add("admin")
        observed[role] = allowed
    assert observed == MATRIX
    assert set().union(*MATRIX.values()) == set(ACTIONS)


async def test_verify_reports_every_memory_and_event_to_an_operator(app):
    for i in range(3):
        await _edited(app, f"verified memory number {i}")
    report = await _call(app, "GET", "/api/admin/verify", await _key(app, "operator"))
    assert report.status_code == 200, report.text
    body = report.json()
    events = await app.count("SELECT count(*) FROM memory_history")
    assert (body["ok"], body["memories"], body["events"], body["breaks"]) == (True, 3, events, [])
    assert events == 6


# -- 2. scope isolation -------------------------------------------------------------------------------------


def _scope_requests(memory_id: str) -> list[tuple[str, str, dict | None, dict | None]]:
    """Every endpoint that takes a memory's id, with bodies that would be valid for bob's memories."""
    base = f"/api/memory/{memory_id}"
    return [
        ("GET", base, None, None),
        ("GET", base + "/history", None, None),
        ("PATCH", base, {"tags": ["alice-was-here"], "reason": "alice edits"}, None),
        ("PATCH", base, {"content": "alice rewrites it", "reason": "alice edits", "if_version": 1}, None),
        ("DELETE", base, None, {"reason": "alice deletes"}),
        ("DELETE", base, None, {"reason": "alice deletes", "force": "true", "if_version": "7"}),
        ("POST", base + "/recover", {"reason": "alice recovers"}, None),
        ("POST", base + "/rollback", {"version": 1, "reason": "alice rolls back"}, None),
        ("POST", base + "/rollback", {"version": 99, "reason": "alice rolls back", "if_version": 3}, None),
        ("POST", base + "/confirm", {"reason": "alice confirms"}, None),
    ]


async def test_a_memory_outside_the_keys_scope_answers_exactly_as_a_missing_one_everywhere(app):
    # An operator, so that no endpoint refuses alice for her role before it looks at the memory.
    alice = await _key(app, "operator", ["user:alice"])
    bob = {"user_id": "bob"}
    bobs = [await _edited(app, "bob's pinned secret", bob, pinned=True),
            await _deleted(app, "bob's deleted note", bob),
            await _quarantined(app, "bob's hand-edited note", bob),
            await _raw(app, "bob's note in a run", {"user_id": "bob", "run_id": "r1"}),
            # alice's own user, but an agent part her key is not granted: not hers to touch either
            await _raw(app, "alice's note kept by agent x", {"user_id": "alice", "agent_id": "x"})]
    before = {m["id"]: await _row(app, m["id"]) for m in bobs}
    mismatches = []
    for memory in bobs:
        unknown = str(uuid.uuid4())
        for (method, path, body, params), (_, unknown_path, _, _) in zip(_scope_requests(memory["id"]),
                                                                         _scope_requests(unknown)):
            foreign = await _call(app, method, path, alice, body=body, params=params)
            missing = await _call(app, method, unknown_path, alice, body=body, params=params)
            error = _error(missing, 404, "not_found")
            assert unknown in error["detail"]
            expected = json.loads(missing.text.replace(unknown, memory["id"]))
            if (foreign.status_code, foreign.json()) != (404, expected):
                mismatches.append((method, path, body, params, foreign.status_code, foreign.text))
    assert mismatches == []
    job = (await app.remember("bob's newest note", bob, mode="async", raw=True))["job_id"]
    await app.wait_job(job)
    unknown_job = str(uuid.uuid4())
    missing = await _call(app, "GET", f"/api/memory/jobs/{unknown_job}", alice)
    foreign = await _call(app, "GET", f"/api/memory/jobs/{job}", alice)
    assert (foreign.status_code, foreign.json()) == (404, json.loads(missing.text.replace(unknown_job, job)))

    unknown = str(uuid.uuid4())
    items = [{"id": m["id"], "tags": ["alice-was-here"], "reason": "alice edits"} for m in bobs]
    items += [{"id": bobs[0]["id"], "importance": 0.1, "reason": "alice edits", "if_version": 1},
              {"id": unknown, "tags": ["alice-was-here"], "reason": "alice edits"}]
    batch = await _call(app, "POST", "/api/memory/modify", alice, body={"items": items})
    assert batch.status_code == 200, batch.text
    assert (batch.json()["applied"], batch.json()["failed"]) == (0, len(items))
    results = batch.json()["results"]
    missing = {k: v for k, v in results[-1].items() if k != "index"}
    assert missing["error"]["type"] == "not_found" and unknown in missing["error"]["detail"]
    for item, result in zip(items[:-1], results[:-1]):
        expected = json.loads(json.dumps(missing).replace(unknown, item["id"]))
        assert {k: v for k, v in result.items() if k != "index"} == expected, result

    assert {m["id"]: await _row(app, m["id"]) for m in bobs} == before


# -- 3. idempotent replays ---------------------------------------------------------------------------------


async def _replayed(app: App, key: Key, method: str, path: str, first: dict, other: dict, watched: list[str],
                    idempotency_key: str | None = None) -> httpx.Response:
    """Send `first` twice and `other` once under one Idempotency-Key: the first applies, the
    replay answers the same and writes nothing, `other` is a 409 and writes nothing."""
    headers = {"Idempotency-Key": idempotency_key or f"idem-{uuid.uuid4()}"}
    before = {m: await _row(app, m) for m in watched}
    answer = await _call(app, method, path, key, headers=headers, **first)
    assert answer.status_code == 200, answer.text
    applied = {m: await _row(app, m) for m in watched}
    assert sum(applied[m]["events"] - before[m]["events"] for m in watched) == 1
    replay = await _call(app, method, path, key, headers=headers, **first)
    assert (replay.status_code, replay.json()) == (200, answer.json())
    assert {m: await _row(app, m) for m in watched} == applied, f"the replay of {method} {path} wrote again"
    refused = await _call(app, method, path, key, headers=headers, **other)
    _error(refused, 409, "conflict")
    assert {m: await _row(app, m) for m in watched} == applied, f"{method} {path}: the refused reuse wrote"
    return answer


async def test_every_mutation_replayed_answers_as_first_and_writes_once(app):
    writer, operator = await _key(app, "writer"), await _key(app, "operator")
    memory = await _raw(app, "a memory patched with an idempotency key")
    path = f"/api/memory/{memory['id']}"
    first = await _replayed(app, writer, "PATCH", path, {"body": {"tags": ["once"], "reason": "r", "if_version": 1}},
                            {"body": {"tags": ["twice"], "reason": "r", "if_version": 1}}, [memory["id"]],
                            idempotency_key="patch-key")
    assert (first.json()["version"], first.json()["tags"]) == (2, ["once"])
    # Later changes by others do not change what the key answers, and its stale if_version is no conflict.
    moved = await _call(app, "PATCH", path, body={"importance": 0.9, "reason": "someone else"})
    assert moved.json()["version"] == 3
    replay = await _call(app, "PATCH", path, writer, body={"tags": ["once"], "reason": "r", "if_version": 1},
                         headers={"Idempotency-Key": "patch-key"})
    assert (replay.status_code, replay.json()) == (200, first.json())
    assert (await _row(app, memory["id"]))["version"] == 3
    # The same key on another endpoint or another memory is another request: 409, nothing changed.
    other = await _raw(app, "another memory")
    before = {m: await _row(app, m) for m in (memory["id"], other["id"])}
    for method, url, kwargs in (("DELETE", path, {"params": {"reason": "r"}}),
                                ("PATCH", f"/api/memory/{other['id']}", {"body": {"tags": ["once"], "reason": "r",
                                                                                    "if_version": 1}})):
        reused = await _call(app, method, url, writer, headers={"Idempotency-Key": "patch-key"}, **kwargs)
        _error(reused, 409, "conflict")
    assert {m: await _row(app, m) for m in (memory["id"], other["id"])} == before
    # Idempotency keys are each caller's own: another key's "patch-key" is a new request.
    mine = await _call(app, "PATCH", f"/api/memory/{other['id']}", await _key(app, "writer"),
                       body={"tags": ["once"], "reason": "r", "if_version": 1},
                       headers={"Idempotency-Key": "patch-key"})
    assert (mine.status_code, mine.json()["version"]) == (200, 2), mine.text

    doomed = await _raw(app, "a memory deleted with an idempotency key")
    deleted = await _replayed(app, writer, "DELETE", f"/api/memory/{doomed['id']}",
                              {"params": {"reason": "gone"}}, {"params": {"reason": "gone for good"}}, [doomed["id"]])
    assert deleted.json()["is_deleted"] is True
    recovered = await _replayed(app, writer, "POST", f"/api/memory/{doomed['id']}/recover",
                                {"body": {"reason": "back"}}, {"body": {"reason": "back again"}}, [doomed["id"]])
    assert recovered.json()["status"] == "active"
    rolled = await _edited(app, "a memory rolled back with an idempotency key")
    answer = await _replayed(app, writer, "POST", f"/api/memory/{rolled['id']}/rollback",
                             {"body": {"version": 1, "reason": "undo"}}, {"body": {"version": 1, "reason": "redo"}},
                             [rolled["id"]])
    assert (answer.json()["version"], answer.json()["tags"]) == (3, [])
    quarantined = await _quarantined(app, "a memory confirmed with an idempotency key")
    answer = await _replayed(app, operator, "POST", f"/api/memory/{quarantined['id']}/confirm",
                             {"body": {"reason": "fine"}}, {"body": {"reason": "fine indeed"}}, [quarantined["id"]])
    assert answer.json()["status"] == "active"

    a, b = await _raw(app, "batch item a"), await _raw(app, "batch item b")
    items = [{"id": a["id"], "tags": ["batched"], "reason": "r"},
             {"id": b["id"], "tags": ["batched"], "reason": "r", "if_version": 5}]
    answer = await _replayed(app, writer, "POST", "/api/memory/modify", {"body": {"items": items}},
                             {"body": {"items": items[:1]}}, [a["id"], b["id"]])
    assert (answer.json()["applied"], answer.json()["failed"]) == (1, 1)
    assert [(await _row(app, m))["events"] for m in (a["id"], b["id"])] == [2, 1]


async def test_concurrent_requests_with_one_idempotency_key_apply_once_and_answer_alike(app):
    writer = await _key(app, "writer")
    memory = await _raw(app, "a memory five retries race to change")
    url = f"/api/memory/{memory['id']}"
    answers = await asyncio.gather(*(
        _call(app, "PATCH", url, writer, body={"content": "a memory changed once", "reason": "retry storm"},
              headers={"Idempotency-Key": "storm"}) for _ in range(5)))
    assert [a.status_code for a in answers] == [200] * 5, [a.text for a in answers]
    assert all(a.json() == answers[0].json() for a in answers)
    assert answers[0].json()["version"] == 2
    assert [e["event"] for e in await _events(app, memory["id"])] == ["ADD", "UPDATE"]

    deletes = await asyncio.gather(*(
        _call(app, "DELETE", url, writer, params={"reason": "retry storm"}, headers={"Idempotency-Key": "storm-2"})
        for _ in range(5)))
    assert [d.status_code for d in deletes] == [200] * 5, [d.text for d in deletes]
    assert all(d.json() == deletes[0].json() for d in deletes)
    assert [e["event"] for e in await _events(app, memory["id"])] == ["ADD", "UPDATE", "DELETE"]


async def test_a_conditional_delete_or_rollback_on_another_version_is_a_version_conflict(app):
    memory = await _edited(app, "a memory at version two")
    url = f"/api/memory/{memory['id']}"
    before = await _row(app, memory["id"])
    for method, path, kwargs in (("DELETE", url, {"params": {"reason": "r", "if_version": "1"}}),
                                 ("POST", url + "/rollback", {"body": {"version": 1, "reason": "r", "if_version": 1}}),
                                 ("PATCH", url, {"body": {"tags": ["x"], "reason": "r", "if_version": 2 ** 31 - 1}})):
        response = await _call(app, method, path, **kwargs)
        assert _error(response, 409, "version_conflict")
        assert response.json()["error"]["current_version"] == 2
    assert await _row(app, memory["id"]) == before


# -- 4. bad input -------------------------------------------------------------------------------------------

BAD_VERSIONS = [0, -1, "x", "1", 2 ** 40, True, 1.5, None]
BAD_QUERY_VERSIONS = ["0", "-1", "x", str(2 ** 40), "1.5", "true"]


def _bad_requests(m: str, d: str) -> list[tuple[str, str, dict, str]]:
    """(method, path, request, a word the detail must name): each is bad input, a 422."""
    patch, one = f"/api/memory/{m}", {"tags": ["x"], "reason": "r"}
    cases = [
        ("PATCH", patch, {"body": {}}, "reason"),
        ("PATCH", patch, {"body": {"tags": ["x"]}}, "reason"),
        ("PATCH", patch, {"body": {"tags": ["x"], "reason": ""}}, "reason"),
        ("PATCH", patch, {"body": {"tags": ["x"], "reason": "   "}}, "reason"),
        ("PATCH", patch, {"body": {"tags": ["x"], "reason": "\u200b\u200b"}}, "reason"),
        ("PATCH", patch, {"body": {"tags": ["x"], "reason": None}}, "reason"),
        ("PATCH", patch, {"body": {"tags": ["x"], "reason": 5}}, "reason"),
        ("PATCH", patch, {"body": {"tags": ["x"], "reason": "r" * 501}}, "reason"),
        ("PATCH", patch, {"body": {"reason": "r"}}, "at least one"),
        ("PATCH", patch, {"body": {"reason": "r", "content": None, "tags": None}}, "at least one"),
        ("PATCH", patch, {"body": {**one, "colour": "red"}}, "colour"),
        ("PATCH", patch, {"body": {**one, "id": m}}, "id"),
        ("PATCH", patch, {"body": {**one, "version": 3}}, "version"),
        ("PATCH", patch, {"body": {**one, "manual_override_until": None}}, "manual_override_until"),
        ("PATCH", patch, {"body": {**one, "status": "active"}}, "status"),
        ("PATCH", patch, {"body": {**one, "is_deleted": False}}, "is_deleted"),
        ("PATCH", patch, {"body": one, "headers": {"Idempotency-Key": ""}}, "Idempotency-Key"),
        ("PATCH", patch, {"body": one, "headers": {"Idempotency-Key": "k" * 201}}, "Idempotency-Key"),
        ("PATCH", patch, {"body": one, "headers": {"X-Engram-Client": "browser"}}, "X-Engram-Client"),
        ("DELETE", patch, {"params": {"reason": "r"}, "headers": {"X-Engram-Client": "grpc"}}, "X-Engram-Client"),
        ("POST", f"/api/memory/{d}/recover", {"body": {"reason": "r"}, "headers": {"Idempotency-Key": ""}},
         "Idempotency-Key"),
        ("POST", "/api/memory/modify", {"body": {"items": [{"id": m, **one}]}, "headers": {"X-Engram-Client": "x"}},
         "X-Engram-Client"),
        ("PATCH", patch, {"body": {"tags": "x", "reason": "r"}}, "tags"),
        ("PATCH", patch, {"body": {"tags": [1], "reason": "r"}}, "tags"),
        ("PATCH", patch, {"body": {"tags": [""], "reason": "r"}}, "tags"),
        ("PATCH", patch, {"body": {"importance": "0.5", "reason": "r"}}, "importance"),
        ("PATCH", patch, {"body": {"importance": 1.5, "reason": "r"}}, "importance"),
        ("PATCH", patch, {"body": {"pinned": "true", "reason": "r"}}, "pinned"),
        ("PATCH", patch, {"body": {"pinned": 1, "reason": "r"}}, "pinned"),
        ("PATCH", patch, {"body": {"content": 5, "reason": "r"}}, "content"),
        ("PATCH", patch, {"body": {"content": " \t ", "reason": "r"}}, "content"),
        ("PATCH", patch, {"body": {"type": "", "reason": "r"}}, "type"),
        ("PATCH", patch, {"body": {"metadata": ["a"], "reason": "r"}}, "metadata"),
        ("PATCH", patch, {"body": ["tags", "reason"]}, "body"),
        ("PATCH", patch, {"content": b'{"tags": ["x"], "reason": '}, "JSON"),
        ("DELETE", patch, {"params": {}}, "reason"),
        ("DELETE", patch, {"params": {"reason": ""}}, "reason"),
        ("DELETE", patch, {"params": {"reason": "  "}}, "reason"),
        ("DELETE", patch, {"params": {"reason": "r", "force": "maybe"}}, "force"),
        ("POST", f"/api/memory/{d}/recover", {"body": {}}, "reason"),
        ("POST", f"/api/memory/{d}/recover", {"body": {"reason": " "}}, "reason"),
        ("POST", f"/api/memory/{d}/recover", {"body": {"reason": 5}}, "reason"),
        ("POST", f"/api/memory/{d}/recover", {"body": {"reason": "r", "force": True}}, "force"),
        ("POST", f"/api/memory/{m}/rollback", {"body": {"reason": "r"}}, "version"),
        ("POST", f"/api/memory/{m}/rollback", {"body": {"version": 1}}, "reason"),
        ("POST", f"/api/memory/{m}/rollback", {"body": {"version": 1, "reason": ""}}, "reason"),
        ("POST", f"/api/memory/{m}/rollback", {"body": {"version": 1, "reason": "r", "tags": []}}, "tags"),
        ("POST", f"/api/memory/{m}/rollback", {"body": {"version": 2, "reason": "r"}}, "version"),  # the current
        ("POST", f"/api/memory/{m}/rollback", {"body": {"version": 99, "reason": "r"}}, "version"),
        ("POST", f"/api/memory/{m}/confirm", {"body": {}}, "reason"),
        ("POST", f"/api/memory/{m}/confirm", {"body": {"reason": "\u200b"}}, "reason"),
        ("POST", f"/api/memory/{m}/confirm", {"body": {"reason": "r", "force": True}}, "force"),
        ("POST", "/api/memory/modify", {"body": {}}, "items"),
        ("POST", "/api/memory/modify", {"body": {"items": []}}, "items"),
        ("POST", "/api/memory/modify", {"body": {"items": {"id": m, **one}}}, "items"),
        ("POST", "/api/memory/modify", {"body": {"items": ["x"]}}, "items"),
        ("POST", "/api/memory/modify", {"body": {"items": [{"id": m, **one}] * 101}}, "items"),
        ("POST", "/api/memory/modify", {"body": {"items": [{"id": m, **one}], "atomic": True}}, "atomic"),
    ]
    for version in BAD_VERSIONS:
        if version is not None:
            cases.append(("PATCH", patch, {"body": {**one, "if_version": version}}, "if_version"))
            cases.append(("POST", f"/api/memory/{m}/rollback", {"body": {"version": version, "reason": "r"}},
                          "version"))
            cases.append(("POST", f"/api/memory/{m}/rollback",
                          {"body": {"version": 1, "reason": "r", "if_version": version}}, "if_version"))
    for version in BAD_QUERY_VERSIONS:
        cases.append(("DELETE", patch, {"params": {"reason": "r", "if_version": version}}, "if_version"))
    cases.append(("POST", f"/api/memory/{m}/rollback", {"body": {"version": None, "reason": "r"}}, "version"))
    return cases


async def test_bad_input_on_every_change_endpoint_is_a_422_and_changes_nothing(app):
    memory = await _edited(app, "a memory that bad requests must leave alone")
    deleted = await _deleted(app, "a deleted memory that bad requests must leave alone")
    watched = [memory["id"], deleted["id"]]
    before = {m: await _row(app, m) for m in watched}
    wrong = []
    for method, path, request, names in _bad_requests(memory["id"], deleted["id"]):
        response = await _call(app, method, path, **request)
        if response.status_code != 422:
            wrong.append((method, path, request, response.status_code, response.text[:200]))
            continue
        detail = _error(response, 422, "validation_error")["detail"]
        assert names in detail, (method, path, request, detail)
    assert wrong == []
    assert {m: await _row(app, m) for m in watched} == before


async def test_an_unknown_or_malformed_id_is_a_not_found_on_every_endpoint(app):
    memory = await _edited(app, "the one memory there is")
    before = await _row(app, memory["id"])
    for memory_id in (str(uuid.uuid4()), str(uuid.uuid4()).upper()):
        for method, path, body, params in _scope_requests(memory_id):
            error = _error(await _call(app, method, path, body=body, params=params), 404, "not_found")
            assert error["detail"] == f"no memory {memory_id.lower()}", (method, path, error)
    # A path that is no memory id at all names no route: the router's 404, in the same shape.
    for memory_id in ("not-a-uuid", "12345", memory["id"] + "0", "%00"):
        for method, path, body, params in _scope_requests(memory_id):
            _error(await _call(app, method, path, body=body, params=params), 404, "not_found")
    assert await _row(app, memory["id"]) == before


async def test_a_patch_equal_to_what_is_stored_writes_no_version_and_takes_no_lock(app):
    memory = await _raw(app, "an unchanging memory", tags=["same"], importance=0.5)
    before = await _row(app, memory["id"])
    response = await _call(app, "PATCH", f"/api/memory/{memory['id']}", await _key(app, "writer"),
                           body={"tags": ["same"], "importance": 0.5, "content": "an unchanging memory",
                                 "reason": "nothing new"})
    assert response.status_code == 200, response.text
    assert (response.json()["version"], response.json()["manual_override_until"]) == (1, None)
    assert await _row(app, memory["id"]) == before


async def test_a_delete_with_an_unknown_query_parameter_is_refused(app):
    memory = await _edited(app, "a memory deleted with a typo")
    before = await _row(app, memory["id"])
    response = await _call(app, "DELETE", f"/api/memory/{memory['id']}",
                           params={"reason": "conditional delete", "ifversion": "1"})
    assert (await _row(app, memory["id"])) == before, "a conditional delete meant for version 1 deleted version 2"
    _error(response, 422, "validation_error")


# -- 5. a batch with mixed outcomes ------------------------------------------------------------------------


async def test_a_batch_applies_each_item_on_its_own_and_reports_each(app):
    carol, dave = {"user_id": "carol"}, {"user_id": "dave"}
    key = await _key(app, "writer", ["user:carol"])
    ok_a = await _raw(app, "carol likes green tea", carol)
    ok_b = await _edited(app, "carol walks to work", carol)
    stale = await _edited(app, "carol's car is blue", carol)
    taken = await _raw(app, "carol's birthday is in May", carol)
    twin = await _raw(app, "carol's birthday is in June", carol)
    invalid = await _raw(app, "carol's cat is called Tom", carol)
    gone = await _deleted(app, "carol's old phone number", carol)
    twice = await _raw(app, "carol plays chess", carol)
    foreign = await _raw(app, "dave's bank pin", dave)
    unknown = str(uuid.uuid4())
    items = [
        {"id": ok_a["id"], "tags": ["drinks"], "importance": 0.8, "reason": "ok"},                 # 0 ok
        {"id": stale["id"], "tags": ["car"], "reason": "stale", "if_version": 1},                  # 1 conflict
        {"id": unknown, "tags": ["x"], "reason": "unknown"},                                       # 2 not found
        {"id": foreign["id"], "tags": ["x"], "reason": "foreign"},                                 # 3 not found
        {"id": invalid["id"], "tags": ["pets"]},                                                   # 4 no reason
        {"id": twin["id"], "content": "carol's birthday is in May", "reason": "dup"},              # 5 duplicate
        {"id": ok_b["id"], "content": "carol cycles to work", "reason": "ok", "if_version": 2},    # 6 ok
        {"id": gone["id"], "tags": ["x"], "reason": "deleted"},                                    # 7 deleted
        {"id": "not-a-uuid", "tags": ["x"], "reason": "malformed"},                                # 8 invalid
        {"id": twice["id"], "tags": ["games"], "reason": "first", "if_version": 1},                # 9 ok
        {"id": twice["id"], "tags": ["board"], "reason": "second", "if_version": 1},               # 10 conflict
        {"id": invalid["id"], "importance": "high", "reason": "wrong type"},                       # 11 invalid
    ]
    watched = [m["id"] for m in (ok_a, ok_b, stale, taken, twin, invalid, gone, twice, foreign)]
    before = {m: await _row(app, m) for m in watched}
    response = await _call(app, "POST", "/api/memory/modify", key, body={"items": items})
    assert response.status_code == 200, response.text
    body = response.json()
    results = body["results"]
    assert [r["index"] for r in results] == list(range(len(items)))
    outcome = [(r["ok"], r["version"], (r["error"] or {}).get("type"), r["current_version"]) for r in results]
    assert outcome == [
        (True, 2, None, None),
        (False, None, "version_conflict", 2),
        (False, None, "not_found", None),
        (False, None, "not_found", None),
        (False, None, "validation_error", None),
        (False, None, "conflict", None),
        (True, 3, None, None),
        (False, None, "conflict", None),
        (False, None, "validation_error", None),
        (True, 2, None, None),
        (False, None, "version_conflict", 2),
        (False, None, "validation_error", None),
    ]
    assert (body["applied"], body["failed"]) == (3, 9)
    for index in (0, 1, 2, 3, 5, 6, 7, 9, 10):
        assert results[index]["id"] == items[index]["id"], results[index]
    assert unknown in results[2]["error"]["detail"] and foreign["id"] in results[3]["error"]["detail"]
    assert "reason" in results[4]["error"]["detail"] and "importance" in results[11]["error"]["detail"]

    after = {m: await _row(app, m) for m in watched}
    for m in (ok_a, ok_b, twice):
        assert after[m["id"]]["events"] == before[m["id"]]["events"] + 1
    assert (after[ok_a["id"]]["tags"], after[ok_a["id"]]["importance"]) == (["drinks"], pytest.approx(0.8))
    assert after[ok_b["id"]]["content"] == "carol cycles to work"
    assert after[twice["id"]]["tags"] == ["games"]
    for m in (stale, taken, twin, invalid, gone, foreign):
        assert after[m["id"]] == before[m["id"]], m["content"]
    events = await _events(app, ok_b["id"])
    assert (events[-1]["event"], events[-1]["actor_id"], events[-1]["reason"]) == ("UPDATE", key.actor, "ok")


# -- 6. the recovery window --------------------------------------------------------------------------------


async def test_a_delete_is_recoverable_inside_the_window_and_gone_after_it(app):
    writer = await _key(app, "writer")
    memory = await _raw(app, "a memory forgotten and recovered")
    url = f"/api/memory/{memory['id']}"
    _error(await _call(app, "POST", url + "/recover", writer, body={"reason": "not deleted"}), 409, "conflict")

    assert (await _call(app, "DELETE", url, writer, params={"reason": "first"})).status_code == 200
    _moved_clock(app, timedelta(days=29, hours=23))
    recovered = await _call(app, "POST", url + "/recover", writer, body={"reason": "within the window"})
    assert recovered.status_code == 200, recovered.text
    assert (recovered.json()["is_deleted"], recovered.json()["status"], recovered.json()["deleted_at"]) == (
        False, "active", None)

    assert (await _call(app, "DELETE", url, writer, params={"reason": "second"})).status_code == 200
    _moved_clock(app, timedelta(days=29, hours=23) + timedelta(days=30, minutes=5))
    before = await _row(app, memory["id"])
    late = await _call(app, "POST", url + "/recover", writer, body={"reason": "too late"})
    assert "30 days" in _error(late, 410, "gone")["detail"]
    assert await _row(app, memory["id"]) == before
    assert before["is_deleted"] and before["status"] == "deleted"
    events = await _events(app, memory["id"])
    assert [e["event"] for e in events] == ["ADD", "DELETE", "RECOVER", "DELETE"]


async def test_recovering_a_memory_whose_content_is_live_again_is_a_conflict(app):
    writer = await _key(app, "writer")
    deleted = await _deleted(app, "the wifi password is hunter2")
    again = await _raw(app, "the wifi password is hunter2")
    assert again["id"] != deleted["id"]
    before = await _row(app, deleted["id"])
    refused = await _call(app, "POST", f"/api/memory/{deleted['id']}/recover", writer, body={"reason": "undo"})
    assert again["id"] in _error(refused, 409, "conflict")["detail"]
    assert await _row(app, deleted["id"]) == before
    assert [h["memory"]["id"] for h in await app.search("wifi password")] == [again["id"]]


async def test_the_recovery_window_is_the_configured_one(make_app):
    async with make_app(tombstone_days=1) as app:
        memory = await _deleted(app, "a memory with a short window")
        _moved_clock(app, timedelta(hours=25))
        late = await _call(app, "POST", f"/api/memory/{memory['id']}/recover", body={"reason": "too late"})
        _error(late, 410, "gone")
        assert (await _row(app, memory["id"]))["is_deleted"]


# -- 7. pinned memories ------------------------------------------------------------------------------------


async def test_a_pinned_memory_is_deleted_only_by_an_operator_with_force(app):
    keys = {role: await _key(app, role) for role in ROLES}
    memory = await _raw(app, "a pinned memory everyone tries to delete", pinned=True)
    url = f"/api/memory/{memory['id']}"
    before = await _row(app, memory["id"])
    for role, key in keys.items():
        plain = await _call(app, "DELETE", url, key, params={"reason": "plain delete"})
        if role == "reader":
            _error(plain, 403, "forbidden")
        else:
            assert "force" in _error(plain, 409, "pinned")["detail"]
        if role in ("reader", "agent", "writer"):
            _error(await _call(app, "DELETE", url, key, params={"reason": "forced", "force": "true"}), 403,
                   "forbidden")
        assert await _row(app, memory["id"]) == before, role
    forced = await _call(app, "DELETE", url, keys["operator"], params={"reason": "an operator forces it",
                                                                        "force": "true"},
                         headers={"X-Engram-Client": "mcp", "X-Request-ID": "req-force-1"})
    assert forced.status_code == 200, forced.text
    assert (forced.json()["is_deleted"], forced.json()["pinned"]) == (True, True)
    last = (await _events(app, memory["id"]))[-1]
    assert (last["event"], last["actor_id"], last["actor_type"], last["reason"], last["path"], last["request_id"]) == (
        "DELETE", keys["operator"].actor, "operator", "an operator forces it", "mcp", "req-force-1")
    assert last["state"]["pinned"] is True and last["state"]["is_deleted"] is True


async def test_only_an_operator_may_unpin_so_nobody_else_gets_round_the_pin(app):
    memory = await _raw(app, "a pinned memory others would like gone", pinned=True)
    url = f"/api/memory/{memory['id']}"
    before = await _row(app, memory["id"])
    for role in ("agent", "writer"):
        key = await _key(app, role)
        _error(await _call(app, "PATCH", url, key, body={"pinned": False, "reason": "unpin it"}), 403, "forbidden")
        await _call(app, "DELETE", url, key, params={"reason": "now delete it"})
        assert await _row(app, memory["id"]) == before, role
    operator = await _key(app, "operator")
    unpinned = await _call(app, "PATCH", url, operator, body={"pinned": False, "reason": "no longer needs a pin"})
    assert (unpinned.status_code, unpinned.json()["pinned"]) == (200, False), unpinned.text


# -- 8. a person's lock against an agent's changes ----------------------------------------------------------


async def test_a_persons_edit_locks_the_memory_against_an_agent_until_the_lock_expires(app):
    writer, other_writer, agent = await _key(app, "writer"), await _key(app, "writer"), await _key(app, "agent")
    memory = await _raw(app, "the user's preferred airline")
    free = await _raw(app, "a memory only agents edit")
    url = f"/api/memory/{memory['id']}"

    own = await _call(app, "PATCH", f"/api/memory/{free['id']}", agent, body={"tags": ["auto"], "reason": "agent"})
    assert (own.status_code, own.json()["manual_override_until"]) == (200, None), own.text

    t0 = datetime.now(timezone.utc)
    edited = await _call(app, "PATCH", url, writer, body={"tags": ["checked"], "reason": "a person checked it"})
    assert edited.status_code == 200, edited.text
    locked_until = datetime.fromisoformat(edited.json()["manual_override_until"])
    week = timedelta(days=7)
    assert t0 + week - timedelta(seconds=1) <= locked_until <= datetime.now(timezone.utc) + week

    before = await _row(app, memory["id"])
    assert "until" in _error(await _call(app, "PATCH", url, agent, body={"tags": ["auto"], "reason": "agent"}), 409,
                             "manual_override")["detail"]
    _error(await _call(app, "DELETE", url, agent, params={"reason": "agent"}), 409, "manual_override")
    batch = await _call(app, "POST", "/api/memory/modify", agent,
                        body={"items": [{"id": memory["id"], "importance": 0.1, "reason": "agent"}]})
    assert batch.json()["results"][0]["error"]["type"] == "manual_override", batch.text
    assert await _row(app, memory["id"]) == before

    by_other = await _call(app, "PATCH", url, other_writer, body={"tags": ["rechecked"], "reason": "another person"})
    assert by_other.status_code == 200, by_other.text
    relocked = datetime.fromisoformat(by_other.json()["manual_override_until"])
    assert relocked >= locked_until

    _moved_clock(app, week - timedelta(hours=1))
    _error(await _call(app, "PATCH", url, agent, body={"tags": ["auto"], "reason": "agent"}), 409, "manual_override")
    _moved_clock(app, relocked - datetime.now(timezone.utc) + timedelta(seconds=5))
    after = await _call(app, "PATCH", url, agent, body={"tags": ["auto"], "reason": "agent, after the lock"})
    assert (after.status_code, after.json()["tags"]) == (200, ["auto"]), after.text
    deleted = await _call(app, "DELETE", url, agent, params={"reason": "agent deletes after the lock"})
    assert (deleted.status_code, deleted.json()["is_deleted"]) == (200, True), deleted.text


async def test_a_rollback_by_a_person_locks_too(app):
    writer, agent = await _key(app, "writer"), await _key(app, "agent")
    memory = await _raw(app, "a memory an agent edits and a person rolls back")
    url = f"/api/memory/{memory['id']}"
    assert (await _call(app, "PATCH", url, agent, body={"tags": ["auto"], "reason": "agent"})).status_code == 200
    rolled = await _call(app, "POST", url + "/rollback", writer, body={"version": 1, "reason": "the agent was wrong"})
    assert rolled.status_code == 200 and rolled.json()["manual_override_until"] is not None, rolled.text
    before = await _row(app, memory["id"])
    _error(await _call(app, "PATCH", url, agent, body={"tags": ["auto"], "reason": "agent again"}), 409,
           "manual_override")
    assert await _row(app, memory["id"]) == before


# -- 9. rate limits ------------------------------------------------------------------------------------------


async def _burst(app: App, key: Key, method: str, memories: list[dict], **kwargs) -> list[httpx.Response]:
    """One request per memory, all at once (so the refill between them is negligible)."""
    return list(await asyncio.gather(*(_call(app, method, f"/api/memory/{m['id']}", key, **kwargs)
                                       for m in memories)))


async def test_changes_beyond_the_burst_are_429_with_retry_after_and_change_nothing(make_app):
    async with make_app(change_rate_per_s=1, change_burst=2) as app:
        writer, other = await _key(app, "writer"), await _key(app, "writer")
        to_patch = [await _raw(app, f"a memory changed too often {i}") for i in range(3)]
        to_delete = [await _raw(app, f"a memory deleted too often {i}") for i in range(3)]
        before = {m["id"]: await _row(app, m["id"]) for m in to_patch + to_delete}

        answers = await _burst(app, writer, "PATCH", to_patch, body={"tags": ["quick"], "reason": "quick"})
        assert sorted(a.status_code for a in answers) == [200, 200, 429], [a.text for a in answers]
        limited = next(i for i, a in enumerate(answers) if a.status_code == 429)
        _error(answers[limited], 429, "rate_limited")
        retry_after = int(answers[limited].headers["Retry-After"])
        assert retry_after >= 1
        untouched = to_patch[limited]["id"]
        assert await _row(app, untouched) == before[untouched]
        # Another key has its own allowance.
        mine = await _call(app, "PATCH", f"/api/memory/{untouched}", other, body={"tags": ["other"], "reason": "r"})
        assert mine.status_code == 200, mine.text

        # Forget has its own allowance, limited alike.
        deletes = await _burst(app, writer, "DELETE", to_delete, params={"reason": "quick"})
        assert sorted(d.status_code for d in deletes) == [200, 200, 429], [d.text for d in deletes]
        kept = to_delete[next(i for i, d in enumerate(deletes) if d.status_code == 429)]["id"]
        assert await _row(app, kept) == before[kept]

        # An honest Retry-After: waiting that long is enough.
        await asyncio.sleep(retry_after + 0.2)
        again = await _call(app, "PATCH", f"/api/memory/{untouched}", writer,
                            body={"tags": ["later"], "reason": "after waiting"})
        assert again.status_code == 200, again.text


async def test_a_batch_beyond_the_burst_answers_rate_limited_for_the_items_over_it(make_app):
    async with make_app(change_rate_per_s=1, change_burst=2) as app:
        writer = await _key(app, "writer")
        memories = [await _raw(app, f"a batched memory {i}") for i in range(3)]
        before = await _row(app, memories[2]["id"])
        response = await _call(app, "POST", "/api/memory/modify", writer, body={"items": [
            {"id": m["id"], "tags": ["batch"], "reason": "r"} for m in memories]})
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert [(r["ok"], (r["error"] or {}).get("type")) for r in results] == [
            (True, None), (True, None), (False, "rate_limited")]
        assert await _row(app, memories[2]["id"]) == before


# -- 10. the list's status filter ----------------------------------------------------------------------------


async def test_the_list_filters_by_status_and_hides_deleted_ones_by_default(app):
    scope = {"user_id": "lister"}
    active = await _raw(app, "a live memory", scope)
    deleted = await _deleted(app, "a deleted memory", scope)
    quarantined = await _quarantined(app, "a quarantined memory", scope)
    await _deleted(app, "someone else's deleted memory", {"user_id": "other"})
    reader = await _key(app, "reader", ["user:lister"])

    async def listed(**params) -> list[str]:
        response = await _call(app, "GET", "/api/memory", reader, params={**scope, **params})
        assert response.status_code == 200, response.text
        return sorted(m["id"] for m in response.json()["items"])

    assert await listed() == [active["id"]]
    assert await listed(status="active") == [active["id"]]
    assert await listed(status="deleted") == [deleted["id"]]
    assert await listed(status="quarantined") == [quarantined["id"]]
    assert await listed(include_deleted="true") == sorted([active["id"], deleted["id"]])
    page = await _call(app, "GET", "/api/memory", reader, params={**scope, "status": "deleted"})
    item = page.json()["items"][0]
    assert (item["is_deleted"], item["status"], item["deleted_at"] is not None) == (True, "deleted", True)
    _error(await _call(app, "GET", "/api/memory", reader, params={"user_id": "other", "status": "deleted"}), 403,
           "forbidden")
    _error(await _call(app, "GET", "/api/memory", reader, params={**scope, "status": "gone"}), 422,
           "validation_error")


async def test_a_batch_remember_sent_again_with_its_idempotency_key_brings_back_nothing(app):
    scope = {"user_id": f"keyed-{uuid.uuid4().hex[:8]}"}
    body = {"items": [{"content": f"keyed batch item {i}", "scope": scope, "raw": True} for i in range(3)]}
    headers = {"Authorization": f"Bearer {app.admin_key}", "Idempotency-Key": f"batch-{uuid.uuid4()}"}
    first = await app.http.post("/api/memory/remember/batch", json=body, headers=headers)
    assert first.status_code == 200, first.text
    ids = [r["memory_id"] for r in first.json()["results"]]
    await app.forget(ids[0])  # without the key, the same batch again would store it anew
    again = await app.http.post("/api/memory/remember/batch", json=body, headers=headers)
    assert again.status_code == 200, again.text
    assert [r["memory_id"] for r in again.json()["results"]] == ids
    assert await app.count("SELECT count(*) FROM memories WHERE user_id = $1", scope["user_id"]) == 3
    assert await app.count("SELECT count(*) FROM memories WHERE user_id = $1 AND NOT is_deleted",
                           scope["user_id"]) == 2


async def test_a_replay_answers_as_first_beyond_the_rate_limit_and_during_a_freeze(make_app):
    async with make_app(change_rate_per_s=0.01, change_burst=2) as app:
        writer = await _key(app, "writer")
        memory = await _raw(app, "a memory a client retries a change to")
        path = f"/api/memory/{memory['id']}"
        patch = {"tags": ["retried"], "reason": "r"}
        first = await _call(app, "PATCH", path, writer, body=patch, headers={"Idempotency-Key": "retry-1"})
        batch = {"items": [{"id": memory["id"], "importance": 0.25, "reason": "r"}]}
        first_batch = await _call(app, "POST", "/api/memory/modify", writer, body=batch,
                                  headers={"Idempotency-Key": "retry-2"})
        assert first.status_code == first_batch.status_code == 200, (first.text, first_batch.text)
        # The burst is spent: a new change is 429, the replays answer as first.
        _error(await _call(app, "PATCH", path, writer, body={"tags": ["new"], "reason": "r"}), 429, "rate_limited")
        assert (await _call(app, "PATCH", path, writer, body=patch,
                            headers={"Idempotency-Key": "retry-1"})).json() == first.json()
        assert (await _call(app, "POST", "/api/memory/modify", writer, body=batch,
                            headers={"Idempotency-Key": "retry-2"})).json() == first_batch.json()
        frozen = await app.post("/api/control", {"switch": "freeze", "on": True, "reason": "hold"})
        assert frozen.status_code == 200, frozen.text
        operator = await _key(app, "operator")
        _error(await _call(app, "PATCH", path, operator, body={"tags": ["new"], "reason": "r"}), 423, "frozen")
        again = await _call(app, "PATCH", path, writer, body=patch, headers={"Idempotency-Key": "retry-1"})
        assert (again.status_code, again.json()) == (200, first.json())
        assert (await _row(app, memory["id"]))["version"] == 3


async def test_an_agent_that_names_its_model_is_named_on_what_it_remembers_and_changes(app):
    agent = await _key(app, "agent")
    said = {"X-Engram-Provider": "openai", "X-Engram-Model": "gpt-test-1", "X-Engram-Prompt-Version": "agent-v3"}
    remembered = await _call(app, "POST", "/api/memory/remember", agent, headers=said,
                             body={"content": "an agent's note on its model", "scope": {"user_id": "modelled"},
                                   "mode": "async", "raw": True})
    assert remembered.status_code == 200, remembered.text
    memory_id = remembered.json()["memory_id"]
    changed = await _call(app, "PATCH", f"/api/memory/{memory_id}", agent, headers=said,
                          body={"tags": ["seen"], "reason": "the agent tags it"})
    assert changed.status_code == 200, changed.text
    plain = await _call(app, "PATCH", f"/api/memory/{memory_id}", agent, body={"tags": ["again"], "reason": "r"})
    assert plain.status_code == 200, plain.text
    events = await _events(app, memory_id)
    assert [(e["event"], e["provider"], e["model"], e["prompt_version"]) for e in events] == [
        ("ADD", "openai", "gpt-test-1", "agent-v3"), ("UPDATE", "openai", "gpt-test-1", "agent-v3"),
        ("UPDATE", None, None, None)]
    too_long = await _call(app, "PATCH", f"/api/memory/{memory_id}", agent, headers={"X-Engram-Model": "m" * 201},
                           body={"tags": ["x"], "reason": "r"})
    _error(too_long, 422, "validation_error")
    assert len(await _events(app, memory_id)) == 3
