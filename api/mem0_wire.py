"""The mem0 platform's wire, as Engram reads and writes it: the request bodies mem0's client
sends (api/mem0.py's routes take them), what their entity ids and filters select in Engram's
terms, and memories and history shown as mem0 shows them."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import Any
from uuid import UUID

from pydantic import Field, StrictBool, StrictFloat, StrictInt, model_validator
from pydantic import ValidationError as PydanticValidationError

from engram.domain.changes import MAX_MODIFY_BATCH, MemoryHistory, Reason
from engram.domain.errors import ValidationFailed
from engram.domain.forget import MAX_FORGET_IDS
from engram.domain.models import (
    MAX_LIMIT, Content, JsonValue, Label, Memory, Metadata, Scope, ScopeId, SearchFilters, Strict, Tag, TimeRange,
)

PARTS = ("user_id", "agent_id", "run_id")
APP_ID_REFUSED = ("app_id is not supported: Engram's scopes are user_id, agent_id and run_id; send the app as one "
                  "of them")


# -- bodies -------------------------------------------------------------------------------------

class _Entities(Strict):
    """Fields every memory body of mem0 may carry: the entity ids, `filters`, and format
    switches that choose among mem0's response formats (Engram answers one; they change nothing)."""

    user_id: ScopeId | None = None
    agent_id: ScopeId | None = None
    run_id: ScopeId | None = None
    filters: dict[str, JsonValue] | None = None
    version: str | None = None
    output_format: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_app_id(cls, data: Any) -> Any:
        if isinstance(data, dict) and "app_id" in data:
            raise ValueError(APP_ID_REFUSED)
        return data


class Message(Strict):
    role: Label
    content: Content
    name: Label | None = None


def _refusing(data: Any, name: str, why: str) -> Any:
    """A body's data, unless it carries `name`: then ValueError, saying `why`."""
    if isinstance(data, dict) and name in data:
        raise ValueError(f"{name}: {why}")
    return data


class _Timeless(Strict):
    """A body that may carry mem0's time fields: `expiration_date: null` already holds (a
    change never moves a memory's expiry in Engram); any other expiry, or a timestamp, is refused."""

    @model_validator(mode="before")
    @classmethod
    def _timeless(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if data.get("expiration_date") is not None:
                raise ValueError("expiration_date: memories do not expire in Engram")
            if "timestamp" in data:
                raise ValueError("timestamp: a memory's created_at is when Engram stored it")
            data = {k: v for k, v in data.items() if k != "expiration_date"}
        return data


class AddBody(_Entities):
    messages: list[Message] = Field(min_length=1, max_length=100)
    metadata: Metadata | None = None
    infer: StrictBool = True
    async_mode: StrictBool | None = None  # absent: Engram's `auto` mode
    # "YYYY-MM-DD": the memories expire after that day (UTC); absent or null: their type's lifetime.
    expiration_date: date | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_timestamp(cls, data: Any) -> Any:
        return _refusing(data, "timestamp", "a memory's created_at is when Engram stored it")

    def expires_at(self) -> datetime | None:
        if self.expiration_date is None:
            return None
        return datetime.combine(self.expiration_date + timedelta(days=1), datetime.min.time(), timezone.utc)


class _Read(_Entities):
    categories: list[Tag] | None = Field(default=None, max_length=64)
    show_expired: StrictBool | None = None  # true: memories past their lifetime too
    # Nothing is marked superseded yet (the status is reserved), so this holds whatever it is set to.
    latest_only: StrictBool | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_metadata(cls, data: Any) -> Any:
        return _refusing(data, "metadata", "filtering on metadata is not supported")


class SearchBody(_Read):
    query: str
    top_k: StrictInt | None = Field(default=None, ge=1, le=MAX_LIMIT)
    limit: StrictInt | None = Field(default=None, ge=1, le=MAX_LIMIT)  # older clients' name for top_k
    threshold: StrictFloat | StrictInt | None = None
    rerank: StrictBool | None = None
    fields: list[str] | None = None
    keyword_search: StrictBool | None = None  # Engram's search is always lexical and semantic


class GetAllBody(_Read):
    start_date: str | None = None
    end_date: str | None = None


class UpdateBody(_Timeless):
    text: Content | None = None
    metadata: Metadata | None = None
    reason: Reason | None = None


class BatchUpdateItem(Strict):
    memory_id: UUID
    text: Content | None = None
    metadata: Metadata | None = None
    reason: Reason | None = None

    @model_validator(mode="after")
    def _changes_something(self) -> "BatchUpdateItem":
        if self.text is None and self.metadata is None:
            raise ValueError("give text or metadata to change")
        return self


class BatchUpdateBody(Strict):
    memories: list[BatchUpdateItem] = Field(min_length=1, max_length=MAX_MODIFY_BATCH)


class BatchDeleteItem(Strict):
    memory_id: UUID


class BatchDeleteBody(Strict):
    memories: list[BatchDeleteItem] = Field(min_length=1, max_length=MAX_FORGET_IDS)
    reason: Reason | None = None


# -- translation --------------------------------------------------------------------------------

@dataclass
class _Selection:
    """What mem0's entity ids and filters select, in Engram's terms."""

    parts: dict[str, str] = field(default_factory=dict)
    tags: list[str] | None = None
    start: datetime | None = None
    end: datetime | None = None
    trust: list[str] | None = None
    min_confidence: float | None = None

    def part(self, name: str, value: Any, where: str) -> None:
        if isinstance(value, dict) and set(value) == {"eq"}:
            value = value["eq"]
        if not isinstance(value, str):
            raise ValidationFailed(f"{where}: one id, as a string (a scope part matches one value)")
        if self.parts.get(name, value) != value:
            raise ValidationFailed(f"{where}: {name} is given twice, with different values")
        self.parts[name] = value

    def read(self, filters: dict[str, Any], where: str = "filters") -> None:
        for key, value in filters.items():
            at = f"{where}.{key}"
            if key in PARTS:
                self.part(key, value, at)
            elif key == "AND":
                if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
                    raise ValidationFailed(f"{at}: a list of filter objects")
                for i, clause in enumerate(value):
                    self.read(clause, f"{at}[{i}]")
            elif key == "app_id":
                raise ValidationFailed(f"{at}: {APP_ID_REFUSED}")
            elif key == "categories":
                self.tags = _categories(value, at)
            elif key == "trust":
                self.trust = _categories(value, at)
            elif key == "confidence":
                self.min_confidence = _minimum(value, at)
            elif key == "created_at":
                if not isinstance(value, dict) or not value:
                    raise ValidationFailed(f"{at}: an object of gte, gt, lte and lt bounds")
                for op, when in value.items():
                    self.bound(op, when, f"{at}.{op}")
            else:
                raise ValidationFailed(f"{at}: not supported by Engram's mem0-compatible API (filters take user_id, "
                                       "agent_id, run_id, AND, categories, created_at, trust and confidence)")

    def bound(self, op: str, text: Any, where: str) -> None:
        """Narrow [start, end) by `created_at <op> text`."""
        if op not in ("gte", "gt", "lte", "lt"):
            raise ValidationFailed(f"{where}: use gte, gt, lte or lt")
        when, step = _instant(text, where)
        if op in ("gt", "lte"):
            when += step  # to the first instant after it: the range is [start, end)
        if op in ("gte", "gt"):
            self.start = max(filter(None, [self.start, when]))
        else:
            self.end = min(filter(None, [self.end, when]))

    def scope(self) -> Scope:
        if not self.parts:
            raise ValidationFailed("give at least one of user_id, agent_id, run_id (at the top level or in filters)")
        return Scope(**self.parts)

    def filters(self) -> SearchFilters:
        span = TimeRange(start=self.start, end=self.end) if self.start or self.end else None
        try:
            return SearchFilters(tags=self.tags, time_range=span, trust=self.trust, min_confidence=self.min_confidence)
        except PydanticValidationError as err:
            raise ValidationFailed("filters: " + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                                           for e in err.errors())) from None


def _minimum(value: Any, where: str) -> float:
    """`{"gte": x}` (or a bare number): at least x."""
    if isinstance(value, dict) and set(value) == {"gte"}:
        value = value["gte"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValidationFailed(f"{where}: a number from 0 to 1, or {{'gte': number}}")
    return float(value)


def _categories(value: Any, where: str) -> list[str]:
    if isinstance(value, dict) and len(value) == 1 and ("in" in value or "contains" in value):
        value = value.get("in", value.get("contains"))
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValidationFailed(f"{where}: a category, a list of them, or {{'in': [...]}}")
    return value


def _instant(text: Any, where: str) -> tuple[datetime, timedelta]:
    """The instant `text` names and its resolution: a date is its first instant in UTC."""
    if isinstance(text, str) and len(text) == 10:
        try:
            return datetime.combine(date.fromisoformat(text), datetime.min.time(), timezone.utc), timedelta(days=1)
        except ValueError:
            pass
    try:
        when = datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise ValidationFailed(f"{where}: an ISO 8601 date, or date-time with a time zone")
    return when, timedelta(microseconds=1)


def select(body: _Entities) -> _Selection:
    selection = _Selection()
    for part in PARTS:
        if getattr(body, part) is not None:
            selection.part(part, getattr(body, part), part)
    if body.filters:
        selection.read(body.filters)
    if isinstance(body, _Read) and body.categories:
        if selection.tags is not None and selection.tags != body.categories:
            raise ValidationFailed("categories: given at the top level and in filters, differently")
        selection.tags = body.categories
    if isinstance(body, GetAllBody):
        for op, text, where in (("gte", body.start_date, "start_date"), ("lte", body.end_date, "end_date")):
            if text is not None:
                selection.bound(op, text, where)
    return selection


def shown(m: Memory, score: float | None = None) -> dict[str, Any]:
    """A memory as mem0's platform shows one; `categories` are its tags."""
    shown = {"id": str(m.id), "memory": m.content, "user_id": m.user_id, "agent_id": m.agent_id, "run_id": m.run_id,
             "app_id": None, "metadata": m.metadata, "categories": m.tags, "hash": m.content_hash,
             # The last day it is in recall, as mem0's expiration_date means (add reads it back so).
             "expiration_date": (m.expires_at - timedelta(microseconds=1)).date().isoformat() if m.expires_at else None,
             "trust": m.trust, "confidence": m.confidence, "memory_type": m.memory_type,
             "created_at": m.created_at.isoformat(), "updated_at": m.updated_at.isoformat()}
    if score is not None:
        shown["score"] = score
    return shown


def history_entries(h: MemoryHistory) -> list[dict[str, Any]]:
    """Each event as a mem0 history entry (old and new text), with Engram's reason, path and actor."""
    entries, text = [], None
    m = h.memory
    for e in h.events:
        after = (e.state or {}).get("content") or e.new_content or text
        entries.append({
            "id": str(e.id), "memory_id": str(m.id), "event": e.event,
            "old_memory": None if e.event == "ADD" else (e.old_content or text),
            "new_memory": None if e.event in ("DELETE", "REJECT") else after,
            "user_id": m.user_id, "agent_id": m.agent_id, "run_id": m.run_id, "categories": m.tags,
            "metadata": (e.state or {}).get("metadata"), "reason": e.reason, "path": e.path, "actor_type": e.actor_type,
            "actor_id": e.actor_id, "version": e.version,
            "created_at": e.created_at.isoformat(), "updated_at": e.created_at.isoformat(),
        })
        text = after
    return entries


def scope_of_repr(text: str) -> dict[str, str]:
    """The scope parts in `delete_all`'s `filters` query parameter, which the client sends as a
    Python repr ({'user_id': 'alice'}), read as a literal, never evaluated."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ValidationFailed("filters: a dict of user_id, agent_id, run_id") from None
    if not isinstance(value, dict) or not value or not set(value) <= set(PARTS) \
            or not all(isinstance(v, str) for v in value.values()):
        raise ValidationFailed("filters: a dict of user_id, agent_id, run_id (strings)")
    return value
