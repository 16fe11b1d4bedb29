"""The request body cap, counted on the bytes actually read.

A `Content-Length` over the cap is refused before reading; a body without one (chunked
transfer encoding) is counted as it arrives and refused the moment it passes the cap. Either
way the answer is a 413 in the API's error shape and the application never sees the body.
Starlette's own RequestBodyLimitMiddleware (behind FastAPI's `max_body_size`) counts the same
way but answers a declared oversize body in plain text, so it is not used.
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send


def error_body(status: int, type_: str, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The API's error answer: `{"error": {"type", "detail"}}`."""
    return JSONResponse(status_code=status, content={"error": {"type": type_, "detail": detail}}, headers=headers)


class BodyLimit:
    """ASGI middleware: bodies over `limit` bytes get 413; others reach the app whole."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = error_body(413, "payload_too_large", f"request body over {self.limit} bytes")
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await too_large(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: let the app see it
                await self.app(scope, _replay([message], receive), send)
                return
            size += len(message.get("body", b""))
            if size > self.limit:
                await too_large(scope, receive, send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([whole], receive), send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that hands out `messages` first, then defers to the server's."""
    pending = list(messages)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay
