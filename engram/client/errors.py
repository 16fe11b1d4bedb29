"""What the SDK raises. Every error answer of the API becomes an `ApiError` of the class its
status names, carrying the body's `type` and `detail` unchanged (the server is the one judge
of a request: the SDK checks nothing itself); `ConnectionFailed` is the API not reached."""

from __future__ import annotations

import httpx


class ClientError(Exception):
    """Base of every error the SDK raises."""


class ConnectionFailed(ClientError):
    """The API could not be reached (refused, reset, timed out), after the retries the call was
    allowed. `maybe_applied`: the request may have reached the server before the failure, so a
    change it asked for may have been made."""

    def __init__(self, message: str, *, maybe_applied: bool) -> None:
        super().__init__(message)
        self.maybe_applied = maybe_applied


class ApiError(ClientError):
    """An error answer: `status` (HTTP), `type` and `detail` (the body's `{"error": {...}}`),
    `request_id` (the server's log and history key for the request), `current_version` (a
    version conflict's: the memory's version now) and `retry_after` (seconds, from the
    `Retry-After` header of a 429 or 503)."""

    def __init__(self, status: int, type: str, detail: str, *, request_id: str | None = None,
                 current_version: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {type}: {detail}")
        self.status = status
        self.type = type
        self.detail = detail
        self.request_id = request_id
        self.current_version = current_version
        self.retry_after = retry_after


class Unauthenticated(ApiError):
    """401: no key, or an unknown or revoked one."""


class PermissionDenied(ApiError):
    """403: the key's role or scope grants do not allow this."""


class NotFound(ApiError):
    """404: no such resource, or one in a scope the key may not see."""


class Conflict(ApiError):
    """409: conflicts with what is stored (`type` says how: pinned, manual_override, ...)."""


class VersionConflict(Conflict):
    """409 `version_conflict`: the memory is not at `if_version`; `current_version` is where it is."""


class Gone(ApiError):
    """410: it existed and can no longer be had (past the recovery window, an expired token)."""


class PayloadTooLarge(ApiError):
    """413: the request body is over the server's limit."""


class ValidationFailed(ApiError):
    """422: the server refused the request as invalid; `detail` names each field."""


class Frozen(ApiError):
    """423: mutations are frozen (everywhere, or in this scope): nothing was changed."""


class RateLimited(ApiError):
    """429: too many changes from this key; `retry_after` says when to try again."""


class Unavailable(ApiError):
    """503: a component the request needs is down (the database, the embedding model)."""


class ServerError(ApiError):
    """Any other 5xx: the server failed; its log has `request_id`."""


_BY_STATUS: dict[int, type[ApiError]] = {
    401: Unauthenticated, 403: PermissionDenied, 404: NotFound, 409: Conflict, 410: Gone, 413: PayloadTooLarge,
    422: ValidationFailed, 423: Frozen, 429: RateLimited, 503: Unavailable,
}


def retry_after(response: httpx.Response) -> float | None:
    """The `Retry-After` header in seconds (the API sends whole seconds), or None."""
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP date, which the API never sends: a proxy's; treat as absent
        return None


def error_from(response: httpx.Response) -> ApiError:
    """The ApiError for an error answer. A body that is not the API's error shape (a proxy's
    page) keeps the status, with type `http_error` and the body's start as detail."""
    try:
        error = response.json()["error"]
        type_, detail, current = str(error["type"]), str(error["detail"]), error.get("current_version")
    except (ValueError, KeyError, TypeError):
        type_, detail, current = "http_error", response.text[:500] or response.reason_phrase, None
    cls = _BY_STATUS.get(response.status_code) or (ServerError if response.status_code >= 500 else ApiError)
    if cls is Conflict and type_ == "version_conflict":
        cls = VersionConflict
    return cls(response.status_code, type_, detail, request_id=response.headers.get("x-request-id"),
               current_version=current, retry_after=retry_after(response))
