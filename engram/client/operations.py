"""Every operation of the HTTP API, described once: which method and path, which query
parameters and JSON body, which model the answer is, and how safe it is to retry. `Engram` and
`AsyncEngram` only send these descriptions; nothing here does I/O.

Requests are sent as given: the SDK does not validate them, so a bad one is refused by the
server's 422 with the server's own words. A scope is a mapping (or a `Scope`) of `user_id`,
`agent_id` and `run_id`.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote
from uuid import UUID

from pydantic import BaseModel

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
Id = UUID | str
ScopeArg = Mapping[str, Any] | BaseModel

JOB_FINISHED = frozenset({"done", "dead"})
# An import job is "parked" once every item is through or parked (waiting for a model).
IMPORT_SETTLED = frozenset({"done", "dead", "parked"})
OPERATION_FINISHED = frozenset({"done", "expired", "rejected", "stale", "dry_run"})


class Safety(enum.Enum):
    """What a retry of a call can do; `engram.client.retries` decides from it.

    READ: changes nothing. REPLAYED: a change the server binds to its `Idempotency-Key`, so a
    repeat answers with the first answer and changes nothing more. ONCE: a change the server
    does not replay: repeating one that was applied would apply it again (a second key) or be
    refused (a confirmed operation, a decided approval)."""

    READ = "read"
    REPLAYED = "replayed"
    ONCE = "once"


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how to read its answer. `answer` turns the JSON of a success (or of a
    status in `answers_with`) into the result; a mutation (REPLAYED or ONCE) is sent with an
    `Idempotency-Key`: `idempotency_key`, or one the client makes for the call."""

    method: str
    path: str
    answer: Callable[[Any], T]
    params: list[tuple[str, str]] = field(default_factory=list)
    json: Any = None
    safety: Safety = Safety.READ
    idempotency_key: str | None = None
    answers_with: frozenset[int] = frozenset()

    @property
    def mutation(self) -> bool:
        return self.safety is not Safety.READ


def _as_dict(value: ScopeArg | None) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    return dict(value)


def _query(**values: Any) -> list[tuple[str, str]]:
    """Query parameters: None left out, a list repeated, a bool as the API spells it."""
    params = []
    for name, value in values.items():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is not None:
                params.append((name, str(item).lower() if isinstance(item, bool) else str(item)))
    return params


def _seg(value: Id) -> str:
    """A path segment: an id as given, escaped, so it cannot reach another route."""
    return quote(str(value), safe="")


def _body(**values: Any) -> dict[str, Any]:
    """A JSON body without the optional fields left at None (the server's defaults apply)."""
    return {name: value for name, value in values.items() if value is not None}


def _identity(body: Any) -> Any:
    return body


# -- health -----------------------------------------------------------------------------------

def health() -> Call[dict[str, str]]:
    """`GET /healthz`: `{"status": "ok"}` while the process serves."""
    return Call("GET", "/healthz", _identity)


def readiness() -> Call[Readiness]:
    """`GET /readyz`: each component's state. Not ready is an answer (`ready` false), not an error."""
    return Call("GET", "/readyz", Readiness.model_validate, answers_with=frozenset({503}))


# -- remember and recall ----------------------------------------------------------------------

def remember(content: str, *, scope: ScopeArg, idempotency_key: str | None = None,
             **fields: Any) -> Call[RememberResponse]:
    """`POST /api/memory/remember`: store `content` in `scope`; `fields` are the request's other
    fields (type, tags, mode, metadata, pinned, ...). Replayed for its idempotency key (the body's
    `idempotency_key` field, which the client also sends as the header): a repeat stores nothing."""
    return Call("POST", "/api/memory/remember", RememberResponse.model_validate,
                json={"content": content, "scope": _as_dict(scope), **_body(idempotency_key=idempotency_key), **fields},
                safety=Safety.REPLAYED, idempotency_key=idempotency_key)


def remember_batch(items: Iterable[Mapping[str, Any]], *,
                   idempotency_key: str | None = None) -> Call[RememberBatchResponse]:
    """`POST /api/memory/remember/batch`: each item stored or answered with its own error, and
    an import job to watch. The header keys each item without a key of its own as `<key>:<i>`,
    so the batch sent again stores nothing twice."""
    return Call("POST", "/api/memory/remember/batch", RememberBatchResponse.model_validate,
                json={"items": [dict(item) for item in items]}, safety=Safety.REPLAYED,
                idempotency_key=idempotency_key)


def search(query: str, *, scope: ScopeArg, limit: int = 10, filters: ScopeArg | None = None,
           **fields: Any) -> Call[SearchResponse]:
    """`POST /api/memory/search`: the memories of `scope` that best answer `query`; `fields` are
    the request's other fields (include_deleted, rerank, explain, ...). Reads only."""
    return Call("POST", "/api/memory/search", SearchResponse.model_validate,
                json={"query": query, "scope": _as_dict(scope), "limit": limit,
                      **_body(filters=_as_dict(filters)), **fields})


def get(memory_id: Id) -> Call[Memory]:
    """`GET /api/memory/{id}`."""
    return Call("GET", f"/api/memory/{_seg(memory_id)}", Memory.model_validate)


def list_memories(*, scope: ScopeArg, cursor: str | None = None, limit: int = 20,
                  **filters: Any) -> Call[MemoryPage]:
    """`GET /api/memory`: a page of `scope`'s memories, newest first; `next_cursor` continues.
    `filters`: kind, type, tags, who, source_type, time, memory_type, trust, min_confidence,
    include_deleted, include_expired, status."""
    return Call("GET", "/api/memory", MemoryPage.model_validate,
                params=_query(**(_as_dict(scope) or {}), **filters, cursor=cursor, limit=limit))


def job(job_id: Id) -> Call[Job]:
    """`GET /api/memory/jobs/{id}`: a job's state, attempts and progress."""
    return Call("GET", f"/api/memory/jobs/{_seg(job_id)}", Job.model_validate)


# -- changes ----------------------------------------------------------------------------------

def modify(memory_id: Id, *, reason: str, if_version: int | None = None, idempotency_key: str | None = None,
           **changes: Any) -> Call[Memory]:
    """`PATCH /api/memory/{id}`: change `changes` (content, type, tags, importance, pinned,
    metadata), with a reason; only at `if_version` when given (else VersionConflict)."""
    return Call("PATCH", f"/api/memory/{_seg(memory_id)}", Memory.model_validate,
                json={**changes, "reason": reason, **_body(if_version=if_version)},
                safety=Safety.REPLAYED, idempotency_key=idempotency_key)


def modify_batch(items: Iterable[Mapping[str, Any]], *,
                 idempotency_key: str | None = None) -> Call[ModifyBatchResponse]:
    """`POST /api/memory/modify`: each patch (with its memory's `id` and a reason) on its own."""
    return Call("POST", "/api/memory/modify", ModifyBatchResponse.model_validate,
                json={"items": [dict(item) for item in items]}, safety=Safety.REPLAYED,
                idempotency_key=idempotency_key)


def forget(memory_id: Id, *, reason: str, force: bool = False, if_version: int | None = None,
           idempotency_key: str | None = None) -> Call[Memory]:
    """`DELETE /api/memory/{id}`: a soft delete, recoverable within the tombstone window. A
    pinned memory needs `force` (operators only)."""
    return Call("DELETE", f"/api/memory/{_seg(memory_id)}", Memory.model_validate,
                params=_query(reason=reason, force=force, if_version=if_version),
                safety=Safety.REPLAYED, idempotency_key=idempotency_key)


def recover(memory_id: Id, *, reason: str, idempotency_key: str | None = None) -> Call[Memory]:
    """`POST /api/memory/{id}/recover`: undo a delete within its recovery window (else Gone)."""
    return Call("POST", f"/api/memory/{_seg(memory_id)}/recover", Memory.model_validate,
                json={"reason": reason}, safety=Safety.REPLAYED, idempotency_key=idempotency_key)


def rollback(memory_id: Id, *, version: int, reason: str, if_version: int | None = None,
             idempotency_key: str | None = None) -> Call[Memory]:
    """`POST /api/memory/{id}/rollback`: a new version equal to `version`."""
    return Call("POST", f"/api/memory/{_seg(memory_id)}/rollback", Memory.model_validate,
                json=_body(version=version, reason=reason, if_version=if_version),
                safety=Safety.REPLAYED, idempotency_key=idempotency_key)


def confirm(memory_id: Id, *, reason: str, idempotency_key: str | None = None) -> Call[Memory]:
    """`POST /api/memory/{id}/confirm`: operators accept a quarantined memory as it is."""
    return Call("POST", f"/api/memory/{_seg(memory_id)}/confirm", Memory.model_validate,
                json={"reason": reason}, safety=Safety.REPLAYED, idempotency_key=idempotency_key)


def history(memory_id: Id) -> Call[MemoryHistory]:
    """`GET /api/memory/{id}/history`: every version, who, why and by which path."""
    return Call("GET", f"/api/memory/{_seg(memory_id)}/history", MemoryHistory.model_validate)


# -- batch forget -----------------------------------------------------------------------------

def forget_preview(*, scope: ScopeArg, reason: str, query: str | None = None, filters: ScopeArg | None = None,
                   ids: Iterable[Id] | None = None, limit: int = 100, everything: bool = False,
                   force: bool = False) -> Call[ForgetPreview]:
    """`POST /api/memory/forget`: the exact set a batch forget would delete and the token that
    confirms it. Deletes nothing (a preview not confirmed expires), so it is retried as a read."""
    return Call("POST", "/api/memory/forget", ForgetPreview.model_validate,
                json={"scope": _as_dict(scope), "reason": reason, "limit": limit, "everything": everything,
                      "force": force, **_body(query=query, filters=_as_dict(filters),
                                              ids=None if ids is None else [str(i) for i in ids])})


def forget_execute(operation_id: str, *, confirm_token: str, reason: str | None = None) -> Call[ForgetStatus]:
    """`POST /api/memory/forget/{op}/execute`: confirm a preview; above the approval threshold it
    then waits for an operator. Not replayed: a repeat is a Conflict (confirmed already)."""
    return Call("POST", f"/api/memory/forget/{_seg(operation_id)}/execute", ForgetStatus.model_validate,
                json=_body(confirm_token=confirm_token, reason=reason), safety=Safety.ONCE)


def forget_status(operation_id: str) -> Call[ForgetStatus]:
    """`GET /api/memory/forget/{op}`: a batch forget's status, progress (`done`/`total`) and receipt."""
    return Call("GET", f"/api/memory/forget/{_seg(operation_id)}", ForgetStatus.model_validate)


def forget_undo(operation_id: str, *, reason: str) -> Call[UndoResult]:
    """`POST /api/memory/forget/{op}/undo`: recover exactly what a finished batch forget deleted."""
    return Call("POST", f"/api/memory/forget/{_seg(operation_id)}/undo", UndoResult.model_validate,
                json={"reason": reason}, safety=Safety.ONCE)


def approvals() -> Call[OperationList]:
    """`GET /api/approvals`: batch forgets waiting for an operator."""
    return Call("GET", "/api/approvals", OperationList.model_validate)


def approve(operation_id: str, *, reason: str) -> Call[ForgetStatus]:
    """`POST /api/approvals/{op}/approve` (an operator other than the requester)."""
    return Call("POST", f"/api/approvals/{_seg(operation_id)}/approve", ForgetStatus.model_validate,
                json={"reason": reason}, safety=Safety.ONCE)


def reject(operation_id: str, *, reason: str) -> Call[ForgetStatus]:
    """`POST /api/approvals/{op}/reject`."""
    return Call("POST", f"/api/approvals/{_seg(operation_id)}/reject", ForgetStatus.model_validate,
                json={"reason": reason}, safety=Safety.ONCE)


def verify_receipt(receipt: Mapping[str, Any]) -> Call[ReceiptCheck]:
    """`POST /api/receipts/verify`: an erasure receipt's signature and each DELETE it names. Reads only."""
    return Call("POST", "/api/receipts/verify", ReceiptCheck.model_validate, json=dict(receipt))


# -- reviews and write approvals ----------------------------------------------------------------

def reviews(*, status: str | None = None, limit: int = 50) -> Call[ReviewPage]:
    """`GET /api/reviews`: contradictions kept for a person (waiting ones by default)."""
    return Call("GET", "/api/reviews", ReviewPage.model_validate, params=_query(status=status, limit=limit))


def review(review_id: Id) -> Call[Review]:
    """`GET /api/reviews/{id}`."""
    return Call("GET", f"/api/reviews/{_seg(review_id)}", Review.model_validate)


def resolve_review(review_id: Id, *, resolution: str, reason: str, content: str | None = None) -> Call[Review]:
    """`POST /api/reviews/{id}/resolve`: keep_existing, replace, keep_both, merge (with
    `content`) or escalate."""
    return Call("POST", f"/api/reviews/{_seg(review_id)}/resolve", Review.model_validate,
                json=_body(resolution=resolution, reason=reason, content=content), safety=Safety.ONCE)


def write_approvals(*, status: str = "pending", limit: int = 50) -> Call[ApprovalPage]:
    """`GET /api/memory/approvals`: writes that waited for approval (the pending ones by default)."""
    return Call("GET", "/api/memory/approvals", ApprovalPage.model_validate,
                params=_query(status=status, limit=limit))


def write_approval(approval_id: Id) -> Call[Approval]:
    """`GET /api/memory/approvals/{id}`."""
    return Call("GET", f"/api/memory/approvals/{_seg(approval_id)}", Approval.model_validate)


def decide_write(approval_id: Id, *, decision: str, reason: str) -> Call[Approval]:
    """`POST /api/memory/approvals/{id}/decide`: approve, reject or quarantine (operators)."""
    return Call("POST", f"/api/memory/approvals/{_seg(approval_id)}/decide", Approval.model_validate,
                json={"decision": decision, "reason": reason}, safety=Safety.ONCE)


# -- operations -------------------------------------------------------------------------------

def control() -> Call[ControlStatus]:
    """`GET /api/control`: the mutation freeze (global and per scope) and the kill switch."""
    return Call("GET", "/api/control", ControlStatus.model_validate)


def set_control(switch: str, on: bool, *, reason: str, scope: ScopeArg | None = None) -> Call[ControlStatus]:
    """`POST /api/control`: operators flip `freeze` (in `scope`, or everywhere) or `kill_switch`."""
    return Call("POST", "/api/control", ControlStatus.model_validate,
                json={"switch": switch, "on": on, "reason": reason, **_body(scope=_as_dict(scope))},
                safety=Safety.ONCE)


def verify() -> Call[VerifyReport]:
    """`GET /api/admin/verify`: operators check every memory's and scope's hash chain."""
    return Call("GET", "/api/admin/verify", VerifyReport.model_validate)


def create_key(name: str, *, role: str, scopes: Iterable[str]) -> Call[CreatedKey]:
    """`POST /api/keys` (admin): the new key's record and its secret, shown only now."""
    return Call("POST", "/api/keys", CreatedKey.model_validate,
                json={"name": name, "role": role, "scopes": list(scopes)}, safety=Safety.ONCE)


def keys() -> Call[KeyList]:
    """`GET /api/keys` (admin): every key, revoked ones too, never a secret."""
    return Call("GET", "/api/keys", KeyList.model_validate)


def revoke_key(key_id: Id) -> Call[ApiKey]:
    """`DELETE /api/keys/{id}` (admin). Revoking twice keeps the first time, so it is replayed by
    nature."""
    return Call("DELETE", f"/api/keys/{_seg(key_id)}", ApiKey.model_validate, safety=Safety.REPLAYED)


def describes(operation: Callable[..., Call[Any]]):
    """Give a client's method the docstring of the operation it sends (the one description)."""

    def document(method):
        method.__doc__ = operation.__doc__
        return method

    return document


def reached(statuses: Iterable[str]) -> Callable[[Any], bool]:
    """Whether a snapshot (a Job, a ForgetStatus) is in one of `statuses`: where a watch ends."""
    wanted = frozenset(statuses)
    return lambda snapshot: snapshot.status in wanted


class Deadline:
    """A wait's limit: `check` raises TimeoutError, naming where the snapshot stood, once
    `timeout` seconds (None: no limit) have passed since it was made."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.at = None if timeout is None else time.monotonic() + timeout

    def check(self, snapshot: Any) -> None:
        if self.at is not None and time.monotonic() > self.at:
            raise TimeoutError(f"still {snapshot.status} after {self.timeout} s: {snapshot!r}"[:500])
