"""The steps of a BatchForgetWorkflow after its confirmation (activities/forget.py adapts them):
moving the operation's status, deleting its items a chunk at a time, and the erasure receipt.

Every step is idempotent. An item's delete, its DELETE event (whose request id is the
operation's id: the correlation id) and its move from `pending` share one transaction, so a
run resumed after a crash takes up exactly the items still pending: nothing is deleted twice.
An item whose memory changed since the preview (another version), or went, is not deleted
and says so; so is one the service refuses to delete (quarantined, under a person's lock
against an agent's request): `refused`, with why. A freeze of the item's scope is not a
refusal: the item waits for it to be lifted while the others go on.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import asyncpg

from engram.changes import MemoryChanges
from engram.control import Control
from engram.domain import auth
from engram.domain.changes import ChangeContext
from engram.domain.control import Frozen
from engram.domain.errors import EngramError, NotFound, VersionConflict
from engram.domain.forget import RECEIPT_SECRET, sign
from engram.domain.models import Scope
from engram.store import changes as store
from engram.store import history, operations

WORKFLOW_PATH = operations.WORKFLOW_ACTOR


@dataclass(frozen=True)
class Chunk:
    settled: int  # items settled by this step
    remaining: int  # items still pending


async def set_status(pool: asyncpg.Pool, operation_id: str, status: str, *, approver: str | None = None,
                     event: str | None = None, actor: str | None = None, reason: str | None = None) -> bool:
    return await operations.set_status(pool, operation_id, status, approver=approver, event=event,
                                       actor=actor or operations.WORKFLOW_ACTOR, reason=reason)


async def delete_chunk(pool: asyncpg.Pool, changes: MemoryChanges, control: Control, operation_id: str,
                       limit: int) -> Chunk:
    """Delete up to `limit` pending items, each in its own transaction with its record. An item
    whose scope is frozen stays pending while the others go on; then Frozen is raised, so the
    activity retries (with its backoff) until the freeze is lifted."""
    op = await operations.get(pool, operation_id)
    await control.check(Scope(**op["scope"]))
    # The requester, as the preview checked it (role, scope): the items are inside its scope.
    principal = auth.Principal(id=op["requester"], name="batch forget", role=op["role"], grants=("*",))
    ctx = ChangeContext(path=WORKFLOW_PATH, request_id=operation_id)
    settled, held = 0, None
    for memory_id in await operations.pending_items(pool, operation_id, limit):
        try:
            async with pool.acquire() as conn:
                async with conn.transaction():
                    item = await operations.lock_item(conn, operation_id, memory_id)
                    if item["state"] != "pending":
                        continue  # another run of this step settled it
                    await _delete_one(conn, changes, principal, op, item, ctx)
        except Frozen as err:
            held = err
            continue
        settled += 1
    await store.wake_index_sync(pool)  # the deleted points leave the vector index now, not at its next poll
    if held is not None:
        raise held
    remaining = len(await operations.pending_items(pool, operation_id, 1))
    return Chunk(settled=settled, remaining=remaining)


async def _delete_one(conn: asyncpg.Connection, changes: MemoryChanges, principal: auth.Principal, op, item,
                      ctx: ChangeContext) -> None:
    memory_id = item["memory_id"]
    try:
        async with conn.transaction():  # a savepoint: a refused delete leaves only its record to write
            memory = await changes.apply_in(conn, principal, memory_id, "DELETE", reason=op["reason"],
                                            if_version=item["version"], ctx=ctx, force=op["force"])
    except (VersionConflict, NotFound):
        await operations.settle_item(conn, op["id"], memory_id, "changed")
        return
    except Frozen:
        raise  # not a refusal: the item waits for the freeze to be lifted
    except EngramError as err:  # retrying cannot change it: settle the item, go on with the rest
        await operations.settle_item(conn, op["id"], memory_id, "refused", refusal=f"{err.type}: {err.detail}")
        return
    if memory.version == item["version"]:  # it was deleted already, by someone else: nothing written
        await operations.settle_item(conn, op["id"], memory_id, "gone")
        return
    event = await operations.delete_event(conn, memory_id, op["id"])
    await operations.settle_item(conn, op["id"], memory_id, "deleted", deleted_version=memory.version,
                                 event_hash=event["hash"])


async def finish(pool: asyncpg.Pool, operation_id: str, approver: str | None) -> dict:
    """Write the erasure receipt (signed) and end the operation `done`. Idempotent: a receipt
    written already is returned as it is."""
    op = await operations.get(pool, operation_id)
    if op["receipt"] is not None:
        return op["receipt"]
    items = await operations.items(pool, operation_id)
    while await history.seal_scopes(pool, 1_000):  # the scope chains hold every DELETE event
        pass
    if unsealed := await operations.unsealed_deletes(pool, operation_id):
        # Events the chain sealer (another process) holds right now: the heads read next would
        # not cover them. The activity retries once it has sealed them.
        raise RuntimeError(f"{unsealed} DELETE events of {operation_id} are being sealed elsewhere; the receipt waits")
    timeline = [{"event": e["event"], "actor": e["actor"], "reason": e["reason"], "at": e["at"].isoformat()}
                for e in await operations.events(pool, operation_id)]
    receipt = {
        "operation_id": operation_id, "requester": op["requester"], "approver": approver, "reason": op["reason"],
        "scope": op["scope"], "previewed_at": op["created_at"].isoformat(),
        **{f"{e['event']}_at": e["at"] for e in timeline if e["event"] in ("confirmed", "approved")},
        "finished_at": datetime.now(timezone.utc).isoformat(),
        "timeline": timeline,
        "items": [{"id": str(i["memory_id"]), "state": i["state"], "version": i["version"],
                   "deleted_version": i["deleted_version"], "content_hash": i["content_hash"],
                   "event_hash": i["event_hash"], **({"refusal": i["refusal"]} if i["refusal"] else {})}
                  for i in items],
        "deleted": sum(i["state"] == "deleted" for i in items),
        "audit_chain_heads": await operations.scope_heads(pool, [i["memory_id"] for i in items]),
    }
    receipt["signature"] = sign(await operations.secret(pool, RECEIPT_SECRET), receipt)
    await operations.set_status(pool, operation_id, "done", approver=approver, receipt=receipt)
    return (await operations.get(pool, operation_id))["receipt"]


