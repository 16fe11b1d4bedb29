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

from tests.conftest import App, serving
from tests.test_workflow import record_history

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
