"""Changing memories by id: modify (one, or a batch of independent items), forget, recover,
roll back, confirm a quarantined memory, and a memory's history. Every gateway calls these.

Each change runs in one transaction: the memory's row is locked, checked (scope, status,
`if_version`, pinned, a person's manual-override lock), written with its next version, its
BM25 postings and scope statistics and its canonical embedding in step, and its history event
appended to the memory's hash chain; an idempotency key, if given, is bound to the answer in
the same transaction. After commit, the index owner's sync loop rewrites the memory's index
points; search does not wait for it: every candidate is re-read from its row, and a memory whose
points are stale is scored by its row instead (recall.candidates.fresh_dense, Bm25).

What the caller may not touch answers exactly as a missing memory: NotFound.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable
from uuid import UUID

import asyncpg
import numpy as np
from pydantic import ValidationError as PydanticValidationError

from engram.control import Control
from engram.domain import auth, chain
from engram.domain.changes import (
    CHANGE_FIELDS, MAX_MODIFY_BATCH, ChangeContext, ConfirmRequest, DecisionRecord, FactRef, HistoryEvent,
    MemoryHistory, MemoryPatch,
    ModifyBatchResponse, ModifyItem, ModifyItemResult, RecoverRequest, RollbackRequest, VerifyReport,
)
from engram.domain.errors import (
    Conflict, EngramError, Forbidden, Gone, NotFound, RateLimited, ValidationFailed, VersionConflict,
)
from engram.domain.models import ItemError, Memory, Scope
from engram.domain.ratelimit import RateLimiter
from engram.domain.text import content_hash, normalize, term_frequencies
from engram.inference.embedding_spaces import EmbeddingSpaces
from engram.integrity import Integrity
from engram.settings import Settings
from engram.store import changes as store
from engram.store import facts, history, idempotency
from engram.store import memories as repo

BATCH_KEY_MEMORY = UUID(int=0)  # what a batch's idempotency key is bound to: no one memory
APPROVAL_EVENTS = ("APPROVE", "REJECT", "QUARANTINE")  # a person's decision on a write that waits for one


class ManualOverride(Conflict):
    type = "manual_override"


class Pinned(Conflict):
    type = "pinned"


@dataclass(frozen=True)
class _Change:
    """What one change asks of a locked row."""

    event: str
    reason: str
    fields: dict[str, Any]  # CHANGE_FIELDS to set
    if_version: int | None = None
    vectors: dict[str, np.ndarray] | None = None  # the new content's, embedded before the lock
    note: dict[str, Any] | None = None  # added to the event's new_metadata (a rollback's target)
    by_model: bool = False  # the pipeline's model decided it: never on a pinned memory


def _now() -> datetime:
    return datetime.now(timezone.utc)


class MemoryChanges:
    def __init__(self, settings: Settings, pool: asyncpg.Pool, spaces: EmbeddingSpaces, integrity: Integrity,
                 control: Control, clock: Callable[[], datetime] = _now) -> None:
        self._settings = settings
        self._pool = pool
        self._spaces = spaces
        self._integrity = integrity
        self._control = control
        self.clock = clock  # what "now" is for windows and locks; tests move it
        self._limiter = RateLimiter(settings.change_rate_per_s, settings.change_burst)

    # -- one memory ---------------------------------------------------------------------------

    async def modify(self, principal: auth.Principal, memory_id: UUID, patch: MemoryPatch,
                     ctx: ChangeContext = ChangeContext()) -> Memory:
        """Apply `patch`. Raises NotFound, VersionConflict, Conflict (deleted, quarantined, or
        another live memory of the scope holds the new content), ManualOverride (an agent
        under a person's lock), Forbidden, RateLimited, EmbeddingUnavailable."""
        principal.require("modify")
        body = patch.model_dump(mode="json")
        if (first := await self._first_answer(principal, ctx, "modify", memory_id, body)) is not None:
            return Memory.model_validate(first)
        self._throttle(principal, "modify")
        current = await self._changeable(principal, memory_id)
        change = _Change("UPDATE", patch.reason, patch.changes(), patch.if_version,
                         await self._vectors(patch.content, current))
        return await self._one(principal, ctx, "modify", memory_id, body, change)

    async def forget(self, principal: auth.Principal, memory_id: UUID, *, reason: str, force: bool = False,
                     if_version: int | None = None, ctx: ChangeContext = ChangeContext()) -> Memory:
        """Soft-delete: the memory leaves search at once and can be recovered for
        `tombstone_days`. A pinned memory needs `force`, which only operators may use.
        Forgetting a deleted memory changes nothing. Raises NotFound, Pinned, Forbidden,
        VersionConflict, ManualOverride, RateLimited."""
        principal.require("forget")
        if force:
            principal.require("force_delete")
        body = {"reason": reason, "force": force, "if_version": if_version}
        if (first := await self._first_answer(principal, ctx, "forget", memory_id, body)) is not None:
            return Memory.model_validate(first)
        self._throttle(principal, "forget")
        memory = await self._changeable(principal, memory_id)
        change = _Change("DELETE", reason, {}, if_version, note={"forced": True} if force and memory.pinned else None)
        forgotten = await self._one(principal, ctx, "forget", memory_id, body, change, force=force)
        await self._control.note_delete(memory_id, _scope(memory))
        return forgotten

    async def recover(self, principal: auth.Principal, memory_id: UUID, req: RecoverRequest,
                      ctx: ChangeContext = ChangeContext()) -> Memory:
        """Undo a delete within `tombstone_days`: searchable again. Raises NotFound, Gone (past
        the window), Conflict (not deleted, or its content is live again in its scope)."""
        principal.require("recover")
        body = req.model_dump(mode="json")
        if (first := await self._first_answer(principal, ctx, "recover", memory_id, body)) is not None:
            return Memory.model_validate(first)
        self._throttle(principal, "forget")
        await self._changeable(principal, memory_id)
        change = _Change("RECOVER", req.reason, {})
        return await self._one(principal, ctx, "recover", memory_id, body, change)

    async def rollback(self, principal: auth.Principal, memory_id: UUID, req: RollbackRequest,
                       ctx: ChangeContext = ChangeContext()) -> Memory:
        """Write a new version equal to `req.version`'s state; history keeps every version. A
        quarantined memory rolled back is active again. Raises NotFound, ValidationFailed (no
        such version), Conflict (deleted, or the version has no recorded state)."""
        principal.require("rollback")
        body = req.model_dump(mode="json")
        if (first := await self._first_answer(principal, ctx, "rollback", memory_id, body)) is not None:
            return Memory.model_validate(first)
        self._throttle(principal, "modify")
        current = await self._changeable(principal, memory_id)
        # A quarantined memory may go back to its own version: to what its history recorded.
        latest = current.version if current.status == "quarantined" else current.version - 1
        if req.version > latest:
            raise ValidationFailed(f"version: roll back to an earlier version than the current {current.version}")
        state = await history.state_at(self._pool, memory_id, req.version)
        if state is None:
            raise Conflict(f"version {req.version} of memory {memory_id} has no recorded state to roll back to")
        fields = {name: state[name] for name in CHANGE_FIELDS if name in state}
        change = _Change("ROLLBACK", req.reason, fields, req.if_version,
                         await self._vectors(fields.get("content"), current), note={"rolled_back_to": req.version})
        return await self._one(principal, ctx, "rollback", memory_id, body, change)

    async def confirm(self, principal: auth.Principal, memory_id: UUID, req: ConfirmRequest,
                      ctx: ChangeContext = ChangeContext()) -> Memory:
        """An operator accepts a quarantined memory's row as it is: active again, with a CONFIRM
        event. Raises NotFound, Conflict (not quarantined), Forbidden."""
        principal.require("maintenance")
        body = req.model_dump(mode="json")
        if (first := await self._first_answer(principal, ctx, "confirm", memory_id, body)) is not None:
            return Memory.model_validate(first)
        await self._changeable(principal, memory_id)
        change = _Change("CONFIRM", req.reason, {})
        return await self._one(principal, ctx, "confirm", memory_id, body, change)

    async def history(self, principal: auth.Principal, memory_id: UUID) -> MemoryHistory:
        """The memory (checked against its chain first) and its events, oldest first."""
        principal.require("read")
        await self._visible(principal, memory_id)
        await self._integrity.check([memory_id])
        memory = await repo.get(self._pool, memory_id)
        events = await history.events(self._pool, memory_id)
        derived = await facts.facts_of(self._pool, memory_id)
        return MemoryHistory(memory=memory, events=[HistoryEvent.model_validate(dict(e)) for e in events],
                             facts=[FactRef.model_validate(dict(r)) for r in derived],
                             decisions=[DecisionRecord.model_validate(dict(r))
                                        for r in await facts.decisions_about(self._pool, memory_id)])

    async def verify(self, principal: auth.Principal) -> VerifyReport:
        """Every memory's and every scope's chain, checked in full (`engram verify`)."""
        principal.require("maintenance")
        return await self._integrity.verify_all()

    async def apply_in(self, conn: asyncpg.Connection, principal: auth.Principal, memory_id: UUID, event: str, *,
                       reason: str, if_version: int | None, ctx: ChangeContext, force: bool = False) -> Memory:
        """A DELETE or RECOVER in the caller's transaction, as `forget` and `recover` make it
        (a batch forget's steps: each item's delete shares a transaction with its record)."""
        assert event in ("DELETE", "RECOVER")
        return await self._apply(conn, principal, memory_id, _Change(event, reason, {}, if_version), ctx, force=force)

    async def decide_in(self, conn: asyncpg.Connection, memory_id: UUID, event: str, *, reason: str, if_version: int,
                        ctx: ChangeContext, content: str | None = None,
                        vectors: dict[str, np.ndarray] | None = None) -> Memory:
        """A model's UPDATE (to `content`, embedded as `vectors`) or DELETE of a fact, in the
        caller's transaction, as the pipeline (an automatic actor: a person's lock holds it
        off). Raises Pinned, ManualOverride, VersionConflict (not at `if_version`, the version
        the model was shown), Conflict (deleted meanwhile, or the content is held by another
        memory), NotFound, Frozen."""
        assert event in ("UPDATE", "DELETE")
        fields = {"content": content} if event == "UPDATE" else {}
        change = _Change(event, reason, fields, if_version, vectors, by_model=True)
        return await self._apply(conn, auth.PIPELINE, memory_id, change, ctx)

    async def decide_approval_in(self, conn: asyncpg.Connection, principal: auth.Principal, memory_id: UUID,
                                 event: str, *, reason: str, ctx: ChangeContext) -> Memory:
        """An APPROVE (into recall), REJECT (soft-deleted) or QUARANTINE (held aside) of a memory
        waiting for approval, in the caller's transaction (engram.approval_steps). Raises
        Conflict (it no longer waits), NotFound, Frozen."""
        assert event in APPROVAL_EVENTS
        return await self._apply(conn, principal, memory_id, _Change(event, reason, {}), ctx)

    async def update_in(self, conn: asyncpg.Connection, principal: auth.Principal, memory_id: UUID, *, content: str,
                        vectors: dict[str, np.ndarray] | None, reason: str, ctx: ChangeContext) -> Memory:
        """A new content (embedded as `vectors`) in the caller's transaction, as `modify` makes
        it (a review's merge). Raises what `modify` raises."""
        return await self._apply(conn, principal, memory_id, _Change("UPDATE", reason, {"content": content},
                                                                     vectors=vectors), ctx)

    # -- a batch ------------------------------------------------------------------------------

    async def modify_batch(self, principal: auth.Principal, items: list[dict],
                           ctx: ChangeContext = ChangeContext()) -> ModifyBatchResponse:
        """Apply each item on its own, in one transaction with a savepoint per item: an item
        that fails (invalid, missing, a version conflict, ...) gets its own error and changes
        nothing; the others are applied. Rows are locked in id order, so batches never
        deadlock on each other."""
        principal.require("modify")
        if len(items) > MAX_MODIFY_BATCH:
            raise ValidationFailed(f"items: at most {MAX_MODIFY_BATCH} per request (got {len(items)})")
        body = {"items": items}
        if (first := await self._first_answer(principal, ctx, "modify_batch", BATCH_KEY_MEMORY, body)) is not None:
            return ModifyBatchResponse.model_validate(first)
        results: dict[int, ModifyItemResult] = {}
        valid: list[tuple[int, ModifyItem, _Change]] = []
        for index, raw in enumerate(items):
            try:
                item = ModifyItem.model_validate(raw)
                self._throttle(principal, "modify")
                current = await self._changeable(principal, item.id)
                change = _Change("UPDATE", item.reason, item.changes(), item.if_version,
                                 await self._vectors(item.content, current))
            except PydanticValidationError as err:
                results[index] = _item_error(index, raw.get("id") if isinstance(raw, dict) else None,
                                             ValidationFailed(_describe(err)))
            except EngramError as err:
                results[index] = _item_error(index, raw.get("id") if isinstance(raw, dict) else None, err)
            else:
                valid.append((index, item, change))
        valid.sort(key=lambda v: v[1].id.int)
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                replay = await self._claim(conn, principal, ctx, "modify_batch", BATCH_KEY_MEMORY, body)
                if replay is not None:
                    return ModifyBatchResponse.model_validate(replay)
                for index, item, change in valid:
                    try:
                        async with conn.transaction():
                            memory = await self._apply(conn, principal, item.id, change, ctx)
                        results[index] = ModifyItemResult(index=index, id=item.id, ok=True, version=memory.version)
                    except EngramError as err:
                        results[index] = _item_error(index, item.id, err)
                applied = sum(r.ok for r in results.values())
                answer = ModifyBatchResponse(applied=applied, failed=len(items) - applied,
                                             results=[results[i] for i in range(len(items))])
                await self._bind(conn, principal, ctx, answer.model_dump(mode="json"))
                await store.wake_index_sync(conn)
        return answer

    # -- the steps ----------------------------------------------------------------------------

    async def _one(self, principal: auth.Principal, ctx: ChangeContext, op: str, memory_id: UUID, body: dict,
                   change: _Change, *, force: bool = False) -> Memory:
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                replay = await self._claim(conn, principal, ctx, op, memory_id, body)
                if replay is not None:
                    return Memory.model_validate(replay)
                memory = await self._apply(conn, principal, memory_id, change, ctx, force=force)
                await self._bind(conn, principal, ctx, memory.model_dump(mode="json"))
                await store.wake_index_sync(conn)
        return memory

    async def _apply(self, conn: asyncpg.Connection, principal: auth.Principal, memory_id: UUID, change: _Change,
                     ctx: ChangeContext, *, force: bool = False) -> Memory:
        """Check and write `change` on the locked row, with its event; the memory as it is now."""
        row = await store.lock(conn, memory_id)
        if row is None or not principal.may_touch(_scope(row)):
            raise NotFound(f"no memory {memory_id}")
        # Here, on the row's own scope, for every way a change comes (a batch forget's items and
        # its undo too); the check before the embedding only spares a frozen change that work.
        await self._control.check(_scope(row), conn)
        now = self.clock()
        self._admissible(principal, row, change, now, force)
        sets = self._sets(row, change, now)
        if change.event != "CONFIRM" and not _differs(row, sets):
            return repo.row_to_memory(row)  # already so: no new version, no event
        # A memory from before history was chained gets its chain first, from its row as it is.
        prev_hash = row["chain_hash"] or await history.seal_memory(conn, memory_id)
        if principal.role not in auth.AUTOMATIC_ROLES and change.event in ("UPDATE", "ROLLBACK"):
            sets |= {"manual_override": True,
                     "manual_override_until": now + timedelta(seconds=self._settings.manual_override_s)}
        await self._keep_postings_in_step(conn, row, sets, change)
        try:
            written = await store.write(conn, memory_id, sets, actor=principal.id)
        except asyncpg.UniqueViolationError:
            raise Conflict("another live memory of this scope now holds this content") from None
        await history.append(conn, memory_id, (row["user_id"], row["agent_id"], row["run_id"]),
                             self._event(principal, row, written, change, ctx), prev_hash)
        return repo.row_to_memory(written)

    def _admissible(self, principal: auth.Principal, row: asyncpg.Record, change: _Change, now: datetime,
                    force: bool) -> None:
        """Raise why `change` may not be made to `row` now, if it may not."""
        memory_id, event = row["id"], change.event
        if change.if_version is not None and row["version"] != change.if_version:
            raise VersionConflict(f"memory {memory_id} is at version {row['version']}, not {change.if_version}; "
                                  "nothing was changed", current_version=row["version"])
        if event == "RECOVER":
            if not row["is_deleted"]:
                raise Conflict(f"memory {memory_id} is not deleted")
            if row["approval"] == "withdrawn":  # deleted while it waited: recovering it would skip the approval
                raise Conflict(f"memory {memory_id} was forgotten while it waited for approval: remember it again")
            if row["approval"] == "rejected":
                self._approver(principal, row, "recover a rejected write")
            window = timedelta(days=self._settings.tombstone_days)
            if row["deleted_at"] is not None and row["deleted_at"] + window < now:
                raise Gone(f"memory {memory_id} was deleted at {row['deleted_at'].isoformat()}, more than "
                           f"{self._settings.tombstone_days:g} days ago: past its recovery window")
            return
        if event == "CONFIRM":
            if row["status"] != "quarantined":
                raise Conflict(f"memory {memory_id} is not quarantined")
            if row["approval"] == "quarantined":
                self._approver(principal, row, "confirm a quarantined write")
            return
        if event in APPROVAL_EVENTS:
            if row["status"] != "pending":
                raise Conflict(f"memory {memory_id} does not wait for approval (it is {row['status']})")
            return
        if row["is_deleted"]:
            if event == "DELETE":
                return  # already so; _differs stops it
            raise Conflict(f"memory {memory_id} is deleted: recover it first")
        if row["status"] == "pending" and event != "DELETE":
            raise Conflict(f"memory {memory_id} waits for an operator's approval: it cannot change before (forget it "
                           "and remember it again)")
        if row["approval"] == "quarantined" and row["status"] == "quarantined" and event == "ROLLBACK":
            self._approver(principal, row, "roll back a quarantined write")
        if row["status"] == "quarantined" and event != "ROLLBACK":
            raise Conflict(f"memory {memory_id} is quarantined (its row did not match its history): an operator "
                           "rolls it back or confirms it first")
        if change.by_model and row["pinned"]:
            raise Pinned(f"memory {memory_id} is pinned: a model's decision never changes or deletes it")
        if event == "DELETE" and row["pinned"] and not force:
            raise Pinned(f"memory {memory_id} is pinned: deleting it needs force=true, from an operator")
        if row["pinned"] and change.fields.get("pinned") is False and not principal.may("force_delete"):
            # Else unpin, then delete, would get round the operator's force that a pinned delete needs.
            raise Forbidden(f"memory {memory_id} is pinned: only an operator may unpin it, as only an operator may "
                            "delete it")
        locked_until = row["manual_override_until"]
        if principal.role in auth.AUTOMATIC_ROLES and locked_until is not None and locked_until > now:
            raise ManualOverride(f"memory {memory_id} was edited by a person and is locked against automatic "
                                 f"changes until {locked_until.isoformat()}")

    @staticmethod
    def _approver(principal: auth.Principal, row: asyncpg.Record, what: str) -> None:
        """Raise Forbidden unless `principal` may decide on the write `row` as its approval would:
        an operator who did not write it. Else a quarantined or rejected write would reach recall
        without the approval it was refused."""
        if not principal.may("approve") or principal.id == row["created_by"]:
            raise Forbidden(f"memory {row['id']} was held back at approval: only an operator other than its writer "
                            f"may {what}")

    def _sets(self, row: asyncpg.Record, change: _Change, now: datetime) -> dict[str, Any]:
        """The columns `change` sets on `row` (only what differs, for a patch)."""
        if change.event == "DELETE":
            if row["is_deleted"]:
                return {}
            withdrawn = {"approval": "withdrawn"} if row["status"] == "pending" else {}
            return {"is_deleted": True, "deleted_at": now, "status": "deleted"} | withdrawn
        if change.event == "RECOVER":
            return {"is_deleted": False, "deleted_at": None, "status": "active"}
        if change.event == "APPROVE":
            return {"status": "active", "approval": "approved"}
        if change.event == "REJECT":
            return {"is_deleted": True, "deleted_at": now, "status": "deleted", "approval": "rejected"}
        if change.event == "QUARANTINE":
            return {"status": "quarantined", "approval": "quarantined"}
        if change.event == "CONFIRM":  # the row as found becomes a version: what is derived from it follows
            normalized = normalize(row["content"])
            return {"status": "active", "normalized_content": normalized, "content_hash": content_hash(normalized)}
        sets = {name: value for name, value in change.fields.items() if not _same(row[name], value)}
        if "content" in sets:
            normalized = normalize(sets["content"])
            sets |= {"normalized_content": normalized, "content_hash": content_hash(normalized)}
        if change.event == "ROLLBACK" and row["status"] == "quarantined":
            sets["status"] = "active"
        return sets

    async def _keep_postings_in_step(self, conn: asyncpg.Connection, row: asyncpg.Record, sets: dict[str, Any],
                                     change: _Change) -> None:
        """The BM25 postings, the scope's statistics (live memories only) and the canonical
        embedding follow the change. Statistics are locked after the row (store.changes says why)."""
        scope = _scope(row)
        stemmer = self._settings.bm25_stemmer
        delta = repo.StatsDelta()
        if change.event in ("DELETE", "REJECT", "RECOVER") and "is_deleted" in sets:
            tf = await store.postings(conn, row["id"])
            (delta.add if change.event == "RECOVER" else delta.remove)(scope, tf, row["token_count"])
        elif change.event == "CONFIRM":
            await self._derive_again(conn, row, sets, delta)
        elif "content" in sets:
            twin = await store.live_twin(conn, row["id"], sets["content_hash"])
            if twin is not None:
                raise Conflict(f"memory {twin} of this scope already holds this content")
            old = await store.postings(conn, row["id"])
            new, length = term_frequencies(sets["content"], stemmer)
            delta.remove(scope, old, row["token_count"])
            delta.add(scope, new, length)
            sets["token_count"] = length
            await store.replace_postings(conn, row["id"], scope, new)
            vectors = change.vectors
            if vectors is None:  # the row's content changed between the read and the lock
                vectors = await self._spaces.embed_text(sets["content"])
            await self._spaces.store_text_vectors(conn, row["id"], vectors)
        if change.event == "RECOVER":
            twin = await store.live_twin(conn, row["id"], row["content_hash"])
            if twin is not None:
                raise Conflict(f"memory {twin} of this scope holds the same content now: recovering this one "
                               "would make two")
        await repo.add_stats(conn, delta)

    async def _derive_again(self, conn: asyncpg.Connection, row: asyncpg.Record, sets: dict[str, Any],
                            delta: repo.StatsDelta) -> None:
        """A confirmed row's content may not be what its postings and embedding were made from
        (it was edited behind the service's back): make them again from the row."""
        twin = await store.live_twin(conn, row["id"], sets["content_hash"])
        if twin is not None:
            raise Conflict(f"memory {twin} of this scope already holds this content: confirming would make two")
        old = await store.postings(conn, row["id"])
        new, length = term_frequencies(row["content"], self._settings.bm25_stemmer)
        if not row["is_deleted"]:
            delta.remove(_scope(row), old, row["token_count"])
            delta.add(_scope(row), new, length)
        sets["token_count"] = length
        await store.replace_postings(conn, row["id"], _scope(row), new)
        await self._spaces.store_text_vectors(conn, row["id"], await self._spaces.embed_text(row["content"]))

    def _event(self, principal: auth.Principal, before: asyncpg.Record, after: asyncpg.Record, change: _Change,
               ctx: ChangeContext) -> history.Event:
        changed = [name for name in CHANGE_FIELDS if name != "content" and not _same(before[name], after[name])]
        content_changed = before["content"] != after["content"]
        return history.Event(
            event=change.event, version=after["version"], state=chain.state_of(after), actor_type=principal.role,
            actor_id=principal.id, path=ctx.path, reason=change.reason, request_id=ctx.request_id,
            session_id=before["session_id"],
            old_content=before["content"] if content_changed or change.event in ("DELETE", "REJECT") else None,
            new_content=after["content"] if content_changed else None,
            old_metadata={name: _jsonable(before[name]) for name in changed} or None,
            new_metadata=({name: _jsonable(after[name]) for name in changed} | (change.note or {})) or None,
            provider=ctx.model.provider, model=ctx.model.model, prompt_version=ctx.model.prompt_version,
            at=self.clock(),
        )

    # -- helpers ------------------------------------------------------------------------------

    async def _visible(self, principal: auth.Principal, memory_id: UUID) -> Memory:
        memory = await repo.get(self._pool, memory_id)
        if memory is None or not principal.may_touch(_scope(memory)):
            raise NotFound(f"no memory {memory_id}")
        return memory

    async def _changeable(self, principal: auth.Principal, memory_id: UUID) -> Memory:
        """The memory, if the caller may see it (else NotFound) and its scope is not frozen (else Frozen)."""
        memory = await self._visible(principal, memory_id)
        await self._control.check(_scope(memory))
        return memory

    async def _vectors(self, content: str | None, current: Memory) -> dict[str, np.ndarray] | None:
        """New content's vectors, embedded before any lock is taken; None when it is not new."""
        if content is None or content == current.content:
            return None
        return await self._spaces.embed_text(content)

    def _throttle(self, principal: auth.Principal, action: str) -> None:
        wait_s = self._limiter.take(principal.id, action)
        if wait_s > 0:
            raise RateLimited(f"too many {action} requests from this key: at most "
                              f"{self._settings.change_rate_per_s:g}/s in bursts of {self._settings.change_burst}; "
                              f"retry in {wait_s:.1f} s", retry_after_s=wait_s)

    async def _first_answer(self, principal: auth.Principal, ctx: ChangeContext, op: str, memory_id: UUID,
                            body: dict) -> dict | None:
        """The first answer to this request, when its idempotency key has one: a replay gets it
        before the rate limit, the freeze or an embedding is consulted (it changes nothing).
        Raises Conflict for the key used with another request."""
        if not ctx.idempotency_key:
            return None
        row = await idempotency.find(self._pool, principal.id, ctx.idempotency_key)
        if row is None or row["response"] is None:
            return None  # not seen, or still in flight: the claim in the change's transaction decides
        if row["request_hash"] != _request_hash(op, memory_id, body):
            raise Conflict("Idempotency-Key was already used with a different request")
        return row["response"]

    async def _claim(self, conn: asyncpg.Connection, principal: auth.Principal, ctx: ChangeContext, op: str,
                     memory_id: UUID, body: dict) -> dict | None:
        """Bind the context's idempotency key to this request; the first answer if it was
        bound already. Raises Conflict for the key reused with another request, or still in flight."""
        if not ctx.idempotency_key:
            return None
        request_hash = _request_hash(op, memory_id, body)
        if await idempotency.claim(conn, principal=principal.id, key=ctx.idempotency_key, request_hash=request_hash,
                                   memory_id=memory_id, job_id=None):
            return None
        row = await idempotency.find(conn, principal.id, ctx.idempotency_key)
        if row["request_hash"] != request_hash:
            raise Conflict("Idempotency-Key was already used with a different request")
        if row["response"] is None:
            raise Conflict("a request with this Idempotency-Key is still being processed: retry shortly")
        return row["response"]

    async def _bind(self, conn: asyncpg.Connection, principal: auth.Principal, ctx: ChangeContext,
                    answer: dict) -> None:
        if ctx.idempotency_key:
            await idempotency.store_response(conn, principal.id, ctx.idempotency_key, answer)


def _scope(memory) -> Scope:
    get = memory.__getitem__ if hasattr(memory, "keys") else memory.__getattribute__
    return Scope.model_construct(user_id=get("user_id"), agent_id=get("agent_id"), run_id=get("run_id"))


def _request_hash(op: str, memory_id: UUID, body: dict) -> str:
    """What an idempotency key is bound to: the operation, the memory and the request's body."""
    return hashlib.sha256(json.dumps({"op": op, "id": str(memory_id), "body": body}, sort_keys=True,
                                     default=str).encode()).hexdigest()


def _same(old: Any, new: Any) -> bool:
    return chain.encode({"v": _jsonable(old)}) == chain.encode({"v": _jsonable(new)})


def _differs(row: asyncpg.Record, sets: dict[str, Any]) -> bool:
    return any(not _same(row[name], value) for name, value in sets.items() if name in row.keys())


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return chain.instant(value)
    if isinstance(value, float):
        return chain.real(value)  # importance, the one float field: compared as the `real` it is stored as
    return list(value) if isinstance(value, tuple) else value


def _item_error(index: int, memory_id: Any, err: EngramError) -> ModifyItemResult:
    try:
        parsed = UUID(str(memory_id)) if memory_id is not None else None
    except ValueError:
        parsed = None
    return ModifyItemResult(index=index, id=parsed, ok=False, error=ItemError(type=err.type, detail=err.detail),
                            current_version=getattr(err, "current_version", None))


def _describe(err: PydanticValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'item'}: {e['msg'].removeprefix('Value error, ')}"
                     for e in err.errors())
