"""Changing memories by id through the HTTP gateway: modify, forget, recover, roll back, history."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid

from engram.domain.auth import EVERYTHING
from engram.domain.filters import Filters
from engram.domain.models import Scope
from engram.domain.text import bm25_terms, term_id
from tests.conftest import App, serving


async def _raw(app: App, content: str, scope: dict | None = None, **fields) -> dict:
    answer = await app.remember(content, scope, mode="async", raw=True, **fields)
    await app.wait_job(answer["job_id"])
    return (await app.get(f"/api/memory/{answer['memory_id']}")).json()


async def _patch(app: App, memory_id: str, body: dict, key: str | None = None, **headers):
    auth = {"Authorization": f"Bearer {key or app.admin_key}", **headers}
    return await app.http.patch(f"/api/memory/{memory_id}", json=body, headers=auth)


async def _delete(app: App, memory_id: str, key: str | None = None, **params):
    return await app.http.delete(f"/api/memory/{memory_id}", params=params,
                                 headers={"Authorization": f"Bearer {key or app.admin_key}"})


async def test_a_content_change_is_searchable_at_once_and_recorded_with_old_and_new(app):
    memory = await _raw(app, "the user lives in Paris")
    response = await _patch(app, memory["id"], {"content": "the user lives in Berlin", "reason": "moved"})
    assert response.status_code == 200, response.text
    changed = response.json()
    assert changed["version"] == memory["version"] + 1 and changed["content"] == "the user lives in Berlin"
    hits = await app.search("Berlin")
    assert [h["memory"]["id"] for h in hits] == [memory["id"]]
    assert await app.search("Paris") == [] or all(h["components"]["bm25"] == 0 for h in await app.search("Paris"))
    history = (await app.get(f"/api/memory/{memory['id']}/history")).json()
    events = history["events"]
    assert [e["event"] for e in events] == ["ADD", "UPDATE"]
    update = events[-1]
    assert (update["old_content"], update["new_content"], update["reason"], update["path"]) == (
        "the user lives in Paris", "the user lives in Berlin", "moved", "http")
    assert update["prev_hash"] == events[0]["hash"] and update["actor_id"].startswith("key:")


async def test_ten_concurrent_patches_with_one_version_one_wins(app):
    memory = await _raw(app, "a memory many agents want to change")
    answers = await asyncio.gather(*(
        _patch(app, memory["id"], {"tags": [f"t{i}"], "reason": "race", "if_version": memory["version"]})
        for i in range(10)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] + [409] * 9, [a.text for a in answers]
    for a in answers:
        if a.status_code == 409:
            assert a.json()["error"]["type"] == "version_conflict"
            assert a.json()["error"]["current_version"] == memory["version"] + 1
    events = (await app.get(f"/api/memory/{memory['id']}/history")).json()["events"]
    assert [e["event"] for e in events] == ["ADD", "UPDATE"]


async def test_a_delete_leaves_search_at_once_and_a_recover_brings_it_back(app):
    memory = await _raw(app, "the garage code is 4711")
    stats = await app.pool.fetchrow("SELECT doc_count, total_len FROM bm25_scope_stats")
    response = await _delete(app, memory["id"], reason="wrong code")
    assert response.status_code == 200, response.text
    assert response.json()["is_deleted"] and response.json()["status"] == "deleted"
    assert await app.search("garage code") == []
    after = await app.pool.fetchrow("SELECT doc_count, total_len FROM bm25_scope_stats")
    assert (after["doc_count"], after["total_len"]) == (stats["doc_count"] - 1, 0)
    recovered = await app.post(f"/api/memory/{memory['id']}/recover", {"reason": "it was right"})
    assert recovered.status_code == 200, recovered.text
    assert [h["memory"]["id"] for h in await app.search("garage code")] == [memory["id"]]
    events = (await app.get(f"/api/memory/{memory['id']}/history")).json()["events"]
    assert [e["event"] for e in events] == ["ADD", "DELETE", "RECOVER"]


async def test_rollback_writes_a_new_version_equal_to_the_old_one(app):
    memory = await _raw(app, "first words", tags=["a"])
    await _patch(app, memory["id"], {"content": "second words", "tags": ["b"], "reason": "edit"})
    response = await app.post(f"/api/memory/{memory['id']}/rollback", {"version": 1, "reason": "undo"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["content"], body["tags"], body["version"]) == ("first words", ["a"], 3)
    events = (await app.get(f"/api/memory/{memory['id']}/history")).json()["events"]
    assert [e["event"] for e in events] == ["ADD", "UPDATE", "ROLLBACK"]
    assert events[-1]["new_metadata"]["rolled_back_to"] == 1


async def _settled(app: App, memory_id: str, timeout_s: float = 20) -> None:
    """Until the index owner has rewritten the memory's points and the sealer sealed its events."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        row = await app.pool.fetchrow(
            "SELECT dense_stale, lexical_indexed, (SELECT count(*) FROM memory_history h WHERE h.memory_id = m.id"
            " AND h.scope_seq IS NULL) AS unsealed FROM memories m WHERE id = $1", uuid.UUID(memory_id))
        if not row["dense_stale"] and row["lexical_indexed"] and not row["unsealed"]:
            return
        assert asyncio.get_running_loop().time() < deadline, dict(row)
        await asyncio.sleep(0.05)


async def test_the_index_owner_rewrites_a_changed_memorys_points(app):
    memory = await _raw(app, "the spare key is under the blue flowerpot", tags=["home"])
    await _settled(app, memory["id"])
    model, space = await app.runtime.spaces.active()
    vector = await space.embedder.embed_query("spare key flowerpot")
    scope = Scope(user_id="u1")
    live = Filters(visible=EVERYTHING)
    assert [h.id for h in await space.index.search(vector.tolist(), scope, live, 5)] == [uuid.UUID(memory["id"])]

    await _patch(app, memory["id"], {"tags": ["garden"], "reason": "relabel"})
    await _settled(app, memory["id"])
    tagged = Filters(visible=EVERYTHING, tags=["garden"])
    assert [h.id for h in await space.index.search(vector.tolist(), scope, tagged, 5)] == [uuid.UUID(memory["id"])]

    await _delete(app, memory["id"], reason="moved the key")
    await _settled(app, memory["id"])
    assert await space.index.search(vector.tolist(), scope, live, 5) == []
    assert await app.runtime.lexical.search({0: 0.0} | _sparse(app, "flowerpot"), scope, live, 5) == []
    everything = Filters(visible=EVERYTHING, include_deleted=True)
    assert [h.id for h in await space.index.search(vector.tolist(), scope, everything, 5)] == [uuid.UUID(memory["id"])]


PETS = ["We are thinking of getting a pet for the kids", "Melanie bought a green parrot that talks",
        "The hamster escaped from its cage again"]


async def test_search_does_not_wait_for_the_index_owner_to_rewrite_a_changed_memorys_points(make_app):
    """Until the index owner's next pass, a changed memory's dense point holds its old vector and
    labels. Search scores it by its canonical embedding and current row instead: it is found by
    its new meaning and labels, and its stale point takes no place among the dense hits."""
    async with make_app(search_candidates=3) as app:  # a dense top of 3 among 4 memories
        pets = [(await _raw(app, text))["id"] for text in PETS]
        target = (await _raw(app, "Caroline adopted a puppy named Biscuit"))["id"]
        for memory_id in [*pets, target]:
            await _settled(app, memory_id)
        [indexer] = [t for t in app.runtime.tasks if t.get_name() == "index-sync"]
        indexer.cancel()  # every point stays as it is now

        async def found(**fields) -> list[str]:  # no query word in any memory: the dense leg alone
            return [h["memory"]["id"] for h in await app.search("a new dog", limit=3, **fields)]

        assert target in await found()
        await _patch(app, target, {"content": "the quarterly tax return is due in April", "reason": "r"})
        assert sorted(await found()) == sorted(pets)  # the puppy's point takes none of the 3 places
        await _patch(app, target, {"content": "Caroline adopted a puppy named Biscuit", "tags": ["dog"],
                                   "reason": "r"})
        assert target in await found()
        assert await found(filters={"tags": ["dog"]}) == [target]  # its point has no tag yet
        assert await app.count("SELECT count(*) FROM memories WHERE dense_stale") == 1


def _sparse(app: App, text: str) -> dict[int, float]:
    return {term_id(t): 1.0 for t in bm25_terms(text, app.settings.bm25_stemmer)}


async def test_a_row_edited_behind_the_service_is_quarantined_on_read_and_leaves_recall(app):
    memory = await _raw(app, "the invoice total is 120 euros")
    await app.pool.execute("UPDATE memories SET content = 'the invoice total is 12000 euros' WHERE id = $1",
                           uuid.UUID(memory["id"]))
    read = (await app.get(f"/api/memory/{memory['id']}")).json()
    assert read["status"] == "quarantined"
    assert await app.search("invoice total") == []
    events = (await app.get(f"/api/memory/{memory['id']}/history")).json()["events"]
    assert events[-1]["event"] == "QUARANTINE" and events[-1]["actor_id"] == "system:verify"
    assert "content" in events[-1]["reason"]
    assert (events[-1]["old_content"], events[-1]["new_content"]) == (
        "the invoice total is 120 euros", "the invoice total is 12000 euros")
    refused = await _patch(app, memory["id"], {"tags": ["x"], "reason": "edit"})
    assert refused.status_code == 409 and "quarantined" in refused.json()["error"]["detail"]

    restored = await app.post(f"/api/memory/{memory['id']}/rollback", {"version": 1, "reason": "tampered"})
    assert restored.status_code == 200, restored.text
    assert (restored.json()["status"], restored.json()["content"]) == ("active", "the invoice total is 120 euros")
    assert [h["memory"]["id"] for h in await app.search("invoice total")] == [memory["id"]]
    assert (await app.get("/api/admin/verify")).json()["ok"]


async def test_a_search_quarantines_a_tampered_result_it_reads_and_a_spare_takes_its_place(app):
    scope = {"user_id": "tamper-search"}
    tampered = await _raw(app, "the invoice total is 120 euros", scope)
    other = await _raw(app, "the invoice was paid in March", scope)
    await app.pool.execute("UPDATE memories SET content = 'the invoice total is 120 euros and a bonus' WHERE id = $1",
                           uuid.UUID(tampered["id"]))
    response = await app.post("/api/memory/search", {"query": "invoice total", "scope": scope, "limit": 1,
                                                     "explain": True})
    assert [h["memory"]["id"] for h in response.json()["results"]] == [other["id"]]
    assert response.json()["explain"]["verify"]["checked"] == 2
    events = (await app.get(f"/api/memory/{tampered['id']}/history")).json()["events"]
    assert (events[-1]["event"], events[-1]["actor_id"]) == ("QUARANTINE", "system:verify")
    assert (await app.get(f"/api/memory/{tampered['id']}")).json()["status"] == "quarantined"


async def test_an_operator_may_confirm_a_quarantined_row(app):
    memory = await _raw(app, "meeting moved to Tuesday")
    await app.pool.execute("UPDATE memories SET tags = '{urgent}', content = 'meeting moved to Wednesday'"
                           " WHERE id = $1", uuid.UUID(memory["id"]))
    assert (await app.get(f"/api/memory/{memory['id']}")).json()["status"] == "quarantined"
    writer = await app.key("writer")
    refused = await app.post(f"/api/memory/{memory['id']}/confirm", {"reason": "looks right"}, key=writer)
    assert refused.status_code == 403
    confirmed = await app.post(f"/api/memory/{memory['id']}/confirm", {"reason": "I tagged it by hand"},
                               key=await app.key("operator"))
    assert confirmed.status_code == 200, confirmed.text
    assert (confirmed.json()["status"], confirmed.json()["tags"]) == ("active", ["urgent"])
    # What search holds of it is made again from the confirmed row: its words, its embedding.
    hits = await app.search("Wednesday")
    assert [h["memory"]["id"] for h in hits] == [memory["id"]] and hits[0]["components"]["bm25"] > 0
    assert all(h["components"]["bm25"] == 0 for h in await app.search("Tuesday"))
    assert (await app.get("/api/admin/verify")).json()["ok"]


async def test_verify_finds_an_edited_and_a_removed_history_row(app):
    first = await _raw(app, "alpha memory about tea")
    second = await _raw(app, "beta memory about coffee")
    await _patch(app, second["id"], {"content": "beta memory about cocoa", "reason": "taste"})
    await _settled(app, first["id"])
    await _settled(app, second["id"])
    report = (await app.get("/api/admin/verify")).json()
    assert report["ok"] and report["memories"] == 2 and report["events"] == 3, report

    await app.pool.execute("UPDATE memory_history SET reason = 'nothing to see' WHERE memory_id = $1 AND event = 'UPDATE'",
                           uuid.UUID(second["id"]))
    await app.pool.execute("DELETE FROM memory_history WHERE memory_id = $1", uuid.UUID(first["id"]))
    report = (await app.get("/api/admin/verify")).json()
    assert not report["ok"]
    where = {(b["kind"], b["where"]) for b in report["breaks"]}
    assert ("memory", second["id"]) in where and ("memory", first["id"]) in where
    assert any(b["kind"] == "scope" for b in report["breaks"]), report["breaks"]


async def test_a_memory_from_before_chains_is_sealed_and_then_verified(app):
    memory = await _raw(app, "an old memory from an earlier release")
    mid = uuid.UUID(memory["id"])
    await _settled(app, memory["id"])
    # As an earlier release left it: no chain, no hashes, no state on its events.
    await app.pool.execute("UPDATE memories SET chain_hash = NULL WHERE id = $1", mid)
    await app.pool.execute("UPDATE memory_history SET hash = NULL, prev_hash = NULL, state = NULL, scope_seq = NULL,"
                           " scope_hash = NULL WHERE memory_id = $1", mid)
    await app.pool.execute("DELETE FROM scope_chains")
    changed = await _patch(app, memory["id"], {"importance": 0.9, "reason": "matters more"})
    assert changed.status_code == 200, changed.text
    await _settled(app, memory["id"])
    events = (await app.get(f"/api/memory/{memory['id']}/history")).json()["events"]
    assert all(e["hash"] for e in events) and events[1]["prev_hash"] == events[0]["hash"]
    assert (await app.get("/api/admin/verify")).json()["ok"]


async def test_the_cli_forgets_only_after_the_id_is_typed_back(app):
    memory = await _raw(app, "a memory the CLI will forget")
    async with serving(app) as url:
        env = {**os.environ, "ENGRAM_URL": url, "ENGRAM_API_KEY": app.admin_key}
        cli = [sys.executable, "-m", "worker.cli", "forget", memory["id"], "--reason", "cleanup"]
        wrong = await _run(cli, env, stdin="yes\n")
        assert wrong.returncode == 1 and "nothing was deleted" in wrong.stderr
        assert not (await app.get(f"/api/memory/{memory['id']}")).json()["is_deleted"]
        right = await _run(cli, env, stdin=memory["id"] + "\n")
        assert right.returncode == 0, right.stderr
    events = (await app.get(f"/api/memory/{memory['id']}/history")).json()["events"]
    assert (events[-1]["event"], events[-1]["path"], events[-1]["reason"]) == ("DELETE", "cli", "cleanup")


async def _run(argv: list[str], env: dict, stdin: str) -> subprocess.CompletedProcess:
    return await asyncio.to_thread(subprocess.run, argv, input=stdin, env=env, capture_output=True, text=True,
                                   timeout=120)


async def test_the_cli_verify_exits_0_on_whole_chains_and_1_naming_a_break(app):
    memory = await _raw(app, "a memory whose chain the CLI checks")
    await _settled(app, memory["id"])
    async with serving(app) as url:
        env = {**os.environ, "ENGRAM_URL": url, "ENGRAM_API_KEY": app.admin_key}
        whole = await _run([sys.executable, "-m", "worker.cli", "verify"], env, stdin="")
        assert whole.returncode == 0 and json.loads(whole.stdout)["ok"] is True, whole.stdout + whole.stderr
        await app.pool.execute("UPDATE memory_history SET reason = 'rewritten' WHERE memory_id = $1",
                               uuid.UUID(memory["id"]))
        broken = await _run([sys.executable, "-m", "worker.cli", "verify"], env, stdin="")
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert memory["id"] in broken.stdout and json.loads(broken.stdout)["ok"] is False
