"""Each request's id and its one log line, as plain ASGI middleware.

The id is the caller's `X-Request-ID` or a new UUID. Handlers read it as
`request.state.request_id` (the service records it on history events), every response carries
it back in `x-request-id`, and one `request` log line per request gives its path, status and
latency, an unhandled error included (logged as a 500). Plain ASGI rather than
`@app.middleware("http")`: Starlette's BaseHTTPMiddleware runs every request through an extra
task and memory streams, which cost about a sixth of the API's CPU per remember.
"""

from __future__ import annotations

import logging
import time
import uuid

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("engram.http")


class RequestContext:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = Headers(scope=scope).get("x-request-id") or str(uuid.uuid4())
        scope.setdefault("state", {})["request_id"] = request_id
        started = time.perf_counter()
        status = 500  # unless a response starts

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message).append("x-request-id", request_id)
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            log.info("request", extra={"request_id": request_id, "path": scope["path"], "status": status,
                                       "latency_ms": round((time.perf_counter() - started) * 1e3, 2)})
