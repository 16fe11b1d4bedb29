"""`AsyncEngram`, the asyncio client of the HTTP API. Each method sends one operation of
engram.client.operations (its docstring is the operation's) and returns the server's own model;
errors are engram.client.errors; retries as engram.client.wire says."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
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


class AsyncEngram:
    """An asyncio client of one Engram API: `Engram`'s arguments and methods, awaited.

    `url`: default ENGRAM_URL, else http://127.0.0.1:8080. `api_key`: default ENGRAM_API_KEY,
    else `$ENGRAM_DATA_DIR/api-key`; with none, requests go without one (and get 401).
    `client`: sent as `X-Engram-Client` (`cli`, `mcp`, `agent`), the `path` history records.
    `headers`: sent on every request (say, `X-Engram-Model` for an agent's model). `transport`:
    an httpx async transport (`httpx.ASGITransport(app=...)` in tests). Use it as an async
    context manager, or `aclose()` it.
    """

    def __init__(self, url: str | None = None, api_key: str | None = None, *, client: str | None = None,
                 timeout: float = 60.0, max_retries: int = 3, transport: httpx.AsyncBaseTransport | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        self.connection = wire.connection(url, api_key, client, timeout, max_retries, headers)
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    @property
    def _http(self) -> httpx.AsyncClient:
        if self._client is None:  # opened on first use: constructing a client connects to nothing
            self._client = httpx.AsyncClient(transport=self._transport, **self.connection.client_options())
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def __aenter__(self) -> AsyncEngram:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def send(self, call: Call[T]) -> T:
        """Send `call`, retried as engram.client.wire says; its result. Raises ApiError (a
        subclass by status) or ConnectionFailed."""
        request = wire.request(self._http, call)
        attempts = wire.Attempts(call, self.connection.max_retries)
        while True:
            try:
                response = await self._http.send(request)
            except httpx.TransportError as err:
                await asyncio.sleep(attempts.after_failure(err))
                continue
            delay = attempts.after_answer(response)
            if delay is None:
                return wire.read(call, response)
            await asyncio.sleep(delay)

    # -- progress ---------------------------------------------------------------------------------

    def watch_job(self, job_id: Id, *, interval: float = 1.0, until: Iterable[str] = ops.JOB_FINISHED
                  ) -> AsyncIterator[Job]:
        """Each snapshot of a job, every `interval` seconds, until one is in a status of `until`
        (done or dead; ops.IMPORT_SETTLED for an import whose parked items count as through)."""
        return self._watch(ops.job(job_id), ops.reached(until), interval)

    async def wait_job(self, job_id: Id, *, interval: float = 1.0, timeout: float | None = None,
                       until: Iterable[str] = ops.JOB_FINISHED) -> Job:
        """The job once in a status of `until`. Raises TimeoutError after `timeout` seconds."""
        return await self._wait(ops.job(job_id), ops.reached(until), interval, timeout)

    def watch_operation(self, operation_id: str, *, interval: float = 1.0,
                        until: Iterable[str] = ops.OPERATION_FINISHED) -> AsyncIterator[ForgetStatus]:
        """Each snapshot of a batch forget (its `done` of `total`), every `interval` seconds,
        until one is in a status of `until` (done, expired, rejected, stale, dry_run)."""
        return self._watch(ops.forget_status(operation_id), ops.reached(until), interval)

    async def wait_operation(self, operation_id: str, *, interval: float = 1.0, timeout: float | None = None,
                             until: Iterable[str] = ops.OPERATION_FINISHED) -> ForgetStatus:
        """The batch forget once in a status of `until`. Raises TimeoutError after `timeout` seconds."""
        return await self._wait(ops.forget_status(operation_id), ops.reached(until), interval, timeout)

    async def _watch(self, call: Call[T], done: Callable[[T], bool], interval: float) -> AsyncIterator[T]:
        while True:
            snapshot = await self.send(call)
            yield snapshot
            if done(snapshot):
                return
            await asyncio.sleep(interval)

    async def _wait(self, call: Call[T], done: Callable[[T], bool], interval: float, timeout: float | None) -> T:
        deadline = ops.Deadline(timeout)
        while not done(snapshot := await self.send(call)):
            deadline.check(snapshot)
            await asyncio.sleep(interval)
        return snapshot

    # -- the API ------------------------------------------------------------------------------------

    @describes(ops.health)
    async def health(self) -> dict[str, str]:
        return await self.send(ops.health())

    @describes(ops.readiness)
    async def readiness(self) -> Readiness:
        return await self.send(ops.readiness())

    @describes(ops.remember)
    async def remember(
        self, content: str, *, scope: ScopeArg, idempotency_key: str | None = None, **fields: Any,
    ) -> RememberResponse:
        return await self.send(ops.remember(content, scope=scope, idempotency_key=idempotency_key, **fields))

    @describes(ops.remember_batch)
    async def remember_batch(
        self, items: Iterable[Mapping[str, Any]], *, idempotency_key: str | None = None,
    ) -> RememberBatchResponse:
        return await self.send(ops.remember_batch(items, idempotency_key=idempotency_key))

    @describes(ops.search)
    async def search(
        self, query: str, *, scope: ScopeArg, limit: int = 10, filters: ScopeArg | None = None, **fields: Any,
    ) -> SearchResponse:
        return await self.send(ops.search(query, scope=scope, limit=limit, filters=filters, **fields))

    @describes(ops.get)
    async def get(self, memory_id: Id) -> Memory:
        return await self.send(ops.get(memory_id))

    @describes(ops.list_memories)
    async def list(self, *, scope: ScopeArg, cursor: str | None = None, limit: int = 20, **filters: Any) -> MemoryPage:
        return await self.send(ops.list_memories(scope=scope, cursor=cursor, limit=limit, **filters))

    @describes(ops.job)
    async def job(self, job_id: Id) -> Job:
        return await self.send(ops.job(job_id))

    @describes(ops.modify)
    async def modify(
        self, memory_id: Id, *, reason: str, if_version: int | None = None, idempotency_key: str | None = None,
        **changes: Any,
    ) -> Memory:
        return await self.send(ops.modify(
            memory_id, reason=reason, if_version=if_version, idempotency_key=idempotency_key, **changes))

    @describes(ops.modify_batch)
    async def modify_batch(
        self, items: Iterable[Mapping[str, Any]], *, idempotency_key: str | None = None,
    ) -> ModifyBatchResponse:
        return await self.send(ops.modify_batch(items, idempotency_key=idempotency_key))

    @describes(ops.forget)
    async def forget(
        self, memory_id: Id, *, reason: str, force: bool = False, if_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Memory:
        return await self.send(ops.forget(
            memory_id, reason=reason, force=force, if_version=if_version, idempotency_key=idempotency_key))

    @describes(ops.recover)
    async def recover(self, memory_id: Id, *, reason: str, idempotency_key: str | None = None) -> Memory:
        return await self.send(ops.recover(memory_id, reason=reason, idempotency_key=idempotency_key))

    @describes(ops.rollback)
    async def rollback(
        self, memory_id: Id, *, version: int, reason: str, if_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Memory:
        return await self.send(ops.rollback(
            memory_id, version=version, reason=reason, if_version=if_version, idempotency_key=idempotency_key))

    @describes(ops.confirm)
    async def confirm(self, memory_id: Id, *, reason: str, idempotency_key: str | None = None) -> Memory:
        return await self.send(ops.confirm(memory_id, reason=reason, idempotency_key=idempotency_key))

    @describes(ops.history)
    async def history(self, memory_id: Id) -> MemoryHistory:
        return await self.send(ops.history(memory_id))

    @describes(ops.forget_preview)
    async def forget_preview(
        self, *, scope: ScopeArg, reason: str, query: str | None = None, filters: ScopeArg | None = None,
        ids: Iterable[Id] | None = None, limit: int = 100, everything: bool = False, force: bool = False,
    ) -> ForgetPreview:
        return await self.send(ops.forget_preview(
            scope=scope, reason=reason, query=query, filters=filters,
            ids=ids, limit=limit, everything=everything, force=force))

    @describes(ops.forget_execute)
    async def forget_execute(self, operation_id: str, *, confirm_token: str, reason: str | None = None) -> ForgetStatus:
        return await self.send(ops.forget_execute(operation_id, confirm_token=confirm_token, reason=reason))

    @describes(ops.forget_status)
    async def forget_status(self, operation_id: str) -> ForgetStatus:
        return await self.send(ops.forget_status(operation_id))

    @describes(ops.forget_undo)
    async def forget_undo(self, operation_id: str, *, reason: str) -> UndoResult:
        return await self.send(ops.forget_undo(operation_id, reason=reason))

    @describes(ops.approvals)
    async def approvals(self) -> OperationList:
        return await self.send(ops.approvals())

    @describes(ops.approve)
    async def approve(self, operation_id: str, *, reason: str) -> ForgetStatus:
        return await self.send(ops.approve(operation_id, reason=reason))

    @describes(ops.reject)
    async def reject(self, operation_id: str, *, reason: str) -> ForgetStatus:
        return await self.send(ops.reject(operation_id, reason=reason))

    @describes(ops.verify_receipt)
    async def verify_receipt(self, receipt: Mapping[str, Any]) -> ReceiptCheck:
        return await self.send(ops.verify_receipt(receipt))

    @describes(ops.reviews)
    async def reviews(self, *, status: str | None = None, limit: int = 50) -> ReviewPage:
        return await self.send(ops.reviews(status=status, limit=limit))

    @describes(ops.review)
    async def review(self, review_id: Id) -> Review:
        return await self.send(ops.review(review_id))

    @describes(ops.resolve_review)
    async def resolve_review(
        self, review_id: Id, *, resolution: str, reason: str, content: str | None = None,
    ) -> Review:
        return await self.send(ops.resolve_review(review_id, resolution=resolution, reason=reason, content=content))

    @describes(ops.write_approvals)
    async def write_approvals(self, *, status: str = "pending", limit: int = 50) -> ApprovalPage:
        return await self.send(ops.write_approvals(status=status, limit=limit))

    @describes(ops.write_approval)
    async def write_approval(self, approval_id: Id) -> Approval:
        return await self.send(ops.write_approval(approval_id))

    @describes(ops.decide_write)
    async def decide_write(self, approval_id: Id, *, decision: str, reason: str) -> Approval:
        return await self.send(ops.decide_write(approval_id, decision=decision, reason=reason))

    @describes(ops.control)
    async def control(self) -> ControlStatus:
        return await self.send(ops.control())

    @describes(ops.set_control)
    async def set_control(self, switch: str, on: bool, *, reason: str, scope: ScopeArg | None = None) -> ControlStatus:
        return await self.send(ops.set_control(switch, on, reason=reason, scope=scope))

    @describes(ops.verify)
    async def verify(self) -> VerifyReport:
        return await self.send(ops.verify())

    @describes(ops.create_key)
    async def create_key(self, name: str, *, role: str, scopes: Iterable[str]) -> CreatedKey:
        return await self.send(ops.create_key(name, role=role, scopes=scopes))

    @describes(ops.keys)
    async def keys(self) -> KeyList:
        return await self.send(ops.keys())

    @describes(ops.revoke_key)
    async def revoke_key(self, key_id: Id) -> ApiKey:
        return await self.send(ops.revoke_key(key_id))
