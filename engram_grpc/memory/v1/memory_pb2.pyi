import datetime

from google.protobuf import empty_pb2 as _empty_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Scope(_message.Message):
    __slots__ = ("user_id", "agent_id", "run_id")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    agent_id: str
    run_id: str
    def __init__(self, user_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class Origin(_message.Message):
    __slots__ = ("source_type", "source_id")
    SOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    source_type: str
    source_id: str
    def __init__(self, source_type: _Optional[str] = ..., source_id: _Optional[str] = ...) -> None: ...

class StringList(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, items: _Optional[_Iterable[str]] = ...) -> None: ...

class RememberItem(_message.Message):
    __slots__ = ("content", "scope", "type", "memory_type", "tags", "who", "source_type", "source_id", "session_id", "metadata", "pinned", "importance", "confidence", "expires_at", "origin", "agent_chain", "raw", "idempotency_key")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TYPE_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    WHO_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    AGENT_CHAIN_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    content: str
    scope: Scope
    type: str
    memory_type: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    who: str
    source_type: str
    source_id: str
    session_id: str
    metadata: _struct_pb2.Struct
    pinned: bool
    importance: float
    confidence: float
    expires_at: _timestamp_pb2.Timestamp
    origin: Origin
    agent_chain: _containers.RepeatedScalarFieldContainer[str]
    raw: bool
    idempotency_key: str
    def __init__(self, content: _Optional[str] = ..., scope: _Optional[_Union[Scope, _Mapping]] = ..., type: _Optional[str] = ..., memory_type: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., who: _Optional[str] = ..., source_type: _Optional[str] = ..., source_id: _Optional[str] = ..., session_id: _Optional[str] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., pinned: _Optional[bool] = ..., importance: _Optional[float] = ..., confidence: _Optional[float] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., origin: _Optional[_Union[Origin, _Mapping]] = ..., agent_chain: _Optional[_Iterable[str]] = ..., raw: _Optional[bool] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class RememberRequest(_message.Message):
    __slots__ = ("content", "scope", "type", "memory_type", "tags", "who", "source_type", "source_id", "session_id", "metadata", "pinned", "importance", "confidence", "expires_at", "origin", "agent_chain", "raw", "idempotency_key", "mode", "pipeline_timeout_ms")
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TYPE_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    WHO_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    AGENT_CHAIN_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    content: str
    scope: Scope
    type: str
    memory_type: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    who: str
    source_type: str
    source_id: str
    session_id: str
    metadata: _struct_pb2.Struct
    pinned: bool
    importance: float
    confidence: float
    expires_at: _timestamp_pb2.Timestamp
    origin: Origin
    agent_chain: _containers.RepeatedScalarFieldContainer[str]
    raw: bool
    idempotency_key: str
    mode: str
    pipeline_timeout_ms: int
    def __init__(self, content: _Optional[str] = ..., scope: _Optional[_Union[Scope, _Mapping]] = ..., type: _Optional[str] = ..., memory_type: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., who: _Optional[str] = ..., source_type: _Optional[str] = ..., source_id: _Optional[str] = ..., session_id: _Optional[str] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., pinned: _Optional[bool] = ..., importance: _Optional[float] = ..., confidence: _Optional[float] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., origin: _Optional[_Union[Origin, _Mapping]] = ..., agent_chain: _Optional[_Iterable[str]] = ..., raw: _Optional[bool] = ..., idempotency_key: _Optional[str] = ..., mode: _Optional[str] = ..., pipeline_timeout_ms: _Optional[int] = ...) -> None: ...

class RememberBatchRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[RememberItem]
    def __init__(self, items: _Optional[_Iterable[_Union[RememberItem, _Mapping]]] = ...) -> None: ...

class TimeRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: _timestamp_pb2.Timestamp
    end: _timestamp_pb2.Timestamp
    def __init__(self, start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SearchFilters(_message.Message):
    __slots__ = ("kind", "type", "tags", "who", "source_type", "memory_type", "trust", "min_confidence", "time", "time_range")
    KIND_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    WHO_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TYPE_FIELD_NUMBER: _ClassVar[int]
    TRUST_FIELD_NUMBER: _ClassVar[int]
    MIN_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    TIME_RANGE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    type: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    who: str
    source_type: str
    memory_type: _containers.RepeatedScalarFieldContainer[str]
    trust: _containers.RepeatedScalarFieldContainer[str]
    min_confidence: float
    time: str
    time_range: TimeRange
    def __init__(self, kind: _Optional[str] = ..., type: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., who: _Optional[str] = ..., source_type: _Optional[str] = ..., memory_type: _Optional[_Iterable[str]] = ..., trust: _Optional[_Iterable[str]] = ..., min_confidence: _Optional[float] = ..., time: _Optional[str] = ..., time_range: _Optional[_Union[TimeRange, _Mapping]] = ...) -> None: ...

class SearchRequest(_message.Message):
    __slots__ = ("query", "scope", "filters", "include_deleted", "include_expired", "limit", "rerank", "rerank_top_n", "explain")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DELETED_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    RERANK_FIELD_NUMBER: _ClassVar[int]
    RERANK_TOP_N_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    query: str
    scope: Scope
    filters: SearchFilters
    include_deleted: bool
    include_expired: bool
    limit: int
    rerank: bool
    rerank_top_n: int
    explain: bool
    def __init__(self, query: _Optional[str] = ..., scope: _Optional[_Union[Scope, _Mapping]] = ..., filters: _Optional[_Union[SearchFilters, _Mapping]] = ..., include_deleted: _Optional[bool] = ..., include_expired: _Optional[bool] = ..., limit: _Optional[int] = ..., rerank: _Optional[bool] = ..., rerank_top_n: _Optional[int] = ..., explain: _Optional[bool] = ...) -> None: ...

class GetMemoryRequest(_message.Message):
    __slots__ = ("memory_id",)
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    memory_id: str
    def __init__(self, memory_id: _Optional[str] = ...) -> None: ...

class ListMemoriesRequest(_message.Message):
    __slots__ = ("user_id", "agent_id", "run_id", "kind", "type", "tags", "who", "source_type", "time", "memory_type", "trust", "min_confidence", "include_deleted", "include_expired", "status", "cursor", "limit")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    WHO_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TYPE_FIELD_NUMBER: _ClassVar[int]
    TRUST_FIELD_NUMBER: _ClassVar[int]
    MIN_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DELETED_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    agent_id: str
    run_id: str
    kind: str
    type: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    who: str
    source_type: str
    time: str
    memory_type: _containers.RepeatedScalarFieldContainer[str]
    trust: _containers.RepeatedScalarFieldContainer[str]
    min_confidence: float
    include_deleted: bool
    include_expired: bool
    status: str
    cursor: str
    limit: int
    def __init__(self, user_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., run_id: _Optional[str] = ..., kind: _Optional[str] = ..., type: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., who: _Optional[str] = ..., source_type: _Optional[str] = ..., time: _Optional[str] = ..., memory_type: _Optional[_Iterable[str]] = ..., trust: _Optional[_Iterable[str]] = ..., min_confidence: _Optional[float] = ..., include_deleted: _Optional[bool] = ..., include_expired: _Optional[bool] = ..., status: _Optional[str] = ..., cursor: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ModifyMemoryRequest(_message.Message):
    __slots__ = ("memory_id", "content", "type", "tags", "importance", "pinned", "metadata", "reason", "if_version")
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    IF_VERSION_FIELD_NUMBER: _ClassVar[int]
    memory_id: str
    content: str
    type: str
    tags: StringList
    importance: float
    pinned: bool
    metadata: _struct_pb2.Struct
    reason: str
    if_version: int
    def __init__(self, memory_id: _Optional[str] = ..., content: _Optional[str] = ..., type: _Optional[str] = ..., tags: _Optional[_Union[StringList, _Mapping]] = ..., importance: _Optional[float] = ..., pinned: _Optional[bool] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., reason: _Optional[str] = ..., if_version: _Optional[int] = ...) -> None: ...

class ModifyItem(_message.Message):
    __slots__ = ("id", "content", "type", "tags", "importance", "pinned", "metadata", "reason", "if_version")
    ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    IF_VERSION_FIELD_NUMBER: _ClassVar[int]
    id: str
    content: str
    type: str
    tags: StringList
    importance: float
    pinned: bool
    metadata: _struct_pb2.Struct
    reason: str
    if_version: int
    def __init__(self, id: _Optional[str] = ..., content: _Optional[str] = ..., type: _Optional[str] = ..., tags: _Optional[_Union[StringList, _Mapping]] = ..., importance: _Optional[float] = ..., pinned: _Optional[bool] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., reason: _Optional[str] = ..., if_version: _Optional[int] = ...) -> None: ...

class ModifyMemoriesRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ModifyItem]
    def __init__(self, items: _Optional[_Iterable[_Union[ModifyItem, _Mapping]]] = ...) -> None: ...

class ForgetMemoryRequest(_message.Message):
    __slots__ = ("memory_id", "reason", "force", "if_version")
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    IF_VERSION_FIELD_NUMBER: _ClassVar[int]
    memory_id: str
    reason: str
    force: bool
    if_version: int
    def __init__(self, memory_id: _Optional[str] = ..., reason: _Optional[str] = ..., force: _Optional[bool] = ..., if_version: _Optional[int] = ...) -> None: ...

class RecoverMemoryRequest(_message.Message):
    __slots__ = ("memory_id", "reason")
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    memory_id: str
    reason: str
    def __init__(self, memory_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RollbackMemoryRequest(_message.Message):
    __slots__ = ("memory_id", "version", "reason", "if_version")
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    IF_VERSION_FIELD_NUMBER: _ClassVar[int]
    memory_id: str
    version: int
    reason: str
    if_version: int
    def __init__(self, memory_id: _Optional[str] = ..., version: _Optional[int] = ..., reason: _Optional[str] = ..., if_version: _Optional[int] = ...) -> None: ...

class ConfirmMemoryRequest(_message.Message):
    __slots__ = ("memory_id", "reason")
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    memory_id: str
    reason: str
    def __init__(self, memory_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class GetHistoryRequest(_message.Message):
    __slots__ = ("memory_id",)
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    memory_id: str
    def __init__(self, memory_id: _Optional[str] = ...) -> None: ...

class ForgetRequest(_message.Message):
    __slots__ = ("scope", "query", "filters", "ids", "limit", "reason", "force", "everything")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    EVERYTHING_FIELD_NUMBER: _ClassVar[int]
    scope: Scope
    query: str
    filters: SearchFilters
    ids: _containers.RepeatedScalarFieldContainer[str]
    limit: int
    reason: str
    force: bool
    everything: bool
    def __init__(self, scope: _Optional[_Union[Scope, _Mapping]] = ..., query: _Optional[str] = ..., filters: _Optional[_Union[SearchFilters, _Mapping]] = ..., ids: _Optional[_Iterable[str]] = ..., limit: _Optional[int] = ..., reason: _Optional[str] = ..., force: _Optional[bool] = ..., everything: _Optional[bool] = ...) -> None: ...

class ExecuteForgetRequest(_message.Message):
    __slots__ = ("operation_id", "confirm_token", "reason")
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    operation_id: str
    confirm_token: str
    reason: str
    def __init__(self, operation_id: _Optional[str] = ..., confirm_token: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class GetForgetRequest(_message.Message):
    __slots__ = ("operation_id",)
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    operation_id: str
    def __init__(self, operation_id: _Optional[str] = ...) -> None: ...

class DecideForgetRequest(_message.Message):
    __slots__ = ("operation_id", "reason")
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    operation_id: str
    reason: str
    def __init__(self, operation_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class VerifyReceiptRequest(_message.Message):
    __slots__ = ("receipt",)
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    receipt: _struct_pb2.Struct
    def __init__(self, receipt: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class ListReviewsRequest(_message.Message):
    __slots__ = ("status", "limit")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    status: str
    limit: int
    def __init__(self, status: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class GetReviewRequest(_message.Message):
    __slots__ = ("review_id",)
    REVIEW_ID_FIELD_NUMBER: _ClassVar[int]
    review_id: str
    def __init__(self, review_id: _Optional[str] = ...) -> None: ...

class ResolveReviewRequest(_message.Message):
    __slots__ = ("review_id", "resolution", "reason", "content")
    REVIEW_ID_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    review_id: str
    resolution: str
    reason: str
    content: str
    def __init__(self, review_id: _Optional[str] = ..., resolution: _Optional[str] = ..., reason: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ListApprovalsRequest(_message.Message):
    __slots__ = ("status", "limit")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    status: str
    limit: int
    def __init__(self, status: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class GetApprovalRequest(_message.Message):
    __slots__ = ("approval_id",)
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    def __init__(self, approval_id: _Optional[str] = ...) -> None: ...

class DecideApprovalRequest(_message.Message):
    __slots__ = ("approval_id", "decision", "reason")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    decision: str
    reason: str
    def __init__(self, approval_id: _Optional[str] = ..., decision: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class SwitchChange(_message.Message):
    __slots__ = ("switch", "on", "scope", "reason")
    SWITCH_FIELD_NUMBER: _ClassVar[int]
    ON_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    switch: str
    on: bool
    scope: Scope
    reason: str
    def __init__(self, switch: _Optional[str] = ..., on: _Optional[bool] = ..., scope: _Optional[_Union[Scope, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class KeyRequest(_message.Message):
    __slots__ = ("name", "role", "scopes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    scopes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ..., scopes: _Optional[_Iterable[str]] = ...) -> None: ...

class RevokeKeyRequest(_message.Message):
    __slots__ = ("key_id",)
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    def __init__(self, key_id: _Optional[str] = ...) -> None: ...

class Memory(_message.Message):
    __slots__ = ("id", "content", "user_id", "agent_id", "run_id", "type", "category", "tags", "who", "source_type", "source_id", "session_id", "metadata", "pinned", "is_deleted", "deleted_at", "confidence", "importance", "extraction_status", "extracted", "access_count", "last_accessed", "embedding_model", "extraction_model", "content_hash", "created_at", "updated_at", "updated_by", "version", "status", "manual_override_until", "kind", "derived_from", "entities", "trust", "memory_type", "expires_at", "created_by", "agent_chain", "origin", "approval")
    ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    WHO_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    IS_DELETED_FIELD_NUMBER: _ClassVar[int]
    DELETED_AT_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    EXTRACTION_STATUS_FIELD_NUMBER: _ClassVar[int]
    EXTRACTED_FIELD_NUMBER: _ClassVar[int]
    ACCESS_COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_ACCESSED_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    EXTRACTION_MODEL_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_BY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MANUAL_OVERRIDE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DERIVED_FROM_FIELD_NUMBER: _ClassVar[int]
    ENTITIES_FIELD_NUMBER: _ClassVar[int]
    TRUST_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TYPE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    AGENT_CHAIN_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    id: str
    content: str
    user_id: str
    agent_id: str
    run_id: str
    type: str
    category: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    who: str
    source_type: str
    source_id: str
    session_id: str
    metadata: _struct_pb2.Struct
    pinned: bool
    is_deleted: bool
    deleted_at: _timestamp_pb2.Timestamp
    confidence: float
    importance: float
    extraction_status: str
    extracted: _struct_pb2.Struct
    access_count: int
    last_accessed: _timestamp_pb2.Timestamp
    embedding_model: str
    extraction_model: str
    content_hash: str
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    updated_by: str
    version: int
    status: str
    manual_override_until: _timestamp_pb2.Timestamp
    kind: str
    derived_from: _containers.RepeatedScalarFieldContainer[str]
    entities: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    trust: str
    memory_type: str
    expires_at: _timestamp_pb2.Timestamp
    created_by: str
    agent_chain: _containers.RepeatedScalarFieldContainer[str]
    origin: _struct_pb2.Struct
    approval: str
    def __init__(self, id: _Optional[str] = ..., content: _Optional[str] = ..., user_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., run_id: _Optional[str] = ..., type: _Optional[str] = ..., category: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., who: _Optional[str] = ..., source_type: _Optional[str] = ..., source_id: _Optional[str] = ..., session_id: _Optional[str] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., pinned: _Optional[bool] = ..., is_deleted: _Optional[bool] = ..., deleted_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., confidence: _Optional[float] = ..., importance: _Optional[float] = ..., extraction_status: _Optional[str] = ..., extracted: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., access_count: _Optional[int] = ..., last_accessed: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., embedding_model: _Optional[str] = ..., extraction_model: _Optional[str] = ..., content_hash: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_by: _Optional[str] = ..., version: _Optional[int] = ..., status: _Optional[str] = ..., manual_override_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., kind: _Optional[str] = ..., derived_from: _Optional[_Iterable[str]] = ..., entities: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., trust: _Optional[str] = ..., memory_type: _Optional[str] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_by: _Optional[str] = ..., agent_chain: _Optional[_Iterable[str]] = ..., origin: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., approval: _Optional[str] = ...) -> None: ...

class RememberResponse(_message.Message):
    __slots__ = ("memory_id", "status", "job_id", "warnings", "approval_id")
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    memory_id: str
    status: str
    job_id: str
    warnings: _containers.RepeatedScalarFieldContainer[str]
    approval_id: str
    def __init__(self, memory_id: _Optional[str] = ..., status: _Optional[str] = ..., job_id: _Optional[str] = ..., warnings: _Optional[_Iterable[str]] = ..., approval_id: _Optional[str] = ...) -> None: ...

class ItemError(_message.Message):
    __slots__ = ("type", "detail")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    type: str
    detail: str
    def __init__(self, type: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class RememberItemResult(_message.Message):
    __slots__ = ("index", "memory_id", "job_id", "status", "warnings", "error", "approval_id")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    index: int
    memory_id: str
    job_id: str
    status: str
    warnings: _containers.RepeatedScalarFieldContainer[str]
    error: ItemError
    approval_id: str
    def __init__(self, index: _Optional[int] = ..., memory_id: _Optional[str] = ..., job_id: _Optional[str] = ..., status: _Optional[str] = ..., warnings: _Optional[_Iterable[str]] = ..., error: _Optional[_Union[ItemError, _Mapping]] = ..., approval_id: _Optional[str] = ...) -> None: ...

class RememberBatchResponse(_message.Message):
    __slots__ = ("job_id", "stored", "failed", "results")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    stored: int
    failed: int
    results: _containers.RepeatedCompositeFieldContainer[RememberItemResult]
    def __init__(self, job_id: _Optional[str] = ..., stored: _Optional[int] = ..., failed: _Optional[int] = ..., results: _Optional[_Iterable[_Union[RememberItemResult, _Mapping]]] = ...) -> None: ...

class ScoreComponents(_message.Message):
    __slots__ = ("vector", "bm25", "vector_norm", "bm25_norm", "fused", "expansion", "access", "rerank")
    VECTOR_FIELD_NUMBER: _ClassVar[int]
    BM25_FIELD_NUMBER: _ClassVar[int]
    VECTOR_NORM_FIELD_NUMBER: _ClassVar[int]
    BM25_NORM_FIELD_NUMBER: _ClassVar[int]
    FUSED_FIELD_NUMBER: _ClassVar[int]
    EXPANSION_FIELD_NUMBER: _ClassVar[int]
    ACCESS_FIELD_NUMBER: _ClassVar[int]
    RERANK_FIELD_NUMBER: _ClassVar[int]
    vector: float
    bm25: float
    vector_norm: float
    bm25_norm: float
    fused: float
    expansion: float
    access: float
    rerank: float
    def __init__(self, vector: _Optional[float] = ..., bm25: _Optional[float] = ..., vector_norm: _Optional[float] = ..., bm25_norm: _Optional[float] = ..., fused: _Optional[float] = ..., expansion: _Optional[float] = ..., access: _Optional[float] = ..., rerank: _Optional[float] = ...) -> None: ...

class SearchHit(_message.Message):
    __slots__ = ("memory", "score", "components")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    memory: Memory
    score: float
    components: ScoreComponents
    def __init__(self, memory: _Optional[_Union[Memory, _Mapping]] = ..., score: _Optional[float] = ..., components: _Optional[_Union[ScoreComponents, _Mapping]] = ...) -> None: ...

class SearchResponse(_message.Message):
    __slots__ = ("results", "warnings", "explain")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SearchHit]
    warnings: _containers.RepeatedScalarFieldContainer[str]
    explain: _struct_pb2.Struct
    def __init__(self, results: _Optional[_Iterable[_Union[SearchHit, _Mapping]]] = ..., warnings: _Optional[_Iterable[str]] = ..., explain: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class MemoryPage(_message.Message):
    __slots__ = ("items", "next_cursor")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Memory]
    next_cursor: str
    def __init__(self, items: _Optional[_Iterable[_Union[Memory, _Mapping]]] = ..., next_cursor: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "memory_id", "job_type", "status", "attempt_count", "max_attempts", "next_attempt_at", "last_error", "last_error_code", "workflow_id", "workflow_started_at", "outcome", "progress", "parent_id", "created_at", "updated_at", "usage")
    ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    id: str
    memory_id: str
    job_type: str
    status: str
    attempt_count: int
    max_attempts: int
    next_attempt_at: _timestamp_pb2.Timestamp
    last_error: str
    last_error_code: str
    workflow_id: str
    workflow_started_at: _timestamp_pb2.Timestamp
    outcome: str
    progress: _struct_pb2.Struct
    parent_id: str
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    usage: _struct_pb2.Struct
    def __init__(self, id: _Optional[str] = ..., memory_id: _Optional[str] = ..., job_type: _Optional[str] = ..., status: _Optional[str] = ..., attempt_count: _Optional[int] = ..., max_attempts: _Optional[int] = ..., next_attempt_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_error: _Optional[str] = ..., last_error_code: _Optional[str] = ..., workflow_id: _Optional[str] = ..., workflow_started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., outcome: _Optional[str] = ..., progress: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., parent_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., usage: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class HistoryEvent(_message.Message):
    __slots__ = ("id", "event", "version", "actor_type", "actor_id", "reason", "path", "provider", "model", "prompt_version", "decision_reason", "request_id", "session_id", "old_content", "new_content", "old_metadata", "new_metadata", "state", "hash", "prev_hash", "scope_seq", "created_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTOR_TYPE_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_VERSION_FIELD_NUMBER: _ClassVar[int]
    DECISION_REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    OLD_CONTENT_FIELD_NUMBER: _ClassVar[int]
    NEW_CONTENT_FIELD_NUMBER: _ClassVar[int]
    OLD_METADATA_FIELD_NUMBER: _ClassVar[int]
    NEW_METADATA_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    PREV_HASH_FIELD_NUMBER: _ClassVar[int]
    SCOPE_SEQ_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: int
    event: str
    version: int
    actor_type: str
    actor_id: str
    reason: str
    path: str
    provider: str
    model: str
    prompt_version: str
    decision_reason: str
    request_id: str
    session_id: str
    old_content: str
    new_content: str
    old_metadata: _struct_pb2.Struct
    new_metadata: _struct_pb2.Struct
    state: _struct_pb2.Struct
    hash: str
    prev_hash: str
    scope_seq: int
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[int] = ..., event: _Optional[str] = ..., version: _Optional[int] = ..., actor_type: _Optional[str] = ..., actor_id: _Optional[str] = ..., reason: _Optional[str] = ..., path: _Optional[str] = ..., provider: _Optional[str] = ..., model: _Optional[str] = ..., prompt_version: _Optional[str] = ..., decision_reason: _Optional[str] = ..., request_id: _Optional[str] = ..., session_id: _Optional[str] = ..., old_content: _Optional[str] = ..., new_content: _Optional[str] = ..., old_metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., new_metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., state: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., hash: _Optional[str] = ..., prev_hash: _Optional[str] = ..., scope_seq: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class FactRef(_message.Message):
    __slots__ = ("id", "content", "version", "is_deleted", "status")
    ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    IS_DELETED_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    id: str
    content: str
    version: int
    is_deleted: bool
    status: str
    def __init__(self, id: _Optional[str] = ..., content: _Optional[str] = ..., version: _Optional[int] = ..., is_deleted: _Optional[bool] = ..., status: _Optional[str] = ...) -> None: ...

class DecisionRecord(_message.Message):
    __slots__ = ("source_memory_id", "fact", "fact_type", "fact_confidence", "action", "target_id", "memory_id", "content", "confidence", "reason", "outcome", "detail", "mode", "provider", "model", "prompt_version", "created_at")
    SOURCE_MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    FACT_FIELD_NUMBER: _ClassVar[int]
    FACT_TYPE_FIELD_NUMBER: _ClassVar[int]
    FACT_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    source_memory_id: str
    fact: str
    fact_type: str
    fact_confidence: float
    action: str
    target_id: str
    memory_id: str
    content: str
    confidence: float
    reason: str
    outcome: str
    detail: str
    mode: str
    provider: str
    model: str
    prompt_version: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, source_memory_id: _Optional[str] = ..., fact: _Optional[str] = ..., fact_type: _Optional[str] = ..., fact_confidence: _Optional[float] = ..., action: _Optional[str] = ..., target_id: _Optional[str] = ..., memory_id: _Optional[str] = ..., content: _Optional[str] = ..., confidence: _Optional[float] = ..., reason: _Optional[str] = ..., outcome: _Optional[str] = ..., detail: _Optional[str] = ..., mode: _Optional[str] = ..., provider: _Optional[str] = ..., model: _Optional[str] = ..., prompt_version: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class MemoryHistory(_message.Message):
    __slots__ = ("memory", "events", "facts", "decisions")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    FACTS_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    memory: Memory
    events: _containers.RepeatedCompositeFieldContainer[HistoryEvent]
    facts: _containers.RepeatedCompositeFieldContainer[FactRef]
    decisions: _containers.RepeatedCompositeFieldContainer[DecisionRecord]
    def __init__(self, memory: _Optional[_Union[Memory, _Mapping]] = ..., events: _Optional[_Iterable[_Union[HistoryEvent, _Mapping]]] = ..., facts: _Optional[_Iterable[_Union[FactRef, _Mapping]]] = ..., decisions: _Optional[_Iterable[_Union[DecisionRecord, _Mapping]]] = ...) -> None: ...

class ModifyItemResult(_message.Message):
    __slots__ = ("index", "id", "ok", "version", "error", "current_version")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    index: int
    id: str
    ok: bool
    version: int
    error: ItemError
    current_version: int
    def __init__(self, index: _Optional[int] = ..., id: _Optional[str] = ..., ok: _Optional[bool] = ..., version: _Optional[int] = ..., error: _Optional[_Union[ItemError, _Mapping]] = ..., current_version: _Optional[int] = ...) -> None: ...

class ModifyBatchResponse(_message.Message):
    __slots__ = ("applied", "failed", "results")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    applied: int
    failed: int
    results: _containers.RepeatedCompositeFieldContainer[ModifyItemResult]
    def __init__(self, applied: _Optional[int] = ..., failed: _Optional[int] = ..., results: _Optional[_Iterable[_Union[ModifyItemResult, _Mapping]]] = ...) -> None: ...

class ChainBreak(_message.Message):
    __slots__ = ("kind", "where", "event_id", "detail")
    KIND_FIELD_NUMBER: _ClassVar[int]
    WHERE_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    kind: str
    where: str
    event_id: int
    detail: str
    def __init__(self, kind: _Optional[str] = ..., where: _Optional[str] = ..., event_id: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class VerifyReport(_message.Message):
    __slots__ = ("ok", "memories", "events", "breaks")
    OK_FIELD_NUMBER: _ClassVar[int]
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    BREAKS_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    memories: int
    events: int
    breaks: _containers.RepeatedCompositeFieldContainer[ChainBreak]
    def __init__(self, ok: _Optional[bool] = ..., memories: _Optional[int] = ..., events: _Optional[int] = ..., breaks: _Optional[_Iterable[_Union[ChainBreak, _Mapping]]] = ...) -> None: ...

class ForgetCandidate(_message.Message):
    __slots__ = ("id", "score", "snippet", "pinned", "version", "content_hash")
    ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SNIPPET_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    id: str
    score: float
    snippet: str
    pinned: bool
    version: int
    content_hash: str
    def __init__(self, id: _Optional[str] = ..., score: _Optional[float] = ..., snippet: _Optional[str] = ..., pinned: _Optional[bool] = ..., version: _Optional[int] = ..., content_hash: _Optional[str] = ...) -> None: ...

class ForgetPreview(_message.Message):
    __slots__ = ("operation_id", "status", "candidates", "total_matched", "needs_approval", "confirm_token", "expires_at")
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MATCHED_FIELD_NUMBER: _ClassVar[int]
    NEEDS_APPROVAL_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    operation_id: str
    status: str
    candidates: _containers.RepeatedCompositeFieldContainer[ForgetCandidate]
    total_matched: int
    needs_approval: bool
    confirm_token: str
    expires_at: _timestamp_pb2.Timestamp
    def __init__(self, operation_id: _Optional[str] = ..., status: _Optional[str] = ..., candidates: _Optional[_Iterable[_Union[ForgetCandidate, _Mapping]]] = ..., total_matched: _Optional[int] = ..., needs_approval: _Optional[bool] = ..., confirm_token: _Optional[str] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ForgetEvent(_message.Message):
    __slots__ = ("event", "actor", "reason", "at")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    event: str
    actor: str
    reason: str
    at: _timestamp_pb2.Timestamp
    def __init__(self, event: _Optional[str] = ..., actor: _Optional[str] = ..., reason: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ForgetStatus(_message.Message):
    __slots__ = ("operation_id", "status", "requester", "reason", "total", "done", "needs_approval", "approver", "created_at", "finished_at", "receipt", "events")
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REQUESTER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    NEEDS_APPROVAL_FIELD_NUMBER: _ClassVar[int]
    APPROVER_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    operation_id: str
    status: str
    requester: str
    reason: str
    total: int
    done: int
    needs_approval: bool
    approver: str
    created_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    receipt: _struct_pb2.Struct
    events: _containers.RepeatedCompositeFieldContainer[ForgetEvent]
    def __init__(self, operation_id: _Optional[str] = ..., status: _Optional[str] = ..., requester: _Optional[str] = ..., reason: _Optional[str] = ..., total: _Optional[int] = ..., done: _Optional[int] = ..., needs_approval: _Optional[bool] = ..., approver: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., receipt: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., events: _Optional[_Iterable[_Union[ForgetEvent, _Mapping]]] = ...) -> None: ...

class OperationList(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ForgetStatus]
    def __init__(self, items: _Optional[_Iterable[_Union[ForgetStatus, _Mapping]]] = ...) -> None: ...

class UndoResult(_message.Message):
    __slots__ = ("operation_id", "recovered", "not_recovered")
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    RECOVERED_FIELD_NUMBER: _ClassVar[int]
    NOT_RECOVERED_FIELD_NUMBER: _ClassVar[int]
    operation_id: str
    recovered: _containers.RepeatedScalarFieldContainer[str]
    not_recovered: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    def __init__(self, operation_id: _Optional[str] = ..., recovered: _Optional[_Iterable[str]] = ..., not_recovered: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ...) -> None: ...

class ReceiptCheck(_message.Message):
    __slots__ = ("ok", "problems")
    OK_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    problems: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ok: _Optional[bool] = ..., problems: _Optional[_Iterable[str]] = ...) -> None: ...

class ReviewedMemory(_message.Message):
    __slots__ = ("id", "content", "is_deleted")
    ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    IS_DELETED_FIELD_NUMBER: _ClassVar[int]
    id: str
    content: str
    is_deleted: bool
    def __init__(self, id: _Optional[str] = ..., content: _Optional[str] = ..., is_deleted: _Optional[bool] = ...) -> None: ...

class Review(_message.Message):
    __slots__ = ("id", "status", "user_id", "agent_id", "run_id", "new", "existing", "reason", "resolution", "merged_content", "resolved_by", "resolved_reason", "detail", "created_at", "expires_at", "resolved_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_FIELD_NUMBER: _ClassVar[int]
    EXISTING_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    MERGED_CONTENT_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_BY_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    status: str
    user_id: str
    agent_id: str
    run_id: str
    new: ReviewedMemory
    existing: ReviewedMemory
    reason: str
    resolution: str
    merged_content: str
    resolved_by: str
    resolved_reason: str
    detail: str
    created_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    resolved_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., status: _Optional[str] = ..., user_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., run_id: _Optional[str] = ..., new: _Optional[_Union[ReviewedMemory, _Mapping]] = ..., existing: _Optional[_Union[ReviewedMemory, _Mapping]] = ..., reason: _Optional[str] = ..., resolution: _Optional[str] = ..., merged_content: _Optional[str] = ..., resolved_by: _Optional[str] = ..., resolved_reason: _Optional[str] = ..., detail: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., resolved_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ReviewPage(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Review]
    def __init__(self, items: _Optional[_Iterable[_Union[Review, _Mapping]]] = ...) -> None: ...

class Approval(_message.Message):
    __slots__ = ("id", "status", "memory", "reason", "requested_by", "decided_by", "decided_reason", "timed_out", "expires_at", "created_at", "decided_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    DECIDED_REASON_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    status: str
    memory: Memory
    reason: str
    requested_by: str
    decided_by: str
    decided_reason: str
    timed_out: bool
    expires_at: _timestamp_pb2.Timestamp
    created_at: _timestamp_pb2.Timestamp
    decided_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., status: _Optional[str] = ..., memory: _Optional[_Union[Memory, _Mapping]] = ..., reason: _Optional[str] = ..., requested_by: _Optional[str] = ..., decided_by: _Optional[str] = ..., decided_reason: _Optional[str] = ..., timed_out: _Optional[bool] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., decided_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ApprovalPage(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Approval]
    def __init__(self, items: _Optional[_Iterable[_Union[Approval, _Mapping]]] = ...) -> None: ...

class FrozenScope(_message.Message):
    __slots__ = ("user_id", "agent_id", "run_id", "reason", "frozen_by", "frozen_at")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FROZEN_BY_FIELD_NUMBER: _ClassVar[int]
    FROZEN_AT_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    agent_id: str
    run_id: str
    reason: str
    frozen_by: str
    frozen_at: _timestamp_pb2.Timestamp
    def __init__(self, user_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., run_id: _Optional[str] = ..., reason: _Optional[str] = ..., frozen_by: _Optional[str] = ..., frozen_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ControlStatus(_message.Message):
    __slots__ = ("frozen", "kill_switch", "frozen_scopes", "updated_at")
    FROZEN_FIELD_NUMBER: _ClassVar[int]
    KILL_SWITCH_FIELD_NUMBER: _ClassVar[int]
    FROZEN_SCOPES_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    frozen: bool
    kill_switch: bool
    frozen_scopes: _containers.RepeatedCompositeFieldContainer[FrozenScope]
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, frozen: _Optional[bool] = ..., kill_switch: _Optional[bool] = ..., frozen_scopes: _Optional[_Iterable[_Union[FrozenScope, _Mapping]]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ApiKey(_message.Message):
    __slots__ = ("id", "name", "role", "scopes", "created_at", "revoked_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    REVOKED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    role: str
    scopes: _containers.RepeatedScalarFieldContainer[str]
    created_at: _timestamp_pb2.Timestamp
    revoked_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., role: _Optional[str] = ..., scopes: _Optional[_Iterable[str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revoked_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreatedKey(_message.Message):
    __slots__ = ("id", "name", "role", "scopes", "created_at", "revoked_at", "key")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    REVOKED_AT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    role: str
    scopes: _containers.RepeatedScalarFieldContainer[str]
    created_at: _timestamp_pb2.Timestamp
    revoked_at: _timestamp_pb2.Timestamp
    key: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., role: _Optional[str] = ..., scopes: _Optional[_Iterable[str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revoked_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., key: _Optional[str] = ...) -> None: ...

class KeyList(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ApiKey]
    def __init__(self, items: _Optional[_Iterable[_Union[ApiKey, _Mapping]]] = ...) -> None: ...
