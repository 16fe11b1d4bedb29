"""The steps of a ReviewWorkflow (workflows/review.py): escalate a review, and apply how it
ends. Idempotent, as Temporal may run a step again: a review already closed is left as it is.
activities/review.py adapts these to Temporal and owns nothing else."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from uuid import UUID

import asyncpg

from engram.changes import MemoryChanges
from engram.control import Control
from engram.domain import auth
from engram.domain.changes import ChangeContext
from engram.domain.control import Frozen
from engram.domain.errors import EngramError, NotFound
from engram.inference.embedding_spaces import EmbeddingSpaces
from engram.store import jobs, reviews

log = logging.getLogger(__name__)
EXPIRY_ACTOR = "system:review"


class Waiting(Exception):
    """The resolution cannot be applied yet (the scope is frozen, or the kill switch holds an
    expiry's automatic change): nothing changed, and the step is to run again later."""


@dataclass(frozen=True)
class Resolved:
    status: str  # resolved or expired (or what an earlier run closed it as)
    detail: str | None


async def escalate(pool: asyncpg.Pool, review_id: UUID, *, actor: str, reason: str) -> None:
    await reviews.escalate(pool, review_id, actor=actor, reason=reason)


async def resolve(pool: asyncpg.Pool, changes: MemoryChanges, spaces: EmbeddingSpaces, control: Control,
                  review_id: UUID, *, resolution: str, actor: str, role: str, reason: str, content: str | None,
                  path: str, expired: bool) -> Resolved:
    """Apply `resolution` to the review's two facts, as `actor` (in `role`; the expiry's default
    acts as an automatic actor, which a person's lock and the kill switch hold off), and close
    the review and its job, in one transaction. A change the memories refuse (a pin, a lock, a
    deleted memory) closes the review all the same, saying so in `detail`. Raises NotFound for
    an unknown review, and Waiting, with nothing changed, while the scope is frozen or (for an
    expiry that changes something) the kill switch is on."""
    vectors = await spaces.embed_text(content) if resolution == "merge" and content else None
    principal = (auth.Principal(id=EXPIRY_ACTOR, name="review expiry", role="agent", grants=("*",)) if expired
                 else auth.Principal(id=actor, name=actor, role=role, grants=("*",)))
    ctx = ChangeContext(path=path if not expired else EXPIRY_ACTOR)
    why = f"review {review_id}: {resolution}: {reason}"
    async with pool.acquire() as conn:
        async with conn.transaction():
            review = await reviews.get(conn, review_id, lock=True)
            if review is None:
                raise NotFound(f"no review {review_id}")
            if review.status in ("resolved", "expired"):
                return Resolved(review.status, review.detail)
            if expired and resolution != "keep_both" and not await control.autonomous_allowed(conn):
                raise Waiting("the kill switch is on: the review's default waits until it is off")
            detail = None
            try:
                async with conn.transaction():
                    await _apply(conn, changes, principal, review, resolution, why, ctx, content, vectors)
            except Frozen as err:
                raise Waiting(err.detail) from err
            except EngramError as err:
                detail = f"not applied: {err.type}: {err.detail}"
            status = "expired" if expired else "resolved"
            await reviews.close(conn, review_id, status=status, resolution=resolution, actor=principal.id,
                                reason=reason, merged_content=content if resolution == "merge" else None,
                                detail=detail)
            await jobs.finish(conn, review_id, status="done")
    log.info("review closed", extra={"stage": "review", "outcome": f"{status} {resolution}",
                                     "memory_id": str(review.new.id)})
    return Resolved(status, detail)


async def _apply(conn: asyncpg.Connection, changes: MemoryChanges, principal: auth.Principal, review, resolution: str,
                 why: str, ctx: ChangeContext, content: str | None, vectors) -> None:
    force = principal.may("force_delete")
    if resolution == "keep_existing":
        await changes.apply_in(conn, principal, review.new.id, "DELETE", reason=why, if_version=None, ctx=ctx,
                               force=force)
    elif resolution == "replace":
        await changes.apply_in(conn, principal, review.existing.id, "DELETE", reason=why, if_version=None, ctx=ctx,
                               force=force)
    elif resolution == "merge":
        # The new fact goes first: merged content that is its very text is then no twin of it.
        await changes.apply_in(conn, principal, review.new.id, "DELETE", reason=why, if_version=None, ctx=ctx,
                               force=force)
        await changes.update_in(conn, principal, review.existing.id, content=content, vectors=vectors, reason=why,
                                ctx=ctx)
