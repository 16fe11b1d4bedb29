"""HTTP/JSON gateway: translation only. Every route resolves the caller, calls the service and
maps domain errors to `{"error": {"type", "detail"}}` with the right status.

Bad input is a 422 `validation_error` wherever it is found: a body that is not JSON (or not
UTF-8), a field of the wrong type, a value the models refuse. The OpenAPI schema at
`/openapi.json` states the authentication schemes, every operation's error statuses and the
enforced limits.
"""

from __future__ import annotations

import logging
import math
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from api.body_limit import BodyLimit
from api.errors import ErrorBody, describe_validation, error_body
from api.mem0 import router as mem0_router
from api.request_context import RequestContext
from engram.domain.auth import Principal
from engram.domain.changes import (
    MAX_VERSION, ChangeContext, ConfirmRequest, MemoryHistory, MemoryPatch, ModelAttribution, ModifyBatchRequest,
    ModifyBatchResponse, Reason, RecoverRequest, RollbackRequest, VerifyReport,
)
from engram.domain.control import ControlStatus, SwitchChange
from engram.domain.approvals import Approval, ApprovalPage, DecideRequest
from engram.domain.provenance import MemoryType, Trust
from engram.domain.reviews import ResolveRequest, Review, ReviewPage
from engram.domain.errors import DatabaseUnavailable, EngramError, RateLimited, VersionConflict
from engram.domain.forget import (
    Decision, ForgetExecute, ForgetPreview, ForgetRequest, ForgetStatus, OperationList, ReceiptCheck, UndoResult,
)
from engram.domain.health import Readiness
from engram.domain.models import (
    MAX_LIMIT, ApiKey, CreatedKey, Job, KeyList, KeyRequest, Memory, MemoryPage, RememberBatchRequest,
    RememberBatchResponse, RememberRequest, RememberResponse, Scope, ScopeId, SearchFilters, SearchRequest,
    SearchResponse, Tag,
)

log = logging.getLogger("engram.http")
MAX_BODY_BYTES = 1 << 20


_MEANING = {
    401: "No API key, or an unknown or revoked one.",
    403: "The key's role or scope grants do not allow this.",
    404: "No such resource, or one in a scope the key may not see.",
    409: ("Conflicts with what is stored: a reused idempotency key, a taken key name, the last admin key, a "
          "version other than if_version (`version_conflict`, with `current_version`), a pinned memory "
          "(`pinned`), a person's lock (`manual_override`), a deleted or quarantined memory."),
    410: "The memory was deleted longer ago than its recovery window.",
    413: f"The request body is over {MAX_BODY_BYTES} bytes.",
    423: "Mutations are frozen (everywhere, or in this scope) by an operator or a delete spike: nothing was changed.",
    422: "The request is not valid: malformed JSON, a wrong type, a value out of bounds.",
    429: "Too many changes from this key: retry after `Retry-After` seconds.",
    503: "A component the request needs is unavailable (the database, the embedding model); retry later.",
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorBody, "description": _MEANING[status]} for status in statuses}


def _allowed_methods(app: FastAPI, request: Request) -> list[str]:
    """Every method some route serves at this path."""
    methods: set[str] = set()
    for route in app.router.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return sorted(methods)


def service(request: Request):
    return request.app.state.runtime.service


def changes(request: Request):
    return request.app.state.runtime.changes


def forgets(request: Request):
    return request.app.state.runtime.forgets


def reviews(request: Request):
    return request.app.state.runtime.reviews


def write_approvals(request: Request):
    return request.app.state.runtime.approvals


OperationId = Annotated[str, Path(pattern=r"^forget-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
                                  max_length=43)]


async def _change_context(
    request: Request,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", min_length=1, max_length=200,
                                                  description="A replay returns the first answer")] = None,
    client: Annotated[Literal["cli", "agent", "mcp"],
                      Header(alias="X-Engram-Client", description="The client the request came by, for history's "
                                                                  "`path` (absent: `http`)")] = None,
    provider: Annotated[str | None, Header(alias="X-Engram-Provider", min_length=1, max_length=200, description=(
        "The provider of the model that acted (an agent's own), recorded on history as declared"))] = None,
    model: Annotated[str | None, Header(alias="X-Engram-Model", min_length=1, max_length=200, description=(
        "The model that acted, recorded on history as declared"))] = None,
    prompt_version: Annotated[str | None, Header(alias="X-Engram-Prompt-Version", min_length=1, max_length=200,
                                                 description="The prompt version the model acted on")] = None,
) -> ChangeContext:
    # async, though it awaits nothing: FastAPI runs a plain function dependency on its thread pool,
    # a thread hand-off on every remember and change.
    return ChangeContext(path=client or "http", request_id=request.state.request_id, idempotency_key=idempotency_key,
                         model=ModelAttribution(provider=provider, model=model, prompt_version=prompt_version))


Context = Annotated[ChangeContext, Depends(_change_context)]


def _only_query(request: Request, known: set[str]) -> None:
    """Refuse a query parameter the operation does not take, or one given twice: a misspelt
    `if_version` must not turn a conditional delete into an unconditional one."""
    names = [name for name, _ in request.query_params.multi_items()]
    problems = [{"loc": ("query", n), "msg": "not a parameter of this operation" if n not in known
                 else "given more than once", "type": "value_error"}
                for n in dict.fromkeys(names) if n not in known or names.count(n) > 1]
    if problems:
        raise RequestValidationError(problems)


_bearer = HTTPBearer(auto_error=False, description="An Engram API key: `Authorization: Bearer <key>`.")
_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="An Engram API key.")


async def _principal(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    api_key: Annotated[str | None, Depends(_api_key_header)],
) -> Principal:
    key = bearer.credentials if bearer is not None else api_key
    return await service(request).authenticate(key)


Caller = Annotated[Principal, Depends(_principal)]


def create_app(runtime_factory) -> FastAPI:
    """The app. `runtime_factory` is an async context manager yielding a `Runtime`; the app
    opens it at start-up and closes it at shut-down."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async with runtime_factory() as runtime:
            app.state.runtime = runtime
            yield

    app = FastAPI(title="Engram", version="0.1.0", lifespan=lifespan)
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    app.add_middleware(RequestContext)  # added last, so outermost: a 413 carries its id and is logged

    @app.exception_handler(EngramError)
    async def _domain(_: Request, exc: EngramError):
        headers = {"Retry-After": "1"} if isinstance(exc, DatabaseUnavailable) else None
        if isinstance(exc, RateLimited):
            headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
        extra = {"current_version": exc.current_version} if isinstance(exc, VersionConflict) else {}
        return error_body(exc.http_status, exc.type, exc.detail, headers=headers, **extra)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError):
        return error_body(422, "validation_error", describe_validation(exc.errors()))

    @app.exception_handler(ValidationError)
    async def _invalid_model(_: Request, exc: ValidationError):
        return error_body(422, "validation_error", describe_validation(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 400:  # FastAPI could not read the body (say, not UTF-8): bad input
            return error_body(422, "validation_error", "body: the body is not valid UTF-8 JSON")
        headers = exc.headers
        if exc.status_code == 405:  # Starlette names only the first route whose path matched
            headers = {**(headers or {}), "Allow": ", ".join(_allowed_methods(app, request))}
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_body(exc.status_code, kind, str(exc.detail), headers=headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.error("unhandled error", exc_info=exc,
                  extra={"request_id": getattr(request.state, "request_id", None), "path": request.url.path})
        return error_body(500, "internal", "an unexpected error; it is logged with this request's id")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", response_model=Readiness,
             responses={503: {"model": Readiness, "description": "A component is not ready."}})
    async def readyz(request: Request):
        state = await request.app.state.runtime.readiness()
        ready = all(part.get("ok") for part in state.values())
        return JSONResponse(status_code=200 if ready else 503, content={"ready": ready, "components": state})

    @app.post("/api/memory/remember", response_model=RememberResponse,
              responses=_errors(401, 403, 409, 413, 422, 423, 503))
    async def remember(body: RememberRequest, request: Request, caller: Caller, ctx: Context):
        if ctx.idempotency_key and body.idempotency_key is None:  # the header serves as the body's field
            body = body.model_copy(update={"idempotency_key": ctx.idempotency_key})
        return await service(request).remember(caller, body, request_id=request.state.request_id, path=ctx.path,
                                               model=ctx.model)

    @app.post("/api/memory/remember/batch", response_model=RememberBatchResponse,
              responses=_errors(401, 403, 413, 422, 423, 503))
    async def remember_batch(body: RememberBatchRequest, request: Request, caller: Caller, ctx: Context):
        """Remember up to ENGRAM_REMEMBER_BATCH_MAX items at once: each is stored, or answered
        with its own error, and processed later (poll the returned import job for progress). An
        `Idempotency-Key` header keys each item that has no key of its own as `<key>:<index>`,
        so the whole batch sent again stores nothing twice."""
        items = body.items
        if ctx.idempotency_key:
            items = [{"idempotency_key": f"{ctx.idempotency_key}:{i}", **item} if isinstance(item, dict) else item
                     for i, item in enumerate(items)]
        return await service(request).remember_batch(caller, items, request_id=request.state.request_id,
                                                     path=ctx.path, model=ctx.model)

    @app.post("/api/memory/search", response_model=SearchResponse, responses=_errors(401, 403, 413, 422, 503))
    async def search(body: SearchRequest, request: Request, caller: Caller):
        return await service(request).search(caller, body)

    @app.get("/api/memory/jobs/{job_id}", response_model=Job, responses=_errors(401, 404, 422, 503))
    async def job(job_id: UUID, request: Request, caller: Caller):
        return await service(request).job(caller, job_id)

    # `:uuid`: /api/memory/remember and /api/memory/search are no memory ids, so another method
    # on them is a 405, not a 422 for a malformed id.
    @app.get("/api/memory/{memory_id:uuid}", response_model=Memory, responses=_errors(401, 404, 422, 503))
    async def get_memory(memory_id: UUID, request: Request, caller: Caller):
        return await service(request).get(caller, memory_id)

    @app.get("/api/memory", response_model=MemoryPage, responses=_errors(401, 403, 422, 503))
    async def list_memories(
        request: Request, caller: Caller,
        user_id: ScopeId | None = None, agent_id: ScopeId | None = None, run_id: ScopeId | None = None,
        kind: Literal["raw", "fact"] | None = None,
        type: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
        tags: Annotated[list[Tag] | None, Query(max_length=64)] = None,
        who: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
        source_type: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
        time: Annotated[str | None, Query(min_length=1, max_length=100)] = None,
        memory_type: Annotated[list[MemoryType] | None, Query(min_length=1)] = None,
        trust: Annotated[list[Trust] | None, Query(min_length=1)] = None,
        min_confidence: Annotated[float | None, Query(ge=0.0, le=1.0)] = None,
        include_deleted: bool = False,
        include_expired: bool = False,
        status: Literal["active", "superseded", "deleted", "quarantined", "pending"] | None = None,
        cursor: Annotated[str | None, Query(min_length=1, max_length=500)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 20,
    ):
        try:
            scope = Scope(user_id=user_id, agent_id=agent_id, run_id=run_id)
            filters = SearchFilters(kind=kind, type=type, tags=tags, who=who, source_type=source_type, time=time,
                                    memory_type=memory_type, trust=trust, min_confidence=min_confidence)
        except ValidationError as exc:  # the parameters' models: name them as query parameters
            raise RequestValidationError([{**e, "loc": ("query", *e["loc"])} for e in exc.errors()]) from None
        return await service(request).list(caller, scope, filters, include_deleted=include_deleted,
                                           cursor=cursor, limit=limit, status=status, include_expired=include_expired)

    @app.patch("/api/memory/{memory_id:uuid}", response_model=Memory,
               responses=_errors(401, 403, 404, 409, 413, 422, 423, 429, 503))
    async def modify(memory_id: UUID, body: MemoryPatch, request: Request, caller: Caller, ctx: Context):
        """Change some of a memory's fields, with a reason; `if_version` makes it conditional."""
        return await changes(request).modify(caller, memory_id, body, ctx)

    @app.delete("/api/memory/{memory_id:uuid}", response_model=Memory,
                responses=_errors(401, 403, 404, 409, 422, 423, 429, 503))
    async def forget(memory_id: UUID, request: Request, caller: Caller, ctx: Context,
                     reason: Annotated[Reason, Query()], force: bool = False,
                     if_version: Annotated[int | None, Query(ge=1, le=MAX_VERSION)] = None):
        """Soft-delete a memory (recoverable within the tombstone window). A pinned memory needs
        `force=true`, which only operators may send."""
        _only_query(request, {"reason", "force", "if_version"})
        return await changes(request).forget(caller, memory_id, reason=reason, force=force, if_version=if_version,
                                             ctx=ctx)

    @app.post("/api/memory/{memory_id:uuid}/recover", response_model=Memory,
              responses=_errors(401, 403, 404, 409, 410, 413, 422, 423, 429, 503))
    async def recover(memory_id: UUID, body: RecoverRequest, request: Request, caller: Caller, ctx: Context):
        return await changes(request).recover(caller, memory_id, body, ctx)

    @app.post("/api/memory/{memory_id:uuid}/rollback", response_model=Memory,
              responses=_errors(401, 403, 404, 409, 413, 422, 423, 429, 503))
    async def rollback(memory_id: UUID, body: RollbackRequest, request: Request, caller: Caller, ctx: Context):
        """Write a new version equal to an earlier one."""
        return await changes(request).rollback(caller, memory_id, body, ctx)

    @app.post("/api/memory/{memory_id:uuid}/confirm", response_model=Memory,
              responses=_errors(401, 403, 404, 409, 413, 422, 423, 503))
    async def confirm(memory_id: UUID, body: ConfirmRequest, request: Request, caller: Caller, ctx: Context):
        """Operators: accept a quarantined memory's row as it is now."""
        return await changes(request).confirm(caller, memory_id, body, ctx)

    @app.get("/api/memory/{memory_id:uuid}/history", response_model=MemoryHistory,
             responses=_errors(401, 404, 422, 503))
    async def memory_history(memory_id: UUID, request: Request, caller: Caller):
        return await changes(request).history(caller, memory_id)

    @app.post("/api/memory/modify", response_model=ModifyBatchResponse,
              responses=_errors(401, 403, 409, 413, 422, 423, 503))
    async def modify_batch(body: ModifyBatchRequest, request: Request, caller: Caller, ctx: Context):
        """Apply a batch of patches (each with its memory's `id`), each on its own."""
        return await changes(request).modify_batch(caller, body.items, ctx)

    @app.post("/api/memory/forget", response_model=ForgetPreview,
              responses=_errors(401, 403, 404, 409, 413, 422, 423, 503))
    async def forget_preview(body: ForgetRequest, request: Request, caller: Caller):
        """Preview a batch forget: the exact set (by query, filters or ids) and the token that
        confirms it. Changes nothing."""
        return await forgets(request).preview(caller, body)

    @app.post("/api/memory/forget/{operation_id}/execute", response_model=ForgetStatus,
              responses=_errors(401, 403, 404, 409, 410, 413, 422, 423, 503))
    async def forget_execute(operation_id: OperationId, body: ForgetExecute, request: Request, caller: Caller,
                             ctx: Context):
        """Confirm a previewed batch forget with its token; above the approval threshold it
        then waits for an operator's approval."""
        return await forgets(request).execute(caller, operation_id, body, ctx)

    @app.get("/api/memory/forget/{operation_id}", response_model=ForgetStatus, responses=_errors(401, 404, 422, 503))
    async def forget_status(operation_id: OperationId, request: Request, caller: Caller):
        return await forgets(request).status(caller, operation_id)

    @app.post("/api/memory/forget/{operation_id}/undo", response_model=UndoResult,
              responses=_errors(401, 403, 404, 409, 413, 422, 503))
    async def forget_undo(operation_id: OperationId, body: Decision, request: Request, caller: Caller, ctx: Context):
        """Recover exactly what a finished batch forget deleted (within the tombstone window)."""
        return await forgets(request).undo(caller, operation_id, body, ctx)

    @app.get("/api/approvals", response_model=OperationList, responses=_errors(401, 403, 503))
    async def approvals(request: Request, caller: Caller):
        return await forgets(request).approvals(caller)

    @app.post("/api/approvals/{operation_id}/approve", response_model=ForgetStatus,
              responses=_errors(401, 403, 404, 409, 413, 422, 503))
    async def approve(operation_id: OperationId, body: Decision, request: Request, caller: Caller):
        return await forgets(request).decide(caller, operation_id, True, body)

    @app.post("/api/approvals/{operation_id}/reject", response_model=ForgetStatus,
              responses=_errors(401, 403, 404, 409, 413, 422, 503))
    async def reject(operation_id: OperationId, body: Decision, request: Request, caller: Caller):
        return await forgets(request).decide(caller, operation_id, False, body)

    @app.get("/api/reviews", response_model=ReviewPage, responses=_errors(401, 403, 422, 503))
    async def list_reviews(request: Request, caller: Caller,
                           status: Literal["open", "escalated", "resolved", "expired"] | None = None,
                           limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50):
        """Contradictions kept for a person, oldest first: waiting ones (open, escalated) by default."""
        return await reviews(request).list(caller, status=status, limit=limit)

    @app.get("/api/reviews/{review_id:uuid}", response_model=Review, responses=_errors(401, 403, 404, 422, 503))
    async def get_review(review_id: UUID, request: Request, caller: Caller):
        return await reviews(request).get(caller, review_id)

    @app.post("/api/reviews/{review_id:uuid}/resolve", response_model=Review,
              responses=_errors(401, 403, 404, 409, 413, 422, 423, 503))
    async def resolve_review(review_id: UUID, body: ResolveRequest, request: Request, caller: Caller, ctx: Context):
        """keep_existing, replace, keep_both, merge (with `content`), or escalate (to an operator).
        Answers once the review's workflow has applied it, or as it stands after 10 s."""
        return await reviews(request).resolve(caller, review_id, body, path=ctx.path)

    @app.get("/api/memory/approvals", response_model=ApprovalPage, responses=_errors(401, 403, 422, 503))
    async def list_write_approvals(request: Request, caller: Caller,
                                   status: Literal["pending", "approved", "rejected", "quarantined",
                                                   "withdrawn"] = "pending",
                                   limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50):
        """Writes that waited for approval (a FACT from an UNTRUSTED source, any LEARNED), oldest
        first: the pending ones, the queue, by default."""
        return await write_approvals(request).list(caller, status=status, limit=limit)

    @app.get("/api/memory/approvals/{approval_id:uuid}", response_model=Approval,
             responses=_errors(401, 403, 404, 422, 503))
    async def get_write_approval(approval_id: UUID, request: Request, caller: Caller):
        return await write_approvals(request).get(caller, approval_id)

    @app.post("/api/memory/approvals/{approval_id:uuid}/decide", response_model=Approval,
              responses=_errors(401, 403, 404, 409, 413, 422, 423, 503))
    async def decide_write_approval(approval_id: UUID, body: DecideRequest, request: Request, caller: Caller,
                                    ctx: Context):
        """approve (into recall; its facts are then extracted), reject (forgotten, soft) or
        quarantine (held aside): an operator's decision, never the writer's own. Answers once the
        approval's workflow has applied it, or as it stands after 10 s."""
        return await write_approvals(request).decide(caller, approval_id, body, path=ctx.path)

    @app.post("/api/receipts/verify", response_model=ReceiptCheck, responses=_errors(401, 413, 422, 503))
    async def verify_receipt(body: dict[str, Any], request: Request, caller: Caller):
        """Check an erasure receipt: its signature, and each DELETE it names against history."""
        problems = await forgets(request).check_receipt(caller, body)
        return ReceiptCheck(ok=not problems, problems=problems)

    @app.get("/api/control", response_model=ControlStatus, responses=_errors(401, 503))
    async def control_status(request: Request, caller: Caller):
        """The operational switches: the mutation freeze (global and per scope) and the kill switch.
        A key without `maintenance` sees only the scope freezes that can hold its own memories."""
        return await request.app.state.runtime.control.status_for(caller)

    @app.post("/api/control", response_model=ControlStatus, responses=_errors(401, 403, 413, 422, 503))
    async def control_change(body: SwitchChange, request: Request, caller: Caller):
        """Operators: flip a switch (the ControlWorkflow's validated `change` update), with a reason."""
        return await request.app.state.runtime.control.change(caller, body)

    @app.get("/api/admin/verify", response_model=VerifyReport, responses=_errors(401, 403, 503))
    async def verify(request: Request, caller: Caller):
        """Operators: check every memory's and every scope's hash chain."""
        return await changes(request).verify(caller)

    @app.post("/api/keys", status_code=201, response_model=CreatedKey, responses=_errors(401, 403, 409, 413, 422, 503))
    async def create_key(body: KeyRequest, request: Request, caller: Caller):
        secret, record = await service(request).create_key(caller, name=body.name, role=body.role,
                                                           scopes=body.scopes)
        return CreatedKey(key=secret, **record.model_dump())

    @app.get("/api/keys", response_model=KeyList, responses=_errors(401, 403, 503))
    async def list_keys(request: Request, caller: Caller):
        return KeyList(items=await service(request).list_keys(caller))

    @app.delete("/api/keys/{key_id}", response_model=ApiKey, responses=_errors(401, 403, 404, 409, 422, 503))
    async def revoke_key(key_id: UUID, request: Request, caller: Caller):
        return await service(request).revoke_key(caller, key_id)

    app.include_router(mem0_router)  # mem0's platform API, for its clients (api/mem0.py)
    return app
