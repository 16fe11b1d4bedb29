"""A mem0-compatible REST surface: the paths, bodies and answers of mem0's hosted platform as the
official `mem0ai` client (2.2.1, `MemoryClient` and `AsyncMemoryClient`) sends and reads them,
so a user moves to Engram by changing the client's `host`. Translation only: every route calls
the same service and changes layer as Engram's own API. The wire, as measured from the client:
/work/shared/compat/MEM0_CLIENT_WIRE.md; tests/test_mem0_compat.py drives the real client.

How mem0's concepts map onto Engram's:

* Keys are Engram API keys, sent as `Authorization: Token <key>` (mem0's), `Bearer <key>` or
  `X-API-Key`. `GET /v1/ping/` checks the key and names a fixed org and project, which the
  client requires and Engram does not have.
* `user_id`, `agent_id`, `run_id` are the scope's parts, at the top level or in `filters`
  (also inside `filters.AND`). `app_id` is refused (422): Engram has no app part, and reading it
  as `agent_id` would mix two namespaces.
* `add` remembers each message as its own memory (mem0's own `infer=False` does the same),
  system messages left out; the role goes into `metadata.role` (unless the caller's metadata
  sets it), a message's `name` into `who`. `infer=false` is a raw remember; the default lets
  Engram's extraction run. Duplicates answer `event: NOOP` with the memory that holds the text.
  An `Idempotency-Key` header becomes `<key>:<index>` per message.
* mem0's `categories` are Engram's tags. Memories do not expire: `expiration_date` is refused
  unless null.
* An update or delete without a `reason` records "via the mem0-compatible API"; every change
  made here has `path: mem0` in its history.
* `delete_all` is a batch forget of the scope: it previews one (engram.forget) and answers 409
  `confirmation_required` with the operation, its candidates and its confirm token; nothing is
  deleted until the token comes back to Engram's own execute endpoint (and, above the approval
  threshold, an operator approves). So is a batch delete of more than APPROVAL_THRESHOLD
  memories (of one scope): previewed by their ids, answered alike. Deleting an entity
  (`delete_users`, `reset`) and `delete_linked` are refused (501 `batch_forget_unsupported`,
  nothing deleted): use delete_all. A batch delete within the threshold deletes each memory by
  id. So does a batch update (at most 100), each with the
  reason; every id is checked first, so a missing one changes nothing.
* A search's `score` is relevance before any rerank, and `threshold` leaves out what scores
  below it before the rerank and the limit (mem0 filters by threshold before its reranker); each
  reranked result adds the cross-encoder's `rerank_score`, as mem0's rerankers do, and the rerank
  orders the results.
* A deleted memory answers 404, as on mem0; its history stays readable. A memory in a scope
  the key may not touch answers exactly as a missing one.
* Errors keep Engram's `{"error": {"type", "detail"}}` and add a top-level `detail`, from which
  the client builds its exception's message; the status picks its class (401/403
  AuthenticationError, 404 MemoryNotFoundError, 409/422 ValidationError, 429 RateLimitError).

The surface is not in /openapi.json: its contract is mem0's client, not Engram's schema.
"""

from __future__ import annotations

import math
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.mem0_wire import (
    AddBody, BatchDeleteBody, BatchUpdateBody, GetAllBody, SearchBody, UpdateBody, history_entries, scope_of_repr,
    select, shown,
)
from engram.domain.auth import Principal
from engram.domain.changes import ChangeContext, MemoryPatch, Reason
from engram.domain.errors import (
    DatabaseUnavailable, EngramError, NotFound, RateLimited, Unauthenticated, ValidationFailed, VersionConflict,
)
from engram.domain.forget import MAX_FORGET_IDS, ForgetPreview, ForgetRequest
from engram.domain.models import MAX_LIMIT, Memory, RememberRequest, Scope, SearchRequest

REASON = "via the mem0-compatible API"
ORG_ID, PROJECT_ID = "engram", "default"  # the ping must name both; Engram has neither
MAX_PAGE_SIZE = 1_000
_NO_BATCH_FORGET = ("Forgetting many memories at once goes through a previewed, confirmed batch forget "
                    "(delete_all, or POST /api/memory/forget); nothing was deleted. Delete memories by id "
                    "(DELETE /v1/memories/{id}/) or in batches (DELETE /v1/batch/).")


# -- errors -------------------------------------------------------------------------------------

class Refused(EngramError):
    """What this surface declines to do, with its own status and type (and more fields in the
    error, `extra`)."""

    def __init__(self, status: int, type_: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.http_status = status
        self.type = type_
        self.extra = extra


def _batch_forget_refused(what: str) -> Refused:
    return Refused(501, "batch_forget_unsupported", f"{what} is a batch forget. " + _NO_BATCH_FORGET)


def _confirmation_required(what: str, preview: ForgetPreview) -> Refused:
    """A batch forget previewed for `what`: nothing deleted until its token is confirmed."""
    return Refused(409, "confirmation_required", (
        f"{what} is a batch forget: {len(preview.candidates)} memories are previewed as operation "
        f"{preview.operation_id} and nothing was deleted. Confirm it with POST /api/memory/forget/"
        f"{preview.operation_id}/execute and its confirm_token before {preview.expires_at.isoformat()}"
        + ("; an operator other than you must then approve it" if preview.needs_approval else "")),
        preview=preview.model_dump(mode="json"))


def error_response(status: int, type_: str, detail: str, headers: dict[str, str] | None = None,
                   **extra: Any) -> JSONResponse:
    """Engram's error shape plus a top-level `detail`: the mem0 client's exception message."""
    return JSONResponse(status_code=status, headers=headers,
                        content={"error": {"type": type_, "detail": detail, **extra}, "detail": detail})


def _describe(errors: list[dict]) -> str:
    parts = []
    for err in errors:
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path"))
        message = err.get("msg", "invalid").removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            message = "not supported by Engram's mem0-compatible API"
        elif err.get("type") == "json_invalid":
            where, message = "body", "not valid JSON"
        parts.append(f"{where or 'body'}: {message}")
    return "; ".join(parts)


def _domain_error(exc: EngramError) -> JSONResponse:
    headers = {"Retry-After": "1"} if isinstance(exc, DatabaseUnavailable) else None
    if isinstance(exc, RateLimited):
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
    extra = {"current_version": exc.current_version} if isinstance(exc, VersionConflict) else {}
    extra |= getattr(exc, "extra", {})
    return error_response(exc.http_status, exc.type, exc.detail, headers=headers, **extra)


class Mem0Route(APIRoute):
    """Answers this surface's errors in its shape, leaving the rest of the API's handlers alone."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def answer(request: Request):
            try:
                return await handler(request)
            except EngramError as exc:
                return _domain_error(exc)
            except (RequestValidationError, ValidationError) as exc:
                return error_response(422, "validation_error", _describe(exc.errors()))
            except StarletteHTTPException as exc:
                if exc.status_code == 400:  # a body FastAPI could not read
                    return error_response(422, "validation_error", "body: the body is not valid UTF-8 JSON")
                return error_response(exc.status_code, "http_error", str(exc.detail), headers=exc.headers)

        return answer


# -- the caller ---------------------------------------------------------------------------------

async def _principal(request: Request) -> Principal:
    header = request.headers.get("authorization")
    key = request.headers.get("x-api-key")
    if header is not None:
        scheme, _, credentials = header.strip().partition(" ")
        if scheme.lower() not in ("token", "bearer") or not credentials.strip():
            raise Unauthenticated("send the API key as 'Authorization: Token <key>' (or 'Bearer <key>')")
        key = credentials.strip()
    if not key:
        raise Unauthenticated("missing API key: send 'Authorization: Token <key>'")
    return await request.app.state.runtime.service.authenticate(key)


async def _context(request: Request) -> ChangeContext:  # async: no thread hand-off
    key = request.headers.get("idempotency-key")
    if key is not None and not 1 <= len(key) <= 190:
        raise ValidationFailed("Idempotency-Key: 1 to 190 characters")
    return ChangeContext(path="mem0", request_id=request.state.request_id, idempotency_key=key)


Caller = Annotated[Principal, Depends(_principal)]
Context = Annotated[ChangeContext, Depends(_context)]


def _service(request: Request):
    return request.app.state.runtime.service


def _forgets(request: Request):
    return request.app.state.runtime.forgets


def _changes(request: Request):
    return request.app.state.runtime.changes


def _nth(idempotency_key: str | None, index: int) -> str | None:
    """The idempotency key of a request's `index`th write."""
    return f"{idempotency_key}:{index}" if idempotency_key else None


def _id(memory_id: str) -> UUID:
    try:
        return UUID(memory_id)
    except ValueError:
        raise NotFound(f"no memory {memory_id}") from None


async def _live(request: Request, caller: Principal, memory_id: UUID) -> Memory:
    """The memory, unless it is missing, out of the key's reach or deleted: NotFound, alike."""
    memory = await _service(request).get(caller, memory_id)
    if memory.is_deleted:
        raise NotFound(f"no memory {memory_id}")
    return memory


async def _all_live(request: Request, caller: Principal, ids: list[UUID]) -> list[Memory]:
    found, missing = [], []
    for memory_id in ids:
        try:
            found.append(await _live(request, caller, memory_id))
        except NotFound:
            missing.append(str(memory_id))
    if missing:
        raise NotFound(f"no memory {', '.join(missing)}; nothing was changed")
    return found


# -- routes -------------------------------------------------------------------------------------

router = APIRouter(route_class=Mem0Route, include_in_schema=False)


@router.get("/v1/ping/")
async def ping(caller: Caller):
    return {"status": "ok", "org_id": ORG_ID, "project_id": PROJECT_ID, "user_email": None, "key_name": caller.name}


@router.post("/v3/memories/add/")
async def add(body: AddBody, request: Request, caller: Caller, ctx: Context):
    scope = select(body).scope()
    messages = [m for m in body.messages if m.role != "system"]
    if not messages:
        raise ValidationFailed("messages: only system messages, so nothing to remember")
    mode = "auto" if body.async_mode is None else "async" if body.async_mode else "sync"
    results: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        req = RememberRequest(
            content=message.content, scope=scope, who=message.name, metadata={"role": message.role,
                                                                                **(body.metadata or {})},
            raw=not body.infer, mode=mode, idempotency_key=_nth(ctx.idempotency_key, index),
            expires_at=body.expires_at())
        try:
            answer = await _service(request).remember(caller, req, request_id=ctx.request_id, path="mem0")
        except EngramError as exc:
            exc.detail += f" (messages stored before it: {', '.join(r['id'] for r in results) or 'none'})"
            raise
        duplicate = any(w.startswith("duplicate") for w in answer.warnings)
        results.append({"id": str(answer.memory_id), "memory": message.content, "event": "NOOP" if duplicate else "ADD",
                        "status": answer.status, "job_id": str(answer.job_id) if answer.job_id else None,
                        "warnings": answer.warnings})
    pending = any(r["status"] in ("queued", "pending_approval") for r in results)
    return {"results": results, "status": "PENDING" if pending else "SUCCEEDED",
            "message": "Memories are stored and still being processed" if pending else "Memories are stored"}


@router.post("/v3/memories/search/")
async def search(body: SearchBody, request: Request, caller: Caller):
    selection = select(body)
    req = SearchRequest(query=body.query, scope=selection.scope(), filters=selection.filters(),
                        limit=next((n for n in (body.top_k, body.limit) if n is not None), 10), rerank=body.rerank,
                        include_expired=bool(body.show_expired))
    # The threshold applies before the rerank and the limit (as mem0's does), so a rerank
    # never pulls below-threshold memories into the top `limit` only for them to be dropped.
    found = await _service(request).search(caller, req, min_score=body.threshold)
    # One scale for every result's `score`, reranked or not (see the module's docstring).
    weight = request.app.state.runtime.settings.rank_access_weight
    results = [shown(h.memory, h.components.before_rerank(weight))
               | ({} if h.components.rerank is None else {"rerank_score": h.components.rerank})
               for h in found.results]
    if body.fields:
        results = [{name: r[name] for name in body.fields if name in r} for r in results]
    return {"results": results}


@router.post("/v3/memories/")
async def get_all(body: GetAllBody, request: Request, caller: Caller,
                  page: Annotated[int, Query(ge=1)] = 1,
                  page_size: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 100):
    """One page of the selected memories, newest first. Engram lists by cursor, so a page is
    reached by walking the ones before it; `count` is exact on the last page and null before it
    (the service has no count)."""
    selection = select(body)
    scope, filters = selection.scope(), selection.filters()
    skip, window, seen, more, cursor = (page - 1) * page_size, [], 0, False, None
    while not more:
        batch = await _service(request).list(caller, scope, filters, include_deleted=False, cursor=cursor,
                                             limit=MAX_LIMIT, include_expired=bool(body.show_expired))
        for memory in batch.items:
            if seen >= skip + page_size:
                more = True
                break
            if seen >= skip:
                window.append(memory)
            seen += 1
        if batch.next_cursor is None:
            break
        cursor = batch.next_cursor
    url = request.url.include_query_params(page_size=page_size)
    return {"count": None if more else seen,
            "next": str(url.include_query_params(page=page + 1)) if more else None,
            "previous": str(url.include_query_params(page=page - 1)) if page > 1 else None,
            "results": [shown(m) for m in window]}


@router.get("/v1/memories/{memory_id}/")
async def get_memory(memory_id: str, request: Request, caller: Caller):
    return shown(await _live(request, caller, _id(memory_id)))


@router.put("/v1/memories/{memory_id}/")
async def update_memory(memory_id: str, body: UpdateBody, request: Request, caller: Caller, ctx: Context):
    memory = await _live(request, caller, _id(memory_id))
    if body.text is None and body.metadata is None:  # only `expiration_date: null`, which already holds
        return {**shown(memory), "message": "Memory updated successfully!"}
    patch = MemoryPatch(content=body.text, metadata=body.metadata, reason=body.reason or REASON)
    changed = await _changes(request).modify(caller, memory.id, patch, ctx)
    return {**shown(changed), "message": "Memory updated successfully!"}


@router.delete("/v1/memories/{memory_id}/")
async def delete_memory(memory_id: str, request: Request, caller: Caller, ctx: Context,
                 delete_linked: bool = False, reason: Annotated[Reason | None, Query()] = None):
    if delete_linked:
        raise _batch_forget_refused("delete_linked (a memory with the memories it superseded)")
    memory = await _live(request, caller, _id(memory_id))
    await _changes(request).forget(caller, memory.id, reason=reason or REASON, ctx=ctx)
    return {"message": "Memory deleted successfully!"}


@router.delete("/v1/memories/")
async def delete_all(request: Request, caller: Caller, user_id: str | None = None, agent_id: str | None = None,
                     run_id: str | None = None, filters: str | None = None):
    """A batch forget of the whole scope: previewed (nothing deleted) and answered 409
    `confirmation_required` with the operation and its token, which Engram's own
    POST /api/memory/forget/{id}/execute takes. Never a silent wipe."""
    parts = {k: v for k, v in (("user_id", user_id), ("agent_id", agent_id), ("run_id", run_id)) if v}
    if filters:
        parts |= scope_of_repr(filters)
    preview = await _forgets(request).preview(caller, ForgetRequest(
        scope=Scope(**parts), everything=True, limit=MAX_FORGET_IDS, reason=REASON))
    raise _confirmation_required("delete_all", preview)


@router.get("/v1/memories/{memory_id}/history/")
async def memory_history(memory_id: str, request: Request, caller: Caller):
    return history_entries(await _changes(request).history(caller, _id(memory_id)))


# A failed batch item's status, by its error's type; the conflicts (pinned, version, lock) are 409.
_STATUS = {"not_found": 404, "validation_error": 422, "forbidden": 403, "rate_limited": 429,
           "embedding_unavailable": 503, "database_unavailable": 503}


@router.put("/v1/batch/")
async def batch_update(body: BatchUpdateBody, request: Request, caller: Caller, ctx: Context):
    await _all_live(request, caller, [item.memory_id for item in body.memories])
    items = [{"id": str(item.memory_id), "reason": item.reason or REASON,
              **({"content": item.text} if item.text is not None else {}),
              **({"metadata": item.metadata} if item.metadata is not None else {})} for item in body.memories]
    answer = await _changes(request).modify_batch(caller, items, ctx)
    results = [{"memory_id": str(r.id) if r.id else None, "ok": r.ok, "version": r.version,
                "error": r.error.model_dump() if r.error else None} for r in answer.results]
    if answer.failed:
        failures = [f"{r['memory_id']}: {r['error']['detail']}" for r in results if not r["ok"]]
        statuses = {_STATUS.get(r["error"]["type"], 409) for r in results if not r["ok"]}
        detail = f"{answer.applied} of {len(items)} updates applied; not applied: {'; '.join(failures)}"
        return error_response(statuses.pop() if len(statuses) == 1 else 409, "batch_partly_applied", detail,
                              results=results)
    return {"message": f"Successfully updated {answer.applied} memories", "results": results}


@router.delete("/v1/batch/")
async def batch_delete(body: BatchDeleteBody, request: Request, caller: Caller, ctx: Context):
    memories = await _all_live(request, caller, [item.memory_id for item in body.memories])
    if pinned := [str(m.id) for m in memories if m.pinned]:
        raise Refused(409, "pinned", f"pinned, so not deleted here: {', '.join(pinned)}; nothing was deleted")
    if len(memories) > request.app.state.runtime.settings.approval_threshold:
        scopes = {(m.user_id, m.agent_id, m.run_id): m.scope for m in memories}
        if len(scopes) > 1:
            raise Refused(409, "several_scopes", f"these {len(memories)} memories are in {len(scopes)} scopes: a "
                          "batch delete this large is a batch forget of one scope; nothing was deleted")
        preview = await _forgets(request).preview(caller, ForgetRequest(
            scope=next(iter(scopes.values())), ids=[m.id for m in memories], limit=len(memories),
            reason=body.reason or REASON))
        raise _confirmation_required(f"Deleting {len(memories)} memories at once", preview)
    deleted: list[str] = []
    for index, memory in enumerate(memories):
        one = ChangeContext(path=ctx.path, request_id=ctx.request_id, idempotency_key=_nth(ctx.idempotency_key, index))
        try:
            await _changes(request).forget(caller, memory.id, reason=body.reason or REASON, ctx=one)
        except EngramError as exc:
            exc.detail += f" (deleted before it: {', '.join(deleted) or 'none'})"
            raise
        deleted.append(str(memory.id))
    return {"message": f"Successfully deleted {len(deleted)} memories", "deleted": deleted}


@router.get("/v1/entities/")
async def users(caller: Caller):
    raise Refused(501, "not_offered", "listing entities is not offered by Engram: its service has no list of "
                                      "scopes. List a scope's memories with POST /v3/memories/.")


@router.delete("/v2/entities/{kind}/{name}/")
async def delete_entity(kind: str, name: str, caller: Caller):
    raise _batch_forget_refused(f"Deleting the {kind} {name!r} with its memories")


# Last: the rest of mem0's API (feedback, exports, profiles, ...) says so, not a bare 404.
@router.api_route("/v1/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
@router.api_route("/v2/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
@router.api_route("/v3/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
async def not_offered(request: Request, caller: Caller):
    raise Refused(501, "not_offered", f"{request.method} {request.url.path} is not offered by Engram's "
                                      "mem0-compatible API")
