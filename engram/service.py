"""The one service layer every gateway (HTTP, CLI through HTTP, agent integrations) calls."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import uuid
from datetime import datetime, timezone
from typing import Callable, Protocol
from uuid import UUID

import asyncpg

from engram.domain import auth
from engram.domain.errors import Conflict, NotFound, Unauthenticated, ValidationFailed
from engram.domain.filters import Filters, resolve
from engram.domain.models import (
    MAX_PIPELINE_TIMEOUT_MS, ApiKey, Job, Memory, MemoryPage, RememberRequest, RememberResponse, Scope,
    SearchFilters, SearchRequest, SearchResponse,
)
from engram.domain.text import content_hash, normalize
from engram.recall.pipeline import Recall, RecallOptions
from engram.settings import Settings
from engram.store import idempotency, jobs, keys
from engram.store import memories as repo

log = logging.getLogger(__name__)


class Pipeline(Protocol):
    """Starts and observes the durable remember pipeline (Temporal, behind this seam)."""

    async def start(self, job_id: UUID, *, extract: bool = True) -> bool:
        """Start a remember job's workflow (`extract`: False for a raw save). True if it runs (or
        already ran); False if the orchestrator is unreachable, in which case the outbox
        dispatcher starts it later."""

    async def wait_first_pass(self, job_id: UUID, timeout_s: float) -> str | None:
        """The first pass's outcome ("processed" or "raw_saved"), or None if not within the timeout."""


class MemoryService:
    def __init__(self, settings: Settings, pool: asyncpg.Pool, recall: Recall, pipeline: Pipeline,
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> None:
        self._settings = settings
        self._pool = pool
        self._recall = recall
        self._pipeline = pipeline
        self._clock = clock
        self._background: set[asyncio.Task] = set()

    # -- principals ---------------------------------------------------------------------------

    async def authenticate(self, key: str | None) -> auth.Principal:
        if not key:
            raise Unauthenticated("missing API key: send 'Authorization: Bearer <key>' or 'X-API-Key'")
        row = await keys.find_active(self._pool, auth.hash_key(key))
        if row is None:
            raise Unauthenticated("unknown or revoked API key")
        return auth.Principal(id=f"key:{row['id']}", name=row["name"], role=row["role"], grants=tuple(row["scopes"]))

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

    async def list_keys(self, principal: auth.Principal) -> list[ApiKey]:
        """Every key, revoked ones too, oldest first; never a secret. Admin only."""
        principal.require("admin")
        return await keys.list_all(self._pool)

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
        return record

    # -- remember -----------------------------------------------------------------------------

    async def remember(self, principal: auth.Principal, req: RememberRequest, *,
                       request_id: str | None = None) -> RememberResponse:
        """Save the memory durably, then run (or queue) the pipeline.

        The raw memory, its ADD history event and its job are written in one transaction before
        any external call: whatever fails afterwards, the memory is kept and the job's workflow
        is started by the outbox dispatcher. Raises ValidationFailed, Forbidden, Conflict (an
        idempotency key reused with a different request).
        """
        principal.require("remember", req.scope)
        s = self._settings
        timeout_ms = req.pipeline_timeout_ms if req.pipeline_timeout_ms is not None else s.pipeline_timeout_ms_default

        replay = await self._write_memory(principal, req, request_id)
        if isinstance(replay, RememberResponse):
            return replay
        memory_id, job_id, duplicate = replay
        if duplicate:
            answer = await self._answer_for_existing(memory_id, ["duplicate: this scope already holds this memory"])
        else:
            answer = await self._run_pipeline(memory_id, job_id, req, timeout_ms / 1000)
        if req.idempotency_key:
            await idempotency.store_response(self._pool, principal.id, req.idempotency_key,
                                             answer.model_dump(mode="json"))
        return answer

    async def _write_memory(self, principal: auth.Principal, req: RememberRequest, request_id: str | None):
        memory_id, job_id = uuid.uuid4(), uuid.uuid4()
        request_hash = _request_hash(req)
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                claimed = not req.idempotency_key or await idempotency.claim(
                    conn, principal=principal.id, key=req.idempotency_key, request_hash=request_hash,
                    memory_id=memory_id, job_id=job_id,
                )
                if claimed:
                    if await repo.insert_raw(conn, req.draft(), memory_id=memory_id, actor=principal.id,
                                             stemmer=self._settings.bm25_stemmer, extraction_status="pending",
                                             request_id=request_id):
                        await jobs.insert(conn, job_id=job_id, memory_id=memory_id, job_type="extract",
                                          max_attempts=self._settings.extraction_max_attempts,
                                          payload={"extract": not req.raw})
                        return memory_id, job_id, False
                    existing = await repo.find_live_by_hash(conn, req.scope, content_hash(normalize(req.content)))
                    if req.idempotency_key:
                        await idempotency.rebind(conn, principal.id, req.idempotency_key, existing)
                    return existing, None, True
        # Another request holds this idempotency key: answer as it did.
        return await self._replay(principal, req.idempotency_key, request_hash)

    async def _replay(self, principal: auth.Principal, key: str, request_hash: str) -> RememberResponse:
        row = await idempotency.find(self._pool, principal.id, key)
        if row["request_hash"] != request_hash:
            raise Conflict("idempotency_key was already used with a different request")
        if row["response"] is not None:
            return RememberResponse.model_validate(row["response"])
        # The first request is still running: report where it stands.
        return await self._answer_for_existing(row["memory_id"], ["replay: the first request is still in flight"])

    async def _answer_for_existing(self, memory_id: UUID, warnings: list[str]) -> RememberResponse:
        job = await jobs.latest_for_memory(self._pool, memory_id)
        status = job.outcome if job is not None and job.outcome else "queued"
        return RememberResponse(memory_id=memory_id, status=status, job_id=job.id if job else None, warnings=warnings)

    async def _run_pipeline(self, memory_id: UUID, job_id: UUID, req: RememberRequest, timeout_s: float
                            ) -> RememberResponse:
        mode, extract = req.mode, not req.raw
        if mode == "async":
            self._spawn(self._pipeline.start(job_id, extract=extract))
            return RememberResponse(memory_id=memory_id, status="queued", job_id=job_id)
        if not await self._pipeline.start(job_id, extract=extract):
            return RememberResponse(memory_id=memory_id, status="raw_saved", job_id=job_id,
                                    warnings=["pipeline_unavailable: saved raw; processing resumes when it is back"])
        wait = MAX_PIPELINE_TIMEOUT_MS / 1000 if mode == "sync" else timeout_s
        outcome = await self._pipeline.wait_first_pass(job_id, wait)
        if outcome is None:
            return RememberResponse(memory_id=memory_id, status="queued", job_id=job_id,
                                    warnings=["pipeline_timeout: still processing; poll the job"])
        warnings = ["provider_unavailable: saved raw; extraction will be retried"] if outcome == "raw_saved" else []
        return RememberResponse(memory_id=memory_id, status=outcome, job_id=job_id, warnings=warnings)

    # -- recall -------------------------------------------------------------------------------

    async def search(self, principal: auth.Principal, req: SearchRequest) -> SearchResponse:
        principal.require("search", req.scope)
        s = self._settings
        top_n = req.rerank_top_n if req.rerank_top_n is not None else s.rerank_top_n
        rerank = s.rerank_default if req.rerank is None else req.rerank
        if rerank and not self._recall.can_rerank:
            raise ValidationFailed("rerank is off on this server (ENGRAM_RERANK_MODEL=none)")
        filters = self._filters(principal, req.filters, req.include_deleted)
        hits, warnings, explain = await self._recall.search(
            req.query, req.scope, filters, RecallOptions(limit=req.limit, rerank=rerank, rerank_top_n=top_n))
        if hits:
            self._spawn(repo.bump_access(self._pool, [h.memory.id for h in hits]))
        return SearchResponse(results=hits, warnings=warnings, explain=explain.stages if req.explain else None)

    def _filters(self, principal: auth.Principal, asked: SearchFilters, include_deleted: bool) -> Filters:
        return resolve(asked, principal.visibility, include_deleted=include_deleted, now=self._clock())

    async def get(self, principal: auth.Principal, memory_id: UUID) -> Memory:
        """A memory by id. One from a scope the caller may not touch looks exactly like a missing one."""
        principal.require("read")
        memory = await repo.get(self._pool, memory_id)
        if memory is None or not principal.may_touch(_scope_of(memory)):
            raise NotFound(f"no memory {memory_id}")
        return memory

    async def list(self, principal: auth.Principal, scope: Scope, f: SearchFilters, *, include_deleted: bool,
                   cursor: str | None, limit: int) -> MemoryPage:
        """The memories in `scope` that the caller may see, newest first, a page of `limit`."""
        principal.require("read", scope)
        after = _decode_cursor(cursor) if cursor else None
        items = await repo.list_page(self._pool, scope, self._filters(principal, f, include_deleted),
                                     after=after, limit=limit)
        next_cursor = _encode_cursor(items[-1]) if len(items) == limit else None
        return MemoryPage(items=items, next_cursor=next_cursor)

    async def job(self, principal: auth.Principal, job_id: UUID) -> Job:
        principal.require("read")
        job = await jobs.get(self._pool, job_id)
        if job is not None and job.memory_id is None and principal.may("admin"):
            return job  # a service-wide job (a re-embed): admins only
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
        """Let off-the-hot-path work (access counts, async starts) finish."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)


def _scope_of(memory: Memory) -> Scope:
    return Scope.model_construct(user_id=memory.user_id, agent_id=memory.agent_id, run_id=memory.run_id)


def _request_hash(req: RememberRequest) -> str:
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
