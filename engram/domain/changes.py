"""The wire models of changing a memory by id: patch, forget, recover, roll back, confirm, its
history, and `engram verify`'s report. Every change needs a reason; history keeps it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, model_validator

from engram.domain.models import (
    _SHOWS, Content, ItemError, JsonValue, Memory, Metadata, ShortLabel, Strict, Tag, _not_blank, wire_int,
)

MAX_MODIFY_BATCH = 100
MAX_VERSION = 2 ** 31 - 1
Reason = Annotated[str, Field(min_length=1, max_length=500, json_schema_extra=_SHOWS), AfterValidator(_not_blank)]
Version = wire_int(1, MAX_VERSION)
# The way a change came in, recorded on its history event (`system:<loop>` for the service's own).
Path = Literal["http", "cli", "grpc", "mcp", "agent", "mem0"]
CHANGE_FIELDS = ("content", "type", "tags", "importance", "pinned", "metadata")


@dataclass(frozen=True)
class ModelAttribution:
    """The model that acted, as the caller declares it (an agent's own model, sent as
    X-Engram-Provider / -Model / -Prompt-Version): recorded on the history events of what it
    writes, beside the pipeline's own; trusted for nothing."""

    provider: str | None = None
    model: str | None = None
    prompt_version: str | None = None


NO_MODEL = ModelAttribution()


@dataclass(frozen=True)
class ChangeContext:
    """How a change came in: its path (history's `path`), request id and idempotency key, and
    the model that acted, if the caller names one."""

    path: str = "http"
    request_id: str | None = None
    idempotency_key: str | None = None
    model: ModelAttribution = NO_MODEL


def _one_change_required(schema: dict) -> None:
    schema["anyOf"] = [{"required": [name], "properties": {name: {"not": {"type": "null"}}}} for name in CHANGE_FIELDS]


class MemoryPatch(Strict):
    """New values for some of a memory's fields (at least one), and why."""

    model_config = ConfigDict(json_schema_extra=_one_change_required)

    content: Content | None = None
    type: ShortLabel | None = None
    tags: list[Tag] | None = Field(default=None, max_length=64)
    importance: float | None = Field(default=None, ge=0.0, le=1.0, strict=True)
    pinned: StrictBool | None = None
    metadata: Metadata | None = None
    reason: Reason
    if_version: Version | None = Field(default=None, description="Change only if the memory is at this version "
                                                                  "(else 409 version_conflict, nothing changed)")

    @model_validator(mode="after")
    def _changes_something(self) -> "MemoryPatch":
        if all(getattr(self, name) is None for name in CHANGE_FIELDS):
            raise ValueError(f"give at least one of {', '.join(CHANGE_FIELDS)} to change")
        return self

    def changes(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in CHANGE_FIELDS if getattr(self, name) is not None}


class ModifyItem(MemoryPatch):
    id: UUID


class ModifyBatchRequest(Strict):
    items: list[dict[str, JsonValue]] = Field(min_length=1, max_length=MAX_MODIFY_BATCH, description=(
        "ModifyItem objects (a patch with the memory's id); each is applied, or refused, on its own"))


class ModifyItemResult(BaseModel):
    index: int
    id: UUID | None = None
    ok: bool
    version: int | None = None  # the memory's version after the change
    error: ItemError | None = None
    current_version: int | None = None  # on a version conflict


class ModifyBatchResponse(BaseModel):
    applied: int
    failed: int
    results: list[ModifyItemResult]


class RecoverRequest(Strict):
    reason: Reason


class RollbackRequest(Strict):
    version: Version
    reason: Reason
    if_version: Version | None = None


class ConfirmRequest(Strict):
    """An operator accepts a quarantined memory's row as it is now."""

    reason: Reason


class HistoryEvent(BaseModel):
    id: int
    event: str
    version: int
    actor_type: str
    actor_id: str
    reason: str | None
    path: str | None
    provider: str | None
    model: str | None
    prompt_version: str | None
    decision_reason: str | None
    request_id: str | None
    session_id: str | None
    old_content: str | None
    new_content: str | None
    old_metadata: dict[str, Any] | None
    new_metadata: dict[str, Any] | None
    state: dict[str, Any] | None
    hash: str | None
    prev_hash: str | None
    scope_seq: int | None
    created_at: datetime


class FactRef(BaseModel):
    """A fact the write pipeline took from this memory."""

    id: UUID
    content: str
    version: int
    is_deleted: bool
    status: str


class DecisionRecord(BaseModel):
    """What the write pipeline decided about one fact (memory_decisions): taken from this
    memory (`source_memory_id`), naming it (`target_id`), or writing it (`memory_id`)."""

    source_memory_id: UUID
    fact: str
    fact_type: str
    fact_confidence: float
    action: str
    target_id: UUID | None
    memory_id: UUID | None
    content: str | None
    confidence: float | None
    reason: str | None
    outcome: str
    detail: str | None
    mode: str
    provider: str | None
    model: str | None
    prompt_version: str | None
    created_at: datetime


class MemoryHistory(BaseModel):
    """A memory's events, oldest first, and its lineage: the facts taken from it and every
    decision about it (a fact's sources are its `memory.derived_from`)."""

    memory: Memory
    events: list[HistoryEvent]
    facts: list[FactRef] = []
    decisions: list[DecisionRecord] = []


class ChainBreak(BaseModel):
    kind: Literal["memory", "scope"]
    where: str
    event_id: int | None
    detail: str


class VerifyReport(BaseModel):
    ok: bool
    memories: int
    events: int
    breaks: list[ChainBreak]
