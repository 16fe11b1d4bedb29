"""The one service layer every gateway (HTTP, CLI through HTTP, agent integrations) calls."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Protocol
from uuid import UUID

import asyncpg
from pydantic import ValidationError as PydanticValidationError

from engram import drafts
from engram.access_counts import AccessCounts
from engram.domain import auth
from engram.domain.changes import NO_MODEL, ModelAttribution
from engram.domain.errors import (
    Conflict, Contention, DatabaseUnavailable, EngramError, ImportStillWriting, NotFound, Unauthenticated,
    ValidationFailed,
)
from engram.domain.filters import resolve
from engram.domain.models import (
    MAX_PIPELINE_TIMEOUT_MS, ApiKey, ItemError, Job, Memory, MemoryPage, RememberBatchResponse, RememberItem,
    RememberItemResult, RememberRequest, RememberResponse, Scope, SearchFilters, SearchRequest, SearchResponse,
)
from engram.domain.text import content_hash, normalize
from engram.group_commit import GroupCommit
from engram.inference.availability import Availability
from engram.control import Control
from engram.integrity import Integrity
from engram.recall.pipeline import Recall, RecallOptions
from engram.settings import Settings
from engram.store import approvals, idempotency, import_batches, jobs, keys
from engram.store import pool as pool_module
from engram.store import memories as repo
from engram.store.notifications import Wakeups

log = logging.getLogger(__name__)
DUPLICATE = "duplicate: this scope already holds this memory"  # the warning on an answer that points at it
KEY_CACHE_S = 1.0  # how long a key lookup is reused; a revocation drops every cached lookup at once
IMPORT_WAIT_S = 120.0  # how long a bulk remember waits for a worker that is writing it


class Pipeline(Protocol):
    """Observes the durable remember pipeline. Remember only writes rows (the memory and its
    job, in one transaction); the worker's dispatcher turns the jobs into batch workflows."""

    async def wait_first_pass(self, job_id: UUID, timeout_s: float) -> str | None:
        """The first pass's outcome ("processed" or "raw_saved"), or None if not within the timeout."""


def _speaks_domain_errors(method):
    """Every gateway gets domain errors only: Postgres out of reach (down, restarting, out of
    connections) is DatabaseUnavailable, a 503 the client may retry, not an unexpected error."""

    @functools.wraps(method)
    async def calling(*args, **kwargs):
        try:
            return await method(*args, **kwargs)
        except asyncpg.TransactionRollbackError as err:  # a deadlock or serialization failure: rolled back
            log.warning("a transaction was rolled back by Postgres", extra={"call": method.__name__,
                                                                            "error": f"{type(err).__name__}: {err}"})
            raise Contention("the request met concurrent work and was rolled back, nothing stored: retry it") from err
        except pool_module.UNREACHABLE as err:
            log.warning("the database is out of reach", extra={"call": method.__name__,
                                                                "error": f"{type(err).__name__}: {err}"})
            raise DatabaseUnavailable(
                "the database cannot be reached; retry shortly (a retried remember is not stored twice: "
                "its idempotency key or the scope's duplicate check answers with the first)") from err

    return calling


@dataclass(frozen=True)
class _Written:
    memory_id: UUID
    job_id: UUID | None
    duplicate: bool
    approval_id: UUID | None = None  # it waits for this approval (engram.approvals)
    session: drafts.Session | None = None  # the scope's session it was written in: earlier ones end


class MemoryService:
    def __init__(self, settings: Settings, pool: asyncpg.Pool, recall: Recall, pipeline: Pipeline,
                 availability: Availability, integrity: Integrity, control: Control,
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
                 imports: Wakeups | None = None) -> None:
        self._settings = settings
        self._pool = pool
        self._recall = recall
        self._pipeline = pipeline
        self._availability = availability
        self._integrity = integrity
        self._control = control
        self.clock = clock  # what "now" is for lifetimes and time phrases; tests move it
        self._imports = imports  # import_batches.WRITTEN's wakeups: None, bulk remembers are written here
        self._group = GroupCommit(pool) if settings.remember_group_commit else None
        self._accesses = AccessCounts(pool)
        self._background: set[asyncio.Task] = set()
        self._queue_state = (float("-inf"), (0, 0.0))  # (when read, (jobs waiting for a batch, oldest's wait))
        self._principals: dict[str, tuple[float, auth.Principal]] = {}  # key hash -> (valid until, principal)
        self._revocations = 0  # bumped by forget_principals: a lookup that straddles one is not cached

    # -- principals ---------------------------------------------------------------------------

    @_speaks_domain_errors
    async def authenticate(self, key: str | None) -> auth.Principal:
        """The key's principal. A lookup is reused for KEY_CACHE_S (a busy client costs one
        query a second, not one a request); a revocation, in this process or another (the
        keys.REVOKED notification), drops every reused lookup."""
        if not key:
            raise Unauthenticated("missing API key: send 'Authorization: Bearer <key>' or 'X-API-Key'")
        key_hash = auth.hash_key(key)
        cached = self._principals.get(key_hash)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        revocations = self._revocations
        row = await keys.find_active(self._pool, key_hash)
        if row is None:
            raise Unauthenticated("unknown or revoked API key")
        principal = auth.Principal(id=f"key:{row['id']}", name=row["name"], role=row["role"],
                                   grants=tuple(row["scopes"]))
        if revocations == self._revocations:
            if len(self._principals) >= 10_000:  # only valid keys get here; bound it all the same
                self._principals.clear()
            self._principals[key_hash] = (time.monotonic() + KEY_CACHE_S, principal)
        return principal

    def forget_principals(self, _payload: str = "") -> None:
        """Drop every reused key lookup: a key was revoked (keys.REVOKED's handler)."""
        self._revocations += 1
        self._principals.clear()

    @_speaks_domain_errors
    async def create_key(self, principal: auth.Principal, *, name: str, role: str, scopes: list[str]
                         ) -> tuple[str, ApiKey]:
        """A new API key: (the secret, shown only now; its record). Admin only. Raises
        ValidationFailed for an unknown role or a malformed grant, Conflict when an active key
        already has `name`."""
        principal.require("admin")
        if role not in auth.ROLES:
            raise ValidationFailed(f"role must be one of {', '.join(auth.ROLES)}")
        secret = auth.new_key()
        record = await keys.insert(self._pool, key_id=uuid.uuid4(), name=name, key_hash=auth.hash_key(secret),
                                   role=role, scopes=auth.check_grants(scopes))
        if record is None:
            raise Conflict(f"an active key is already named {name!r}")
        return secret, record

    @_speaks_domain_errors
    async def list_keys(self, principal: auth.Principal) -> list[ApiKey]:
        """Every key, revoked ones too, oldest first; never a secret. Admin only."""
        principal.require("admin")
        return await keys.list_all(self._pool)

    @_speaks_domain_errors
    async def revoke_key(self, principal: auth.Principal, key_id: UUID) -> ApiKey:
        """Revoke a key (idempotent: a revoked key keeps its first revocation time). Admin only.
        Raises NotFound for an unknown id, Conflict for the last active admin key granted every
        scope: without it nobody could create or revoke keys."""
        principal.require("admin")
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                superadmins = await keys.lock_active_superadmins(conn)
                if superadmins == [key_id]:
                    raise Conflict("this is the last active admin key granted '*': create another first")
                record = await keys.revoke(conn, key_id)
                if record is None:
                    raise NotFound(f"no key {key_id}")
        self.forget_principals()  # at once here; other API processes hear keys.REVOKED
        return record

    # -- remember -----------------------------------------------------------------------------

    @_speaks_domain_errors
    async def remember(self, principal: auth.Principal, req: RememberRequest, *,
                       request_id: str | None = None, path: str = "http",
                       model: ModelAttribution = NO_MODEL) -> RememberResponse:
        """Save the memory durably and answer as `req.mode` asks.

        The raw memory, its ADD history event and its job are written in one transaction (shared
        with the remembers that arrive meanwhile: engram.group_commit), and nothing else
        happens on the request: the worker's dispatcher batches the job, so a
        remember never waits on Temporal or a model. `auto` and `sync` then wait for the first
        pass, except that `auto` answers at once `raw_saved` while every LLM provider is known
        to be down, and `queued` while the write queue is deeper than its bound. Raises
        ValidationFailed, Forbidden, Conflict (an idempotency key reused with a different
        request).
        """
        principal.require("remember", req.scope)
        await self._control.check(req.scope)
        s = self._settings
        timeout_ms = req.pipeline_timeout_ms if req.pipeline_timeout_ms is not None else s.pipeline_timeout_ms_default
        down = None if req.raw else await self._availability.chain_down()

        async def write(conn: asyncpg.Connection, stats: repo.StatsDelta | None = None) -> _Written | RememberResponse:
            return await self._write(conn, principal, req, request_id, raw_saved=down is not None, stats=stats,
                                     path=path, model=model)

        # A remember that begins a session ends the scope's other sessions in its transaction,
        # and two in one group would end each other's: those keep a transaction of their own.
        if self._group is not None and req.session_id is None:
            written = await self._group.write(write, order=(_scope_order(req.scope), normalize(req.content)))
        else:
            async with self._pool.acquire() as conn:
                async with conn.transaction():
                    written = await write(conn)
                    if isinstance(written, _Written) and written.session is not None:
                        await drafts.end_earlier_sessions(conn, [written.session])
        if isinstance(written, RememberResponse):
            return written
        if written.duplicate:
            answer = await self._answer_for_existing(written.memory_id,
                                                     [DUPLICATE])
        elif written.approval_id is not None:
            answer = _pending_answer(written)
        else:
            answer = await self._answer(written, req, down, timeout_ms / 1000)
        if req.idempotency_key:
            await idempotency.store_response(self._pool, principal.id, req.idempotency_key,
                                             answer.model_dump(mode="json"))
        return answer

    @_speaks_domain_errors
    async def remember_batch(self, principal: auth.Principal, items: list[dict], *,
                             request_id: str | None = None, path: str = "http",
                             model: ModelAttribution = NO_MODEL) -> RememberBatchResponse:
        """Write every valid item, each as `remember` would in `async` mode (or `raw_saved` while
        every provider is down), in one transaction with a savepoint per item, under one import
        job whose progress counts the items' processing. An item that is invalid, forbidden or
        conflicts gets its own error and is not stored; the others are. Raises ValidationFailed
        for more than `remember_batch_max` items.

        With `import_handoff_s`, the items are staged in one statement and a worker writes them
        (`write_staged`, at the worker's niceness): the API process, whose one event loop and
        GIL also answer searches, only waits. A batch no worker has taken by then, the API
        writes itself."""
        principal.require("remember")
        limit = self._settings.remember_batch_max
        if len(items) > limit:
            raise ValidationFailed(f"items: at most {limit} per request (got {len(items)}); split the import")
        if not self._settings.import_handoff_s or self._imports is None:
            async with self._pool.acquire() as conn:
                return await self._write_batch(conn, principal, items, uuid.uuid4(), request_id, path, model)
        batch_id = uuid.uuid4()
        with self._imports.watch(batch_id) as written:  # before staging: its notification cannot be missed
            await import_batches.stage(self._pool, batch_id, principal=dataclasses.asdict(principal), items=items,
                                       request_id=request_id, path=path, model=dataclasses.asdict(model))
            return await self._collect(batch_id, written)

    async def _collect(self, batch_id: UUID, written: asyncio.Event) -> RememberBatchResponse:
        """The staged batch's answer: written by a worker, or here if none has taken it within
        `import_handoff_s`. One a worker is writing is waited for, up to IMPORT_WAIT_S."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:
            if (answer := await import_batches.collect(self._pool, batch_id)) is not None:
                return RememberBatchResponse.model_validate(answer)
            waited = loop.time() - started
            if waited >= self._settings.import_handoff_s:
                if (answer := await self.write_staged(batch_id)) is not None:
                    await import_batches.collect(self._pool, batch_id)
                    log.info("the API wrote a bulk remember itself: no worker took it in time",
                             extra={"import_id": str(batch_id), "waited_s": round(waited, 1)})
                    return answer
                if waited >= IMPORT_WAIT_S:  # a worker holds it this long: it stays staged, and is written
                    raise ImportStillWriting(
                        f"a worker is still writing the import after {IMPORT_WAIT_S:.0f} s; its items are staged "
                        "and will be stored: send it again with the same Idempotency-Key for their answers")
            until_handoff = self._settings.import_handoff_s - waited
            try:
                async with asyncio.timeout(until_handoff if until_handoff > 0 else 1.0):  # not wait_for: NewJobs.wait
                    await written.wait()
            except TimeoutError:
                pass
            written.clear()

    async def write_staged(self, batch_id: UUID | None = None) -> RememberBatchResponse | None:
        """Take a staged bulk remember (`batch_id`, or the oldest) and write it in the transaction
        that holds it, its answer with it. None if there is none to take (written, or another
        process holds it)."""
        taken = None
        try:
            async with self._pool.acquire() as conn:
                async with conn.transaction():
                    batch = await import_batches.take(conn, batch_id)
                    if batch is None:
                        return None
                    taken, p = batch["id"], batch["principal"]
                    principal = auth.Principal(id=p["id"], name=p["name"], role=p["role"], grants=tuple(p["grants"]))
                    answer = await self._write_batch(conn, principal, batch["items"], taken, batch["request_id"],
                                                     batch["path"], ModelAttribution(**batch["model"]))
                    await import_batches.answer(conn, taken, answer.model_dump(mode="json"))
        except Exception:
            if taken is not None:  # rolled back: still staged, for the next taker
                with contextlib.suppress(*pool_module.UNREACHABLE, asyncpg.PostgresError):
                    await import_batches.failed(self._pool, taken)
            raise
        return answer

    async def _write_batch(self, conn: asyncpg.Connection, principal: auth.Principal, items: list, import_id: UUID,
                           request_id: str | None, path: str, model: ModelAttribution) -> RememberBatchResponse:
        """`remember_batch`'s write, in one transaction (a savepoint of the caller's, if it has
        one), which also ends the scopes' sessions before the ones its items began.

        Items are written in (scope, content) order, so two imports holding the same texts
        cannot deadlock on them, and their BM25 statistics are written once, at the end."""
        principal.require("remember")
        down = await self._availability.chain_down()
        results: dict[int, RememberItemResult] = {}
        valid: list[tuple[int, RememberItem]] = []
        for index, item in enumerate(items):
            try:
                req = RememberItem.model_validate(item)
                principal.require("remember", req.scope)
                await self._control.check(req.scope)
            except PydanticValidationError as err:
                results[index] = _item_error(index, ValidationFailed(_describe(err)))
            except EngramError as err:
                results[index] = _item_error(index, err)
            else:
                valid.append((index, req))
        valid.sort(key=lambda item: (_scope_order(item[1].scope), normalize(item[1].content)))
        stats = repo.StatsDelta()
        sessions: dict[tuple, tuple[int, drafts.Session]] = {}  # per scope, the last item's (by index)
        async with conn.transaction():
            await jobs.insert(conn, job_id=import_id, memory_id=None, job_type="import", max_attempts=1,
                              payload={"principal": principal.id, "items": len(items)})
            for index, req in valid:
                item_stats = repo.StatsDelta()
                try:
                    async with conn.transaction():  # a savepoint: a failed item undoes only itself
                        written = await self._write(conn, principal, req, request_id,
                                                    raw_saved=down is not None and not req.raw,
                                                    parent_id=import_id, stats=item_stats, path=path,
                                                    model=model)
                except EngramError as err:
                    results[index] = _item_error(index, err)
                    continue
                stats.merge(item_stats)
                results[index] = await self._item_answer(conn, principal, index, req, written, down)
                if isinstance(written, _Written) and written.session is not None:
                    scope = _scope_order(req.scope)
                    if index >= sessions.get(scope, (-1, None))[0]:
                        sessions[scope] = (index, written.session)
            await drafts.end_earlier_sessions(conn, [s for _, s in sessions.values()])
            await repo.add_stats(conn, stats)
        stored = sum(r.error is None for r in results.values())
        return RememberBatchResponse(job_id=import_id, stored=stored, failed=len(items) - stored,
                                     results=[results[i] for i in range(len(items))])

    async def _item_answer(self, conn: asyncpg.Connection, principal: auth.Principal, index: int, req: RememberItem,
                           written: _Written | RememberResponse, down: str | None) -> RememberItemResult:
        """A stored bulk item's result, kept for its idempotency key."""
        if isinstance(written, RememberResponse):  # a replay: answer as the first request did
            return RememberItemResult(index=index, **written.model_dump())
        if written.duplicate:
            answer = await self._answer_for_existing(
                written.memory_id, [DUPLICATE], conn)
        elif written.approval_id is not None:
            answer = _pending_answer(written)
        else:
            status = "raw_saved" if down is not None and not req.raw else "queued"
            answer = RememberResponse(memory_id=written.memory_id, job_id=written.job_id, status=status)
        if req.idempotency_key:
            await idempotency.store_response(conn, principal.id, req.idempotency_key, answer.model_dump(mode="json"))
        return RememberItemResult(index=index, **answer.model_dump())

    async def _write(self, conn: asyncpg.Connection, principal: auth.Principal, req: RememberItem,
                     request_id: str | None, *, raw_saved: bool, parent_id: UUID | None = None,
                     stats: repo.StatsDelta | None = None, path: str = "http",
                     model: ModelAttribution = NO_MODEL) -> _Written | RememberResponse:
        """Write the memory and its job in the caller's transaction; or the duplicate it is; or,
        for an idempotency key already bound, the answer the first request gave."""
        memory_id, job_id = uuid.uuid4(), uuid.uuid4()
        request_hash = _request_hash(req)
        claimed = not req.idempotency_key or await idempotency.claim(
            conn, principal=principal.id, key=req.idempotency_key, request_hash=request_hash,
            memory_id=memory_id, job_id=job_id,
        )
        if not claimed:  # another request holds this idempotency key: answer as it did
            return await self._replay(conn, principal, req.idempotency_key, request_hash)
        now = self.clock()
        draft = drafts.draft_of(self._settings, principal.id, req, now)
        if await repo.insert_raw(conn, draft, memory_id=memory_id, actor=principal.id,
                                 stemmer=self._settings.bm25_stemmer,
                                 extraction_status="unprocessed" if raw_saved else "pending", request_id=request_id,
                                 stats=stats, actor_type=principal.role, path=path, model=model):
            payload = {"extract": not req.raw}
            approval_id = None
            if draft.approval == "pending":
                approval_id = await drafts.hold_for_approval(conn, self._settings, memory_id, draft, principal.id, now)
                payload["approval"] = str(approval_id)  # its extraction waits for the approval
            await jobs.insert(conn, job_id=job_id, memory_id=memory_id, job_type="extract",
                              max_attempts=self._settings.extraction_max_attempts, payload=payload,
                              parent_id=parent_id, outcome="raw_saved" if raw_saved else None)
            session = None
            # A write held for approval begins no session: it may yet be rejected.
            if draft.session_id is not None and self._settings.trust_and_lifetimes and draft.approval is None:
                session = drafts.Session(req.scope, draft.session_id, now)
            return _Written(memory_id, job_id, duplicate=False, approval_id=approval_id, session=session)
        existing = await repo.find_live_by_hash(conn, req.scope, content_hash(normalize(req.content)))
        # Said again after it expired: it lives again, as long as this write would have.
        await repo.renew(conn, existing, draft.expires_at, now)
        if req.idempotency_key:
            await idempotency.rebind(conn, principal.id, req.idempotency_key, existing)
        return _Written(existing, None, duplicate=True)

    async def _replay(self, conn: asyncpg.Connection, principal: auth.Principal, key: str, request_hash: str
                      ) -> RememberResponse:
        row = await idempotency.find(conn, principal.id, key)
        if row["request_hash"] != request_hash:
            raise Conflict("idempotency_key was already used with a different request")
        if row["response"] is not None:
            return RememberResponse.model_validate(row["response"])
        # The first request is still running: report where it stands.
        return await self._answer_for_existing(row["memory_id"], ["replay: the first request is still in flight"],
                                               conn)

    async def _answer_for_existing(self, memory_id: UUID, warnings: list[str],
                                   conn: asyncpg.Connection | None = None) -> RememberResponse:
        job = await jobs.latest_for_memory(conn or self._pool, memory_id)
        status = job.outcome if job is not None and job.outcome else "queued"
        approval_id = await approvals.waiting_for(conn or self._pool, memory_id)
        if approval_id is not None:  # the memory it duplicates waits for approval: say so, not "stored"
            status, warnings = "pending_approval", [*warnings, f"approval_required: it waits for approval {approval_id}"]
        return RememberResponse(memory_id=memory_id, status=status, job_id=job.id if job else None, warnings=warnings,
                                approval_id=approval_id)

    async def _answer(self, written: _Written, req: RememberRequest, down: str | None, timeout_s: float
                      ) -> RememberResponse:
        memory_id, job_id = written.memory_id, written.job_id
        if req.mode == "async":
            return RememberResponse(memory_id=memory_id, status="queued", job_id=job_id)
        if down is not None:
            return RememberResponse(memory_id=memory_id, status="raw_saved", job_id=job_id, warnings=[
                f"provider_unavailable: every LLM provider is down ({down}); saved raw, embedded shortly; "
                "extraction resumes when one answers"])
        if req.mode == "auto" and (busy := await self._write_queue_busy()):
            return RememberResponse(memory_id=memory_id, status="queued", job_id=job_id, warnings=[busy])
        wait = MAX_PIPELINE_TIMEOUT_MS / 1000 if req.mode == "sync" else timeout_s
        outcome = await self._pipeline.wait_first_pass(job_id, wait)
        if outcome is None:
            return RememberResponse(memory_id=memory_id, status="queued", job_id=job_id,
                                    warnings=["pipeline_timeout: still processing; poll the job"])
        warnings = ["provider_unavailable: saved raw; extraction will be retried"] if outcome == "raw_saved" else []
        return RememberResponse(memory_id=memory_id, status=outcome, job_id=job_id, warnings=warnings)

    async def _write_queue_busy(self) -> str | None:
        """Why `auto` should not wait for the first pass: the write queue is deeper than its
        bound, or its oldest job has waited past `pipeline_stall_s` (the worker or Temporal is
        down or far behind). Read at most every half second."""
        read_at, (depth, oldest_s) = self._queue_state
        if time.monotonic() - read_at > 0.5:
            depth, oldest_s = await jobs.write_queue(self._pool)
            self._queue_state = (time.monotonic(), (depth, oldest_s))
        if depth > self._settings.write_queue_bound:
            return f"backpressure: {depth} memories wait for processing; saved, and processed in turn: poll the job"
        if oldest_s > self._settings.pipeline_stall_s:
            return (f"pipeline_unavailable: the oldest of {depth} waiting memories has waited {oldest_s:.0f} s; "
                    "saved, and processed when the pipeline is back: poll the job")
        return None

    # -- recall -------------------------------------------------------------------------------

    @_speaks_domain_errors
    async def search(self, principal: auth.Principal, req: SearchRequest, *,
                     min_score: float | None = None) -> SearchResponse:
        principal.require("search", req.scope)
        s = self._settings
        top_n = req.rerank_top_n if req.rerank_top_n is not None else s.rerank_top_n
        rerank = s.rerank_default if req.rerank is None else req.rerank
        if rerank and not self._recall.can_rerank:
            raise ValidationFailed("rerank is off on this server (ENGRAM_RERANK_MODEL=none)")
        filters = resolve(req.filters, principal.visibility, include_deleted=req.include_deleted,
                          include_expired=req.include_expired, now=self.clock())
        # A result whose row does not match its history is quarantined and leaves recall at once.
        hits, warnings, explain = await self._recall.search(
            req.query, req.scope, filters, RecallOptions(limit=req.limit, rerank=rerank, rerank_top_n=top_n,
                                                          min_score=min_score),
            verify=self._integrity.judge)
        self._accesses.add([h.memory.id for h in hits])
        return SearchResponse(results=hits, warnings=warnings, explain=explain.stages if req.explain else None)

    @_speaks_domain_errors
    async def get(self, principal: auth.Principal, memory_id: UUID) -> Memory:
        """A memory by id. One from a scope the caller may not touch looks exactly like a missing one."""
        principal.require("read")
        memory = await repo.get(self._pool, memory_id)
        if memory is None or not principal.may_touch(_scope_of(memory)):
            raise NotFound(f"no memory {memory_id}")
        if await self._integrity.check([memory_id]):
            memory = await repo.get(self._pool, memory_id)  # quarantined: say so
        return memory

    @_speaks_domain_errors
    async def list(self, principal: auth.Principal, scope: Scope, f: SearchFilters, *, include_deleted: bool,
                   cursor: str | None, limit: int, status: str | None = None,
                   include_expired: bool = False) -> MemoryPage:
        """The memories in `scope` that the caller may see, newest first, a page of `limit`; of
        one `status` if given (else live ones, deleted ones too with `include_deleted`); past
        their lifetime only with `include_expired`."""
        principal.require("read", scope)
        if status == "pending":  # writes held back as possible poison: for those who decide on them
            principal.require("approve")
        after = _decode_cursor(cursor) if cursor else None
        filters = resolve(f, principal.visibility, include_deleted=include_deleted, now=self.clock(), status=status,
                          include_expired=include_expired)
        items = await repo.list_page(self._pool, scope, filters, after=after, limit=limit)
        next_cursor = _encode_cursor(items[-1]) if len(items) == limit else None
        if quarantined := await self._integrity.check([m.id for m in items]):
            fresh = {m.id: m for m in await repo.get_many(self._pool, list(quarantined))}
            items = [fresh.get(m.id, m) for m in items if status == "quarantined" or m.id not in quarantined]
        return MemoryPage(items=items, next_cursor=next_cursor)

    @_speaks_domain_errors
    async def job(self, principal: auth.Principal, job_id: UUID) -> Job:
        principal.require("read")
        job = await jobs.get(self._pool, job_id)
        if job is not None and job.memory_id is None:
            if principal.may("admin") or await jobs.owner_of(self._pool, job_id) == principal.id:
                return job  # a service-wide job (a re-embed: admins only) or the caller's own import
            raise NotFound(f"no job {job_id}")
        memory = await repo.get(self._pool, job.memory_id) if job and job.memory_id else None
        if job is None or memory is None or not principal.may_touch(_scope_of(memory)):
            raise NotFound(f"no job {job_id}")
        return job

    # -- lifecycle ----------------------------------------------------------------------------

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception())

    async def aclose(self) -> None:
        """Let off-the-hot-path work (access counts, async starts) and queued writes finish."""
        if self._group is not None:
            await self._group.aclose()
        await self._accesses.aclose()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)


def _pending_answer(written: _Written) -> RememberResponse:
    return RememberResponse(memory_id=written.memory_id, status="pending_approval", job_id=written.job_id,
                            approval_id=written.approval_id, warnings=[
                                "approval_required: stored, and out of recall until an operator approves it "
                                f"(approval {written.approval_id})"])


def _scope_of(memory: Memory) -> Scope:
    return Scope.model_construct(user_id=memory.user_id, agent_id=memory.agent_id, run_id=memory.run_id)


def _scope_order(scope: Scope) -> tuple[str, str, str]:
    return repo.scope_order((scope.user_id, scope.agent_id, scope.run_id))


def _item_error(index: int, err: EngramError) -> RememberItemResult:
    return RememberItemResult(index=index, error=ItemError(type=err.type, detail=err.detail))


def _describe(err: PydanticValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'item'}: {e['msg'].removeprefix('Value error, ')}"
                     for e in err.errors())


def _request_hash(req: RememberItem) -> str:
    body = req.model_dump(mode="json", exclude={"idempotency_key", "mode", "pipeline_timeout_ms"})
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _encode_cursor(memory: Memory) -> str:
    return _cursor_text(memory.created_at, memory.id)


def _cursor_text(created_at: datetime, memory_id: UUID) -> str:
    return base64.urlsafe_b64encode(f"{created_at.isoformat()}|{memory_id}".encode()).decode()


def _decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    """The (created_at, id) a cursor of `_encode_cursor` holds. Raises ValidationFailed for
    anything else: a cursor is opaque, and only what `_encode_cursor` writes is read back."""
    try:
        text = base64.b64decode(cursor.encode("ascii"), altchars=b"-_", validate=True).decode("ascii")
        created, memory_id = text.split("|")
        position = datetime.fromisoformat(created), UUID(memory_id)
        if position[0].tzinfo is None or _cursor_text(*position) != cursor:
            raise ValueError("not a cursor this service wrote")
        return position
    except (ValueError, OverflowError):  # UnicodeError and binascii.Error are ValueErrors
        raise ValidationFailed("bad cursor: pass back a next_cursor exactly as it came") from None
