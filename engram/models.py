"""The service's request and result models, shared by every gateway."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, model_validator

_ID = Field(default=None, min_length=1, max_length=200)


class Strict(BaseModel):
    """Unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


class Scope(Strict):
    """Who a memory belongs to. At least one part is required."""

    user_id: str | None = _ID
    agent_id: str | None = _ID
    run_id: str | None = _ID

    @model_validator(mode="after")
    def _at_least_one(self) -> "Scope":
        if self.user_id is None and self.agent_id is None and self.run_id is None:
            raise ValueError("scope needs at least one of user_id, agent_id, run_id")
        return self

    @property
    def key(self) -> str:
        """Canonical text of the scope, used in the dedupe key."""
        return f"u:{self.user_id or ''}|a:{self.agent_id or ''}|r:{self.run_id or ''}"


Mode = Literal["auto", "sync", "async"]
RememberStatus = Literal["processed", "queued", "raw_saved"]


class RememberRequest(Strict):
    content: str
    scope: Scope
    type: str = Field(default="fact", min_length=1, max_length=64)
    tags: list[str] = Field(default_factory=list, max_length=64)
    who: str | None = Field(default=None, max_length=200)
    source_type: str | None = Field(default=None, max_length=64)
    source_id: str | None = Field(default=None, max_length=200)
    session_id: str | None = Field(default=None, max_length=200)
    metadata: dict[str, Any] = Field(default_factory=dict)
    pinned: bool = False
    importance: float = Field(default=0.5, ge=0.0, le=1.0)
    mode: Mode = "auto"
    raw: bool = False
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)
    pipeline_timeout_ms: int | None = Field(default=None, ge=0)


class RememberResponse(BaseModel):
    memory_id: UUID
    status: RememberStatus
    job_id: UUID | None
    warnings: list[str] = Field(default_factory=list)


class TimeRange(Strict):
    start: datetime | None = None
    end: datetime | None = None


class SearchFilters(Strict):
    type: str | None = None
    tags: list[str] | None = None
    who: str | None = None
    source_type: str | None = None
    time: str | None = Field(default=None, description='A phrase: "yesterday", "last 3 months", ...')
    time_range: TimeRange | None = None


class SearchRequest(Strict):
    query: str = Field(min_length=1, max_length=4_000)
    scope: Scope
    filters: SearchFilters = Field(default_factory=SearchFilters)
    include_deleted: bool = False
    limit: int = Field(default=10, ge=1)
    rerank: bool | None = Field(default=None, description="None: the rerank_default setting")
    rerank_top_n: int | None = Field(default=None, ge=1)
    explain: bool = False


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


class ScoreComponents(BaseModel):
    vector: float
    bm25: float
    vector_norm: float
    bm25_norm: float
    fused: float
    expansion: float
    access: float
    rerank: float | None = None


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
    workflow_id: str
    workflow_started_at: datetime | None
    outcome: str | None
    progress: dict[str, int] | None = None  # re-embed jobs: {"done", "total"}
    created_at: datetime
    updated_at: datetime
