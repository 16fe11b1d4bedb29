"""Batch forget's wire models and its signatures: a preview's confirm token and an erasure
receipt are HMAC-SHA256 over a canonical encoding, with a secret only the service holds, so
neither can be guessed or altered."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, Field, StrictBool, model_validator

from engram.domain.changes import Reason
from engram.domain.models import MAX_QUERY_CHARS, Scope, SearchFilters, Strict, _SHOWS, wire_int

MAX_FORGET_IDS = 1_000
CONFIRM_SECRET, RECEIPT_SECRET = "confirm-token", "erasure-receipt"  # the names of the service's secrets
OperationStatus = Literal["awaiting_confirmation", "awaiting_approval", "executing", "done", "expired",
                          "rejected", "stale", "dry_run"]


class ForgetRequest(Strict):
    """What to forget in `scope`: by `query` (semantic and keyword, its best `limit`), `filters`,
    explicit `ids`, or several at once (all must hold). At least one of them: a whole scope is
    not forgotten by leaving the selection out."""

    scope: Scope
    query: str | None = Field(default=None, min_length=1, max_length=MAX_QUERY_CHARS, json_schema_extra=_SHOWS)
    filters: SearchFilters = Field(default_factory=SearchFilters)
    ids: list[UUID] | None = Field(default=None, min_length=1, max_length=MAX_FORGET_IDS)
    limit: wire_int(1, MAX_FORGET_IDS) = 100
    reason: Reason
    force: StrictBool = Field(default=False, description="Include pinned memories (operators only)")
    everything: StrictBool = Field(default=False, description="Select the whole scope: said, never implied")

    @model_validator(mode="after")
    def _selects(self) -> "ForgetRequest":
        chosen = self.query is not None or self.ids is not None or self.filters.model_dump(exclude_none=True)
        if not chosen and not self.everything:
            raise ValueError("give a query, filters or ids (or everything: true for the whole scope): a whole "
                             "scope is not forgotten by leaving the selection out")
        if chosen and self.everything:
            raise ValueError("everything: true selects the whole scope; give no query, filters or ids with it")
        return self


class ForgetCandidate(BaseModel):
    id: UUID
    score: float | None
    snippet: str
    pinned: bool
    version: int
    content_hash: str


class ForgetPreview(BaseModel):
    operation_id: str
    status: OperationStatus
    candidates: list[ForgetCandidate]
    total_matched: int
    needs_approval: bool
    confirm_token: str
    expires_at: datetime


class ForgetExecute(Strict):
    confirm_token: str = Field(min_length=1, max_length=200)
    reason: Reason | None = None


class Decision(Strict):
    reason: Reason


class ForgetItemOutcome(BaseModel):
    id: UUID
    state: str
    version: int
    deleted_version: int | None
    content_hash: str


class ForgetEvent(BaseModel):
    """One move of an operation: previewed, confirmed, approved, rejected, expired, stale,
    dry_run, executing or done; by whom and why."""

    event: str
    actor: str
    reason: str | None
    at: datetime


class ForgetStatus(BaseModel):
    operation_id: str
    status: OperationStatus
    requester: str
    reason: str
    total: int
    done: int
    needs_approval: bool
    approver: str | None
    created_at: datetime
    finished_at: datetime | None
    receipt: dict[str, Any] | None = None
    events: list[ForgetEvent] = []  # the operation's audit trail (on a single operation's status)


class OperationList(BaseModel):
    items: list[ForgetStatus]


class UndoResult(BaseModel):
    operation_id: str
    recovered: list[UUID]
    not_recovered: list[dict[str, Any]]  # {id, why}: changed since the forget, recovered already, ...


class ReceiptCheck(BaseModel):
    """An erasure receipt checked: `ok` when its signature and every DELETE it names hold."""

    ok: bool
    problems: list[str]


def canonical(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def sign(secret: bytes, fields: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(hmac.new(secret, canonical(fields), hashlib.sha256).digest()).decode().rstrip("=")


def token_digest(token: str) -> str:
    """What a BatchForgetWorkflow keeps of its confirm token (never the token or the secret): the
    `confirm` update must carry a token with this digest."""
    return hashlib.sha256(token.encode()).hexdigest()


def signed_by(secret: bytes, fields: dict[str, Any], signature: str) -> bool:
    return hmac.compare_digest(sign(secret, fields), signature)


def token_fields(operation_id: str, scope: dict, items: list[tuple[str, int]], actor: str,
                 expires_at: datetime) -> dict[str, Any]:
    """What a confirm token binds: the operation, its scope, the exact (id, version) set, who may
    confirm it and until when."""
    return {"op": operation_id, "scope": scope, "items": sorted([str(i), v] for i, v in items), "actor": actor,
            "expires": expires_at.isoformat()}
