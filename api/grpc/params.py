"""What HTTP reads from a path, a query string or a header, as models: a gRPC request carries
these as fields and metadata, and they are checked with the same bounds as the HTTP routes'
(api/http.py; each model names the route it mirrors). A refused value is a ValidationFailed
whose detail names the field, in the words of HTTP's 422."""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, TypeAdapter, ValidationError

from api.errors import describe_validation
from engram.domain.changes import MAX_VERSION, Reason
from engram.domain.errors import ValidationFailed
from engram.domain.models import MAX_LIMIT, ScopeId, Tag
from engram.domain.provenance import MemoryType, Trust

# POST /api/memory/forget/{operation_id}/...
OPERATION_ID = r"^forget-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
_UUID = TypeAdapter(UUID)
_OPERATION = TypeAdapter(Annotated[str, Field(pattern=OPERATION_ID, max_length=43)])


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ListParams(_Params):
    """GET /api/memory's query parameters."""

    user_id: ScopeId | None = None
    agent_id: ScopeId | None = None
    run_id: ScopeId | None = None
    kind: Literal["raw", "fact"] | None = None
    type: Annotated[str | None, Field(min_length=1, max_length=64)] = None
    tags: Annotated[list[Tag] | None, Field(max_length=64)] = None
    who: Annotated[str | None, Field(min_length=1, max_length=200)] = None
    source_type: Annotated[str | None, Field(min_length=1, max_length=64)] = None
    time: Annotated[str | None, Field(min_length=1, max_length=100)] = None
    memory_type: Annotated[list[MemoryType] | None, Field(min_length=1)] = None
    trust: Annotated[list[Trust] | None, Field(min_length=1)] = None
    min_confidence: Annotated[float | None, Field(ge=0.0, le=1.0)] = None
    include_deleted: StrictBool = False
    include_expired: StrictBool = False
    status: Literal["active", "superseded", "deleted", "quarantined", "pending"] | None = None
    cursor: Annotated[str | None, Field(min_length=1, max_length=500)] = None
    limit: Annotated[StrictInt, Field(ge=1, le=MAX_LIMIT)] = 20


class ForgetParams(_Params):
    """DELETE /api/memory/{memory_id}'s query parameters."""

    reason: Reason
    force: StrictBool = False
    if_version: Annotated[StrictInt | None, Field(ge=1, le=MAX_VERSION)] = None


class ReviewListParams(_Params):
    """GET /api/reviews's query parameters."""

    status: Literal["open", "escalated", "resolved", "expired"] | None = None
    limit: Annotated[StrictInt, Field(ge=1, le=MAX_LIMIT)] = 50


class ApprovalListParams(_Params):
    """GET /api/memory/approvals's query parameters."""

    status: Literal["pending", "approved", "rejected", "quarantined", "withdrawn"] = "pending"
    limit: Annotated[StrictInt, Field(ge=1, le=MAX_LIMIT)] = 50


class CallMetadata(BaseModel):
    """The headers HTTP reads beside the key (`_change_context`), as gRPC metadata."""

    idempotency_key: Annotated[str | None, Field(alias="idempotency-key", min_length=1, max_length=200)] = None
    provider: Annotated[str | None, Field(alias="x-engram-provider", min_length=1, max_length=200)] = None
    model: Annotated[str | None, Field(alias="x-engram-model", min_length=1, max_length=200)] = None
    prompt_version: Annotated[str | None, Field(alias="x-engram-prompt-version", min_length=1,
                                                max_length=200)] = None


def checked(model: type[BaseModel], values: dict, where: str = ""):
    """`model` read from `values`. Raises ValidationFailed naming each refused field (under
    `where.` when given), as HTTP's 422 does."""
    try:
        return model.model_validate(values)
    except ValidationError as err:
        raise ValidationFailed(describe_validation(
            [{**e, "loc": (where, *e["loc"]) if where else e["loc"]} for e in err.errors()])) from None


def uuid_of(value: str, name: str) -> UUID:
    """The UUID `value` names. Raises ValidationFailed, naming the field `name`."""
    try:
        return _UUID.validate_python(value)
    except ValidationError as err:
        raise ValidationFailed(describe_validation([{**e, "loc": (name,)} for e in err.errors()])) from None


def operation_id(value: str) -> str:
    """A batch forget's operation id (`forget-<uuid>`). Raises ValidationFailed otherwise."""
    try:
        return _OPERATION.validate_python(value)
    except ValidationError as err:
        raise ValidationFailed(describe_validation([{**e, "loc": ("operation_id",)} for e in err.errors()])) from None
