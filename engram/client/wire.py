"""How a `Call` goes over HTTP, for both clients: the connection settings, the request it
becomes, the answer it is read from, and when a failed attempt is sent again. No I/O here: the
clients send and sleep.

Retries, by the call's `Safety` (each call's in engram.client.operations):

- a 429 or a 503 is retried for every call: the server answered that it did nothing (rate
  limited, or a component it needs is down), and `Retry-After` is honoured;
- a connection that never opened (refused, connect timeout, no free connection in the pool)
  is retried for every call: the request was not sent;
- any other connection failure (reset, read timeout, a broken answer) is retried only for
  READ and REPLAYED calls: the request may have been applied, and only those answer a repeat
  without applying it again (a REPLAYED call's repeat carries the same `Idempotency-Key`).
  A ONCE call then raises ConnectionFailed with `maybe_applied`.

At most `max_retries` retries, with exponential backoff (0.5 s doubling to 8 s) and jitter.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from engram.client.errors import ApiError, ConnectionFailed, error_from, retry_after
from engram.client.operations import Call, Safety

T = TypeVar("T")
DEFAULT_URL = "http://127.0.0.1:8080"
RETRIED_STATUSES = frozenset({429, 503})
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_BACKOFF_FIRST_S, _BACKOFF_MAX_S = 0.5, 8.0


def default_url() -> str:
    """ENGRAM_URL, else the local API."""
    return os.environ.get("ENGRAM_URL") or DEFAULT_URL


def default_api_key() -> str | None:
    """ENGRAM_API_KEY, else the key `engram up` wrote to `$ENGRAM_DATA_DIR/api-key` (default
    ./data), else None."""
    key = os.environ.get("ENGRAM_API_KEY")
    if key:
        return key
    path = Path(os.environ.get("ENGRAM_DATA_DIR", "./data")) / "api-key"
    return path.read_text().strip() if path.exists() else None


@dataclass(frozen=True)
class Connection:
    """What every request of one client carries."""

    url: str
    api_key: str | None
    client: str | None  # X-Engram-Client: history's `path` (cli, mcp, agent)
    timeout: float
    max_retries: int
    headers: Mapping[str, str]

    def client_options(self) -> dict[str, Any]:
        """httpx.Client / httpx.AsyncClient arguments. The clients' own retries stay off: a
        retry is decided per call, here."""
        headers = {"User-Agent": "engram-client", **self.headers}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        if self.client:
            headers["X-Engram-Client"] = self.client
        return {"base_url": self.url, "headers": headers, "timeout": self.timeout}


def connection(url: str | None, api_key: str | None, client: str | None, timeout: float, max_retries: int,
               headers: Mapping[str, str] | None) -> Connection:
    return Connection(url or default_url(), api_key if api_key is not None else default_api_key(), client,
                      timeout, max_retries, dict(headers or {}))


def request(http: httpx.Client | httpx.AsyncClient, call: Call[Any]) -> httpx.Request:
    """The request for `call`, built once and sent as is on every attempt: a mutation's
    `Idempotency-Key` (the call's, or a new one) is the same on each retry."""
    headers = {}
    if call.mutation:
        headers["Idempotency-Key"] = call.idempotency_key or str(uuid.uuid4())
    return http.build_request(call.method, call.path, params=call.params or None, json=call.json,
                              headers=headers)


def read(call: Call[T], response: httpx.Response) -> T:
    """The call's result. Raises the ApiError subclass for an error status."""
    if response.status_code >= 400 and response.status_code not in call.answers_with:
        raise error_from(response)
    try:
        body = response.json()
    except ValueError:
        raise ApiError(response.status_code, "invalid_answer", f"the API's answer is not JSON: {response.text[:200]}",
                       request_id=response.headers.get("x-request-id")) from None
    return call.answer(body)


class Attempts:
    """The retry decisions of one call (module docstring): each says how long to wait before
    the next attempt, or None to stop."""

    def __init__(self, call: Call[Any], max_retries: int) -> None:
        self.call = call
        self.max_retries = max_retries
        self.retries = 0

    def after_answer(self, response: httpx.Response) -> float | None:
        """None: `response` is the call's answer (success or error)."""
        if response.status_code not in RETRIED_STATUSES or response.status_code in self.call.answers_with:
            return None
        return self._next(retry_after(response))

    def after_failure(self, err: httpx.TransportError) -> float:
        """The wait before the next attempt. Raises ConnectionFailed when there is none."""
        sent = not isinstance(err, _NOT_SENT)
        retryable = not sent or self.call.safety is not Safety.ONCE
        delay = self._next(None) if retryable else None
        if delay is None:
            raise ConnectionFailed(f"{type(err).__name__}: {err}" if str(err) else type(err).__name__,
                                   maybe_applied=sent and self.call.mutation) from err
        return delay

    def _next(self, at_least: float | None) -> float | None:
        if self.retries >= self.max_retries:
            return None
        backoff = min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2 ** self.retries)
        self.retries += 1
        return max(at_least or 0.0, random.uniform(backoff / 2, backoff))
