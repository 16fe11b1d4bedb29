"""HTTP/JSON gateway: translation only. Every route resolves the caller, calls the service and
maps domain errors to `{"error": {"type", "detail"}}` with the right status."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Annotated
from uuid import UUID

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from engram.auth import Principal
from engram.errors import EngramError
from engram.models import (
    Job, Memory, MemoryPage, RememberRequest, RememberResponse, Scope, SearchFilters, SearchRequest,
    SearchResponse,
)

log = logging.getLogger("engram.http")
MAX_BODY_BYTES = 1 << 20


def _error(status: int, type_: str, detail) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"type": type_, "detail": detail}})


def _describe_validation(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{where or 'body'}: {err.get('msg')}")
    return "; ".join(parts)


class KeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=100)
    role: str
    scopes: list[str] = Field(min_length=1)


def service(request: Request):
    return request.app.state.runtime.service


async def _principal(
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
    x_api_key: Annotated[str | None, Header()] = None,
) -> Principal:
    key = x_api_key
    if authorization and authorization.lower().startswith("bearer "):
        key = authorization[7:].strip()
    return await service(request).authenticate(key)


Caller = Annotated[Principal, Depends(_principal)]


def create_app(runtime_factory) -> FastAPI:
    """The app. `runtime_factory` is an async context manager yielding a `Runtime`; the app
    opens it at start-up and closes it at shut-down."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async with runtime_factory() as runtime:
            app.state.runtime = runtime
            yield

    app = FastAPI(title="Engram", version="0.1.0", lifespan=lifespan)

    @app.exception_handler(EngramError)
    async def _domain(_: Request, exc: EngramError):
        return _error(exc.http_status, exc.type, exc.detail)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError):
        return _error(422, "validation_error", _describe_validation(exc))

    @app.exception_handler(ValidationError)
    async def _invalid_model(_: Request, exc: ValidationError):
        return _error(422, "validation_error", "; ".join(e["msg"] for e in exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        kind = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, kind, exc.detail)

    @app.middleware("http")
    async def _request_context(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
            return _error(413, "payload_too_large", f"request body over {MAX_BODY_BYTES} bytes")
        request.state.request_id = request.headers.get("x-request-id") or str(uuid.uuid4())
        started = time.perf_counter()
        response = await call_next(request)
        response.headers["x-request-id"] = request.state.request_id
        log.info("request", extra={"request_id": request.state.request_id, "path": request.url.path,
                                   "status": response.status_code,
                                   "latency_ms": round((time.perf_counter() - started) * 1e3, 2)})
        return response


    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request):
        state = await request.app.state.runtime.readiness()
        ready = all(part.get("ok") for part in state.values())
        return JSONResponse(status_code=200 if ready else 503, content={"ready": ready, "components": state})

    @app.post("/api/memory/remember", response_model=RememberResponse)
    async def remember(body: RememberRequest, request: Request, caller: Caller):
        return await service(request).remember(caller, body, request_id=request.state.request_id)

    @app.post("/api/memory/search", response_model=SearchResponse)
    async def search(body: SearchRequest, request: Request, caller: Caller):
        return await service(request).search(caller, body)

    @app.get("/api/memory/jobs/{job_id}", response_model=Job)
    async def job(job_id: UUID, request: Request, caller: Caller):
        return await service(request).job(caller, job_id)

    @app.get("/api/memory/{memory_id}", response_model=Memory)
    async def get_memory(memory_id: UUID, request: Request, caller: Caller):
        return await service(request).get(caller, memory_id)

    @app.get("/api/memory", response_model=MemoryPage)
    async def list_memories(
        request: Request, caller: Caller,
        user_id: str | None = None, agent_id: str | None = None, run_id: str | None = None,
        type: str | None = None, tags: Annotated[list[str] | None, Query()] = None, who: str | None = None,
        source_type: str | None = None, time: str | None = None, include_deleted: bool = False,
        cursor: str | None = None, limit: Annotated[int, Query(ge=1)] = 20,
    ):
        scope = Scope(user_id=user_id, agent_id=agent_id, run_id=run_id)
        filters = SearchFilters(type=type, tags=tags, who=who, source_type=source_type, time=time)
        return await service(request).list(caller, scope, filters, include_deleted=include_deleted,
                                           cursor=cursor, limit=limit)

    @app.post("/api/keys", status_code=201)
    async def create_key(body: KeyRequest, request: Request, caller: Caller):
        key = await service(request).create_key(caller, name=body.name, role=body.role, scopes=body.scopes)
        return {"key": key, "name": body.name, "role": body.role, "scopes": body.scopes}

    return app
