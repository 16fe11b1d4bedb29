"""Contradictions under review: the model's CONTRADICT keeps both facts and opens a review item,
a ReviewWorkflow waiting for a person's `resolve` signal (HTTP, CLI or the Temporal UI) or its
time limit, whose default then applies. Real Postgres and Temporal; the model is the fake."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid

import pytest

from tests.conftest import ollama_settings, serving
from tests.fakes.llm_server import FakeReply
from tests.test_workflow import record_history
from tests.test_write_pipeline import remembered
from workflows.models import ReviewResolution
from workflows.review import ReviewWorkflow

ALLERGIC = "User is allergic to peanuts"
NOT_ALLERGIC = "User is not allergic to peanuts"


async def contradiction(app, fake_llm) -> dict:
    """Two opposing facts and the review between them, once its workflow runs."""
    await remembered(app, fake_llm, "peanuts make me ill", ALLERGIC)
    await remembered(app, fake_llm, "I'm fine with peanuts", NOT_ALLERGIC, decisions=FakeReply.decisions(
        {"action": "CONTRADICT", "target": 1, "confidence": 0.8, "reason": "opposite claims about peanuts"}))
    items = (await app.get("/api/reviews")).json()["items"]
    assert len(items) == 1
    review = items[0]
    for _ in range(200):  # the dispatcher starts its workflow
        if await app.count("SELECT count(*) FROM memory_jobs WHERE id = $1 AND workflow_started_at IS NOT NULL",
                           uuid.UUID(review["id"])):
            break
        await asyncio.sleep(0.05)
    return review


async def resolve(app, review_id: str, resolution: str, key: str | None = None, **body):
    return await app.post(f"/api/reviews/{review_id}/resolve", {"resolution": resolution, "reason": "checked",
                                                                **body}, key=key)


async def live_facts(app) -> list[str]:
    rows = await app.pool.fetch("SELECT content FROM memories WHERE kind = 'fact' AND NOT is_deleted ORDER BY 1")
    return [r["content"] for r in rows]


@pytest.fixture
async def pipeline(make_app, fake_llm):
    async with make_app(**ollama_settings(fake_llm)) as app:
        yield app


async def test_a_contradiction_keeps_both_facts_and_waits_for_review(pipeline, fake_llm):
    review = await contradiction(pipeline, fake_llm)
    assert review["status"] == "open" and review["reason"] == "opposite claims about peanuts"
    assert (review["existing"]["content"], review["new"]["content"]) == (ALLERGIC, NOT_ALLERGIC)
    assert await live_facts(pipeline) == [ALLERGIC, NOT_ALLERGIC]
    handle = pipeline.runtime.client.get_workflow_handle(f"review-{review['id']}")
    assert (await handle.query("state"))["status"] == "open"


@pytest.mark.parametrize("resolution, body, left", [
    ("keep_existing", {}, [ALLERGIC]),
    ("replace", {}, [NOT_ALLERGIC]),
    ("keep_both", {}, [ALLERGIC, NOT_ALLERGIC]),
    ("merge", {"content": "User was allergic to peanuts until 2024"}, ["User was allergic to peanuts until 2024"]),
])
async def test_each_resolution_does_what_it_says(pipeline, fake_llm, resolution, body, left):
    review = await contradiction(pipeline, fake_llm)
    writer = await pipeline.key("writer")
    answer = await resolve(pipeline, review["id"], resolution, key=writer, **body)
    assert answer.status_code == 200, answer.text
    closed = answer.json()
    assert (closed["status"], closed["resolution"], closed["detail"]) == ("resolved", resolution, None)
    assert await live_facts(pipeline) == left
    if resolution != "keep_both":  # the delete is soft, and says who and why
        deleted = await pipeline.pool.fetchrow("SELECT actor_id, reason FROM memory_history WHERE event = 'DELETE'")
        assert deleted["actor_id"].startswith("key:") and f"review {review['id']}: {resolution}" in deleted["reason"]
    handle = pipeline.runtime.client.get_workflow_handle(f"review-{review['id']}")
    assert (await handle.result())["status"] == "resolved"
    if resolution == "merge":
        record_history(await handle.fetch_history(), "review_merged")
    again = await resolve(pipeline, review["id"], "keep_both", key=writer)
    assert again.status_code == 409 and again.json()["error"]["type"] == "conflict"


async def test_an_escalated_review_waits_for_an_operator(pipeline, fake_llm):
    review = await contradiction(pipeline, fake_llm)
    writer = await pipeline.key("writer")
    escalated = await resolve(pipeline, review["id"], "escalate", key=writer)
    assert escalated.status_code == 200 and escalated.json()["status"] == "escalated"
    refused = await resolve(pipeline, review["id"], "replace", key=writer)
    assert refused.status_code == 403
    done = await resolve(pipeline, review["id"], "replace")  # the admin key: an operator
    assert done.status_code == 200 and done.json()["status"] == "resolved"
    assert await live_facts(pipeline) == [NOT_ALLERGIC]


async def test_an_agent_key_may_not_resolve_a_review_and_bad_requests_change_nothing(pipeline, fake_llm):
    review = await contradiction(pipeline, fake_llm)
    agent = await pipeline.key("agent")
    assert (await resolve(pipeline, review["id"], "replace", key=agent)).status_code == 403
    no_content = await resolve(pipeline, review["id"], "merge")
    assert no_content.status_code == 422 and no_content.json()["error"]["type"] == "validation_error"
    unknown = await resolve(pipeline, review["id"], "delete_everything")
    assert unknown.status_code == 422
    missing = await resolve(pipeline, "00000000-0000-4000-8000-000000000000", "keep_both")
    assert missing.status_code == 404
    other_scope = await pipeline.key("writer", scopes=["user:someone-else"])
    assert (await pipeline.get(f"/api/reviews/{review['id']}", key=other_scope)).status_code == 404
    assert (await pipeline.get("/api/reviews", key=other_scope)).json()["items"] == []
    assert await live_facts(pipeline) == [ALLERGIC, NOT_ALLERGIC]
    assert (await pipeline.get(f"/api/reviews/{review['id']}")).json()["status"] == "open"


async def test_a_review_nobody_resolves_expires_to_the_default(make_app, fake_llm):
    async with make_app(**ollama_settings(fake_llm), review_ttl_s=1.5, review_default="keep_both") as app:
        review = await contradiction(app, fake_llm)
        handle = app.runtime.client.get_workflow_handle(f"review-{review['id']}")
        result = await asyncio.wait_for(handle.result(), 30)
        assert (result["status"], result["resolution"]) == ("expired", "keep_both")
        closed = (await app.get(f"/api/reviews/{review['id']}")).json()
        assert closed["status"] == "expired" and closed["resolved_by"] == "system:review"
        assert await live_facts(app) == [ALLERGIC, NOT_ALLERGIC]
        record_history(await handle.fetch_history(), "review_expired")


async def test_the_cli_lists_and_resolves_reviews(pipeline, fake_llm):
    review = await contradiction(pipeline, fake_llm)
    async with serving(pipeline) as url:
        env = {**os.environ, "ENGRAM_URL": url, "ENGRAM_API_KEY": pipeline.admin_key}

        async def cli(*args: str) -> subprocess.CompletedProcess:
            return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "worker.cli", *args], env=env,
                                           capture_output=True, text=True, timeout=60)

        listed = await cli("review", "list")
        assert listed.returncode == 0, listed.stderr
        assert review["id"] in listed.stdout and NOT_ALLERGIC in listed.stdout
        done = await cli("review", "resolve", review["id"], "replace", "--reason", "the user said so")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["status"] == "resolved"
        bad = await cli("review", "resolve", review["id"], "merge", "--reason", "no content")
        assert bad.returncode != 0 and "validation_error" in bad.stderr + bad.stdout
    history = await pipeline.pool.fetchrow("SELECT path FROM memory_history WHERE event = 'DELETE'")
    assert history["path"] == "cli"
    assert await live_facts(pipeline) == [NOT_ALLERGIC]


async def test_status_counts_decisions_and_waiting_reviews(pipeline, fake_llm):
    await contradiction(pipeline, fake_llm)
    pipeline_state = (await pipeline.get("/readyz")).json()["components"]["pipeline"]
    assert pipeline_state["decisions_24h"] == {"ADD applied": 1, "CONTRADICT review_needed": 1}
    assert pipeline_state["reviews_waiting"] == 1


async def test_a_merge_into_the_new_facts_own_words_applies(pipeline, fake_llm):
    review = await contradiction(pipeline, fake_llm)
    answer = await resolve(pipeline, review["id"], "merge", content=NOT_ALLERGIC)
    assert answer.status_code == 200 and answer.json()["detail"] is None, answer.text
    assert await live_facts(pipeline) == [NOT_ALLERGIC]
    existing = await pipeline.pool.fetchrow("SELECT content, version FROM memories WHERE id = $1",
                                            uuid.UUID(review["existing"]["id"]))
    assert (existing["content"], existing["version"]) == (NOT_ALLERGIC, 2)


async def test_a_merge_into_another_live_facts_words_is_refused_before_anything_changes(pipeline, fake_llm):
    review = await contradiction(pipeline, fake_llm)
    await remembered(pipeline, fake_llm, "I work as a nurse", "User works as a nurse")
    refused = await resolve(pipeline, review["id"], "merge", content="User works as a nurse")
    assert refused.status_code == 409 and refused.json()["error"]["type"] == "conflict", refused.text
    assert await live_facts(pipeline) == [ALLERGIC, NOT_ALLERGIC, "User works as a nurse"]
    assert (await pipeline.get(f"/api/reviews/{review['id']}")).json()["status"] == "open"


async def test_a_review_in_a_frozen_scope_is_refused_until_the_freeze_lifts(pipeline, fake_llm):
    review = await contradiction(pipeline, fake_llm)
    freeze = {"switch": "freeze", "scope": {"user_id": "u1"}, "reason": "incident"}
    assert (await pipeline.post("/api/control", {**freeze, "on": True})).status_code == 200
    refused = await resolve(pipeline, review["id"], "replace")
    assert refused.status_code == 423 and refused.json()["error"]["type"] == "frozen", refused.text
    assert await live_facts(pipeline) == [ALLERGIC, NOT_ALLERGIC]
    assert (await pipeline.post("/api/control", {**freeze, "on": False})).status_code == 200
    done = await resolve(pipeline, review["id"], "replace")
    assert done.status_code == 200 and done.json()["status"] == "resolved"
    assert await live_facts(pipeline) == [NOT_ALLERGIC]
    # The review's job ends with it, so no queue shows it pending for ever.
    assert (await pipeline.job(review["id"]))["status"] == "done"


async def test_an_expiry_that_would_delete_waits_while_the_kill_switch_is_on(make_app, fake_llm):
    # A time limit the switch is surely on within (a second was not, once, on a busy machine).
    async with make_app(**ollama_settings(fake_llm), review_ttl_s=4.0, review_default="replace") as app:
        review = await contradiction(app, fake_llm)
        kill = {"switch": "kill_switch", "reason": "incident"}
        assert (await app.post("/api/control", {**kill, "on": True})).status_code == 200
        handle = app.runtime.client.get_workflow_handle(f"review-{review['id']}")
        for _ in range(300):  # past the time limit: the default's step runs, and is held
            pending = (await handle.describe()).raw_description.pending_activities
            if any("kill switch" in p.last_failure.message for p in pending):
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the default's step never ran into the kill switch")
        assert (await app.get(f"/api/reviews/{review['id']}")).json()["status"] == "open"
        assert await live_facts(app) == [ALLERGIC, NOT_ALLERGIC]
        assert (await app.post("/api/control", {**kill, "on": False})).status_code == 200
        result = await asyncio.wait_for(handle.result(), 60)
        assert (result["status"], result["resolution"]) == ("expired", "replace")
        assert await live_facts(app) == [NOT_ALLERGIC]


async def test_while_an_escalation_is_recorded_only_an_operators_resolution_is_taken(pipeline, fake_llm):
    review = await contradiction(pipeline, fake_llm)
    handle = pipeline.runtime.client.get_workflow_handle(f"review-{review['id']}")

    def signal(resolution: str, role: str) -> ReviewResolution:
        return ReviewResolution(resolution=resolution, actor=f"key:{role}", role=role, reason="checked")

    # Hold the review's row, so the escalation's step waits inside its transaction: the window in
    # which the service, reading the review as open, may still signal.
    async with pipeline.pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT 1 FROM memory_reviews WHERE id = $1 FOR UPDATE", uuid.UUID(review["id"]))
        await handle.signal(ReviewWorkflow.resolve, signal("escalate", "writer"))
        for _ in range(100):
            if (await handle.query("state"))["status"] == "escalating":
                break
            await asyncio.sleep(0.05)
        await handle.signal(ReviewWorkflow.resolve, signal("escalate", "writer"))
        await handle.signal(ReviewWorkflow.resolve, signal("keep_existing", "writer"))
        await handle.signal(ReviewWorkflow.resolve, signal("replace", "operator"))
        assert (await handle.query("state")) == {"status": "escalating", "ignored_signals": 2}
    result = await asyncio.wait_for(handle.result(), 30)
    assert (result["status"], result["resolution"]) == ("resolved", "replace")
    assert await live_facts(pipeline) == [NOT_ALLERGIC]


async def test_opposing_facts_of_one_memory_are_both_kept_for_review_without_a_model(pipeline, fake_llm):
    fake_llm.script(FakeReply.json({"facts": [{"content": c, "type": "fact", "confidence": 0.9}
                                              for c in (ALLERGIC, NOT_ALLERGIC, "User has a dog named Rex")],
                                    "entities": [], "category": None, "tags": []}))
    answer = await pipeline.remember("peanuts make me ill; no wait, I'm fine with them. I have a dog, Rex.",
                                     mode="sync")
    await pipeline.wait_job(answer["job_id"], "done")
    assert await live_facts(pipeline) == ["User has a dog named Rex", ALLERGIC, NOT_ALLERGIC]
    assert fake_llm.decision_requests() == []  # nothing to decide against, and the pair needs no model
    rows = await pipeline.pool.fetch("SELECT fact, action, outcome, provider FROM memory_decisions ORDER BY id")
    assert [(r["fact"], r["action"], r["outcome"], r["provider"]) for r in rows] == [
        (ALLERGIC, "ADD", "applied", None), (NOT_ALLERGIC, "CONTRADICT", "review_needed", None),
        ("User has a dog named Rex", "ADD", "applied", None)]
    [review] = (await pipeline.get("/api/reviews")).json()["items"]
    assert (review["existing"]["content"], review["new"]["content"]) == (ALLERGIC, NOT_ALLERGIC)


@pytest.mark.parametrize("proposal", [{"action": "DELETE"}, {"action": "UPDATE", "content": NOT_ALLERGIC}],
                         ids=["DELETE", "UPDATE"])
async def test_a_models_change_that_opposes_its_target_with_no_word_of_change_goes_to_review(
        pipeline, fake_llm, proposal):
    await remembered(pipeline, fake_llm, "peanuts make me ill", ALLERGIC)
    await remembered(pipeline, fake_llm, "I'm fine with peanuts", NOT_ALLERGIC, decisions=FakeReply.decisions(
        {"target": 1, "confidence": 0.95, "reason": "the user corrected it"} | proposal))
    assert await live_facts(pipeline) == [ALLERGIC, NOT_ALLERGIC]
    last = await pipeline.pool.fetchrow("SELECT action, outcome, reason FROM memory_decisions ORDER BY id DESC LIMIT 1")
    assert (last["action"], last["outcome"]) == ("CONTRADICT", "review_needed")
    assert last["reason"].startswith(f"the model's {proposal['action']} would set an opposing claim")
    [review] = (await pipeline.get("/api/reviews")).json()["items"]
    assert (review["existing"]["content"], review["new"]["content"]) == (ALLERGIC, NOT_ALLERGIC)


async def test_the_schema_documents_a_frozen_scopes_refusal_of_a_resolution(pipeline):
    schema = (await pipeline.get("/openapi.json")).json()
    responses = schema["paths"]["/api/reviews/{review_id}/resolve"]["post"]["responses"]
    assert {"409", "423"} <= set(responses)
