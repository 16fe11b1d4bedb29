"""`Engram`, the synchronous client of the HTTP API. Each method sends one operation of
engram.client.operations (its docstring is the operation's) and returns the server's own model;
errors are engram.client.errors; retries as engram.client.wire says."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import httpx

from engram.client import operations as ops
from engram.client import wire
from engram.client.operations import Call, Id, ScopeArg, describes
from engram.domain.approvals import Approval, ApprovalPage
from engram.domain.changes import MemoryHistory, ModifyBatchResponse, VerifyReport
from engram.domain.control import ControlStatus
from engram.domain.forget import ForgetPreview, ForgetStatus, OperationList, ReceiptCheck, UndoResult
from engram.domain.health import Readiness
from engram.domain.models import (
    ApiKey, CreatedKey, Job, KeyList, Memory, MemoryPage, RememberBatchResponse, RememberResponse, SearchResponse,
)
from engram.domain.reviews import Review, ReviewPage

T = TypeVar("T")


class Engram:
    """A client of one Engram API.

    `url`: default ENGRAM_URL, else http://127.0.0.1:8080. `api_key`: default ENGRAM_API_KEY,
    else `$ENGRAM_DATA_DIR/api-key`; with none, requests go without one (and get 401).
    `client`: sent as `X-Engram-Client` (`cli`, `mcp`, `agent`), the `path` history records.
    `headers`: sent on every request (say, `X-Engram-Model` for an agent's model). `transport`:
    an httpx transport, for tests. Use it as a context manager, or `close()` it.
    """

    def __init__(self, url: str | None = None, api_key: str | None = None, *, client: str | None = None,
                 timeout: float = 60.0, max_retries: int = 3, transport: httpx.BaseTransport | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        self.connection = wire.connection(url, api_key, client, timeout, max_retries, headers)
        self._transport = transport
        self._client: httpx.Client | None = None

    @property
    def _http(self) -> httpx.Client:
        if self._client is None:  # opened on first use: constructing a client connects to nothing
            self._client = httpx.Client(transport=self._transport, **self.connection.client_options())
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> Engram:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def send(self, call: Call[T]) -> T:
        """Send `call`, retried as engram.client.wire says; its result. Raises ApiError (a
        subclass by status) or ConnectionFailed."""
        request = wire.request(self._http, call)
        attempts = wire.Attempts(call, self.connection.max_retries)
        while True:
            try:
                response = self._http.send(request)
            except httpx.TransportError as err:
                time.sleep(attempts.after_failure(err))
                continue
            delay = attempts.after_answer(response)
            if delay is None:
                return wire.read(call, response)
            time.sleep(delay)

    # -- progress ---------------------------------------------------------------------------------

    def watch_job(self, job_id: Id, *, interval: float = 1.0, until: Iterable[str] = ops.JOB_FINISHED
                  ) -> Iterator[Job]:
        """Each snapshot of a job, every `interval` seconds, until one is in a status of `until`
        (done or dead; ops.IMPORT_SETTLED for an import whose parked items count as through)."""
        return self._watch(ops.job(job_id), ops.reached(until), interval)

    def wait_job(self, job_id: Id, *, interval: float = 1.0, timeout: float | None = None,
                 until: Iterable[str] = ops.JOB_FINISHED) -> Job:
        """The job once in a status of `until`. Raises TimeoutError after `timeout` seconds."""
        return self._wait(ops.job(job_id), ops.reached(until), interval, timeout)

    def watch_operation(self, operation_id: str, *, interval: float = 1.0,
                        until: Iterable[str] = ops.OPERATION_FINISHED) -> Iterator[ForgetStatus]:
        """Each snapshot of a batch forget (its `done` of `total`), every `interval` seconds,
        until one is in a status of `until` (done, expired, rejected, stale, dry_run)."""
        return self._watch(ops.forget_status(operation_id), ops.reached(until), interval)

    def wait_operation(self, operation_id: str, *, interval: float = 1.0, timeout: float | None = None,
                       until: Iterable[str] = ops.OPERATION_FINISHED) -> ForgetStatus:
        """The batch forget once in a status of `until`. Raises TimeoutError after `timeout` seconds."""
        return self._wait(ops.forget_status(operation_id), ops.reached(until), interval, timeout)

    def _watch(self, call: Call[T], done: Callable[[T], bool], interval: float) -> Iterator[T]:
        while True:
            snapshot = self.send(call)
            yield snapshot
            if done(snapshot):
                return
            time.sleep(interval)

    def _wait(self, call: Call[T], done: Callable[[T], bool], interval: float, timeout: float | None) -> T:
        deadline = ops.Deadline(timeout)
        while not done(snapshot := self.send(call)):
            deadline.check(snapshot)
            time.sleep(interval)
        return snapshot

    # -- the API ------------------------------------------------------------------------------------

    @describes(ops.health)
    def health(self) -> dict[str, str]:
        return self.send(ops.health())

    @describes(ops.readiness)
    def readiness(self) -> Readiness:
        return self.send(ops.readiness())

    @describes(ops.remember)
    def remember(
        self, content: str, *, scope: ScopeArg, idempotency_key: str | None = None, **fields: Any,
    ) -> RememberResponse:
        return self.send(ops.remember(content, scope=scope, idempotency_key=idempotency_key, **fields))

    @describes(ops.remember_batch)
    def remember_batch(
        self, items: Iterable[Mapping[str, Any]], *, idempotency_key: str | None = None,
    ) -> RememberBatchResponse:
        return self.send(ops.remember_batch(items, idempotency_key=idempotency_key))

    @describes(ops.search)
    def search(
        self, query: str, *, scope: ScopeArg, limit: int = 10, filters: ScopeArg | None = None, **fields: Any,
    ) -> SearchResponse:
        return self.send(ops.search(query, scope=scope, limit=limit, filters=filters, **fields))

    @describes(ops.get)
    def get(self, memory_id: Id) -> Memory:
        return self.send(ops.get(memory_id))

    @describes(ops.list_memories)
    def list(self, *, scope: ScopeArg, cursor: str | None = None, limit: int = 20, **filters: Any) -> MemoryPage:
        return self.send(ops.list_memories(scope=scope, cursor=cursor, limit=limit, **filters))

    @describes(ops.job)
    def job(self, job_id: Id) -> Job:
        return self.send(ops.job(job_id))

    @describes(ops.modify)
    def modify(
        self, memory_id: Id, *, reason: str, if_version: int | None = None, idempotency_key: str | None = None,
        **changes: Any,
    ) -> Memory:
        return self.send(ops.modify(
            memory_id, reason=reason, if_version=if_version, idempotency_key=idempotency_key, **changes))

    @describes(ops.modify_batch)
    def modify_batch(
        self, items: Iterable[Mapping[str, Any]], *, idempotency_key: str | None = None,
    ) -> ModifyBatchResponse:
        return self.send(ops.modify_batch(items, idempotency_key=idempotency_key))

    @describes(ops.forget)
    def forget(
        self, memory_id: Id, *, reason: str, force: bool = False, if_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Memory:
        return self.send(ops.forget(
            memory_id, reason=reason, force=force, if_version=if_version, idempotency_key=idempotency_key))

    @describes(ops.recover)
    def recover(self, memory_id: Id, *, reason: str, idempotency_key: str | None = None) -> Memory:
        return self.send(ops.recover(memory_id, reason=reason, idempotency_key=idempotency_key))

    @describes(ops.rollback)
    def rollback(
        self, memory_id: Id, *, version: int, reason: str, if_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Memory:
        return self.send(ops.rollback(
            memory_id, version=version, reason=reason, if_version=if_version, idempotency_key=idempotency_key))

    @describes(ops.confirm)
    def confirm(self, memory_id: Id, *, reason: str, idempotency_key: str | None = None) -> Memory:
        return self.send(ops.confirm(memory_id, reason=reason, idempotency_key=idempotency_key))

    @describes(ops.history)
    def history(self, memory_id: Id) -> MemoryHistory:
        return self.send(ops.history(memory_id))

    @describes(ops.forget_preview)
    def forget_preview(
        self, *, scope: ScopeArg, reason: str, query: str | None = None, filters: ScopeArg | None = None,
        ids: Iterable[Id] | None = None, limit: int = 100, everything: bool = False, force: bool = False,
    ) -> ForgetPreview:
        return self.send(ops.forget_preview(
            scope=scope, reason=reason, query=query, filters=filters,
            ids=ids, limit=limit, everything=everything, force=force))

    @describes(ops.forget_execute)
    def forget_execute(self, operation_id: str, *, confirm_token: str, reason: str | None = None) -> ForgetStatus:
        return self.send(ops.forget_execute(operation_id, confirm_token=confirm_token, reason=reason))

    @describes(ops.forget_status)
    def forget_status(self, operation_id: str) -> ForgetStatus:
        return self.send(ops.forget_status(operation_id))

    @describes(ops.forget_undo)
    def forget_undo(self, operation_id: str, *, reason: str) -> UndoResult:
        return self.send(ops.forget_undo(operation_id, reason=reason))

    @describes(ops.approvals)
    def approvals(self) -> OperationList:
        return self.send(ops.approvals())

    @describes(ops.approve)
    def approve(self, operation_id: str, *, reason: str) -> ForgetStatus:
        return self.send(ops.approve(operation_id, reason=reason))

    @describes(ops.reject)
    def reject(self, operation_id: str, *, reason: str) -> ForgetStatus:
        return self.send(ops.reject(operation_id, reason=reason))

    @describes(ops.verify_receipt)
    def verify_receipt(self, receipt: Mapping[str, Any]) -> ReceiptCheck:
        return self.send(ops.verify_receipt(receipt))

    @describes(ops.reviews)
    def reviews(self, *, status: str | None = None, limit: int = 50) -> ReviewPage:
        return self.send(ops.reviews(status=status, limit=limit))

    @describes(ops.review)
    def review(self, review_id: Id) -> Review:
        return self.send(ops.review(review_id))

    @describes(ops.resolve_review)
    def resolve_review(self, review_id: Id, *, resolution: str, reason: str, content: str | None = None) -> Review:
        return self.send(ops.resolve_review(review_id, resolution=resolution, reason=reason, content=content))

    @describes(ops.write_approvals)
    def write_approvals(self, *, status: str = "pending", limit: int = 50) -> ApprovalPage:
        return self.send(ops.write_approvals(status=status, limit=limit))

    @describes(ops.write_approval)
    def write_approval(self, approval_id: Id) -> Approval:
        return self.send(ops.write_approval(approval_id))

    @describes(ops.decide_write)
    def decide_write(self, approval_id: Id, *, decision: str, reason: str) -> Approval:
        return self.send(ops.decide_write(approval_id, decision=decision, reason=reason))

    @describes(ops.control)
    def control(self) -> ControlStatus:
        return self.send(ops.control())

    @describes(ops.set_control)
    def set_control(self, switch: str, on: bool, *, reason: str, scope: ScopeArg | None = None) -> ControlStatus:
        return self.send(ops.set_control(switch, on, reason=reason, scope=scope))

    @describes(ops.verify)
    def verify(self) -> VerifyReport:
        return self.send(ops.verify())

    @describes(ops.create_key)
    def create_key(self, name: str, *, role: str, scopes: Iterable[str]) -> CreatedKey:
        return self.send(ops.create_key(name, role=role, scopes=scopes))

    @describes(ops.keys)
    def keys(self) -> KeyList:
        return self.send(ops.keys())

    @describes(ops.revoke_key)
    def revoke_key(self, key_id: Id) -> ApiKey:
        return self.send(ops.revoke_key(key_id))
