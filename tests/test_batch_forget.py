"""Batch forget through the HTTP gateway: preview, the confirm token, approval by another
operator, execution, the erasure receipt and undo, each operation one BatchForgetWorkflow on a
real Temporal server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from datetime import datetime, timezone

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.forget import ForgetActivities
from engram.settings import Settings
from engram.store import operations
from engram.store import pool as pool_module
from tests.conftest import App, new_database, serving
from tests.test_workflow import TEST_SERVER, record_history
from workflows.forget import BatchForgetWorkflow
from workflows.models import ForgetConfirmation, ForgetRunInput

SCOPE = {"user_id": "forgetful"}


async def _memories(app: App, texts: list[str], **fields) -> list[str]:
    ids = []
    for text in texts:
        answer = await app.remember(text, SCOPE, mode="async", raw=True, **fields)
        ids.append(answer["memory_id"])
    return ids


async def _preview(app: App, key: str | None = None, **selection) -> dict:
    response = await app.post("/api/memory/forget", {"scope": SCOPE, "reason": "cleanup", **selection}, key=key)
    assert response.status_code == 200, response.text
    return response.json()


async def _execute(app: App, preview: dict, key: str | None = None, token: str | None = None):
    return await app.post(f"/api/memory/forget/{preview['operation_id']}/execute",
                          {"confirm_token": token or preview["confirm_token"]}, key=key)


async def _until(app: App, operation_id: str, status: str, timeout_s: float = 30) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        body = (await app.get(f"/api/memory/forget/{operation_id}")).json()
        if body["status"] == status:
            return body
        assert asyncio.get_running_loop().time() < deadline, body
        await asyncio.sleep(0.1)


async def _live(app: App) -> set[str]:
    page = (await app.get("/api/memory", **SCOPE, limit=100)).json()
    return {m["id"] for m in page["items"]}


async def test_preview_changes_nothing_and_execute_forgets_exactly_the_set_with_a_receipt(app):
    ids = await _memories(app, ["old note about apples", "old note about pears", "keep this note on plums"])
    preview = await _preview(app, query="apples pears old note", limit=2)
    assert {c["id"] for c in preview["candidates"]} == set(ids[:2]) and not preview["needs_approval"]
    assert await _live(app) == set(ids)
    executed = await _execute(app, preview)
    assert executed.status_code == 200, executed.text
    done = await _until(app, preview["operation_id"], "done")
    assert await _live(app) == {ids[2]}
    receipt = done["receipt"]
    assert {i["id"] for i in receipt["items"] if i["state"] == "deleted"} == set(ids[:2])
    for memory_id in ids[:2]:
        events = (await app.get(f"/api/memory/{memory_id}/history")).json()["events"]
        assert (events[-1]["event"], events[-1]["request_id"], events[-1]["reason"]) == (
            "DELETE", preview["operation_id"], "cleanup")
    checked = (await app.post("/api/receipts/verify", receipt)).json()
    assert checked == {"ok": True, "problems": []}
    tampered = {**receipt, "items": receipt["items"][:1]}
    assert not (await app.post("/api/receipts/verify", tampered)).json()["ok"]
    replayed = await _execute(app, preview)
    assert replayed.status_code == 409, replayed.text
    handle = app.runtime.client.get_workflow_handle(preview["operation_id"])
    record_history(await handle.fetch_history(), "forget_done")


async def test_a_token_works_only_for_its_operation_and_its_requester(app):
    ids = await _memories(app, ["token test one", "token test two"])
    first = await _preview(app, ids=ids[:1])
    second = await _preview(app, ids=ids[1:])
    wrong = await _execute(app, first, token=second["confirm_token"])
    assert wrong.status_code == 403 and wrong.json()["error"]["type"] == "forbidden"
    other = await app.key("writer")
    assert (await _execute(app, first, key=other)).status_code == 403
    missing = await app.post(f"/api/memory/forget/forget-{uuid.uuid4()}/execute", {"confirm_token": "x"})
    assert missing.status_code == 404
    assert await _live(app) == set(ids)


async def test_a_set_changed_since_the_preview_is_refused_and_nothing_is_deleted(app):
    ids = await _memories(app, ["change race one", "change race two"])
    preview = await _preview(app, ids=ids)
    patched = await app.http.patch(f"/api/memory/{ids[0]}", json={"tags": ["x"], "reason": "meanwhile"},
                                   headers={"Authorization": f"Bearer {app.admin_key}"})
    assert patched.status_code == 200
    refused = await _execute(app, preview)
    assert refused.status_code == 409 and ids[0] in refused.json()["error"]["detail"]
    await _until(app, preview["operation_id"], "stale")
    assert await _live(app) == set(ids)


async def test_an_expired_token_is_refused_and_the_operation_ends_expired(make_app):
    async with make_app(forget_confirm_ttl_s=1.0) as app:
        ids = await _memories(app, ["expiring one"])
        preview = await _preview(app, ids=ids)
        await _until(app, preview["operation_id"], "expired")
        late = await _execute(app, preview)
        assert late.status_code in (409, 410), late.text
        assert await _live(app) == set(ids)
        handle = app.runtime.client.get_workflow_handle(preview["operation_id"])
        record_history(await handle.fetch_history(), "forget_expired")


async def test_above_the_threshold_another_operator_must_approve(make_app):
    async with make_app(approval_threshold=1) as app:
        ids = await _memories(app, ["approve one", "approve two"])
        requester = await app.key("operator")
        preview = await _preview(app, key=requester, ids=ids)
        assert preview["needs_approval"]
        waiting = await _execute(app, preview, key=requester)
        assert waiting.status_code == 200 and waiting.json()["status"] == "awaiting_approval", waiting.text
        path = f"/api/approvals/{preview['operation_id']}"
        assert (await app.post(f"{path}/approve", {"reason": "mine"}, key=requester)).status_code == 403
        assert (await app.post(f"{path}/approve", {"reason": "ok"}, key=await app.key("writer"))).status_code == 403
        listed = (await app.get("/api/approvals")).json()["items"]
        assert [o["operation_id"] for o in listed] == [preview["operation_id"]]
        assert await _live(app) == set(ids)
        approver = await app.key("operator")
        approved = await app.post(f"{path}/approve", {"reason": "checked the list"}, key=approver)
        assert approved.status_code == 200, approved.text
        done = await _until(app, preview["operation_id"], "done")
        assert done["approver"] == done["receipt"]["approver"] and done["approver"].startswith("key:")
        assert await _live(app) == set()
        handle = app.runtime.client.get_workflow_handle(preview["operation_id"])
        record_history(await handle.fetch_history(), "forget_approved")


async def test_a_rejected_operation_deletes_nothing(make_app):
    async with make_app(approval_threshold=0) as app:
        ids = await _memories(app, ["reject me not"])
        preview = await _preview(app, ids=ids)
        await _execute(app, preview)
        await _until(app, preview["operation_id"], "awaiting_approval")
        rejected = await app.post(f"/api/approvals/{preview['operation_id']}/reject", {"reason": "no"},
                                  key=await app.key("operator"))
        assert rejected.status_code == 200, rejected.text
        await _until(app, preview["operation_id"], "rejected")
        assert await _live(app) == set(ids)


async def test_an_approval_not_given_in_time_expires(make_app):
    async with make_app(approval_threshold=0, approval_ttl_s=1.0) as app:
        ids = await _memories(app, ["nobody approves"])
        preview = await _preview(app, ids=ids)
        await _execute(app, preview)
        await _until(app, preview["operation_id"], "expired")
        assert await _live(app) == set(ids)


async def test_undo_recovers_exactly_the_set(app):
    ids = await _memories(app, ["undo one", "undo two", "undo bystander"])
    await app.forget(ids[2])
    preview = await _preview(app, ids=ids[:2])
    await _execute(app, preview)
    await _until(app, preview["operation_id"], "done")
    undone = await app.post(f"/api/memory/forget/{preview['operation_id']}/undo", {"reason": "too eager"})
    assert undone.status_code == 200, undone.text
    assert set(undone.json()["recovered"]) == set(ids[:2])
    assert await _live(app) == set(ids[:2])
    again = (await app.post(f"/api/memory/forget/{preview['operation_id']}/undo", {"reason": "twice"})).json()
    assert again["recovered"] == [] and len(again["not_recovered"]) == 2


async def test_pinned_memories_need_force_from_an_operator(app):
    ids = await _memories(app, ["pinned keepsake"], pinned=True)
    response = await app.post("/api/memory/forget", {"scope": SCOPE, "reason": "x", "ids": ids})
    assert response.status_code == 404 and "pinned" in response.json()["error"]["detail"]
    writer = await app.key("writer")
    forced = await app.post("/api/memory/forget", {"scope": SCOPE, "reason": "x", "ids": ids, "force": True},
                            key=writer)
    assert forced.status_code == 403
    preview = await _preview(app, ids=ids, force=True)
    assert preview["needs_approval"]  # pinned memories always wait for a second operator


async def test_the_dry_run_policy_makes_every_execute_a_preview(make_app):
    async with make_app(forget_dry_run=True) as app:
        ids = await _memories(app, ["canary one", "canary two"])
        preview = await _preview(app, ids=ids)
        executed = await _execute(app, preview)
        assert executed.status_code == 200 and executed.json()["status"] == "dry_run", executed.text
        assert await _live(app) == set(ids)


async def test_the_cli_confirms_a_batch_forget_only_with_its_count(app):
    ids = await _memories(app, ["cli batch one", "cli batch two"], tags=["cli"])
    async with serving(app) as url:
        env = {**os.environ, "ENGRAM_URL": url, "ENGRAM_API_KEY": app.admin_key}
        cli = [sys.executable, "-m", "worker.cli", "batch-forget", "--user-id", SCOPE["user_id"], "--tag", "cli",
               "--reason", "cli test"]
        wrong = await asyncio.to_thread(subprocess.run, cli, input="yes\n", env=env, capture_output=True, text=True,
                                        timeout=120)
        assert wrong.returncode == 1 and "nothing was deleted" in wrong.stderr
        assert await _live(app) == set(ids)
        right = await asyncio.to_thread(subprocess.run, cli, input="2\n", env=env, capture_output=True, text=True,
                                        timeout=120)
        assert right.returncode == 0, right.stderr
        operation = json.loads(right.stdout)["operation_id"]
    await _until(app, operation, "done")
    assert await _live(app) == set()


async def test_an_item_the_service_refuses_is_settled_refused_and_the_rest_are_deleted(app):
    ids = await _memories(app, ["refusal one", "refusal two", "refusal three"])
    preview = await _preview(app, ids=ids)
    # Edited behind the service's back, then read: quarantined, at the version the preview saw.
    await app.pool.execute("UPDATE memories SET content = 'edited in SQL' WHERE id = $1", uuid.UUID(ids[0]))
    assert (await app.get(f"/api/memory/{ids[0]}")).json()["status"] == "quarantined"
    assert (await _execute(app, preview)).status_code == 200
    done = await _until(app, preview["operation_id"], "done")  # it used to retry its chunk for ever
    states = {i["id"]: i for i in done["receipt"]["items"]}
    assert states[ids[0]]["state"] == "refused" and "quarantined" in states[ids[0]]["refusal"]
    assert {states[i]["state"] for i in ids[1:]} == {"deleted"} and done["receipt"]["deleted"] == 2
    assert await _live(app) == set()  # the quarantined one is out of the list, not deleted:
    assert (await app.get(f"/api/memory/{ids[0]}")).json()["is_deleted"] is False
    assert [(e["event"], e["actor"]) for e in done["receipt"]["timeline"]] == [
        ("previewed", done["requester"]), ("confirmed", done["requester"])]
    assert done["receipt"]["confirmed_at"] == done["receipt"]["timeline"][1]["at"]
    assert [e["event"] for e in done["events"]] == ["previewed", "confirmed", "done"]
    assert (await app.post("/api/receipts/verify", done["receipt"])).json() == {"ok": True, "problems": []}


async def test_a_freeze_inside_the_operations_scope_holds_its_items_and_its_undo_until_lifted(app):
    ids = await _memories(app, ["outside the frozen part"])
    bot = {**SCOPE, "agent_id": "bot"}
    ids.append((await app.remember("inside the frozen part", bot, mode="async", raw=True))["memory_id"])
    preview = await _preview(app, ids=ids)
    assert {c["id"] for c in preview["candidates"]} == set(ids)

    async def freeze(on: bool) -> None:
        response = await app.post("/api/control", {"switch": "freeze", "on": on, "scope": bot, "reason": "hold"})
        assert response.status_code == 200, response.text

    await freeze(True)
    assert (await _execute(app, preview)).status_code == 200
    deadline = asyncio.get_running_loop().time() + 30
    while ids[0] in await _live(app):
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.1)
    await asyncio.sleep(2)  # the chunk retries while the freeze holds: the frozen memory stays
    held = (await app.get(f"/api/memory/forget/{preview['operation_id']}")).json()
    assert held["status"] == "executing" and held["done"] == 1, held
    assert (await app.get(f"/api/memory/{ids[1]}")).json()["is_deleted"] is False
    await freeze(False)
    await _until(app, preview["operation_id"], "done")
    assert (await app.get(f"/api/memory/{ids[1]}")).json()["is_deleted"] is True
    await freeze(True)
    undone = (await app.post(f"/api/memory/forget/{preview['operation_id']}/undo", {"reason": "undo"})).json()
    assert undone["recovered"] == [ids[0]], undone
    assert [k["id"] for k in undone["not_recovered"]] == [ids[1]] and "frozen" in undone["not_recovered"][0]["why"]
    assert (await app.get(f"/api/memory/{ids[1]}")).json()["is_deleted"] is True


async def test_an_operation_that_ends_without_deleting_says_who_ended_it_and_why(make_app):
    async with make_app(approval_threshold=0, forget_confirm_ttl_s=1.0) as app:
        ids = await _memories(app, ["rejected one", "left to expire"])
        rejected = await _preview(app, ids=ids[:1])
        await _execute(app, rejected)
        await _until(app, rejected["operation_id"], "awaiting_approval")
        operator = await app.key("operator")
        decided = await app.post(f"/api/approvals/{rejected['operation_id']}/reject", {"reason": "not these"},
                                 key=operator)
        assert decided.status_code == 200, decided.text
        ended = await _until(app, rejected["operation_id"], "rejected")
        handle = app.runtime.client.get_workflow_handle(rejected["operation_id"])
        record_history(await handle.fetch_history(), "forget_rejected")
        assert [(e["event"], e["reason"]) for e in ended["events"]] == [
            ("previewed", "cleanup"), ("confirmed", "cleanup"), ("rejected", "not these")]
        assert ended["events"][-1]["actor"] == ended["approver"] != ended["requester"]
        expiring = await _preview(app, ids=ids[1:])
        expired = await _until(app, expiring["operation_id"], "expired")
        assert [(e["event"], e["actor"]) for e in expired["events"]] == [
            ("previewed", expired["requester"]), ("expired", "system:batch-forget")]
        assert "not confirmed within 1 s" in expired["events"][-1]["reason"]
        assert await _live(app) == set(ids)


@pytest.mark.parametrize("needs_approval", [False, True], ids=["unconfirmed", "unapproved"])
async def test_on_the_default_time_limits_an_operation_left_waiting_expires_with_its_event(postgres, needs_approval):
    """15 minutes to confirm and 24 hours to approve (the settings' defaults), skipped through on
    Temporal's time-skipping server with the real workflow and its status activity."""
    settings = Settings()
    wait_s = settings.approval_ttl_s if needs_approval else settings.forget_confirm_ttl_s
    pool = await pool_module.create_pool(await new_database(postgres), min_size=1, max_size=4)
    operation_id = f"forget-{uuid.uuid4()}"
    try:
        async with pool.acquire() as conn:
            await operations.create(conn, operation_id=operation_id, requester="key:r", role="writer",
                                    scope=SCOPE, reason="cleanup", force=False, status="awaiting_confirmation",
                                    items=[], expires_at=datetime.now(timezone.utc), needs_approval=needs_approval)
        async with await WorkflowEnvironment.start_time_skipping(
            test_server_existing_path=str(TEST_SERVER), data_converter=pydantic_data_converter,
        ) as env:
            # Only the status activity runs on these paths: nothing is deleted.
            async with Worker(env.client, task_queue="tq", workflows=[BatchForgetWorkflow],
                              activities=ForgetActivities(pool, changes=None, control=None).all()):
                handle = await env.client.start_workflow(BatchForgetWorkflow.run, ForgetRunInput(
                    operation_id=operation_id, requester="key:r", needs_approval=needs_approval, dry_run=False,
                    confirm_ttl_s=settings.forget_confirm_ttl_s, approval_ttl_s=settings.approval_ttl_s),
                    id=operation_id, task_queue="tq")
                if needs_approval:
                    await handle.execute_update(BatchForgetWorkflow.confirm,
                                                ForgetConfirmation(actor="key:r", reason="go ahead"))
                assert (await handle.result()).status == "expired"
                events = (await handle.fetch_history()).events
        # The workflow's own clock: from its start to the time limit's timer firing.
        fired = [e for e in events if e.HasField("timer_fired_event_attributes")]
        waited_s = (fired[-1].event_time.ToDatetime() - events[0].event_time.ToDatetime()).total_seconds()
        assert wait_s <= waited_s < wait_s + 60, waited_s
        assert (await operations.get(pool, operation_id))["status"] == "expired"
        events = [(e["event"], e["actor"]) for e in await operations.events(pool, operation_id)]
        assert events == [("previewed", "key:r"), *([("confirmed", "key:r")] if needs_approval else []),
                          ("expired", "system:batch-forget")]
    finally:
        await pool.close()


async def test_the_workflow_takes_a_confirmation_only_with_the_previews_token(app):
    ids = await _memories(app, ["confirmed straight through Temporal"])
    preview = await _preview(app, ids=ids)
    requester = (await app.get(f"/api/memory/forget/{preview['operation_id']}")).json()["requester"]
    handle = app.runtime.client.get_workflow_handle(preview["operation_id"])
    for token in (None, "not-the-token"):  # as an update sent from the Web UI without the API would be
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update(BatchForgetWorkflow.confirm,
                                        ForgetConfirmation(actor=requester, reason="via the Web UI", token=token))
    assert (await handle.query(BatchForgetWorkflow.state)).status == "awaiting_confirmation"
    assert await _live(app) == set(ids)
    assert (await _execute(app, preview)).status_code == 200
    await _until(app, preview["operation_id"], "done")
    await handle.result()  # the row says done a moment before the workflow's own state does
    state = await handle.query(BatchForgetWorkflow.state)
    assert (state.status, state.done, state.total) == ("done", 1, 1)
