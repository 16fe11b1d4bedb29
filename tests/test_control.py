"""The ControlWorkflow's switches through the HTTP gateway: a mutation freeze (global, per
scope, and by a delete spike) and the kill switch of autonomous mutations."""

from __future__ import annotations

import asyncio
import time

from tests.conftest import App, ollama_settings
from tests.fakes.llm_server import FakeReply
from tests.test_workflow import record_history
from workflows.control import ControlWorkflow, control_workflow_id

ALICE = {"user_id": "alice"}


async def _switch(app: App, key: str | None = None, **change) -> dict:
    response = await app.post("/api/control", {"reason": "test", **change}, key=key)
    assert response.status_code == 200, response.text
    return response.json()


async def _raw(app: App, content: str, scope: dict) -> str:
    answer = await app.remember(content, scope, mode="async", raw=True)
    await app.wait_job(answer["job_id"])
    return answer["memory_id"]


def _auth(app: App) -> dict:
    return {"Authorization": f"Bearer {app.admin_key}"}


async def _mutations(app: App, memory_id: str, deleted_id: str, scope: dict) -> dict[str, int]:
    """Every mutating endpoint once, against `scope`'s memories: each answer's status."""
    h = _auth(app)
    return {
        "remember": (await app.post("/api/memory/remember", {"content": "new words", "scope": scope,
                                                             "mode": "async"})).status_code,
        "remember batch": (await app.post("/api/memory/remember/batch", {"items": [
            {"content": "batch words", "scope": scope}]})).json()["results"][0].get("error", {}).get("type") == "frozen"
        and 423 or 200,
        "patch": (await app.http.patch(f"/api/memory/{memory_id}", json={"tags": ["t"], "reason": "r"},
                                       headers=h)).status_code,
        "delete": (await app.http.delete(f"/api/memory/{memory_id}", params={"reason": "r"}, headers=h)).status_code,
        "recover": (await app.post(f"/api/memory/{deleted_id}/recover", {"reason": "r"})).status_code,
        "rollback": (await app.post(f"/api/memory/{memory_id}/rollback", {"version": 1, "reason": "r"})).status_code,
        "batch modify": (await app.post("/api/memory/modify", {"items": [
            {"id": memory_id, "tags": ["u"], "reason": "r"}]})).json()["results"][0].get("error", {}).get("type")
        == "frozen" and 423 or 200,
        "forget preview": (await app.post("/api/memory/forget", {"scope": scope, "ids": [memory_id],
                                                                 "reason": "r"})).status_code,
    }


async def test_a_freeze_refuses_every_mutation_at_once_and_lifts(app):
    memory_id = await _raw(app, "a memory to protect", ALICE)
    await app.http.patch(f"/api/memory/{memory_id}", json={"tags": ["v2"], "reason": "second version"},
                         headers=_auth(app))
    deleted_id = await _raw(app, "a deleted memory", ALICE)
    await app.forget(deleted_id)
    preview = (await app.post("/api/memory/forget", {"scope": ALICE, "ids": [memory_id], "reason": "r"})).json()
    operator = await app.key("operator")
    started = time.monotonic()
    await _switch(app, operator, switch="freeze", on=True)
    refused = await _mutations(app, memory_id, deleted_id, ALICE)
    assert time.monotonic() - started < 5
    assert refused == {name: 423 for name in refused}, refused
    executed = await app.post(f"/api/memory/forget/{preview['operation_id']}/execute",
                              {"confirm_token": preview["confirm_token"]})
    assert executed.status_code == 423
    memory = (await app.get(f"/api/memory/{memory_id}")).json()
    assert (memory["version"], memory["is_deleted"]) == (2, False)
    assert (await app.post("/api/memory/search", {"query": "protect", "scope": ALICE})).status_code == 200

    await _switch(app, operator, switch="freeze", on=False)
    assert (await app.post("/api/memory/remember", {"content": "after the thaw", "scope": ALICE,
                                                    "mode": "async"})).status_code == 200
    events = await app.pool.fetch("SELECT switch, value, actor, role, reason FROM control_events ORDER BY id")
    assert [(e["switch"], e["value"], e["role"]) for e in events] == [("freeze", True, "operator"),
                                                                     ("freeze", False, "operator")]
    handle = app.runtime.client.get_workflow_handle(control_workflow_id(app.settings.temporal_task_queue))
    assert (await handle.query(ControlWorkflow.state)).frozen is False
    record_history(await handle.fetch_history(), "control_freeze")


async def test_a_scope_freeze_holds_that_scope_and_the_scopes_inside_it_only(app):
    alice = await _raw(app, "alice's note", ALICE)
    alice_x = await _raw(app, "alice's note for agent x", {**ALICE, "agent_id": "x"})
    bob = await _raw(app, "bob's note", {"user_id": "bob"})
    await _switch(app, switch="freeze", on=True, scope=ALICE)
    for memory_id in (alice, alice_x):
        refused = await app.http.patch(f"/api/memory/{memory_id}", json={"tags": ["t"], "reason": "r"},
                                       headers=_auth(app))
        assert refused.status_code == 423 and refused.json()["error"]["type"] == "frozen"
    allowed = await app.http.patch(f"/api/memory/{bob}", json={"tags": ["t"], "reason": "r"}, headers=_auth(app))
    assert allowed.status_code == 200
    status = (await app.get("/api/control")).json()
    assert [(s["user_id"], s["agent_id"]) for s in status["frozen_scopes"]] == [("alice", None)]


async def test_a_key_bounded_to_one_user_sees_only_the_freezes_that_hold_its_memories(app):
    await _switch(app, switch="freeze", on=True, scope=ALICE)
    await _switch(app, switch="freeze", on=True, scope={"user_id": "bob"})
    await _switch(app, switch="freeze", on=True, scope={"agent_id": "x"})
    bob = await app.key("writer", scopes=["user:bob", "agent:*"])
    seen = (await app.get("/api/control", key=bob)).json()["frozen_scopes"]
    assert {(s["user_id"], s["agent_id"]) for s in seen} == {("bob", None), (None, "x")}
    everything = (await app.get("/api/control")).json()["frozen_scopes"]
    assert len(everything) == 3


async def test_only_operators_flip_a_switch_and_each_change_needs_a_reason(app):
    writer = await app.key("writer")
    refused = await app.post("/api/control", {"switch": "freeze", "on": True, "reason": "x"}, key=writer)
    assert refused.status_code == 403
    blank = await app.post("/api/control", {"switch": "freeze", "on": True, "reason": " "})
    assert blank.status_code == 422
    scoped_kill = await app.post("/api/control", {"switch": "kill_switch", "on": True, "reason": "x",
                                                  "scope": ALICE})
    assert scoped_kill.status_code == 403 and "no scope" in scoped_kill.json()["error"]["detail"]
    assert not (await app.get("/api/control")).json()["frozen"]
    assert await app.count("SELECT count(*) FROM control_events") == 0


async def test_a_delete_spike_freezes_its_scope_until_an_operator_lifts_it(make_app):
    async with make_app(delete_spike_threshold=3) as app:
        ids = [await _raw(app, f"spike memory {n}", ALICE) for n in range(6)]
        for memory_id in ids[:4]:
            await app.forget(memory_id)
        refused = await app.http.delete(f"/api/memory/{ids[4]}", params={"reason": "r"}, headers=_auth(app))
        assert refused.status_code == 423, refused.text
        event = await app.pool.fetchrow("SELECT * FROM control_events")
        assert (event["actor"], event["value"]) == ("system:delete-spike", True) and "spike" in event["reason"]
        await _switch(app, switch="freeze", on=False, scope=ALICE)
        assert (await app.http.delete(f"/api/memory/{ids[4]}", params={"reason": "r"},
                                      headers=_auth(app))).status_code == 200


async def test_the_kill_switch_stops_model_decisions_and_not_the_api(make_app, fake_llm):
    async with make_app(**ollama_settings(fake_llm)) as app:
        await _switch(app, switch="kill_switch", on=True)
        answer = await app.remember("Nina keeps bees", ALICE, mode="async")
        job = await app.wait_job(answer["job_id"], "parked")
        assert job["last_error_code"] == "KillSwitch" and fake_llm.chat_requests() == []
        changed = await app.http.patch(f"/api/memory/{answer['memory_id']}", json={"tags": ["bees"], "reason": "r"},
                                       headers=_auth(app))
        assert changed.status_code == 200
        await _switch(app, switch="kill_switch", on=False)
        await app.wait_job(answer["job_id"], "done", timeout_s=60)
        assert len(fake_llm.chat_requests()) == 1
        await asyncio.sleep(0)


async def test_a_freeze_set_while_the_model_answers_keeps_its_output_from_being_written(make_app, fake_llm):
    async with make_app(**ollama_settings(fake_llm), drain_idle_s=0.5) as app:
        fake_llm.script(FakeReply.delay(3.0))
        answer = await app.remember("Omar restores clocks", ALICE, mode="async")
        deadline = asyncio.get_running_loop().time() + 30
        while not fake_llm.chat_requests():
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        await _switch(app, switch="freeze", on=True, scope=ALICE)
        job = await app.wait_job(answer["job_id"], "parked")
        assert job["last_error_code"] == "Frozen", job
        events = (await app.get(f"/api/memory/{answer['memory_id']}/history")).json()["events"]
        assert [e["event"] for e in events] == ["ADD"], events  # the model's output was not written
        await _switch(app, switch="freeze", on=False, scope=ALICE)
        await app.wait_job(answer["job_id"], "done", timeout_s=60)
        events = (await app.get(f"/api/memory/{answer['memory_id']}/history")).json()["events"]
        assert [e["event"] for e in events] == ["ADD", "UPDATE"], events
