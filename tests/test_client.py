"""The Python SDK (engram.client) against a real running Engram: its operations return the
server's models, its errors mirror the server's, its retries are safe, and it passes progress
through. Only the retry mechanics for a 503 use a stub transport (they test the client alone)."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import subprocess
import sys
import time
import uuid

import httpx
import pytest

from api.http import create_app
from engram.client import (
    AsyncEngram, Conflict, ConnectionFailed, Engram, Frozen, NotFound, PermissionDenied, RateLimited,
    Unauthenticated, Unavailable, ValidationFailed, VersionConflict,
)
from engram.domain.models import Job, Memory, RememberResponse
from tests.conftest import closed_port_url, serving

SCOPE = {"user_id": "ana"}


def gateway(app) -> httpx.ASGITransport:
    """`app`'s HTTP gateway, in-process."""
    web = create_app(None)
    web.state.runtime = app.runtime
    return httpx.ASGITransport(app=web)


def sdk(app, key: str | None = None, transport: httpx.AsyncBaseTransport | None = None, **options) -> AsyncEngram:
    return AsyncEngram("http://engram.test", key or app.admin_key, transport=transport or gateway(app), **options)


class DropsAnswers(httpx.AsyncBaseTransport):
    """The real gateway behind a network that loses the first `drops` answers: each request
    reaches the server and is applied, then the connection breaks before its answer arrives."""

    def __init__(self, inner: httpx.AsyncBaseTransport, drops: int = 1) -> None:
        self.inner, self.drops, self.sent = inner, drops, []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        response = await self.inner.handle_async_request(request)
        await response.aread()
        if self.drops:
            self.drops -= 1
            raise httpx.ReadError("connection reset by peer", request=request)
        return response


class RefusesFirst(httpx.AsyncBaseTransport):
    """The real gateway behind a connection that is refused `refusals` times first: those
    requests never leave the client."""

    def __init__(self, inner: httpx.AsyncBaseTransport, refusals: int = 1) -> None:
        self.inner, self.refusals, self.sent = inner, refusals, []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.refusals:
            self.refusals -= 1
            raise httpx.ConnectError("connection refused", request=request)
        self.sent.append(request)
        return await self.inner.handle_async_request(request)


async def test_remember_search_get_list_modify_forget_and_history_return_the_servers_models(app):
    async with sdk(app, client="cli") as engram:
        stored = await engram.remember("Ana prefers green tea in the morning", scope=SCOPE, mode="sync",
                                       tags=["drink"])
        assert isinstance(stored, RememberResponse) and stored.status == "processed"
        hits = await engram.search("what does Ana drink?", scope=SCOPE, limit=3)
        assert hits.results[0].memory.id == stored.memory_id
        memory = await engram.get(stored.memory_id)
        assert isinstance(memory, Memory) and memory.tags == ["drink"]
        page = await engram.list(scope=SCOPE, tags=["drink"], limit=5)
        assert [m.id for m in page.items] == [stored.memory_id] and page.next_cursor is None
        changed = await engram.modify(stored.memory_id, reason="she switched", content="Ana prefers black tea",
                                      if_version=memory.version)
        assert changed.version == memory.version + 1 and changed.content == "Ana prefers black tea"
        rolled = await engram.rollback(stored.memory_id, version=memory.version, reason="it was right before")
        assert rolled.content == "Ana prefers green tea in the morning"
        assert (await engram.forget(stored.memory_id, reason="asked to")).is_deleted
        assert (await engram.list(scope=SCOPE)).items == []
        assert not (await engram.recover(stored.memory_id, reason="asked back")).is_deleted
        history = await engram.history(stored.memory_id)
        assert [e.event for e in history.events] == ["ADD", "UPDATE", "ROLLBACK", "DELETE", "RECOVER"]
        # X-Engram-Client: every change the SDK made as the CLI is on history with path cli.
        assert {e.path for e in history.events} == {"cli"}


async def test_watch_job_yields_snapshots_until_the_job_is_done(app):
    async with sdk(app) as engram:
        stored = await engram.remember("Ana's sister lives in Porto", scope=SCOPE, mode="async")
        snapshots = [job async for job in engram.watch_job(stored.job_id, interval=0.1)]
        assert all(isinstance(j, Job) for j in snapshots)
        assert snapshots[-1].status == "done" and all(j.status != "done" for j in snapshots[:-1])
        assert (await engram.wait_job(stored.job_id, timeout=5)).status == "done"


async def test_a_batch_remember_and_a_batch_modify_answer_per_item_and_their_import_job_settles(app):
    async with sdk(app) as engram:
        batch = await engram.remember_batch([{"content": f"Ana visited city {i}", "scope": SCOPE} for i in range(3)]
                                            + [{"content": "", "scope": SCOPE}])
        assert (batch.stored, batch.failed) == (3, 1) and batch.results[3].error.type == "validation_error"
        job = await engram.wait_job(batch.job_id, interval=0.1, timeout=30)
        assert job.job_type == "import" and job.progress["done"] == job.progress["total"] == 3
        ids = [r.memory_id for r in batch.results[:3]]
        changed = await engram.modify_batch([{"id": str(ids[0]), "importance": 0.9, "reason": "it matters"},
                                             {"id": str(ids[1]), "if_version": 99, "importance": 0.1, "reason": "x"}])
        assert (changed.applied, changed.failed) == (1, 1)
        assert changed.results[1].error.type == "version_conflict"


async def test_a_batch_forget_is_previewed_executed_watched_verified_and_undone(app):
    async with sdk(app) as engram:
        ids = [(await engram.remember(f"Ana's old address {i}", scope=SCOPE, mode="async")).memory_id
               for i in range(2)]
        preview = await engram.forget_preview(scope=SCOPE, reason="she moved", ids=ids)
        assert {c.id for c in preview.candidates} == set(ids) and not preview.needs_approval
        started = await engram.forget_execute(preview.operation_id, confirm_token=preview.confirm_token)
        assert started.operation_id == preview.operation_id
        snapshots = [op async for op in engram.watch_operation(preview.operation_id, interval=0.1)]
        assert snapshots[-1].status == "done" and snapshots[-1].done == 2
        assert (await engram.verify_receipt(snapshots[-1].receipt)).ok
        with pytest.raises(Conflict):  # not replayed: a second confirmation is refused, not applied twice
            await engram.forget_execute(preview.operation_id, confirm_token=preview.confirm_token)
        undone = await engram.forget_undo(preview.operation_id, reason="wrong person")
        assert set(undone.recovered) == set(ids)
        assert (await engram.approvals()).items == []


async def test_the_operator_surfaces_reviews_approvals_control_verify_keys_and_health(app):
    async with sdk(app) as engram:
        assert await engram.health() == {"status": "ok"}
        assert (await engram.readiness()).ready
        assert (await engram.reviews()).items == [] and (await engram.write_approvals()).items == []
        assert (await engram.verify()).ok
        created = await engram.create_key("reader-of-ana", role="reader", scopes=["user:ana"])
        assert created.key and created.role == "reader"
        assert created.id in {k.id for k in (await engram.keys()).items}
        assert (await engram.revoke_key(created.id)).revoked_at is not None
        frozen = await engram.set_control("freeze", True, reason="incident 42", scope=SCOPE)
        assert [s.user_id for s in frozen.frozen_scopes] == ["ana"]
        with pytest.raises(Frozen) as refused:
            await engram.remember("Ana likes jazz", scope=SCOPE)
        assert refused.value.status == 423 and refused.value.type == "frozen"
        await engram.set_control("freeze", False, reason="incident over", scope=SCOPE)
        assert not (await engram.control()).frozen_scopes
    async with sdk(app, key=created.key) as revoked:
        with pytest.raises(Unauthenticated):
            await revoked.search("jazz", scope=SCOPE)


async def test_error_answers_raise_the_class_of_their_status_with_the_servers_type_and_detail(app):
    reader = await app.key("reader")
    async with sdk(app) as engram, sdk(app, key=reader) as reading, sdk(app, key="engram_not-a-key") as stranger:
        stored = await engram.remember("Ana is learning Finnish", scope=SCOPE, mode="async")
        with pytest.raises(Unauthenticated) as err:
            await stranger.get(stored.memory_id)
        assert err.value.status == 401 and err.value.request_id
        with pytest.raises(PermissionDenied) as err:
            await reading.remember("Ana is learning Swedish", scope=SCOPE)
        assert err.value.status == 403 and err.value.type == "forbidden"
        with pytest.raises(NotFound):
            await engram.get(uuid.uuid4())
        with pytest.raises(VersionConflict) as err:
            await engram.modify(stored.memory_id, reason="a stale edit", content="Ana is fluent", if_version=7)
        assert err.value.status == 409 and err.value.current_version == 1
        with pytest.raises(ValidationFailed) as err:  # the server's words: the SDK checks nothing itself
            await engram.remember("", scope=SCOPE)
        direct = await app.post("/api/memory/remember", {"content": "", "scope": SCOPE})
        assert err.value.detail == direct.json()["error"]["detail"] and err.value.type == "validation_error"
        with pytest.raises(Conflict) as err:
            await engram.confirm(stored.memory_id, reason="not quarantined")
        assert not isinstance(err.value, VersionConflict)


async def test_a_rate_limited_change_raises_with_retry_after_or_is_retried_after_it(make_app):
    async with make_app(change_rate_per_s=1, change_burst=1) as app:
        async with sdk(app, max_retries=0) as impatient, sdk(app, max_retries=2) as patient:
            stored = await impatient.remember("Ana plays the cello", scope=SCOPE, mode="async")
            await impatient.modify(stored.memory_id, reason="more exact", importance=0.8)
            with pytest.raises(RateLimited) as err:
                await impatient.modify(stored.memory_id, reason="more exact", importance=0.9)
            assert err.value.status == 429 and err.value.retry_after == 1.0
            began = time.monotonic()
            changed = await patient.modify(stored.memory_id, reason="more exact", importance=0.9)
            assert changed.importance == pytest.approx(0.9) and time.monotonic() - began >= 0.9


async def test_a_remember_whose_answer_was_lost_is_retried_with_its_key_and_stored_once(app):
    network = DropsAnswers(gateway(app))
    async with sdk(app, transport=network) as engram:
        stored = await engram.remember("Ana's flight is on Friday", scope=SCOPE, mode="async")
    keys = {r.headers["idempotency-key"] for r in network.sent}
    assert len(network.sent) == 2 and len(keys) == 1
    assert await app.count("SELECT count(*) FROM memories WHERE content = $1", "Ana's flight is on Friday") == 1
    assert (await app.runtime.pool.fetchval("SELECT id FROM memories WHERE content = $1",
                                            "Ana's flight is on Friday")) == stored.memory_id


async def test_a_change_the_server_does_not_replay_is_not_resent_after_it_may_have_been_applied(app):
    network = DropsAnswers(gateway(app))
    async with sdk(app, transport=network) as engram:
        with pytest.raises(ConnectionFailed) as err:
            await engram.create_key("once", role="reader", scopes=["*"])
        assert err.value.maybe_applied and len(network.sent) == 1
        assert await app.count("SELECT count(*) FROM api_keys WHERE name = 'once'") == 1
    refused = RefusesFirst(gateway(app))
    async with sdk(app, transport=refused) as engram:  # refused: never sent, so sent again
        assert (await engram.create_key("twice-refused", role="reader", scopes=["*"])).name == "twice-refused"
        assert len(refused.sent) == 1


async def test_a_503_is_retried_after_its_retry_after_and_raised_once_retries_run_out():
    answers = []

    def unavailable_then_ok(request: httpx.Request) -> httpx.Response:
        answers.append(request.headers.get("idempotency-key"))
        if len(answers) < 3:
            return httpx.Response(503, headers={"Retry-After": "0"},
                                  json={"error": {"type": "database_unavailable", "detail": "down"}})
        return httpx.Response(200, json={"status": "ok"})

    async with AsyncEngram("http://stub", "k", transport=httpx.MockTransport(unavailable_then_ok)) as engram:
        assert await engram.health() == {"status": "ok"}
    assert len(answers) == 3
    answers.clear()
    always = httpx.MockTransport(lambda r: httpx.Response(503, headers={"Retry-After": "0"}, json={
        "error": {"type": "embedding_unavailable", "detail": "the embedder is down"}}))
    async with AsyncEngram("http://stub", "k", transport=always, max_retries=1) as engram:
        with pytest.raises(Unavailable) as err:
            await engram.search("x", scope=SCOPE)
    assert err.value.type == "embedding_unavailable" and err.value.retry_after == 0.0


async def test_an_unreachable_api_raises_connection_failed_after_the_retries():
    async with AsyncEngram(closed_port_url(), "k", max_retries=1) as engram:
        with pytest.raises(ConnectionFailed) as err:
            await engram.get(uuid.uuid4())
    assert not err.value.maybe_applied


async def test_the_sync_client_speaks_to_a_real_port(app):
    async with serving(app) as url:
        def use() -> tuple:
            with Engram(url, app.admin_key, client="agent") as engram:
                stored = engram.remember("Ana runs on Sundays", scope=SCOPE, mode="async")
                job = engram.wait_job(stored.job_id, interval=0.1, timeout=30)
                try:
                    engram.get(uuid.uuid4())
                except NotFound as err:
                    missing = err
                return stored, job, engram.history(stored.memory_id), missing

        stored, job, history, missing = await asyncio.to_thread(use)
    assert job.status == "done" and job.memory_id == stored.memory_id
    assert history.events[0].path == "agent" and missing.status == 404


async def test_the_cli_is_a_user_of_the_sdk_its_changes_carry_path_cli_and_its_errors_keep_their_shape(app):
    async with serving(app) as url:
        env = {**os.environ, "ENGRAM_URL": url, "ENGRAM_API_KEY": app.admin_key}

        async def cli(*args: str, **extra) -> subprocess.CompletedProcess:
            return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "worker.cli", *args],
                                           env={**env, **extra}, capture_output=True, text=True, timeout=60)

        stored = await cli("remember", "Ana keeps bees", "--user-id", "ana", "--mode", "async")
        assert stored.returncode == 0, stored.stderr
        memory_id = json.loads(stored.stdout)["memory_id"]
        changed = await cli("modify", memory_id, "--reason", "more exact", "--content", "Ana keeps two hives")
        assert changed.returncode == 0 and json.loads(changed.stdout)["version"] == 2
        history = await cli("history", memory_id)
        assert history.returncode == 0 and history.stdout.count("(admin, cli)") == 2, history.stdout
        stale = await cli("modify", memory_id, "--reason", "stale", "--content", "x", "--if-version", "1")
        assert stale.returncode == 1 and stale.stderr.startswith("engram: 409 version_conflict: ")
        bad = await cli("remember", "", "--user-id", "ana")
        assert bad.returncode == 1 and "engram: 422 validation_error: " in bad.stderr
        away = await cli("get", memory_id, ENGRAM_URL=closed_port_url())
        assert away.returncode == 1 and away.stderr.startswith("engram: cannot reach the API: ")


async def test_the_cli_import_waits_on_its_jobs_with_a_progress_bar(app, tmp_path):
    lines = tmp_path / "notes.jsonl"
    lines.write_text("Ana likes figs\n" + json.dumps({"content": "Ana likes plums", "tags": ["fruit"]}) + "\n")
    async with serving(app) as url:
        env = {**os.environ, "ENGRAM_URL": url, "ENGRAM_API_KEY": app.admin_key}
        done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "worker.cli", "import", str(lines),
                                                        "--user-id", "ana", "--wait"],
                                       env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stored"] == 2
    assert "2/2 100% processed, 0 parked" in done.stderr


def test_the_sync_and_async_clients_offer_the_same_operations_with_the_same_signatures():
    public = {n for n in dir(Engram) if not n.startswith("_")} - {"close"}
    assert public == {n for n in dir(AsyncEngram) if not n.startswith("_")} - {"aclose"}
    for name in public - {"connection"}:
        sync, aio = inspect.signature(getattr(Engram, name)), inspect.signature(getattr(AsyncEngram, name))
        assert list(sync.parameters.values()) == list(aio.parameters.values()), name
    assert "Idempotency-Key" in Engram.remember.__doc__ or "idempotency key" in Engram.remember.__doc__
