"""The service's request and result models, shared by every gateway.

The request models are the wire contract: what they refuse is refused before anything is
written, with a 422 that says where. Their limits are constants here, so the OpenAPI schema
states exactly what the service enforces.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, Union
from uuid import UUID

from typing_extensions import TypeAliasType

from pydantic import (
    AfterValidator, AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt,
    model_validator,
)

from engram.domain.provenance import MemoryType, Trust
from engram.domain.text import VISIBLE_CHAR, is_blank, unstorable

SCOPE_PARTS = ("user_id", "agent_id", "run_id")
WILDCARD = "*"  # "any value" in a key's grants, so never a scope id

# Limits of the wire format.
MAX_CONTENT_CHARS = 32_000
MAX_QUERY_CHARS = 4_000
MAX_LIMIT = 100  # results of a search, items of a list page
MAX_RERANK_TOP_N = 100
MAX_PIPELINE_TIMEOUT_MS = 30_000
METADATA_MAX_DEPTH = 32
METADATA_MAX_BYTES = 64 * 1024
_MAX_NESTING = METADATA_MAX_DEPTH + 8  # of a whole request: metadata plus the objects around it


def check_wire_value(value: Any, where: str = "", depth: int = 0) -> None:
    """Raise ValueError, naming where, for the first string Postgres cannot store (a NUL, a
    lone surrogate; in keys too), number JSON cannot carry (NaN, ±Infinity, an overflow such as
    1e400) or nesting deeper than any request needs."""
    if depth > _MAX_NESTING:
        raise ValueError(f"{where or 'body'}: nested deeper than {_MAX_NESTING} levels")
    if isinstance(value, str):
        if problem := unstorable(value):
            raise ValueError(f"{where or 'value'}: {problem}")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where or 'value'}: {value} is not a finite number")
    elif isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            if isinstance(key, str) and (problem := unstorable(key)):
                raise ValueError(f"{where or 'body'}: a key {problem}")
            check_wire_value(item, path, depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_wire_value(item, f"{where}[{i}]", depth + 1)


class Strict(BaseModel):
    """Unknown fields are an error, not silently dropped; so is any string or number that
    could not be stored as sent (see check_wire_value)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        check_wire_value(data)
        return data


def _not_blank(text: str) -> str:
    if is_blank(text):
        raise ValueError("is empty (white space or invisible characters only)")
    return text


def _scope_id(value: str) -> str:
    if value == WILDCARD:
        raise ValueError(f"{WILDCARD!r} is reserved: it means 'any' in a key's grants")
    return _not_blank(value)


# What the wire checks (check_wire_value, _not_blank) enforce, stated for the OpenAPI schema.
NUL_FREE = "^[^\\u0000]*$"
_NUL_FREE = {"pattern": NUL_FREE}
_SHOWS = {"allOf": [{"pattern": NUL_FREE}, {"pattern": VISIBLE_CHAR}]}


def _text(min_length: int, max_length: int, **schema: Any) -> Any:
    """A string field of the wire: its lengths, and in the schema no NUL (plus `schema`)."""
    return Field(min_length=min_length, max_length=max_length, json_schema_extra={**_NUL_FREE, **schema})


ScopeId = Annotated[str, Field(min_length=1, max_length=200, json_schema_extra={**_SHOWS, "not": {"const": WILDCARD}}),
                    AfterValidator(_scope_id)]
Label = Annotated[str, _text(1, 200)]
Tag = Annotated[str, _text(1, 100)]
ShortLabel = Annotated[str, _text(1, 64)]


def _integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def wire_int(ge: int, le: int) -> Any:
    """An integer field of the wire, within [ge, le]. JSON Schema's integer admits 57.0, and so
    does the wire; it is strict otherwise (no "57", no true)."""
    return Annotated[StrictInt, Field(ge=ge, le=le), BeforeValidator(_integral)]


def _one_part_required(schema: dict) -> None:
    schema["anyOf"] = [{"required": [part], "properties": {part: {"type": "string"}}} for part in SCOPE_PARTS]


class Scope(Strict):
    """Who a memory belongs to. At least one part is required."""

    model_config = ConfigDict(json_schema_extra=_one_part_required)

    user_id: ScopeId | None = None
    agent_id: ScopeId | None = None
    run_id: ScopeId | None = None

    @model_validator(mode="after")
    def _at_least_one(self) -> "Scope":
        if self.user_id is None and self.agent_id is None and self.run_id is None:
            raise ValueError("scope needs at least one of user_id, agent_id, run_id")
        return self


def _metadata(value: dict[str, Any]) -> dict[str, Any]:
    def depth(item: Any) -> int:
        if isinstance(item, dict):
            return 1 + max(map(depth, item.values()), default=0)
        if isinstance(item, list):
            return 1 + max(map(depth, item), default=0)
        return 0

    if depth(value) > METADATA_MAX_DEPTH:
        raise ValueError(f"is nested deeper than {METADATA_MAX_DEPTH} levels")
    size = len(json.dumps(value, ensure_ascii=False).encode())
    if size > METADATA_MAX_BYTES:
        raise ValueError(f"is {size} bytes as JSON; the limit is {METADATA_MAX_BYTES}")
    return value


WireString = Annotated[str, Field(json_schema_extra=_NUL_FREE)]
# An object whose keys all match the NUL-free pattern (patternProperties alone would let others by).
_KEYS_NUL_FREE = Field(json_schema_extra={"additionalProperties": False})
# Any JSON value, as the schema states it: its strings and object keys hold no NUL.
JsonValue = TypeAliasType("JsonValue", Union[Annotated[dict[WireString, "JsonValue"], _KEYS_NUL_FREE],
                                             list["JsonValue"], WireString, bool, int, float, None])
Metadata = Annotated[dict[WireString, JsonValue], _KEYS_NUL_FREE, AfterValidator(_metadata)]


def _in_utc(when: datetime) -> datetime:
    try:
        return when.astimezone(timezone.utc)
    except OverflowError:
        raise ValueError(f"{when.isoformat()} is outside the years 1 to 9999 in UTC") from None


def _text_only(value: Any) -> Any:
    if not isinstance(value, (str, datetime)):  # pydantic would read a number as a Unix time
        raise ValueError("must be an ISO 8601 date-time string with a time zone")
    return value


InstantUTC = Annotated[AwareDatetime, BeforeValidator(_text_only), AfterValidator(_in_utc)]


Mode = Literal["auto", "sync", "async"]
# pending_approval: stored, out of recall until an operator approves it (engram.approvals).
RememberStatus = Literal["processed", "queued", "raw_saved", "pending_approval"]


Content = Annotated[str, Field(min_length=1, max_length=MAX_CONTENT_CHARS, json_schema_extra=_SHOWS),
                    AfterValidator(_not_blank)]


class Origin(Strict):
    """The original source of a memory relayed by another (an agent passing on a web page)."""

    source_type: ShortLabel
    source_id: Label | None = None


class RememberItem(Strict):
    """One memory to write: a remember's body without how to wait (an item of a bulk remember)."""

    content: Content
    scope: Scope
    type: ShortLabel = "fact"
    memory_type: MemoryType | None = Field(default=None, description=(
        "None: the type `type` names (fact, preference, pattern, decision, state, context, learned), else FACT. "
        "PATTERN, CONTEXT, LEARNED and STATE expire after their lifetime; LEARNED waits for approval"))
    tags: list[Tag] = Field(default_factory=list, max_length=64)
    who: Label | None = None
    source_type: ShortLabel | None = None
    source_id: Label | None = None
    session_id: Label | None = None
    metadata: Metadata = Field(default_factory=dict)
    pinned: StrictBool = False
    importance: float = Field(default=0.5, ge=0.0, le=1.0, strict=True)
    confidence: float = Field(default=1.0, ge=0.0, le=1.0, strict=True,
                              description="At most 0.5 is stored for an UNTRUSTED source")
    expires_at: InstantUTC | None = Field(default=None, description="None: the type's default lifetime")
    origin: Origin | None = Field(default=None, description="The original source, when this one relays it")
    agent_chain: list[Label] = Field(default_factory=list, max_length=32,
                                     description="The agents the content passed through before this write")
    raw: StrictBool = False
    idempotency_key: Label | None = None


class RememberRequest(RememberItem):
    mode: Mode = "auto"
    pipeline_timeout_ms: wire_int(0, MAX_PIPELINE_TIMEOUT_MS) | None = None


@dataclass(frozen=True)
class MemoryDraft:
    """A memory as it is stored: what every write path hands the store (engram.provenance
    fills in its trust, type and lifetime)."""

    scope: Scope
    content: str
    type: str = "fact"
    tags: list[str] = field(default_factory=list)
    who: str | None = None
    source_type: str | None = None
    source_id: str | None = None
    session_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    pinned: bool = False
    importance: float = 0.5
    kind: str = "raw"  # "fact": extracted by the pipeline from the memories in `derived_from`
    derived_from: list[UUID] = field(default_factory=list)
    confidence: float = 1.0
    trust: str = "TRUSTED"
    memory_type: str = "FACT"
    expires_at: datetime | None = None
    agent_chain: list[str] = field(default_factory=list)
    origin: dict[str, Any] | None = None
    approval: str | None = None  # "pending": it waits for an operator, out of recall (status pending)


class RememberResponse(BaseModel):
    memory_id: UUID
    status: RememberStatus
    job_id: UUID | None
    warnings: list[str] = Field(default_factory=list)
    approval_id: UUID | None = None  # status pending_approval: what an operator decides (/api/approvals)


class RememberBatchRequest(Strict):
    """A bulk remember: each item is checked on its own (a bad one gets its own error and the
    rest are stored), each with its own idempotency key; the batch answers without waiting."""

    items: list[dict[str, JsonValue]] = Field(min_length=1, description=(
        "RememberItem objects (the remember body without mode and pipeline_timeout_ms); at most "
        "ENGRAM_REMEMBER_BATCH_MAX (default 500), within the 1 MiB body limit"))


class ItemError(BaseModel):
    type: str
    detail: str


class RememberItemResult(BaseModel):
    index: int  # the item's position in the request
    memory_id: UUID | None = None
    job_id: UUID | None = None
    status: RememberStatus | None = None
    warnings: list[str] = Field(default_factory=list)
    error: ItemError | None = None  # set when this item was not stored; nothing else is then
    approval_id: UUID | None = None


class RememberBatchResponse(BaseModel):
    job_id: UUID | None  # the import's job: its progress counts the stored items' processing
    stored: int
    failed: int
    results: list[RememberItemResult]




class TimeRange(Strict):
    """[start, end): created at or after start, before end. Each needs a time zone."""

    start: InstantUTC | None = None
    end: InstantUTC | None = None

    @model_validator(mode="after")
    def _ordered(self) -> "TimeRange":
        if self.start is not None and self.end is not None and self.start > self.end:
            raise ValueError("time_range start is after its end")
        return self


class SearchFilters(Strict):
    kind: Literal["raw", "fact"] | None = Field(default=None, description=(
        "raw: memories as remembered; fact: facts the write pipeline extracted from them; none: both"))
    type: ShortLabel | None = None
    tags: list[Tag] | None = Field(default=None, max_length=64)
    who: Label | None = None
    source_type: ShortLabel | None = None
    memory_type: list[MemoryType] | None = Field(default=None, min_length=1, description="Any of these types")
    trust: list[Trust] | None = Field(default=None, min_length=1, description="Any of these trust levels")
    min_confidence: float | None = Field(default=None, ge=0.0, le=1.0, strict=True)
    time: str | None = Field(default=None, min_length=1, max_length=100, json_schema_extra=_NUL_FREE,
                             description='A phrase: "yesterday", "last 3 months", ...')
    time_range: TimeRange | None = None


class SearchRequest(Strict):
    query: Annotated[str, Field(min_length=1, max_length=MAX_QUERY_CHARS, json_schema_extra=_SHOWS),
                     AfterValidator(_not_blank)]
    scope: Scope
    filters: SearchFilters = Field(default_factory=SearchFilters)
    include_deleted: StrictBool = False
    include_expired: StrictBool = Field(default=False, description="Memories past their lifetime too")
    limit: wire_int(1, MAX_LIMIT) = 10
    rerank: StrictBool | None = Field(default=None, description="None: the server's rerank_default setting")
    rerank_top_n: wire_int(1, MAX_RERANK_TOP_N) | None = None
    explain: StrictBool = False


class Memory(BaseModel):
    id: UUID
    content: str
    user_id: str | None
    agent_id: str | None
    run_id: str | None
    type: str
    category: str | None
    tags: list[str]
    who: str | None
    source_type: str | None
    source_id: str | None
    session_id: str | None
    metadata: dict[str, Any]
    pinned: bool
    is_deleted: bool
    deleted_at: datetime | None
    confidence: float
    importance: float
    extraction_status: str
    extracted: dict[str, Any] | None
    access_count: int
    last_accessed: datetime | None
    embedding_model: str | None
    extraction_model: str | None
    content_hash: str
    created_at: datetime
    updated_at: datetime
    updated_by: str
    version: int
    status: str = "active"  # active, superseded, deleted, quarantined, or pending (approval)
    manual_override_until: datetime | None = None  # a person's edit locks it against automatic ones until then
    kind: Literal["raw", "fact"] = "raw"  # raw: as remembered; fact: extracted from `derived_from`
    derived_from: list[UUID] = Field(default_factory=list)
    # A fact's: the (source, relationship, target) links its extraction found that it mentions.
    entities: list[dict[str, Any]] = Field(default_factory=list)
    # Secrets restored into `content` that no redaction pattern finds (engram.fact_steps): every
    # provider call showing this memory redacts them. Kept out of every answer and hash.
    sensitive: list[str] = Field(default_factory=list, exclude=True)
    # Provenance (engram.domain.provenance).
    trust: Trust = "SEMI_TRUSTED"
    memory_type: MemoryType = "FACT"
    expires_at: datetime | None = None  # leaves default recall then; never deleted for it
    created_by: str | None = None
    agent_chain: list[str] = Field(default_factory=list)
    origin: dict[str, Any] | None = None  # {"source_type", "source_id"}: the original source, if relayed
    approval: str | None = None  # pending, approved, rejected, quarantined or withdrawn; None: none needed

    @property
    def scope(self) -> Scope:
        """The scope the memory belongs to (its three parts as stored, unchecked)."""
        return Scope.model_construct(user_id=self.user_id, agent_id=self.agent_id, run_id=self.run_id)


def ranked_score(fused: float, expansion: float, access: float, access_weight: float) -> float:
    """What ranks a search hit before any rerank: its fused score, the lift its session
    neighbours gave it, and c·log(1 + access_count) (`access` is the log, c ENGRAM_RANK_ACCESS_WEIGHT)."""
    return fused + expansion + access_weight * access


class ScoreComponents(BaseModel):
    vector: float
    bm25: float
    vector_norm: float
    bm25_norm: float
    fused: float
    expansion: float
    access: float
    rerank: float | None = None

    def before_rerank(self, access_weight: float) -> float:
        """The hit's score before any rerank (`ranked_score` of these components)."""
        return ranked_score(self.fused, self.expansion, self.access, access_weight)


class SearchHit(BaseModel):
    memory: Memory
    score: float
    components: ScoreComponents


class SearchResponse(BaseModel):
    results: list[SearchHit]
    warnings: list[str] = Field(default_factory=list)
    explain: dict[str, Any] | None = None


class MemoryPage(BaseModel):
    items: list[Memory]
    next_cursor: str | None


class Job(BaseModel):
    id: UUID
    memory_id: UUID | None
    job_type: str
    status: str
    attempt_count: int
    max_attempts: int
    next_attempt_at: datetime | None
    last_error: str | None
    last_error_code: str | None
    # The run that processes it: its batch's IngestWorkflow for a remember job (None until the
    # dispatcher batches it), its own run for a re-embed; none for an import.
    workflow_id: str | None
    workflow_started_at: datetime | None
    outcome: str | None
    # Re-embed and import jobs: {"done", "total"}; an import's also counts "parked" items.
    progress: dict[str, int] | None = None
    parent_id: UUID | None = None  # a remember job of a bulk import: the import's job
    created_at: datetime
    updated_at: datetime
    # A remember job's model calls (extraction, decisions) by "provider/model": {"calls", "in", "out"} tokens.
    usage: dict[str, dict[str, int]] | None = None


Role = Literal["reader", "agent", "writer", "operator", "admin"]
Grant = Annotated[str, Field(pattern=r"^(\*|(user|agent|run):[^\u0000]+)$", max_length=210,
                             description="'*', or 'user:<id>', 'agent:<id>', 'run:<id>' where <id> may be '*'")]


class KeyRequest(Strict):
    name: Annotated[str, Field(min_length=1, max_length=100, json_schema_extra=_SHOWS), AfterValidator(_not_blank)]
    role: Role
    scopes: list[Grant] = Field(min_length=1, max_length=100)


class ApiKey(BaseModel):
    """An API key's record. The secret itself is shown once, when the key is created."""

    id: UUID
    name: str
    role: Role
    scopes: list[str]
    created_at: datetime
    revoked_at: datetime | None


class CreatedKey(ApiKey):
    key: str = Field(description="The secret: send it as 'Authorization: Bearer <key>'. Shown only now.")


class KeyList(BaseModel):
    items: list[ApiKey]
