"""The semantic write pipeline: a memory's extracted facts become memories of their own, or
change the facts already held, as a model decides.

For each new fact of a source memory:
1. its nearest live facts in exactly the source's scope are read from Postgres (exact cosine,
   so a fact written a moment ago counts);
2. one that is nearly the same text and says the same (engram.domain.decisions.same_claim) is
   a MERGE, decided without a model; a fact nearly the same as an earlier fact of the same
   extraction but saying otherwise ("allergic" / "not allergic") is a CONTRADICT of it, decided
   without a model: both are kept, for a person to review;
3. the rest go to the model in one call, beside their candidates under temporary ids
   (engram.domain.decisions); a fact with no candidate at all is an ADD, with no call;
4. each decision is applied in its own short transaction, under the rollout mode and the
   confidence thresholds (`decisions.plan`): an UPDATE or DELETE compares and sets the version
   the model was shown, and is refused on a pinned memory, under a person's lock, or in a
   frozen scope; a refused write adds the fact instead, so a fact is never lost. The
   decision's row (memory_decisions) commits with its write, once per (source, fact).

Raw memories are never a decision's target: they are what a caller said. The kill switch
stops the step between two decisions (`Held`); the job parks and, when it is lifted, a drain
runs the step again, which skips the facts already decided.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from uuid import UUID, uuid4

import asyncpg
import numpy as np

from engram.changes import MemoryChanges
from engram.control import Control
from engram.domain import decisions as contract
from engram.domain import provenance
from engram.domain.changes import ChangeContext, ModelAttribution
from engram.domain.control import Frozen
from engram.domain.errors import EngramError
from engram.domain.extraction import ExtractedFact, Extraction, mentioned
from engram.domain.models import Memory, MemoryDraft
from engram.domain.text import content_hash, normalize
from engram.domain.usage import usage_of
from engram.inference.availability import Availability, is_outage
from engram.inference.embedding_spaces import EmbeddingSpaces
from engram.inference.providers import ProviderChainError
from engram.settings import Settings
from engram.store import changes as change_store
from engram.store import facts as store
from engram.store import jobs, reviews
from engram.store import memories as repo

log = logging.getLogger(__name__)
PIPELINE_ACTOR = "system:pipeline"
PASSING = ("PATTERN", "CONTEXT", "LEARNED", "STATE")  # a source of these types gives its facts its lifetime
PATH = "system:pipeline"
MAX_SHOWN = 20  # memories one decision call may show, whatever the number of facts


class Held(Exception):
    """The kill switch went on, or the scope froze, between two decisions: the rest wait."""

    def __init__(self, code: str, why: str) -> None:
        super().__init__(why)
        self.code = code
        self.why = why


@dataclass(frozen=True)
class _Proposal:
    action: str  # ADD, UPDATE, DELETE, NONE, CONTRADICT, or MERGE (no model)
    confidence: float
    reason: str
    target: store.Candidate | None = None
    content: str | None = None  # an UPDATE's
    attribution: ModelAttribution = ModelAttribution()
    secrets: tuple[str, ...] = ()  # redacted originals the content may hold again
    related: float | None = None  # cosine of the target to this fact (None: not among its own candidates)


@dataclass
class FactsResult:
    """What the step did: decisions by "ACTION outcome", and warnings (dropped decisions...)."""

    decided: Counter = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {"decided": dict(sorted(self.decided.items())), "warnings": self.warnings}


class FactWriter:
    def __init__(self, settings: Settings, pool: asyncpg.Pool, spaces: EmbeddingSpaces, changes: MemoryChanges,
                 control: Control) -> None:
        self._settings = settings
        self._pool = pool
        self._spaces = spaces
        self._changes = changes
        self._control = control
        # One source at a time per scope in this process: two memories of a batch deciding
        # against the same facts would otherwise both UPDATE one (the second then adds).
        self._scopes: weakref.WeakValueDictionary[tuple, asyncio.Lock] = weakref.WeakValueDictionary()

    @property
    def enabled(self) -> bool:
        """Whether extracted facts are decided at all (WRITE_PIPELINE is not off)."""
        return self._settings.write_pipeline != "off"

    async def write(self, availability: Availability, source: Memory, found: Extraction, *, job_id: UUID | None,
                    request_id: str | None) -> FactsResult:
        """Decide and apply each of `found`'s facts not decided yet. Raises ChainDown, or
        ProviderChainError when every provider failed for an outage (the job parks); Held
        (the job parks); EmbeddingUnavailable. A malformed or refused answer is not raised:
        the facts it left undecided are added, with a warning."""
        mode = self._settings.write_pipeline
        if not self.enabled or not found.facts:
            return FactsResult()
        key = (source.user_id, source.agent_id, source.run_id)
        lock = self._scopes.get(key)
        if lock is None:
            lock = self._scopes[key] = asyncio.Lock()
        async with lock:
            return await self._write(availability, source, found, mode, job_id, request_id)

    async def _write(self, availability: Availability, source: Memory, found: Extraction, mode: str,
                     job_id: UUID | None, request_id: str | None) -> FactsResult:
        result = FactsResult()
        done = await store.decided(self._pool, source.id)
        todo = [f for f in found.facts if _hash(f.content) not in done]
        if not todo:
            return result
        model, _ = await self._spaces.active()
        vectors = await self._spaces.embed_texts([f.content for f in todo])
        near = [await store.nearest_facts(self._pool, source.scope, v[model], model,
                                          self._settings.decision_candidates) for v in vectors]
        proposals = self._without_model(todo, near)
        opposed = self._opposed(todo, [v[model] for v in vectors])
        for j, (i, similarity) in opposed.items():
            proposals[j] = _Proposal("CONTRADICT", similarity, f"opposes another fact of the same memory, "
                                                               f"{todo[i].content[:80]!r}", related=similarity)
        ask = [i for i, p in enumerate(proposals) if p is None]
        if ask:
            await self._ask_model(availability, todo, near, ask, proposals, found.secrets, result, job_id)
        extraction = ModelAttribution(found.provider, found.model, found.prompt_version)
        holders: dict[int, UUID | None] = {}  # the memory that holds each fact once it is decided
        for k, (fact, vector, proposal) in enumerate(zip(todo, vectors, proposals)):
            if k in opposed:
                proposal = _against_sibling(proposal, todo[opposed[k][0]], holders.get(opposed[k][0]))
            outcome, holders[k] = await self._apply(source, fact, vector, proposal, mode, extraction, found,
                                                    job_id, request_id)
            result.decided[f"{proposal.action} {outcome}"] += 1
        return result

    def _opposed(self, todo: list[ExtractedFact], vectors: list[np.ndarray]) -> dict[int, tuple[int, float]]:
        """For each fact that opposes an earlier one of the same extraction (cosine at least
        BATCH_CONTRADICTION_SIMILARITY, yet not the same claim: a negation or a number differs),
        that earlier fact's index and the cosine."""
        floor = self._settings.batch_contradiction_similarity
        found: dict[int, tuple[int, float]] = {}
        for j in range(1, len(todo)):
            for i in range(j):
                similarity = float(np.dot(vectors[i], vectors[j]))
                if (similarity >= floor and not contract.same_claim(todo[i].content, todo[j].content)
                        and similarity > found.get(j, (i, -1.0))[1]):
                    found[j] = (i, similarity)
        return found

    def _without_model(self, todo: list[ExtractedFact], near: list[list[store.Candidate]]) -> list[_Proposal | None]:
        """MERGE onto a near-duplicate, ADD when there is nothing near; None: the model decides."""
        proposals: list[_Proposal | None] = []
        for fact, candidates in zip(todo, near):
            top = candidates[0] if candidates else None
            if top is None:
                proposals.append(_Proposal("ADD", 1.0, "no fact of the scope is near it"))
            elif top.similarity >= self._settings.merge_similarity and contract.same_claim(fact.content, top.content):
                proposals.append(_Proposal("MERGE", top.similarity, f"cosine {top.similarity:.3f} to an existing fact "
                                                                    "saying the same", target=top))
            else:
                proposals.append(None)
        return proposals

    async def _ask_model(self, availability: Availability, todo: list[ExtractedFact],
                         near: list[list[store.Candidate]], ask: list[int], proposals: list[_Proposal | None],
                         secrets: list[str], result: FactsResult, job_id: UUID | None) -> None:
        """Fill `proposals[i]` for each i in `ask` from one decision call; a fact the model left
        undecided (or an answer it could not give) is added. The call's tokens count on the job."""
        shown: dict[UUID, store.Candidate] = {}
        for candidate in sorted((c for i in ask for c in near[i]), key=lambda c: -c.similarity):
            if candidate.id not in shown and len(shown) < MAX_SHOWN:
                shown[candidate.id] = candidate
        memories = list(shown.values())
        known = tuple(sorted({s for m in memories for s in m.sensitive} | set(secrets)))
        try:
            answer = await availability.decide([todo[i].content for i in ask], [m.content for m in memories], known)
        except ProviderChainError as err:
            if all(is_outage(e) for e in err.errors):
                raise
            result.warnings.append(f"no decisions: {err}; the facts were added")
            answer = None
        if answer is not None:
            result.warnings.extend(answer.warnings)
            if job_id is not None:  # spent, however the job's attempt ends
                await jobs.add_usage(self._pool, job_id, usage_of(answer))
            attribution = ModelAttribution(answer.provider, answer.model, answer.prompt_version)
            for d in answer.decisions:
                target = memories[d.target - 1] if d.target else None
                # How near the target is to this fact, not to another one it was shown for.
                related = next((c.similarity for c in near[ask[d.fact - 1]] if target and c.id == target.id), None)
                proposals[ask[d.fact - 1]] = _Proposal(
                    d.action, d.confidence, d.reason, target=target, content=d.content, attribution=attribution,
                    secrets=tuple(answer.secrets) + known, related=related)
        for i in ask:
            if proposals[i] is None:
                if answer is not None:
                    result.warnings.append(f"fact {todo[i].content[:60]!r}: no decision from the model; added")
                proposals[i] = _Proposal("ADD", 0.0, "no decision from the model")

    async def _apply(self, source: Memory, fact: ExtractedFact, vectors: dict[str, np.ndarray], p: _Proposal,
                     mode: str, extraction: ModelAttribution, found: Extraction, job_id: UUID | None,
                     request_id: str | None) -> tuple[str, UUID | None]:
        """Apply one proposal with its decision row, in one transaction: the outcome recorded
        ("already" when another run recorded this fact first), and the live memory that holds
        the fact now (None when none does: shadow mode, a DELETE, or "already")."""
        thresholds = contract.Thresholds(self._settings.decision_min_confidence_update,
                                         self._settings.decision_min_confidence_delete)
        if p.action in ("UPDATE", "DELETE") and contract.opposes(fact.content, p.target.content, p.content):
            p = replace(p, action="CONTRADICT", content=None,
                        reason=f"the model's {p.action} would set an opposing claim over the memory, with no word of "
                               f"change: kept both for review ({p.reason})")
        if p.action in ("UPDATE", "DELETE") and provenance.lowest(source.trust, p.target.trust) != p.target.trust:
            p = replace(p, action="CONTRADICT", content=None,
                        reason=f"the model's {p.action} would let a {source.trust} source change a {p.target.trust} "
                               f"memory: kept both for review ({p.reason})")
        step = contract.plan(p.action, p.confidence, mode, thresholds)
        new_vectors = None
        if step.act == "UPDATE":  # embedded before any lock is taken
            new_vectors = await self._spaces.embed_text(p.content)
        if p.action in ("UPDATE", "DELETE", "CONTRADICT", "NONE") and mode != "shadow":
            step = self._unrelated(p, vectors, new_vectors) or step
        ctx = ChangeContext(path=PATH, request_id=request_id, model=p.attribution)
        outcome, detail, written, add = step.outcome, step.detail, None, step.act == "ADD"
        deleted, holder = False, None
        try:
            async with self._pool.acquire() as conn:
                async with conn.transaction():
                    if step.act is not None:
                        await self._check_held(source, conn)
                    if step.act in ("UPDATE", "DELETE"):
                        try:
                            async with conn.transaction():
                                await self._changes.decide_in(conn, p.target.id, step.act, reason=p.reason,
                                                              if_version=p.target.version, ctx=ctx,
                                                              content=p.content, vectors=new_vectors)
                            written, deleted = p.target.id, step.act == "DELETE"
                            if step.act == "UPDATE":
                                holder = p.target.id
                                await store.add_source(conn, p.target.id, source.id)
                                await store.set_sensitive(conn, p.target.id, _held_in(p.content, p.secrets))
                        except Frozen as err:
                            raise Held("Frozen", err.detail) from err
                        except EngramError as err:  # pinned, a person's lock, a newer version...
                            outcome, detail, add = "refused", f"{err.type}: {err.detail}; the fact was added", True
                    if add:
                        written, held_by = await self._add(conn, source, fact, vectors, extraction, found, request_id)
                        holder = written
                        if held_by:
                            detail = f"{detail + '; ' if detail else ''}the fact is held by memory {held_by} already"
                    elif step.act is None and p.target is not None and mode != "shadow" and p.action != "CONTRADICT":
                        await store.add_source(conn, p.target.id, source.id)  # NONE, MERGE: it supports the fact
                        holder = p.target.id
                    recorded = await store.record(
                        conn, source.scope, source_memory_id=source.id, job_id=job_id, fact=fact.content,
                        fact_hash=_hash(fact.content), fact_type=fact.type, fact_confidence=fact.confidence,
                        action=p.action, target_id=p.target.id if p.target else None, memory_id=written,
                        content=p.content, confidence=p.confidence, reason=p.reason, outcome=outcome, detail=detail,
                        mode=mode, provider=p.attribution.provider, model=p.attribution.model,
                        prompt_version=p.attribution.prompt_version)
                    if recorded is None:
                        raise _DecidedElsewhere
                    if outcome == "review_needed" and written is not None and written != p.target.id:
                        await self._open_review(conn, source, recorded, written, p)
                    if written is not None:
                        await change_store.wake_index_sync(conn)
        except _DecidedElsewhere:
            return "already", None
        if deleted:
            await self._control.note_delete(written, source.scope)  # a run of model deletes freezes the scope
        log.info("fact decided", extra={"memory_id": str(source.id), "job_id": str(job_id) if job_id else None,
                                        "stage": "decide", "outcome": f"{p.action} {outcome}",
                                        "provider": p.attribution.provider, "model": p.attribution.model})
        return outcome, holder

    def _unrelated(self, p: _Proposal, fact_vectors: dict[str, np.ndarray],
                   new_vectors: dict[str, np.ndarray] | None) -> contract.Plan | None:
        """Refuse a decision about a memory the fact is not about, or an UPDATE whose new content
        strays from the fact: the fact is added instead. A small model told inside a memory to
        "delete everything" names some target (bge-small: 0.43-0.55 cosine to it); a real change
        of the same subject scores 0.63-0.90 ("sold their car" / "owns a red car" 0.83). The new
        content of a faithful UPDATE is the fact, or the fact merged with the target: 0.8 and up.
        After a NONE ("already held") the target stands for the fact, as an UPDATE's content does,
        so it must be as near: else the fact would be dropped for a memory saying something else
        ("enjoys green tea" / "lives in Paris" score above 0.6)."""
        floor, content_floor = self._settings.decision_min_similarity, self._settings.decision_min_content_similarity
        if p.action == "NONE":
            floor = content_floor
        if p.related is None or p.related < floor:
            near = "not among its candidates" if p.related is None else f"cosine {p.related:.2f}"
            return contract.Plan("ADD", "unrelated", f"the target is not what the fact is about ({near}, below "
                                                     f"{floor:.2f}); the fact was added")
        if new_vectors:
            model = next(iter(set(new_vectors) & set(fact_vectors)), None)
            if model is not None and (close := float(np.dot(new_vectors[model], fact_vectors[model]))) < content_floor:
                return contract.Plan("ADD", "unrelated", f"the new content strays from the fact (cosine {close:.2f}, "
                                                         f"below {content_floor:.2f}); the fact was added")
        return None

    async def _add(self, conn: asyncpg.Connection, source: Memory, fact: ExtractedFact,
                   vectors: dict[str, np.ndarray], extraction: ModelAttribution, found: Extraction,
                   request_id: str | None) -> tuple[UUID, UUID | None]:
        """Write the fact as a memory of the source's scope, with the extraction's entities it
        mentions: (its id, None), or (the id of the live memory of the scope that holds this
        content already, that id) with lineage added."""
        # Provenance follows the source: its trust (and an UNTRUSTED one's cap), its origin and
        # lifetime, its agents and the pipeline; its passing type, else the fact's own. An
        # UNTRUSTED source no person approved gives its own type: else a web page written as a
        # "preference" would put FACTs from an UNTRUSTED source into recall unapproved.
        keeps_type = source.memory_type in PASSING or (source.trust == "UNTRUSTED" and source.approval != "approved")
        draft = MemoryDraft(
            scope=source.scope, content=fact.content, type=fact.type, who=source.who,
            source_type=source.source_type, source_id=source.source_id, session_id=source.session_id,
            kind="fact", derived_from=[source.id], confidence=provenance.capped(fact.confidence, source.trust),
            trust=source.trust, expires_at=source.expires_at, origin=source.origin,
            memory_type=source.memory_type if keeps_type else provenance.type_of(fact.type),
            agent_chain=[*source.agent_chain, PIPELINE_ACTOR])
        memory_id = uuid4()
        if not await repo.insert_raw(conn, draft, memory_id=memory_id, actor=PIPELINE_ACTOR,
                                     stemmer=self._settings.bm25_stemmer, extraction_status="skipped",
                                     request_id=request_id, actor_type="agent", path=PATH, model=extraction):
            held = await repo.find_live_by_hash(conn, source.scope, content_hash(normalize(fact.content)), "fact")
            await store.add_source(conn, held, source.id)
            return held, held
        await self._spaces.store_text_vectors(conn, memory_id, vectors)
        await store.mark_stale(conn, memory_id)
        await store.note_facts(conn, source.id)
        if held := _held_in(fact.content, found.secrets):
            await store.set_sensitive(conn, memory_id, held)
        if entities := mentioned(fact.content, found.entities):
            await store.set_entities(conn, memory_id, [e.model_dump() for e in entities])
        return memory_id, None

    async def _open_review(self, conn: asyncpg.Connection, source: Memory, decision_id: int, new_id: UUID,
                           p: _Proposal) -> None:
        """A review item for the two facts, and the job whose run (a ReviewWorkflow) holds it open."""
        review_id = uuid4()
        expires_at = datetime.now(timezone.utc) + timedelta(seconds=self._settings.review_ttl_s)
        await reviews.insert(conn, review_id, scope=source.scope, decision_id=decision_id, new_memory_id=new_id,
                             existing_memory_id=p.target.id, reason=p.reason, expires_at=expires_at)
        await jobs.insert(conn, job_id=review_id, memory_id=new_id, job_type="review", max_attempts=1,
                          payload={"review_id": str(review_id), "expires_at": expires_at.isoformat()})

    async def _check_held(self, source: Memory, conn: asyncpg.Connection) -> None:
        if not await self._control.autonomous_allowed(conn):
            raise Held("KillSwitch", "the kill switch is on: model decisions wait (engram control kill-switch off)")
        try:
            await self._control.check(source.scope, conn)
        except Frozen as err:
            raise Held("Frozen", err.detail) from err


def _against_sibling(p: _Proposal, sibling: ExtractedFact, holder: UUID | None) -> _Proposal:
    """A CONTRADICT of an earlier fact of the same extraction, aimed at the memory that holds
    that fact now; with none (shadow mode, or the fact deleted something), the fact is added."""
    if holder is None:
        return _Proposal("ADD", 1.0, f"{p.reason}, which no memory holds; added")
    return replace(p, target=store.Candidate(holder, sibling.content, 1, p.confidence))


class _DecidedElsewhere(Exception):
    """Another run recorded this fact's decision first: this transaction rolls back."""


def _held_in(content: str | None, secrets) -> list[str]:
    return sorted(s for s in set(secrets) if content and s in content)


def _hash(fact: str) -> str:
    return content_hash(normalize(fact))
