"""The gRPC gateway against the HTTP one, on one app: the same scenarios through both answer the
same, field by field (ids and times aside), every error with the matching canonical code and the
HTTP error's type and detail in google.rpc details; scope isolation holds for every read; changes
are recorded with path `grpc`; idempotency metadata replays; the streams end at the terminal
state; health and reflection answer; the committed generated code is what the proto generates."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from fastapi.routing import APIRoute
from google.protobuf import empty_pb2, json_format
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status
from pydantic import BaseModel

from api.grpc.server import SERVICES, serving
from api.http import create_app
from engram.domain import approvals, changes, control, forget, models, reviews
from engram_grpc.memory.v1 import memory_pb2 as pb
from engram_grpc.memory.v1 import memory_pb2_grpc as rpc
from tests.conftest import App, app_settings, new_database, running_app
from tests.test_scope_isolation import GRANTS, SCOPES, contains, grants_cover
from tests.test_scope_isolation import as_dict as scope_dict

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "engram_grpc" / "memory" / "v1"
VOLATILE = {"id", "memory_id", "job_id", "approval_id", "operation_id", "confirm_token", "created_at", "updated_at",
            "expires_at", "content_hash", "hash", "prev_hash", "request_id", "actor_id", "updated_by", "created_by",
            "agent_chain", "requester", "at", "last_accessed", "access_count", "scope_seq", "recovered", "user_id",
            "finished_at", "receipt", "workflow_id", "workflow_started_at", "manual_override_until"}
UUID_TEXT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# The canonical code each HTTP error status maps to (api/grpc/calls.py's table, stated here on its own).
CODE = {401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 409: "ABORTED", 410: "NOT_FOUND",
        422: "INVALID_ARGUMENT", 423: "FAILED_PRECONDITION", 429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE"}


# -- the gateway on a real port --------------------------------------------------------------------

@contextlib.asynccontextmanager
async def grpc_serving(app: App):
    """`app`'s gRPC gateway on a loopback port, over the app's runtime; yields a channel to it."""
    async with serving(app.runtime, "127.0.0.1", 0, health_check_s=0.2) as port:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel


@dataclass
class Gate:
    app: App
    channel: grpc.aio.Channel

    def __post_init__(self) -> None:
        self.memories = rpc.MemoryServiceStub(self.channel)
        self.forgets = rpc.ForgetServiceStub(self.channel)
        self.reviews = rpc.ReviewServiceStub(self.channel)
        self.approvals = rpc.ApprovalServiceStub(self.channel)
        self.control = rpc.ControlServiceStub(self.channel)
        self.keys = rpc.KeyServiceStub(self.channel)

    def metadata(self, key: str | None = None, **extra: str) -> tuple:
        auth = () if key == "" else (("authorization", f"Bearer {key or self.app.admin_key}"),)
        return (*auth, *((name.replace("_", "-"), value) for name, value in extra.items()))

    async def call(self, method, request, key: str | None = None, **extra: str):
        return await method(request, metadata=self.metadata(key, **extra), timeout=60)

    async def http(self, verb: str, path: str, key: str | None = None, body=None, params=None, headers=None):
        auth = {} if key == "" else {"Authorization": f"Bearer {key or self.app.admin_key}"}
        return await self.app.http.request(verb, path, json=body, params=params, headers={**auth, **(headers or {})})


@pytest.fixture(scope="module")
async def gate(postgres, temporal, embedder, reranker, tmp_path_factory):
    """One app for the module: each test writes in scopes of its own."""
    dsn = await new_database(postgres)
    settings = app_settings(tmp_path_factory.mktemp("grpc"), dsn, temporal_address=temporal.address)
    async with running_app(settings, embedder, reranker) as app, grpc_serving(app) as channel:
        yield Gate(app, channel)


def as_dict(message) -> dict:
    return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


def _strip(value, ignore: set[str]):
    if isinstance(value, dict):
        return {k: _strip(v, ignore) for k, v in value.items() if k not in ignore}
    if isinstance(value, list):
        return [_strip(v, ignore) for v in value]
    if isinstance(value, str) and "id" in ignore:  # an id inside a text ("... (approval <id>)")
        return UUID_TEXT.sub("<id>", value)
    return value


def assert_same(http_json: dict, message, ignore: set[str] = frozenset()) -> None:
    """The HTTP answer and the gRPC one hold the same fields and values, but `ignore`'s. The
    HTTP JSON is read into the message's type (an unknown field fails), so both compare alike."""
    from_http = _strip(as_dict(json_format.ParseDict(http_json, type(message)())), set(ignore))
    from_grpc = _strip(as_dict(message), set(ignore))
    assert from_http == from_grpc, "differ (path: http, grpc): " + "; ".join(_differences(from_http, from_grpc))


def _differences(one, two, path: str = "") -> list[str]:
    if isinstance(one, dict) and isinstance(two, dict):
        return [d for k in sorted(set(one) | set(two)) for d in _differences(one.get(k), two.get(k), f"{path}.{k}")]
    if isinstance(one, list) and isinstance(two, list) and len(one) == len(two):
        return [d for i, (a, b) in enumerate(zip(one, two)) for d in _differences(a, b, f"{path}[{i}]")]
    return [] if one == two else [f"{path}: {one!r}, {two!r}"]


def scope(prefix: str) -> dict:
    return {"user_id": f"{prefix}-{uuid.uuid4().hex[:8]}"}


async def grpc_error(call) -> dict:
    """A failed call's code, and what its google.rpc.Status details say."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    err = caught.value
    status = rpc_status.from_call(err)
    assert status is not None, f"{err.code().name} without rich details: {err.details()}"
    found = {"code": err.code().name}
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            found.update(type=info.reason, detail=info.metadata["detail"], domain=info.domain)
            if "current_version" in info.metadata:
                found["current_version"] = int(info.metadata["current_version"])
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            found["retry_s"] = retry.retry_delay.seconds
    assert found.get("detail") == err.details(), "the status message is the detail"
    return found


def assert_same_error(response, found: dict, *, detail: bool = True) -> None:
    assert response.status_code >= 400, response.text
    error = response.json()["error"]
    assert found["code"] == CODE[response.status_code] if error["type"] != "version_conflict" else (
        found["code"] == "FAILED_PRECONDITION"), (response.status_code, error, found)
    assert found["type"] == error["type"] and found["domain"] == "engram", (error, found)
    if detail:
        assert found["detail"] == error["detail"], (error, found)
    if "current_version" in error and error["current_version"] is not None:
        assert found["current_version"] == error["current_version"]


async def remember_both(gate: Gate, body: dict, key: str | None = None) -> tuple[dict, pb.RememberResponse]:
    http = await gate.http("POST", "/api/memory/remember", key, body)
    assert http.status_code == 200, http.text
    message = json_format.ParseDict({**body, "scope": {**body["scope"], "user_id": body["scope"]["user_id"] + "-g"}},
                                    pb.RememberRequest())
    return http.json(), await gate.call(gate.memories.Remember, message, key)


# -- the contract, statically ----------------------------------------------------------------------

def test_the_committed_generated_code_is_what_the_proto_generates(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "proto" / "generate.py"), str(tmp_path)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    assert [p.name for p in generated] == ["memory_pb2.py", "memory_pb2.pyi", "memory_pb2_grpc.py"]
    for path in generated:
        assert (tmp_path / path).read_text() == (ROOT / path).read_text(), f"{path} is stale: run `make proto`"


RPC_OF_ROUTE = {
    ("POST", "/api/memory/remember"): "MemoryService.Remember",
    ("POST", "/api/memory/remember/batch"): "MemoryService.RememberBatch",
    ("POST", "/api/memory/search"): "MemoryService.Search",
    ("GET", "/api/memory/jobs/{job_id}"): "MemoryService.GetJob",
    ("GET", "/api/memory/{memory_id:uuid}"): "MemoryService.GetMemory",
    ("GET", "/api/memory"): "MemoryService.ListMemories",
    ("PATCH", "/api/memory/{memory_id:uuid}"): "MemoryService.ModifyMemory",
    ("DELETE", "/api/memory/{memory_id:uuid}"): "MemoryService.ForgetMemory",
    ("POST", "/api/memory/{memory_id:uuid}/recover"): "MemoryService.RecoverMemory",
    ("POST", "/api/memory/{memory_id:uuid}/rollback"): "MemoryService.RollbackMemory",
    ("POST", "/api/memory/{memory_id:uuid}/confirm"): "MemoryService.ConfirmMemory",
    ("GET", "/api/memory/{memory_id:uuid}/history"): "MemoryService.GetHistory",
    ("POST", "/api/memory/modify"): "MemoryService.ModifyMemories",
    ("GET", "/api/admin/verify"): "MemoryService.VerifyChains",
    ("POST", "/api/memory/forget"): "ForgetService.PreviewForget",
    ("POST", "/api/memory/forget/{operation_id}/execute"): "ForgetService.ExecuteForget",
    ("GET", "/api/memory/forget/{operation_id}"): "ForgetService.GetForget",
    ("POST", "/api/memory/forget/{operation_id}/undo"): "ForgetService.UndoForget",
    ("GET", "/api/approvals"): "ForgetService.ListForgetApprovals",
    ("POST", "/api/approvals/{operation_id}/approve"): "ForgetService.ApproveForget",
    ("POST", "/api/approvals/{operation_id}/reject"): "ForgetService.RejectForget",
    ("POST", "/api/receipts/verify"): "ForgetService.VerifyReceipt",
    ("GET", "/api/reviews"): "ReviewService.ListReviews",
    ("GET", "/api/reviews/{review_id:uuid}"): "ReviewService.GetReview",
    ("POST", "/api/reviews/{review_id:uuid}/resolve"): "ReviewService.ResolveReview",
    ("GET", "/api/memory/approvals"): "ApprovalService.ListApprovals",
    ("GET", "/api/memory/approvals/{approval_id:uuid}"): "ApprovalService.GetApproval",
    ("POST", "/api/memory/approvals/{approval_id:uuid}/decide"): "ApprovalService.DecideApproval",
    ("GET", "/api/control"): "ControlService.GetControl",
    ("POST", "/api/control"): "ControlService.ChangeControl",
    ("POST", "/api/keys"): "KeyService.CreateKey",
    ("GET", "/api/keys"): "KeyService.ListKeys",
    ("DELETE", "/api/keys/{key_id}"): "KeyService.RevokeKey",
}


def test_every_operation_of_the_http_api_has_its_rpc_and_every_rpc_its_operation():
    routes = {(method, route.path) for route in create_app(None).routes if isinstance(route, APIRoute)
              and route.path.startswith("/api/") for method in route.methods}
    assert routes == set(RPC_OF_ROUTE), f"routes without an rpc: {routes - set(RPC_OF_ROUTE)}"
    rpcs = {f"{service.name}.{method.name}" for service in pb.DESCRIPTOR.services_by_name.values()
            for method in service.methods}
    assert rpcs == set(RPC_OF_ROUTE.values()) | {"MemoryService.WatchJob", "ForgetService.WatchOperation"}


# (wire model, message, the message's fields the model does not hold: a path parameter)
MESSAGES = [
    (models.Memory, pb.Memory, ()), (models.RememberResponse, pb.RememberResponse, ()),
    (models.RememberBatchResponse, pb.RememberBatchResponse, ()), (models.RememberItemResult, pb.RememberItemResult, ()),
    (models.ItemError, pb.ItemError, ()), (models.SearchResponse, pb.SearchResponse, ()),
    (models.SearchHit, pb.SearchHit, ()), (models.ScoreComponents, pb.ScoreComponents, ()),
    (models.MemoryPage, pb.MemoryPage, ()), (models.Job, pb.Job, ()), (changes.MemoryHistory, pb.MemoryHistory, ()),
    (changes.HistoryEvent, pb.HistoryEvent, ()), (changes.FactRef, pb.FactRef, ()),
    (changes.DecisionRecord, pb.DecisionRecord, ()), (changes.ModifyBatchResponse, pb.ModifyBatchResponse, ()),
    (changes.ModifyItemResult, pb.ModifyItemResult, ()), (changes.VerifyReport, pb.VerifyReport, ()),
    (changes.ChainBreak, pb.ChainBreak, ()), (forget.ForgetPreview, pb.ForgetPreview, ()),
    (forget.ForgetCandidate, pb.ForgetCandidate, ()), (forget.ForgetStatus, pb.ForgetStatus, ()),
    (forget.ForgetEvent, pb.ForgetEvent, ()), (forget.OperationList, pb.OperationList, ()),
    (forget.UndoResult, pb.UndoResult, ()), (forget.ReceiptCheck, pb.ReceiptCheck, ()),
    (reviews.Review, pb.Review, ()), (reviews.ReviewedMemory, pb.ReviewedMemory, ()),
    (reviews.ReviewPage, pb.ReviewPage, ()), (approvals.Approval, pb.Approval, ()),
    (approvals.ApprovalPage, pb.ApprovalPage, ()), (control.ControlStatus, pb.ControlStatus, ()),
    (control.FrozenScope, pb.FrozenScope, ()), (models.ApiKey, pb.ApiKey, ()), (models.CreatedKey, pb.CreatedKey, ()),
    (models.KeyList, pb.KeyList, ()),
    # requests
    (models.RememberRequest, pb.RememberRequest, ()), (models.RememberItem, pb.RememberItem, ()),
    (models.Scope, pb.Scope, ()), (models.Origin, pb.Origin, ()), (models.SearchRequest, pb.SearchRequest, ()),
    (models.SearchFilters, pb.SearchFilters, ()), (models.TimeRange, pb.TimeRange, ()),
    (changes.MemoryPatch, pb.ModifyMemoryRequest, ("memory_id",)), (changes.ModifyItem, pb.ModifyItem, ()),
    (changes.RecoverRequest, pb.RecoverMemoryRequest, ("memory_id",)),
    (changes.RollbackRequest, pb.RollbackMemoryRequest, ("memory_id",)),
    (changes.ConfirmRequest, pb.ConfirmMemoryRequest, ("memory_id",)), (forget.ForgetRequest, pb.ForgetRequest, ()),
    (forget.ForgetExecute, pb.ExecuteForgetRequest, ("operation_id",)),
    (forget.Decision, pb.DecideForgetRequest, ("operation_id",)),
    (reviews.ResolveRequest, pb.ResolveReviewRequest, ("review_id",)),
    (approvals.DecideRequest, pb.DecideApprovalRequest, ("approval_id",)), (control.SwitchChange, pb.SwitchChange, ()),
    (models.KeyRequest, pb.KeyRequest, ()),
]


@pytest.mark.parametrize("model, message, extra", MESSAGES, ids=[m.__name__ for m, _, _ in MESSAGES])
def test_every_message_has_exactly_its_wire_models_fields(model: type[BaseModel], message, extra):
    fields = {name for name, info in model.model_fields.items() if not info.exclude}
    assert set(message.DESCRIPTOR.fields_by_name) == fields | set(extra)


# -- the same answers ------------------------------------------------------------------------------

async def test_reads_of_one_memory_answer_as_http_does(gate):
    where = scope("reads")
    body = {"content": "the lighthouse keeper feeds a grey cat", "scope": where, "tags": ["cat", "coast"],
            "metadata": {"n": 1, "nested": {"x": [1, 2.5, "y", None, True]}}, "importance": 0.7, "mode": "sync"}
    http, message = await remember_both(gate, body)
    assert_same(http, message, VOLATILE)
    memory_id = http["memory_id"]
    got = await gate.call(gate.memories.GetMemory, pb.GetMemoryRequest(memory_id=memory_id))
    assert_same((await gate.http("GET", f"/api/memory/{memory_id}")).json(), got)
    # what gRPC wrote reads over HTTP as HTTP's own write does: integral Struct numbers are integers
    written = (await gate.http("GET", f"/api/memory/{message.memory_id}")).json()
    assert written["metadata"] == body["metadata"] and written["tags"] == ["cat", "coast"]
    listed = await gate.call(gate.memories.ListMemories, pb.ListMemoriesRequest(user_id=where["user_id"], tags=["cat"]))
    assert_same((await gate.http("GET", "/api/memory", params={**where, "tags": "cat"})).json(), listed,
                {"last_accessed", "access_count"})
    query = {"query": "who feeds the cat", "scope": where, "rerank": False, "explain": True}
    found = await gate.call(gate.memories.Search, json_format.ParseDict(query, pb.SearchRequest()))
    http_found = (await gate.http("POST", "/api/memory/search", body=query)).json()
    assert [h.memory.id for h in found.results] == [h["memory"]["id"] for h in http_found["results"]] == [memory_id]
    assert_same(http_found, found, {"last_accessed", "access_count", "access", "explain"})  # the first search counted
    job = await gate.call(gate.memories.GetJob, pb.GetJobRequest(job_id=http["job_id"]))
    assert_same((await gate.http("GET", f"/api/memory/jobs/{http['job_id']}")).json(), job)
    history = await gate.call(gate.memories.GetHistory, pb.GetHistoryRequest(memory_id=memory_id))
    assert_same((await gate.http("GET", f"/api/memory/{memory_id}/history")).json(), history,
                {"last_accessed", "access_count"})


async def test_changes_answer_as_http_and_history_records_path_grpc_and_the_model(gate):
    where = scope("changes")
    body = {"content": "the meeting is on Tuesday", "scope": where, "mode": "async", "raw": True}
    http, message = await remember_both(gate, body)
    one, two = http["memory_id"], message.memory_id
    for job_id in (http["job_id"], message.job_id):  # a raw save's extraction status settles ("skipped")
        await gate.app.wait_job(job_id)
    attribution = {"x_engram_provider": "acme", "x_engram_model": "acme-1", "x_engram_prompt_version": "p7"}
    patch = {"content": "the meeting is on Wednesday", "tags": [], "reason": "moved", "if_version": 1}
    changed = await gate.http("PATCH", f"/api/memory/{one}", body=patch)
    assert changed.status_code == 200, changed.text
    request = json_format.ParseDict({**patch, "memory_id": two, "tags": {"items": []}}, pb.ModifyMemoryRequest())
    assert_same(changed.json(), await gate.call(gate.memories.ModifyMemory, request, **attribution), VOLATILE)

    forgot = await gate.http("DELETE", f"/api/memory/{one}", params={"reason": "stale"})
    assert_same(forgot.json(), await gate.call(gate.memories.ForgetMemory, pb.ForgetMemoryRequest(
        memory_id=two, reason="stale")), VOLATILE | {"deleted_at"})
    recovered = await gate.http("POST", f"/api/memory/{one}/recover", body={"reason": "needed"})
    assert_same(recovered.json(), await gate.call(gate.memories.RecoverMemory, pb.RecoverMemoryRequest(
        memory_id=two, reason="needed")), VOLATILE)
    rolled = await gate.http("POST", f"/api/memory/{one}/rollback", body={"version": 1, "reason": "undo"})
    assert_same(rolled.json(), await gate.call(gate.memories.RollbackMemory, pb.RollbackMemoryRequest(
        memory_id=two, version=1, reason="undo")), VOLATILE)
    batch = {"items": [{"id": one, "pinned": True, "reason": "keep"}, {"id": str(uuid.uuid4()), "pinned": True,
                                                                         "reason": "keep"}]}
    http_batch = await gate.http("POST", "/api/memory/modify", body=batch)
    batch["items"][0]["id"] = two
    assert_same(http_batch.json(), await gate.call(gate.memories.ModifyMemories, json_format.ParseDict(
        batch, pb.ModifyMemoriesRequest())), VOLATILE)

    http_events = (await gate.http("GET", f"/api/memory/{one}/history")).json()["events"]
    grpc_events = (await gate.call(gate.memories.GetHistory, pb.GetHistoryRequest(memory_id=two))).events
    assert [e["event"] for e in http_events] == [e.event for e in grpc_events] == [
        "ADD", "UPDATE", "DELETE", "RECOVER", "ROLLBACK", "UPDATE"]
    assert [e.path for e in grpc_events] == ["grpc"] * 6 and {e["path"] for e in http_events} == {"http"}
    update = grpc_events[1]
    assert (update.provider, update.model, update.prompt_version) == ("acme", "acme-1", "p7")
    assert update.old_content == "the meeting is on Tuesday" and update.reason == "moved"


async def test_batch_forget_answers_as_http_and_watch_operation_streams_to_done(gate):
    halves = {}
    for side in ("http", "grpc"):
        where = scope(f"forget-{side}")
        for n in range(3):
            await gate.app.remember(f"an old note number {n} about parking", scope=where, mode="async", raw=True)
        halves[side] = where
    request = {"everything": True, "reason": "spring cleaning"}
    preview = await gate.http("POST", "/api/memory/forget", body={**request, "scope": halves["http"]})
    assert preview.status_code == 200, preview.text
    g_preview = await gate.call(gate.forgets.PreviewForget, json_format.ParseDict(
        {"scope": halves["grpc"], "everything": True, "reason": "spring cleaning"}, pb.ForgetRequest()))
    assert_same(preview.json(), g_preview, VOLATILE | {"snippet", "candidates"})
    assert g_preview.total_matched == 3

    op = preview.json()["operation_id"]
    executed = await gate.http("POST", f"/api/memory/forget/{op}/execute",
                               body={"confirm_token": preview.json()["confirm_token"]})
    g_executed = await gate.call(gate.forgets.ExecuteForget, pb.ExecuteForgetRequest(
        operation_id=g_preview.operation_id, confirm_token=g_preview.confirm_token))
    assert_same(executed.json(), g_executed, VOLATILE | {"status", "done", "events"})

    watched = [s async for s in gate.forgets.WatchOperation(
        pb.GetForgetRequest(operation_id=g_preview.operation_id), metadata=gate.metadata(), timeout=60)]
    assert watched[-1].status == "done" and watched[-1].done == 3
    assert all(s.status != "done" for s in watched[:-1]), "the stream goes on past the terminal state"
    for _ in range(100):
        status = await gate.http("GET", f"/api/memory/forget/{op}")
        if status.json()["status"] == "done":
            break
        await asyncio.sleep(0.1)
    g_status = await gate.call(gate.forgets.GetForget, pb.GetForgetRequest(operation_id=g_preview.operation_id))
    assert_same(status.json(), g_status, VOLATILE | {"events"})
    assert [e.event for e in g_status.events] == [e["event"] for e in status.json()["events"]]

    receipt = status.json()["receipt"]
    checked = await gate.http("POST", "/api/receipts/verify", body=receipt)
    g_checked = await gate.call(gate.forgets.VerifyReceipt, json_format.ParseDict({"receipt": receipt},
                                                                                  pb.VerifyReceiptRequest()))
    assert checked.json() == {"ok": True, "problems": []}
    assert_same(checked.json(), g_checked)

    undone = await gate.http("POST", f"/api/memory/forget/{op}/undo", body={"reason": "too eager"})
    g_undone = await gate.call(gate.forgets.UndoForget, pb.DecideForgetRequest(
        operation_id=g_preview.operation_id, reason="too eager"))
    assert_same(undone.json(), g_undone, VOLATILE)
    assert len(g_undone.recovered) == 3
    assert_same((await gate.http("GET", "/api/approvals")).json(),
                await gate.call(gate.forgets.ListForgetApprovals, empty_pb2.Empty()), VOLATILE)


async def test_watch_job_streams_the_job_until_it_is_done(gate):
    answer = await gate.call(gate.memories.Remember, json_format.ParseDict(
        {"content": "a job to watch", "scope": scope("watch"), "mode": "async"}, pb.RememberRequest()))
    jobs = [job async for job in gate.memories.WatchJob(pb.GetJobRequest(job_id=answer.job_id),
                                                        metadata=gate.metadata(), timeout=60)]
    assert jobs[-1].status == "done" and jobs[-1].id == answer.job_id
    assert all(job.status not in ("done", "dead") for job in jobs[:-1])
    assert len({json_format.MessageToJson(job) for job in jobs}) == len(jobs), "a job sent twice unchanged"


async def test_write_approvals_answer_as_http(gate):
    writer = await gate.app.key("writer")
    body = {"content": "always answer in French", "memory_type": "LEARNED", "scope": scope("approve"),
            "mode": "async"}
    http, message = await remember_both(gate, body, writer)
    assert http["status"] == message.status == "pending_approval"
    assert_same(http, message, VOLATILE)
    # The memory's job may embed it, or end, between the two reads of one approval.
    running = {"embedding_model", "extraction_status"}
    listed = await gate.call(gate.approvals.ListApprovals, pb.ListApprovalsRequest(limit=100))
    assert_same((await gate.http("GET", "/api/memory/approvals", params={"limit": 100})).json(), listed, running)
    got = await gate.call(gate.approvals.GetApproval, pb.GetApprovalRequest(approval_id=message.approval_id))
    assert_same((await gate.http("GET", f"/api/memory/approvals/{message.approval_id}")).json(), got, running)
    decision = {"decision": "quarantine", "reason": "needs a look"}
    decided = await gate.http("POST", f"/api/memory/approvals/{http['approval_id']}/decide", body=decision)
    g_decided = await gate.call(gate.approvals.DecideApproval, pb.DecideApprovalRequest(
        approval_id=message.approval_id, **decision))
    assert g_decided.status == "quarantined"
    assert_same(decided.json(), g_decided, VOLATILE | running | {"decided_at"})
    confirmed = await gate.call(gate.memories.ConfirmMemory, pb.ConfirmMemoryRequest(
        memory_id=message.memory_id, reason="it is fine"))
    assert confirmed.status == "active"


async def test_operator_services_answer_as_http(gate):
    assert_same((await gate.http("GET", "/api/control")).json(),
                await gate.call(gate.control.GetControl, empty_pb2.Empty()))
    where = scope("freeze")
    change = {"switch": "freeze", "on": True, "scope": where, "reason": "an incident"}
    frozen = await gate.call(gate.control.ChangeControl, json_format.ParseDict(change, pb.SwitchChange()))
    assert where["user_id"] in [s.user_id for s in frozen.frozen_scopes]
    assert_same((await gate.http("GET", "/api/control")).json(), frozen)
    lifted = await gate.http("POST", "/api/control", body={**change, "on": False})
    assert where["user_id"] not in [s["user_id"] for s in lifted.json()["frozen_scopes"]]

    for status in (None, "resolved"):
        params = {"status": status} if status else {}
        assert_same((await gate.http("GET", "/api/reviews", params=params)).json(),
                    await gate.call(gate.reviews.ListReviews, pb.ListReviewsRequest(**params)))
    assert_same((await gate.http("GET", "/api/admin/verify")).json(),
                await gate.call(gate.memories.VerifyChains, empty_pb2.Empty()), {"memories", "events"})

    request = {"name": f"ci-{uuid.uuid4().hex[:6]}", "role": "reader", "scopes": ["user:alice"]}
    created = await gate.http("POST", "/api/keys", body=request)
    g_created = await gate.call(gate.keys.CreateKey, pb.KeyRequest(**{**request, "name": request["name"] + "-g"}))
    assert_same(created.json(), g_created, VOLATILE | {"key", "name"})
    assert g_created.key.startswith("engram_")
    assert (await gate.call(gate.memories.Search, pb.SearchRequest(query="x", scope=pb.Scope(user_id="alice")),
                            key=g_created.key)).results == []
    assert_same((await gate.http("GET", "/api/keys")).json(), await gate.call(gate.keys.ListKeys, empty_pb2.Empty()))
    revoked = await gate.call(gate.keys.RevokeKey, pb.RevokeKeyRequest(key_id=g_created.id))
    assert revoked.HasField("revoked_at")
    assert_same((await gate.http("DELETE", f"/api/keys/{g_created.id}")).json(), revoked)


# -- errors ----------------------------------------------------------------------------------------

async def test_every_kind_of_error_has_its_code_and_the_http_type_and_detail(gate):
    where = scope("errors")
    memory = await gate.app.remember("a memory to fail on", scope=where, mode="async", raw=True)
    memory_id = memory["memory_id"]
    reader, stranger = await gate.app.key("reader"), await gate.app.key("writer", ["user:someone-else"])
    cases = [
        # (what, the HTTP call, the gRPC call)
        ("no key", gate.http("GET", f"/api/memory/{memory_id}", key=""),
         gate.memories.GetMemory(pb.GetMemoryRequest(memory_id=memory_id))),
        ("bad key", gate.http("GET", f"/api/memory/{memory_id}", key="engram_nope"),
         gate.call(gate.memories.GetMemory, pb.GetMemoryRequest(memory_id=memory_id), key="engram_nope")),
        ("x-api-key, wrong role", gate.http("POST", "/api/memory/remember", key="", headers={"X-API-Key": reader},
                                            body={"content": "no", "scope": where}),
         gate.memories.Remember(pb.RememberRequest(content="no", scope=pb.Scope(**where)),
                                metadata=(("x-api-key", reader),))),
        ("foreign scope", gate.http("GET", f"/api/memory/{memory_id}", key=stranger),
         gate.call(gate.memories.GetMemory, pb.GetMemoryRequest(memory_id=memory_id), key=stranger)),
        ("foreign scope change", gate.http("PATCH", f"/api/memory/{memory_id}", key=stranger,
                                           body={"pinned": True, "reason": "mine"}),
         gate.call(gate.memories.ModifyMemory, pb.ModifyMemoryRequest(memory_id=memory_id, pinned=True, reason="mine"),
                   key=stranger)),
        ("missing", gate.http("GET", f"/api/memory/jobs/{uuid.UUID(int=7)}"),
         gate.call(gate.memories.GetJob, pb.GetJobRequest(job_id=str(uuid.UUID(int=7))))),
        ("version conflict", gate.http("PATCH", f"/api/memory/{memory_id}", body={
            "pinned": True, "reason": "race", "if_version": 5}),
         gate.call(gate.memories.ModifyMemory, pb.ModifyMemoryRequest(memory_id=memory_id, pinned=True, reason="race",
                                                                      if_version=5))),
        ("other conflict", gate.http("POST", f"/api/memory/{memory_id}/recover", body={"reason": "not deleted"}),
         gate.call(gate.memories.RecoverMemory, pb.RecoverMemoryRequest(memory_id=memory_id, reason="not deleted"))),
        ("empty content", gate.http("POST", "/api/memory/remember", body={"content": "", "scope": where}),
         gate.call(gate.memories.Remember, pb.RememberRequest(content="", scope=pb.Scope(**where)))),
        ("several bad fields", gate.http("POST", "/api/memory/remember", body={
            "content": "x", "scope": {"user_id": "*"}, "importance": 2.0, "mode": "later"}),
         gate.call(gate.memories.Remember, pb.RememberRequest(content="x", scope=pb.Scope(user_id="*"),
                                                              importance=2.0, mode="later"))),
        ("no scope part", gate.http("POST", "/api/memory/search", body={"query": "x", "scope": {}}),
         gate.call(gate.memories.Search, pb.SearchRequest(query="x", scope=pb.Scope()))),
        ("NUL in metadata", gate.http("POST", "/api/memory/remember", body={
            "content": "x", "scope": where, "metadata": {"a": "b\u0000"}}),
         gate.call(gate.memories.Remember, json_format.ParseDict(
             {"content": "x", "scope": where, "metadata": {"a": "b\u0000"}}, pb.RememberRequest()))),
        ("patch changes nothing", gate.http("PATCH", f"/api/memory/{memory_id}", body={"reason": "nothing"}),
         gate.call(gate.memories.ModifyMemory, pb.ModifyMemoryRequest(memory_id=memory_id, reason="nothing"))),
        ("list limit", gate.http("GET", "/api/memory", params={**where, "limit": 1000}),
         gate.call(gate.memories.ListMemories, pb.ListMemoriesRequest(user_id=where["user_id"], limit=1000))),
        ("forget without reason", gate.http("DELETE", f"/api/memory/{memory_id}"),
         gate.call(gate.memories.ForgetMemory, pb.ForgetMemoryRequest(memory_id=memory_id))),
        ("a bad idempotency key", gate.http("PATCH", f"/api/memory/{memory_id}", body={"pinned": True, "reason": "r"},
                                            headers={"Idempotency-Key": "k" * 201}),
         gate.call(gate.memories.ModifyMemory, pb.ModifyMemoryRequest(memory_id=memory_id, pinned=True, reason="r"),
                   idempotency_key="k" * 201)),
        ("an unknown review", gate.http("GET", f"/api/reviews/{uuid.UUID(int=9)}"),
         gate.call(gate.reviews.GetReview, pb.GetReviewRequest(review_id=str(uuid.UUID(int=9))))),
        ("an unknown operation", gate.http("GET", f"/api/memory/forget/forget-{uuid.UUID(int=9)}"),
         gate.call(gate.forgets.GetForget, pb.GetForgetRequest(operation_id=f"forget-{uuid.UUID(int=9)}"))),
        ("a reader switches", gate.http("POST", "/api/control", key=reader, body={
            "switch": "kill_switch", "on": True, "reason": "r"}),
         gate.call(gate.control.ChangeControl, pb.SwitchChange(switch="kill_switch", on=True, reason="r"), key=reader)),
        ("a reader lists keys", gate.http("GET", "/api/keys", key=reader),
         gate.call(gate.keys.ListKeys, empty_pb2.Empty(), key=reader)),
    ]
    wrong = []
    for what, http_call, grpc_call in cases:
        response, found = await http_call, await grpc_error(grpc_call)
        try:
            assert_same_error(response, found, detail=not what.startswith("a bad idempotency"))
        except AssertionError as err:
            wrong.append(f"{what}: {err}")
    assert not wrong, "\n".join(wrong)


async def test_version_conflict_is_failed_precondition_with_the_current_version(gate):
    memory = await gate.app.remember("versioned", scope=scope("conflict"), mode="async", raw=True)
    found = await grpc_error(gate.call(gate.memories.ModifyMemory, pb.ModifyMemoryRequest(
        memory_id=memory["memory_id"], pinned=True, reason="stale", if_version=3)))
    assert (found["code"], found["type"], found["current_version"]) == ("FAILED_PRECONDITION", "version_conflict", 1)


async def test_a_frozen_scope_refuses_with_failed_precondition_as_http_refuses_with_423(gate):
    where = scope("frozen")
    memory = await gate.app.remember("cannot change while frozen", scope=where, mode="async", raw=True)
    await gate.call(gate.control.ChangeControl, json_format.ParseDict(
        {"switch": "freeze", "on": True, "scope": where, "reason": "incident"}, pb.SwitchChange()))
    try:
        for http_call, grpc_call in (
            (gate.http("POST", "/api/memory/remember", body={"content": "new", "scope": where}),
             gate.call(gate.memories.Remember, pb.RememberRequest(content="new", scope=pb.Scope(**where)))),
            (gate.http("DELETE", f"/api/memory/{memory['memory_id']}", params={"reason": "r"}),
             gate.call(gate.memories.ForgetMemory, pb.ForgetMemoryRequest(memory_id=memory["memory_id"], reason="r"))),
        ):
            response, found = await http_call, await grpc_error(grpc_call)
            assert response.status_code == 423 and found["code"] == "FAILED_PRECONDITION"
            assert_same_error(response, found)
    finally:
        await gate.http("POST", "/api/control", body={"switch": "freeze", "on": False, "scope": where, "reason": "ok"})


async def test_too_many_changes_are_resource_exhausted_with_retry_info(make_app):
    async with make_app(change_burst=6, change_rate_per_s=0.2) as app, grpc_serving(app) as channel:
        await _too_many_changes(Gate(app, channel))


async def _too_many_changes(gate: Gate) -> None:
    key = await gate.app.key("writer")
    memory = await gate.app.remember("changed too often", scope=scope("rate"), mode="async", raw=True)
    for n in range(10):
        try:
            await gate.call(gate.memories.ModifyMemory, pb.ModifyMemoryRequest(
                memory_id=memory["memory_id"], importance=n / 10, reason="again"), key=key)
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
            break
    else:
        pytest.fail("ten changes in a row were all accepted with a burst of 6")
    found = await grpc_error(gate.call(gate.memories.ModifyMemory, pb.ModifyMemoryRequest(
        memory_id=memory["memory_id"], importance=0.1, reason="again"), key=key))
    response = await gate.http("PATCH", f"/api/memory/{memory['memory_id']}", key=key,
                               body={"importance": 0.1, "reason": "again"})
    assert response.status_code == 429
    assert_same_error(response, found, detail=False)  # its detail names the seconds left, which move on
    assert found["retry_s"] == int(response.headers["Retry-After"]) >= 1


# -- metadata --------------------------------------------------------------------------------------

async def test_idempotency_metadata_replays_the_first_answer_as_the_header_does(gate):
    where = scope("idem")
    request = pb.RememberRequest(content="said once", scope=pb.Scope(**where), mode="async")
    first = await gate.call(gate.memories.Remember, request, idempotency_key="k-1")
    again = await gate.call(gate.memories.Remember, request, idempotency_key="k-1")
    assert again == first
    other = pb.RememberRequest(content="said otherwise", scope=pb.Scope(**where), mode="async")
    found = await grpc_error(gate.call(gate.memories.Remember, other, idempotency_key="k-1"))
    assert (found["code"], found["type"]) == ("ABORTED", "conflict")

    batch = json_format.ParseDict({"items": [{"content": f"imported {n}", "scope": where} for n in range(3)]},
                                  pb.RememberBatchRequest())
    one = await gate.call(gate.memories.RememberBatch, batch, idempotency_key="b-1")
    two = await gate.call(gate.memories.RememberBatch, batch, idempotency_key="b-1")
    assert [r.memory_id for r in two.results] == [r.memory_id for r in one.results] and one.stored == 3
    # the item keys are `<key>:<index>`, as HTTP's: the HTTP replay of item 1 alone answers item 1's memory
    http = await gate.http("POST", "/api/memory/remember", headers={"Idempotency-Key": "b-1:1"},
                           body={"content": "imported 1", "scope": where, "mode": "async"})
    assert http.json()["memory_id"] == one.results[1].memory_id

    patch = pb.ModifyMemoryRequest(memory_id=first.memory_id, importance=0.9, reason="once")
    changed = await gate.call(gate.memories.ModifyMemory, patch, idempotency_key="m-1")
    replayed = await gate.call(gate.memories.ModifyMemory, patch, idempotency_key="m-1")
    assert replayed == changed and replayed.version == 2


async def test_the_request_id_comes_back_and_is_on_the_history_it_wrote(gate):
    call = gate.memories.Remember(pb.RememberRequest(content="traced", scope=pb.Scope(**scope("trace")), mode="async"),
                                  metadata=gate.metadata(x_request_id="req-42"))
    answer = await call
    assert ("x-request-id", "req-42") in tuple(await call.trailing_metadata())
    history = await gate.call(gate.memories.GetHistory, pb.GetHistoryRequest(memory_id=answer.memory_id))
    assert [(e.request_id, e.path) for e in history.events] == [("req-42", "grpc")]
    fresh = gate.memories.GetMemory(pb.GetMemoryRequest(memory_id=answer.memory_id), metadata=gate.metadata())
    await fresh
    assert uuid.UUID(dict(tuple(await fresh.trailing_metadata()))["x-request-id"])
    failed = gate.memories.GetMemory(pb.GetMemoryRequest(memory_id=str(uuid.UUID(int=3))),
                                     metadata=gate.metadata(x_request_id="req-43"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await failed
    assert ("x-request-id", "req-43") in tuple(caught.value.trailing_metadata())
    watch = gate.memories.WatchJob(pb.GetJobRequest(job_id=answer.job_id), metadata=gate.metadata(x_request_id="w-1"))
    assert ("x-request-id", "w-1") in tuple(await watch.initial_metadata())
    watch.cancel()


# -- scope isolation -------------------------------------------------------------------------------

async def test_every_read_shows_exactly_what_http_shows_for_every_grant(gate):
    """The scope isolation matrix of tests/test_scope_isolation.py, through gRPC: list, search,
    get, job and history show, per key, exactly the memories HTTP shows; the rest are NOT_FOUND."""
    tag = uuid.uuid4().hex[:6]
    worlds = {}
    for n, parts in enumerate(SCOPES):
        where = {k: f"{v}-{tag}" for k, v in scope_dict(parts).items()}
        answer = await gate.app.remember(f"zebra sighting {n}", scope=where, mode="async", raw=True)
        worlds[parts] = answer
    await asyncio.gather(*(gate.app.wait_job(a["job_id"]) for a in worlds.values()))
    wrong = []
    for grants in GRANTS:
        mine = [g if g == "*" or g.endswith(":*") else f"{g}-{tag}" for g in grants]
        key = await gate.app.key("reader", mine)
        for request in SCOPES:
            where = {k: f"{v}-{tag}" for k, v in scope_dict(request).items()}
            want = None if not grants_cover(grants, request) else {
                worlds[m]["memory_id"] for m in SCOPES if contains(request, m) and grants_cover(grants, m)}
            try:
                listed = await gate.call(gate.memories.ListMemories, pb.ListMemoriesRequest(**where, limit=100), key)
                found = await gate.call(gate.memories.Search, pb.SearchRequest(
                    query="zebra", scope=pb.Scope(**where), limit=100, rerank=False), key)
                got = ({m.id for m in listed.items}, {h.memory.id for h in found.results})
                if want is None or got != (want, want):
                    wrong.append(f"{grants} {where}: listed/found {got}, want {want}")
            except grpc.aio.AioRpcError as err:
                if want is not None or err.code() != grpc.StatusCode.PERMISSION_DENIED:
                    wrong.append(f"{grants} {where}: {err.code().name} {err.details()}")
        for parts, answer in worlds.items():
            visible = grants_cover(grants, parts)
            for method, request in ((gate.memories.GetMemory, pb.GetMemoryRequest(memory_id=answer["memory_id"])),
                                    (gate.memories.GetJob, pb.GetJobRequest(job_id=answer["job_id"])),
                                    (gate.memories.GetHistory, pb.GetHistoryRequest(memory_id=answer["memory_id"]))):
                try:
                    await gate.call(method, request, key)
                    if not visible:
                        wrong.append(f"{grants}: {method._method} shows {parts}")
                except grpc.aio.AioRpcError as err:
                    if visible or err.code() != grpc.StatusCode.NOT_FOUND:
                        wrong.append(f"{grants}: {method._method} of {parts}: {err.code().name}")
    assert not wrong, "\n".join(wrong[:30])


# -- health and reflection -------------------------------------------------------------------------

async def test_health_follows_readiness_and_reflection_lists_the_services(gate):
    health = health_pb2_grpc.HealthStub(gate.channel)
    for service in ("", *SERVICES):
        for _ in range(50):
            answer = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            if answer.status == health_pb2.HealthCheckResponse.SERVING:
                break
            await asyncio.sleep(0.1)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING, service

    reflection = reflection_pb2_grpc.ServerReflectionStub(gate.channel)

    async def ask():
        yield reflection_pb2.ServerReflectionRequest(list_services="")
        yield reflection_pb2.ServerReflectionRequest(file_containing_symbol="engram.memory.v1.MemoryService")

    answers = [a async for a in reflection.ServerReflectionInfo(ask(), timeout=10)]
    listed = {s.name for s in answers[0].list_services_response.service}
    assert set(SERVICES) | {"grpc.health.v1.Health"} <= listed
    assert answers[1].file_descriptor_response.file_descriptor_proto, "no descriptor for MemoryService"


async def test_a_message_over_the_body_limit_is_refused_as_resource_exhausted(gate):
    request = pb.RememberRequest(content="x" * (1 << 20), scope=pb.Scope(user_id="big"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await gate.call(gate.memories.Remember, request)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
