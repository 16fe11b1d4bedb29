"""The request body cap, counted on the bytes actually read.

A `Content-Length` over the cap is refused before reading; a body without one (chunked
transfer encoding) is counted as it arrives and refused the moment it passes the cap. Either
way the answer is a 413 in the API's error shape and the application never sees the body.
Starlette's own RequestBodyLimitMiddleware (behind FastAPI's `max_body_size`) counts the same
way but answers a declared oversize body in plain text, so it is not used.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_body


class BodyLimit:
    """ASGI middleware: bodies over `limit` bytes get 413; others reach the app whole."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await self._too_large(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: let the app see it
                await self.app(scope, _replay([message], receive), send)
                return
            size += len(message.get("body", b""))
            if size > self.limit:
                await self._too_large(scope, receive, send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([whole], receive), send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        await error_body(413, "payload_too_large", f"request body over {self.limit} bytes")(scope, receive, send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that hands out `messages` first, then defers to the server's."""
    pending = list(messages)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay
