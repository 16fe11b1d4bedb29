"""The Python SDK of Engram's HTTP API: `Engram` (sync) and `AsyncEngram` (asyncio), which
return the server's own models (engram.domain) and raise engram.client.errors.

    from engram.client import Engram

    with Engram(client="agent") as engram:
        stored = engram.remember("Ana prefers tea", scope={"user_id": "ana"})
        hits = engram.search("what does Ana drink?", scope={"user_id": "ana"})
"""

from engram.client.aio import AsyncEngram
from engram.client.errors import (
    ApiError, ClientError, Conflict, ConnectionFailed, Frozen, Gone, NotFound, PayloadTooLarge, PermissionDenied,
    RateLimited, ServerError, Unauthenticated, Unavailable, ValidationFailed, VersionConflict,
)
from engram.client.operations import IMPORT_SETTLED, JOB_FINISHED, OPERATION_FINISHED, Call, Safety
from engram.client.sync import Engram

__all__ = [
    "ApiError", "AsyncEngram", "Call", "ClientError", "Conflict", "ConnectionFailed", "Engram", "Frozen", "Gone",
    "IMPORT_SETTLED", "JOB_FINISHED", "NotFound", "OPERATION_FINISHED", "PayloadTooLarge", "PermissionDenied",
    "RateLimited", "Safety", "ServerError", "Unauthenticated", "Unavailable", "ValidationFailed", "VersionConflict",
]
