"""Batch forget: preview, confirm, approve or reject, progress, undo, and the erasure receipt's
check. Each operation is one BatchForgetWorkflow (workflows/forget.py), which waits for its
confirmation and, where needed, an operator's approval, then deletes and writes the receipt
(engram.forget_steps).

Preview computes the exact set here, where search runs, and records it (every item `pending`,
the audit record of the intent) before the workflow starts. The confirm token is an HMAC with
a secret only the service holds, over the operation, its scope, the exact (id, version) set,
the requester and the expiry; it never enters a workflow's history.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone
from typing import Callable, Protocol
from uuid import UUID

import asyncpg

from engram.changes import MemoryChanges
from engram.control import Control
from engram.domain import auth
from engram.domain.changes import ChangeContext
from engram.domain.errors import Conflict, EngramError, Forbidden, Gone, NotFound
from engram.domain.filters import resolve
from engram.domain.forget import (
    CONFIRM_SECRET, RECEIPT_SECRET, Decision, ForgetCandidate, ForgetExecute, ForgetPreview, ForgetRequest,
    ForgetEvent, ForgetStatus, OperationList, UndoResult, sign, signed_by, token_digest, token_fields,
)
from engram.domain.models import Scope
from engram.recall.pipeline import Recall, RecallOptions
from engram.settings import Settings
from engram.store import changes as store
from engram.store import operations


class TooMany(Conflict):
    type = "too_many"


class ForgetRuns(Protocol):
    """The workflows behind batch forgets (worker/temporal_forget.py)."""

    async def start(self, operation_id: str, *, requester: str, needs_approval: bool, dry_run: bool,
                    confirm_ttl_s: float, approval_ttl_s: float, total: int, token_sha256: str) -> None: ...

    async def confirm(self, operation_id: str, *, actor: str, reason: str, stale: bool, token: str) -> str:
        """The status after the confirmation; raises Conflict if the workflow refuses it."""

    async def decide(self, operation_id: str, *, approve: bool, actor: str, role: str, reason: str) -> None: ...


def _now() -> datetime:
    return datetime.now(timezone.utc)


class BatchForgets:
    def __init__(self, settings: Settings, pool: asyncpg.Pool, recall: Recall, changes: MemoryChanges,
                 runs: ForgetRuns, control: Control, clock: Callable[[], datetime] = _now) -> None:
        self._settings = settings
        self._pool = pool
        self._recall = recall
        self._changes = changes
        self._runs = runs
        self._control = control
        self.clock = clock

    async def preview(self, principal: auth.Principal, req: ForgetRequest) -> ForgetPreview:
        """Compute and record the exact set, start its workflow, and answer with the set and the
        token that confirms it. Changes no memory. Pinned memories are in the set only with
        `force` (operators). Raises Forbidden, NotFound (nothing matches), TooMany (more than
        `forget_max_items` match)."""
        principal.require("forget", req.scope)
        if req.force:
            principal.require("force_delete")
        await self._control.check(req.scope)
        s = self._settings
        # What is stored, not only what recall shows: expired memories and writes waiting for approval too.
        filters = resolve(req.filters, principal.visibility, include_deleted=False, now=self.clock(),
                          include_expired=True, include_pending=True)
        scores: dict[UUID, float] = {}
        if req.query is not None:
            hits, _, _ = await self._recall.search(req.query, req.scope, filters,
                                                   RecallOptions(limit=req.limit, rerank=False, rerank_top_n=0))
            wanted = set(req.ids) if req.ids is not None else None
            scores = {h.memory.id: h.score for h in hits if wanted is None or h.memory.id in wanted}
            rows = await operations.rows_of(self._pool, list(scores))
            rows.sort(key=lambda r: -scores[r["id"]])
            total = len(rows)
        else:
            rows, total = await operations.matching(self._pool, req.scope, filters, req.ids, req.limit)
        if total > s.forget_max_items:
            raise TooMany(f"{total} memories match; one batch forget takes at most {s.forget_max_items}: narrow it")
        pinned_left = [r for r in rows if r["pinned"] and not req.force]
        rows = [r for r in rows if not r["pinned"] or req.force]
        if not rows:
            raise NotFound("no memory matches this selection" + (
                f" ({len(pinned_left)} pinned ones do, and need force=true from an operator)" if pinned_left else ""))
        operation_id = f"forget-{uuid.uuid4()}"
        expires_at = self.clock() + timedelta(seconds=s.forget_confirm_ttl_s)
        scope = req.scope.model_dump(exclude_none=True)
        needs_approval = len(rows) > s.approval_threshold or any(r["pinned"] for r in rows)
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                await operations.create(conn, operation_id=operation_id, requester=principal.id, role=principal.role,
                                        scope=scope, reason=req.reason, force=req.force,
                                        status="awaiting_confirmation", expires_at=expires_at,
                                        needs_approval=needs_approval,
                                        items=[(r["id"], r["version"], r["content_hash"]) for r in rows])
            secret = await operations.secret(conn, CONFIRM_SECRET)
        token = sign(secret, token_fields(operation_id, scope, [(r["id"], r["version"]) for r in rows],
                                          principal.id, expires_at))
        await self._runs.start(operation_id, requester=principal.id, needs_approval=needs_approval,
                               dry_run=s.forget_dry_run, confirm_ttl_s=s.forget_confirm_ttl_s,
                               approval_ttl_s=s.approval_ttl_s, total=len(rows), token_sha256=token_digest(token))
        return ForgetPreview(
            operation_id=operation_id, status="awaiting_confirmation", total_matched=total,
            needs_approval=needs_approval, confirm_token=token, expires_at=expires_at,
            candidates=[ForgetCandidate(id=r["id"], score=scores.get(r["id"]), snippet=r["content"][:200],
                                        pinned=r["pinned"], version=r["version"], content_hash=r["content_hash"])
                        for r in rows])

    async def execute(self, principal: auth.Principal, operation_id: str, req: ForgetExecute,
                      ctx: ChangeContext = ChangeContext()) -> ForgetStatus:
        """Confirm a preview with its token. Raises NotFound, Forbidden (a token for another
        set, scope or key), Gone (expired), Conflict (already confirmed or ended, or the set
        changed since the preview: a new preview is needed)."""
        principal.require("forget")
        op = await self._visible(principal, operation_id)
        await self._control.check(Scope.model_construct(**op["scope"]))
        items = await operations.items(self._pool, operation_id)
        secret = await operations.secret(self._pool, CONFIRM_SECRET)
        fields = token_fields(operation_id, op["scope"], [(i["memory_id"], i["version"]) for i in items],
                              principal.id, op["expires_at"])
        if not signed_by(secret, fields, req.confirm_token):
            raise Forbidden("this confirm token was not issued for this operation, its set and this key")
        if op["status"] != "awaiting_confirmation":
            raise Conflict(f"operation {operation_id} is {op['status']}: it was confirmed already or has ended")
        if self.clock() > op["expires_at"]:
            raise Gone(f"the confirm token expired at {op['expires_at'].isoformat()}: preview again")
        changed = await operations.changed_items(self._pool, operation_id)
        if changed:
            await self._runs.confirm(operation_id, actor=principal.id, reason=req.reason or op["reason"], stale=True,
                                     token=req.confirm_token)
            raise Conflict(f"{len(changed)} of the previewed memories changed since the preview "
                           f"({', '.join(map(str, changed[:10]))}): nothing was deleted; preview again")
        await self._runs.confirm(operation_id, actor=principal.id, reason=req.reason or op["reason"], stale=False,
                                 token=req.confirm_token)
        return await self._status_after(operation_id, "awaiting_confirmation")

    async def decide(self, principal: auth.Principal, operation_id: str, approve: bool, req: Decision) -> ForgetStatus:
        """An operator other than the requester approves or rejects an operation waiting for
        approval (the workflow's `approve` / `reject` signal). Raises Forbidden (self-approval,
        not an operator), NotFound, Conflict (not waiting for approval)."""
        principal.require("approve")
        op = await self._visible(principal, operation_id)
        if op["requester"] == principal.id:
            raise Forbidden("the requester of an operation may not approve or reject it")
        if op["status"] != "awaiting_approval":
            raise Conflict(f"operation {operation_id} is {op['status']}, not awaiting approval")
        await self._runs.decide(operation_id, approve=approve, actor=principal.id, role=principal.role,
                                reason=req.reason)
        return await self._status_after(operation_id, "awaiting_approval")

    async def status(self, principal: auth.Principal, operation_id: str) -> ForgetStatus:
        principal.require("read")
        status = _status(await self._visible(principal, operation_id))
        status.events = [ForgetEvent.model_validate(dict(e))
                         for e in await operations.events(self._pool, operation_id)]
        return status

    async def approvals(self, principal: auth.Principal) -> OperationList:
        """Operations waiting for an operator's approval, oldest first."""
        principal.require("approve")
        found = []
        for operation_id in await operations.awaiting(self._pool, "awaiting_approval"):
            op = await operations.get(self._pool, operation_id)
            if principal.may_touch(Scope.model_construct(**op["scope"])):
                found.append(_status(op))
        return OperationList(items=found)

    async def undo(self, principal: auth.Principal, operation_id: str, req: Decision,
                   ctx: ChangeContext = ChangeContext()) -> UndoResult:
        """Recover exactly what the operation deleted (within the tombstone window), each with a
        RECOVER event; a memory changed since the forget is reported, not overwritten."""
        principal.require("recover")
        op = await self._visible(principal, operation_id)
        if op["status"] != "done":
            raise Conflict(f"operation {operation_id} is {op['status']}: only a finished forget can be undone")
        recovered, kept = [], []
        context = ChangeContext(path=ctx.path, request_id=operation_id, model=ctx.model)
        for item in await operations.items(self._pool, operation_id):
            if item["state"] != "deleted":
                kept.append({"id": str(item["memory_id"]), "why": f"not deleted by this operation ({item['state']})"})
                continue
            try:
                async with self._pool.acquire() as conn:
                    async with conn.transaction():
                        await self._changes.apply_in(conn, principal, item["memory_id"], "RECOVER", reason=req.reason,
                                                     if_version=item["deleted_version"], ctx=context)
                        await operations.settle_item(conn, operation_id, item["memory_id"], "recovered",
                                                     deleted_version=item["deleted_version"],
                                                     event_hash=item["event_hash"])
                recovered.append(item["memory_id"])
            except EngramError as err:
                kept.append({"id": str(item["memory_id"]), "why": f"{err.type}: {err.detail}"})
        await store.wake_index_sync(self._pool)
        return UndoResult(operation_id=operation_id, recovered=recovered, not_recovered=kept)

    async def check_receipt(self, principal: auth.Principal, receipt: dict) -> list[str]:
        """What does not hold of an erasure receipt (empty: it is genuine and the database
        agrees): its signature, and each memory's DELETE event by the operation."""
        principal.require("read")
        problems = []
        fields = {k: v for k, v in receipt.items() if k != "signature"}
        secret = await operations.secret(self._pool, RECEIPT_SECRET)
        if not isinstance(receipt.get("signature"), str) or not signed_by(secret, fields, receipt["signature"]):
            problems.append("the signature does not match the receipt: it was altered or not issued by this service")
        for item in receipt.get("items") or []:
            if item.get("state") != "deleted":
                continue
            event = await operations.delete_event(self._pool, UUID(str(item["id"])), str(receipt.get("operation_id")))
            if event is None:
                problems.append(f"memory {item['id']}: no DELETE event by this operation in its history")
            elif (event["hash"], event["version"]) != (item.get("event_hash"), item.get("deleted_version")):
                problems.append(f"memory {item['id']}: its DELETE event is not the one the receipt names")
        return problems

    async def _visible(self, principal: auth.Principal, operation_id: str):
        op = await operations.get(self._pool, operation_id)
        if op is None or not principal.may_touch(Scope.model_construct(**op["scope"])):
            raise NotFound(f"no operation {operation_id}")
        return op

    async def _status_after(self, operation_id: str, before: str, wait_s: float = 10.0) -> ForgetStatus:
        """The operation's status once the workflow has moved it on from `before` (or as it is
        after `wait_s`)."""
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            op = await operations.get(self._pool, operation_id)
            if op["status"] != before or asyncio.get_running_loop().time() > deadline:
                return _status(op)
            await asyncio.sleep(0.05)


def _status(op) -> ForgetStatus:
    return ForgetStatus(operation_id=op["id"], status=op["status"], requester=op["requester"], reason=op["reason"],
                        total=op["total"], done=op["done"], needs_approval=op["needs_approval"],
                        approver=op["approver"], created_at=op["created_at"],
                        finished_at=op["finished_at"], receipt=op["receipt"])
