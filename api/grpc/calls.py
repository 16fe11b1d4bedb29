"""One gRPC call: its caller, its metadata, its one log line, and the gateway's one error
handler, which maps domain errors to canonical status codes with google.rpc rich details.

| HTTP | error type                     | gRPC code            | why                                   |
|------|--------------------------------|----------------------|---------------------------------------|
| 401  | unauthenticated                | UNAUTHENTICATED      |                                       |
| 403  | forbidden                      | PERMISSION_DENIED    |                                       |
| 404  | not_found (foreign scopes too) | NOT_FOUND            |                                       |
| 409  | version_conflict               | FAILED_PRECONDITION  | if_version is a precondition; details carry current_version |
| 409  | any other conflict             | ABORTED              | google.rpc.Code's own mapping of 409; `reason` tells which |
| 410  | gone                           | NOT_FOUND            | the recoverable state is gone for good: no retry or fix helps |
| 413  | (message too large)            | RESOURCE_EXHAUSTED   | gRPC itself refuses a message over the server's limit |
| 422  | validation_error               | INVALID_ARGUMENT     |                                       |
| 423  | frozen                         | FAILED_PRECONDITION  | holds until an operator lifts the freeze |
| 429  | rate_limited                   | RESOURCE_EXHAUSTED   | RetryInfo: Retry-After's delay        |
| 503  | database_unavailable, ...      | UNAVAILABLE          | RetryInfo: 1 s, as HTTP's Retry-After |
| 500  | internal (anything unexpected) | INTERNAL             | logged with the request id            |

Every error's google.rpc.Status (`grpc-status-details-bin`) holds an ErrorInfo whose `reason` is
the HTTP error's `type` and whose metadata holds its `detail` (and `current_version` on a
version conflict), so a client reads what the HTTP error body says.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
import uuid

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from pydantic import ValidationError

from api.errors import describe_validation
from api.grpc.params import CallMetadata, checked
from engram.domain.auth import Principal
from engram.domain.changes import ChangeContext, ModelAttribution
from engram.domain.errors import DatabaseUnavailable, EngramError, RateLimited, ValidationFailed, VersionConflict

log = logging.getLogger("engram.grpc")
PATH = "grpc"  # history's `path` of every change made through this gateway
DOMAIN = "engram"  # ErrorInfo.domain
_CODES = {401: grpc.StatusCode.UNAUTHENTICATED, 403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
          409: grpc.StatusCode.ABORTED, 410: grpc.StatusCode.NOT_FOUND, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
          422: grpc.StatusCode.INVALID_ARGUMENT, 423: grpc.StatusCode.FAILED_PRECONDITION,
          429: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE}
UNEXPECTED = "an unexpected error; it is logged with this request's id"


def code_of(exc: EngramError) -> grpc.StatusCode:
    """The canonical code of a domain error (the module's table)."""
    if isinstance(exc, VersionConflict):
        return grpc.StatusCode.FAILED_PRECONDITION
    return _CODES.get(exc.http_status, grpc.StatusCode.INTERNAL)


def rich_status(exc: EngramError) -> status_pb2.Status:
    """The google.rpc.Status a domain error ends its call with (the module's docstring)."""
    code = code_of(exc)
    metadata = {"detail": exc.detail}
    if isinstance(exc, VersionConflict):
        metadata["current_version"] = str(exc.current_version)
    details = [error_details_pb2.ErrorInfo(reason=exc.type, domain=DOMAIN, metadata=metadata)]
    retry_s = None
    if isinstance(exc, RateLimited):
        retry_s = max(1, math.ceil(exc.retry_after_s))
    elif isinstance(exc, DatabaseUnavailable) or exc.http_status == 503:
        retry_s = 1
    if retry_s is not None:
        details.append(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=retry_s)))
    packed = []
    for detail in details:
        item = any_pb2.Any()
        item.Pack(detail)
        packed.append(item)
    return status_pb2.Status(code=getattr(code_pb2, code.name), message=exc.detail, details=packed)


class Call:
    """One call's request id, metadata and caller. `principal` is set once the key is known."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self.context = context
        self.metadata = {m.key: m.value for m in context.invocation_metadata() or () if isinstance(m.value, str)}
        self.request_id = self.metadata.get("x-request-id") or str(uuid.uuid4())
        self.principal: Principal | None = None
        self._change: ChangeContext | None = None

    @property
    def key(self) -> str | None:
        """The API key: `authorization: Bearer <key>`, else `x-api-key`, as HTTP reads them."""
        scheme, _, credentials = self.metadata.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and credentials.strip():
            return credentials.strip()
        return self.metadata.get("x-api-key")

    @property
    def change(self) -> ChangeContext:
        """How a change made by this call is recorded: path grpc, this request id, the
        `idempotency-key` and the model the caller names. Raises ValidationFailed for metadata
        that HTTP would refuse as a header."""
        if self._change is None:
            md = checked(CallMetadata, self.metadata, "metadata")
            self._change = ChangeContext(path=PATH, request_id=self.request_id, idempotency_key=md.idempotency_key,
                                         model=ModelAttribution(provider=md.provider, model=md.model,
                                                                prompt_version=md.prompt_version))
        return self._change

    async def fail(self, exc: Exception) -> None:
        """End the call with `exc`'s status (the module's table); unexpected errors are logged."""
        if isinstance(exc, ValidationError):  # a wire model refused a value deeper in: HTTP's 422 too
            exc = ValidationFailed(describe_validation(exc.errors()))
        if not isinstance(exc, EngramError):
            log.error("unhandled error", exc_info=exc, extra={"request_id": self.request_id})
            exc = EngramError(UNEXPECTED)
        status = rpc_status.to_status(rich_status(exc))
        await self.context.abort(status.code, status.details, trailing_metadata=(
            *status.trailing_metadata, ("x-request-id", self.request_id)))


def _log(call: Call, method: str, started: float) -> None:
    code = call.context.code() or grpc.StatusCode.OK
    log.info("request", extra={"request_id": call.request_id, "path": method, "status": getattr(code, "name", code),
                               "latency_ms": round((time.perf_counter() - started) * 1e3, 2)})


WATCH_POLL_S = 0.25  # how often a Watch stream reads what it watches


async def watch(read, ends: tuple[str, ...]):
    """Yield what `read()` answers, first and then each time it changes, until its `status` is
    one of `ends` (that last state included). Errors of `read` propagate to the stream."""
    last = None
    while True:
        state = await read()
        if state != last:
            yield state
            last = state
        if state.status in ends:
            return
        await asyncio.sleep(WATCH_POLL_S)


def unary(method):
    """A unary method `(self, request, call) -> reply` of a servicer that has `service` (the
    MemoryService): authenticated first, as HTTP does, its request id sent back as trailing
    metadata (with the status: no extra message), its errors mapped, one log line."""

    @functools.wraps(method)
    async def handler(self, request, context: grpc.aio.ServicerContext):
        call, started = Call(context), time.perf_counter()
        try:
            context.set_trailing_metadata((("x-request-id", call.request_id),))
            call.principal = await self.service.authenticate(call.key)
            return await method(self, request, call)
        except Exception as exc:  # noqa: BLE001 - every error ends the call with its status
            await call.fail(exc)
        finally:
            _log(call, method.__name__, started)

    return handler


def streaming(method):
    """`unary` for a server-streaming method (an async generator); its request id comes back as
    initial metadata, before the first message."""

    @functools.wraps(method)
    async def handler(self, request, context: grpc.aio.ServicerContext):
        call, started = Call(context), time.perf_counter()
        try:
            await context.send_initial_metadata((("x-request-id", call.request_id),))
            call.principal = await self.service.authenticate(call.key)
            async for item in method(self, request, call):
                yield item
        except Exception as exc:  # noqa: BLE001
            await call.fail(exc)
        finally:
            _log(call, method.__name__, started)

    return handler


class Servicer:
    """A servicer over the runtime's service layer."""

    def __init__(self, runtime) -> None:
        self.runtime = runtime

    @property
    def service(self):
        """The MemoryService (engram.service): every call authenticates through it."""
        return self.runtime.service
