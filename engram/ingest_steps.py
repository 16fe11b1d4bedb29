"""The steps of remembering after the first save, a batch at a time, as IngestWorkflow runs them
(embed, index, extract), and the steps of the drain that takes parked extractions once a
provider answers again (ExtractionDrainWorkflow).

Every step is idempotent, because Temporal may run it again after a crash or a timeout: each
job moves on only from the state the step expects (`pending` in a batch, `leased` to this drain
owner in the drain), so a job is completed, parked or given up once. activities/ingest.py adapts
these to Temporal and owns nothing else.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from uuid import UUID

import asyncpg

from engram.control import Control
from engram.domain.control import Frozen
from engram.domain.extraction import Extraction
from engram.domain.models import Memory
from engram.domain.usage import usage_of
from engram.fact_steps import FactWriter, Held
from engram.inference.availability import Availability, ChainDown, is_outage
from engram.inference.embedding_spaces import EmbeddingSpaces
from engram.inference.providers import ProviderChainError
from engram.store import jobs
from engram.store import memories as repo

log = logging.getLogger(__name__)
PIPELINE_ACTOR = "system:pipeline"
KILL_SWITCH = "the kill switch is on: autonomous mutations wait (engram control kill-switch off)"
AWAITING_APPROVAL = "its memory waits for an operator's approval: no LLM sees it before (engram pending list)"


@dataclass(frozen=True)
class Embedded:
    memory_ids: list[UUID]  # the memories with a canonical vector stored
    refused: int  # texts an embedder refused for good (left to BM25)


@dataclass
class Settled:
    """What an extract or drain step did to its jobs."""

    done: int = 0
    parked: int = 0
    dead: int = 0
    taken: int = 0  # drain only: jobs it leased
    chain_down: str | None = None  # why every provider is down, if that stopped the step


@dataclass(frozen=True)
class Retry:
    """How parked jobs that failed for their own sake (a malformed answer) wait: attempt n waits
    initial_s * 2**(n-1), at most max_s."""

    initial_s: float
    max_s: float

    def after(self, attempts: int) -> datetime:
        delay = min(self.initial_s * 2 ** max(attempts - 1, 0), self.max_s)
        return datetime.now(timezone.utc) + timedelta(seconds=delay)


async def embed_batch(pool: asyncpg.Pool, spaces: EmbeddingSpaces, job_ids: list[UUID]) -> Embedded:
    """Store the canonical vectors of the batch's memories (still pending ones only). Raises
    EmbeddingUnavailable for an embedder outage; a text an embedder refuses is noted on its job."""
    pending = await jobs.of_batch(pool, job_ids)
    memories = await repo.get_many(pool, [j.memory_id for j in pending])
    stored = await spaces.embed_and_store(memories)
    if stored.refusals:
        job_of = {j.memory_id: j.id for j in pending}
        async with pool.acquire() as conn:
            for memory_id, why in stored.refusals.items():
                await jobs.note_error(conn, job_of[memory_id], error=why, code="EmbeddingRejected")
        log.warning("embedder refused texts; they are searchable by BM25 only",
                    extra={"count": len(stored.refusals), "detail": next(iter(stored.refusals.values()))})
    return Embedded(memory_ids=stored.ids, refused=len(stored.refusals))


async def index_batch(spaces: EmbeddingSpaces, memory_ids: list[UUID]) -> int:
    """Write the index points of `memory_ids` from their canonical vectors (index owner only)."""
    return await spaces.index(memory_ids)


async def extract_batch(pool: asyncpg.Pool, availability: Availability, control: Control, facts: FactWriter,
                        job_ids: list[UUID], *, concurrency: int, retry: Retry, request_id: str) -> Settled:
    """Finish the batch's pending jobs: skipped (a raw save, or no provider configured),
    extracted, or parked (an outage: at once, with no call, while every provider is known to be
    down; the kill switch: while it is on, no model decides anything)."""
    pending = await jobs.of_batch(pool, job_ids)
    settled = await _settle(pool, availability, control, facts, pending, from_status="pending", owner=None,
                            concurrency=concurrency, retry=retry, request_id=request_id)
    await jobs.wake_dispatcher(pool)
    return settled


async def drain(pool: asyncpg.Pool, availability: Availability, control: Control, facts: FactWriter, owner: str, *,
                limit: int,
                lease_s: float, concurrency: int, retry: Retry, request_id: str) -> Settled:
    """Take up to `limit` due parked jobs (and any whose earlier drain died) and finish them
    like `extract_batch`. Takes nothing while every provider is known to be down, or while the
    kill switch is on."""
    if why := await availability.chain_down():
        return Settled(chain_down=why)
    if not await control.autonomous_allowed():
        return Settled(chain_down=KILL_SWITCH)
    leased = await jobs.lease_parked(pool, owner, limit=limit, lease_s=lease_s)
    settled = await _settle(pool, availability, control, facts, leased, from_status="leased", owner=owner,
                            concurrency=concurrency, retry=retry, request_id=request_id)
    settled.taken = len(leased)
    return settled


async def _settle(pool: asyncpg.Pool, availability: Availability, control: Control, facts: FactWriter,
                  pending: list[jobs.Pending], *,
                  from_status: str, owner: str | None, concurrency: int, retry: Retry, request_id: str) -> Settled:
    settled = Settled()
    skip = [j for j in pending if not j.extract or not availability.chain]
    if skip:
        done = await _complete_skipped(pool, skip, from_status, owner)
        settled.done += done
    wanted = [j for j in pending if j.extract and availability.chain]
    if held := [j for j in wanted if j.awaits_approval]:  # the approval releases them to the drain
        settled.parked += await _park_outage(pool, held, from_status, owner, AWAITING_APPROVAL, code="AwaitingApproval")
        wanted = [j for j in wanted if not j.awaits_approval]
    if not wanted:
        return settled
    if why := await availability.chain_down():
        parked = await _park_outage(pool, wanted, from_status, owner, why)
        settled.parked += parked
        settled.chain_down = why
        return settled
    if not await control.autonomous_allowed():  # parked like an outage: the drain takes them once it is off
        settled.parked += await _park_outage(pool, wanted, from_status, owner, KILL_SWITCH, code="KillSwitch")
        settled.chain_down = KILL_SWITCH
        return settled
    memories = {m.id: m for m in await repo.get_many(pool, [j.memory_id for j in wanted])}
    gate = asyncio.Semaphore(concurrency)

    async def one(job: jobs.Pending) -> None:
        async with gate:
            if held := await _held(control, memories[job.memory_id]):  # checked again at each job's turn
                settled.parked += await _park_outage(pool, [job], from_status, owner, held[1], code=held[0])
                return
            await _extract_one(pool, availability, control, facts, job, memories[job.memory_id], from_status, owner,
                               retry, request_id, settled)

    await asyncio.gather(*(one(j) for j in wanted))
    return settled


async def _held(control: Control, memory: Memory, conn: asyncpg.Connection | None = None) -> tuple[str, str] | None:
    """(code, why) when the model's output may not be written to `memory` now: the kill switch
    is on, or its scope is frozen. The job parks, and the drain takes it up once lifted."""
    if not await control.autonomous_allowed(conn):
        return "KillSwitch", KILL_SWITCH
    try:
        await control.check(memory.scope, conn)
    except Frozen as err:
        return "Frozen", err.detail
    return None


async def _extract_one(pool: asyncpg.Pool, availability: Availability, control: Control, facts: FactWriter,
                       job: jobs.Pending, memory: Memory, from_status: str, owner: str | None, retry: Retry,
                       request_id: str, settled: Settled) -> None:
    try:
        if job.extraction is not None:  # an earlier attempt's, whose facts it began to decide
            found = Extraction.model_validate(job.extraction)
        else:
            found = await availability.extract(memory.content)
            await jobs.add_usage(pool, job.id, usage_of(found))  # spent, however this attempt ends
            if found.facts and facts.enabled:
                await jobs.save_extraction(pool, job.id, found.model_dump(mode="json") | {"secrets": found.secrets})
        # The facts become memories (or change the scope's facts) before the job finishes: a
        # crash between the two runs this again, on the same extraction, and the facts decided
        # already are skipped.
        written = await facts.write(availability, memory, found, job_id=job.id, request_id=request_id)
    except Held as err:
        settled.parked += await _park_outage(pool, [job], from_status, owner, err.why, code=err.code)
        return
    except ChainDown as err:
        parked = await _park_outage(pool, [job], from_status, owner, str(err))
        settled.parked += parked  # read after the await: concurrent extractions update it too
        settled.chain_down = str(err)
        return
    except ProviderChainError as err:
        if all(is_outage(e) for e in err.errors):
            parked = await _park_outage(pool, [job], from_status, owner, str(err))
            settled.parked += parked
        elif job.attempt_count + 1 >= job.max_attempts:
            dead = await _give_up(pool, job, from_status, owner, str(err))
            settled.dead += dead
        else:
            async with pool.acquire() as conn:
                async with conn.transaction():
                    if await jobs.park(conn, [job.id], from_status=from_status, owner=owner, error=str(err),
                                       code="ProviderMalformedOutput", counts=True,
                                       next_attempt_at=retry.after(job.attempt_count + 1)):
                        await _raw_saved(conn, [job])
                        settled.parked += 1
        return
    async with pool.acquire() as conn:
        async with conn.transaction():
            # Again where the output is written: a freeze set during the model call holds too.
            held = await _held(control, memory, conn)
            if held is None:
                if not await jobs.finish_many(conn, [job.id], status="done", from_status=from_status, owner=owner):
                    return  # another run of this step finished it
                await jobs.publish_first_pass(conn, [job.id], "processed")
                await repo.record_extraction(
                    conn, job.memory_id, status="done", extracted=found.model_dump(mode="json") | written.summary(),
                    model=found.model,
                    category=found.category, actor=PIPELINE_ACTOR, provider=found.provider,
                    prompt_version=found.prompt_version, request_id=request_id,
                )
    if held is not None:
        settled.parked += await _park_outage(pool, [job], from_status, owner, held[1], code=held[0])
        return
    settled.done += 1


async def _complete_skipped(pool: asyncpg.Pool, skip: list[jobs.Pending], from_status: str, owner: str | None) -> int:
    async with pool.acquire() as conn:
        async with conn.transaction():
            moved = await jobs.finish_many(conn, [j.id for j in skip], status="done", from_status=from_status,
                                           owner=owner)
            if moved:
                await jobs.publish_first_pass(conn, moved, "processed")
                memory_of = {j.id: j.memory_id for j in skip}
                await repo.set_extraction_status_many(conn, [memory_of[i] for i in moved], "skipped")
    return len(moved)


async def _park_outage(pool: asyncpg.Pool, park: list[jobs.Pending], from_status: str, owner: str | None,
                       why: str, code: str = "ProviderUnavailable") -> int:
    async with pool.acquire() as conn:
        async with conn.transaction():
            moved = set(await jobs.park(conn, [j.id for j in park], from_status=from_status, owner=owner,
                                        error=why, code=code, counts=False))
            await _raw_saved(conn, [j for j in park if j.id in moved])
    return len(moved)


async def _raw_saved(conn: asyncpg.Connection, parked: list[jobs.Pending]) -> None:
    """A parked job's first pass concluded `raw_saved`; its memory is `unprocessed` meanwhile."""
    if parked:
        await jobs.publish_first_pass(conn, [j.id for j in parked], "raw_saved")
        await repo.set_extraction_status_many(conn, [j.memory_id for j in parked], "unprocessed")


async def _give_up(pool: asyncpg.Pool, job: jobs.Pending, from_status: str, owner: str | None, error: str) -> int:
    """Out of attempts: the job is dead; the memory stays raw, embedded and searchable."""
    async with pool.acquire() as conn:
        async with conn.transaction():
            if not await jobs.finish_many(conn, [job.id], status="dead", from_status=from_status, owner=owner,
                                          error=error, code="ProviderMalformedOutput"):
                return 0
            await jobs.publish_first_pass(conn, [job.id], "raw_saved")
            await repo.set_extraction_status(conn, job.memory_id, "failed")
    return 1


async def probe(availability: Availability) -> list[str]:
    """Probe the providers known to be down; what is still down ("<provider>: why")."""
    return await availability.probe_down()


async def backlog(pool: asyncpg.Pool) -> jobs.Backlog:
    return await jobs.backlog(pool)
