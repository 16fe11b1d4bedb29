"""What the MCP tools (api.mcp_server) take and give: their argument types, stated for the model
with the API's own limits (engram.domain), and the compact views of the API's answers they
return as structured output."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, Field

from engram.domain.changes import HistoryEvent, Reason, Version
from engram.domain.forget import ForgetPreview
from engram.domain.models import MAX_QUERY_CHARS, NUL_FREE, Memory, Scope, ShortLabel, Strict, Tag
from engram.domain.provenance import MemoryType, Trust
from engram.domain.text import VISIBLE_CHAR

# -- inputs ---------------------------------------------------------------------------------------

class Filters(Strict):
    """What a memory must match: every filter given holds."""

    memory_type: list[MemoryType] | None = Field(default=None, min_length=1, description="Any of these types")
    trust: list[Trust] | None = Field(default=None, min_length=1, description=(
        "Any of these trust levels of the memory's source"))
    min_confidence: float | None = Field(default=None, ge=0.0, le=1.0, strict=True, description=(
        "At least this confidence"))
    tags: list[Tag] | None = Field(default=None, min_length=1, max_length=64, description="Any of these tags")
    type: ShortLabel | None = Field(default=None, description="This free-text label (fact, preference, ...)")
    source_type: ShortLabel | None = Field(default=None, description="Written by this kind of source (user, web, ...)")
    kind: Literal["raw", "fact"] | None = Field(default=None, description=(
        "raw: memories as stored; fact: facts extracted from them; none: both"))
    time: str | None = Field(default=None, min_length=1, max_length=100, description=(
        'Created within this time phrase: "yesterday", "last 3 months", ...'))

    def given(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


ScopeParam = Annotated[Scope, Field(description=(
    "Whose memories: at least one of user_id, agent_id, run_id. The server's key bounds it: a scope "
    "the key may not see answers not_found or forbidden"))]
MemoryId = Annotated[UUID, Field(description="The memory's id (from memory_search, memory_list or memory_store)")]
ReasonParam = Annotated[Reason, Field(description="Why: kept in the memory's history")]
Query = Annotated[str, Field(min_length=1, max_length=MAX_QUERY_CHARS, description="What to look for, in words")]
FiltersParam = Annotated[Filters | None, Field(description="Only memories matching all of these")]
IncludeExpired = Annotated[bool, Field(description="Memories past their lifetime too")]
IfVersion = Annotated[Version | None, Field(description=(
    "Only if the memory is still at this version (its `version`), else version_conflict and nothing changes"))]


# -- outputs --------------------------------------------------------------------------------------

class MemoryView(BaseModel):
    """A memory as the tools show it: its text, whose it is, what kind, how far to trust it and
    its version (for if_version). `status`: active, superseded, deleted, quarantined or pending."""

    id: UUID
    content: str
    user_id: str | None
    agent_id: str | None
    run_id: str | None
    memory_type: str
    type: str
    kind: str
    trust: str
    confidence: float
    importance: float
    tags: list[str]
    pinned: bool
    status: str
    version: int
    source_type: str | None
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None

    @classmethod
    def of(cls, memory: Memory) -> MemoryView:
        return cls.model_validate(memory.model_dump(include=set(cls.model_fields)))


class SearchHitView(BaseModel):
    score: float
    memory: MemoryView


class SearchResult(BaseModel):
    results: list[SearchHitView]
    warnings: list[str]


class MemoryList(BaseModel):
    items: list[MemoryView]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null: the last page")


class HistoryEventView(BaseModel):
    event: str
    version: int
    actor: str
    reason: str | None
    path: str | None = Field(description="How the change came: http, cli, grpc, mcp, agent, ...")
    old_content: str | None
    new_content: str | None
    created_at: datetime

    @classmethod
    def of(cls, event: HistoryEvent) -> HistoryEventView:
        return cls(event=event.event, version=event.version, actor=f"{event.actor_type}:{event.actor_id}",
                   reason=event.reason, path=event.path, old_content=event.old_content,
                   new_content=event.new_content, created_at=event.created_at)


class HistoryView(BaseModel):
    memory: MemoryView
    events: list[HistoryEventView] = Field(description="Oldest first")


class CandidateView(BaseModel):
    id: UUID
    snippet: str
    score: float | None
    pinned: bool
    version: int


class PreviewView(BaseModel):
    operation_id: str
    total_matched: int
    candidates: list[CandidateView]
    needs_approval: bool = Field(description="Over the approval threshold or holding pinned memories: an "
                                             "operator must approve after a person confirms")
    expires_at: datetime = Field(description="When this preview lapses unconfirmed")

    @classmethod
    def of(cls, preview: ForgetPreview) -> PreviewView:
        return cls(operation_id=preview.operation_id, total_matched=preview.total_matched,
                   needs_approval=preview.needs_approval, expires_at=preview.expires_at,
                   candidates=[CandidateView(id=c.id, snippet=c.snippet, score=c.score, pinned=c.pinned,
                                             version=c.version) for c in preview.candidates])


class ForgetResult(BaseModel):
    outcome: Literal["forgotten", "previewed"] = Field(description=(
        "forgotten: the one memory was soft-deleted; previewed: nothing was deleted"))
    memory: MemoryView | None = Field(description="The forgotten memory (outcome forgotten)")
    preview: PreviewView | None = Field(description="What a bulk forget would take (outcome previewed)")
    next_step: str


_WIRE_PATTERNS = frozenset({NUL_FREE, VISIBLE_CHAR})


def lean_schema(schema: Any) -> Any:
    """`schema` without the wire's character checks (no NUL; not blank): their regexes would
    cost the model thousands of tokens on every turn and tell it nothing it would get wrong.
    The arguments are still checked, by the tool's argument model and again by the API, and a
    refusal says why. Everything else of the schema is kept."""
    if isinstance(schema, list):
        return [lean_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    lean: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "pattern" and value in _WIRE_PATTERNS:
            continue
        if key == "allOf":
            kept = [item for item in lean_schema(value) if item]
            if kept:
                lean[key] = kept
            continue
        lean[key] = lean_schema(value)
    keyed = lean.pop("patternProperties", None)
    if keyed is not None:
        if set(keyed) <= _WIRE_PATTERNS:  # an object whose keys hold no NUL: any key, as far as the model goes
            lean["additionalProperties"] = next(iter(keyed.values()))
        else:
            lean["patternProperties"] = keyed
    return lean
