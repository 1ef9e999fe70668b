import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RetrievalOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RETRIEVAL_OUTCOME_UNSPECIFIED: _ClassVar[RetrievalOutcome]
    RETRIEVAL_OUTCOME_OK: _ClassVar[RetrievalOutcome]
    RETRIEVAL_OUTCOME_NO_RESULTS: _ClassVar[RetrievalOutcome]
    RETRIEVAL_OUTCOME_BELOW_THRESHOLD: _ClassVar[RetrievalOutcome]
    RETRIEVAL_OUTCOME_ACCESS_REVOKED_UPSTREAM: _ClassVar[RetrievalOutcome]
    RETRIEVAL_OUTCOME_SOURCE_UNAVAILABLE: _ClassVar[RetrievalOutcome]
    RETRIEVAL_OUTCOME_DOCUMENT_NO_LONGER_EXISTS: _ClassVar[RetrievalOutcome]
    RETRIEVAL_OUTCOME_DOCUMENT_REF_UNRESOLVED: _ClassVar[RetrievalOutcome]
RETRIEVAL_OUTCOME_UNSPECIFIED: RetrievalOutcome
RETRIEVAL_OUTCOME_OK: RetrievalOutcome
RETRIEVAL_OUTCOME_NO_RESULTS: RetrievalOutcome
RETRIEVAL_OUTCOME_BELOW_THRESHOLD: RetrievalOutcome
RETRIEVAL_OUTCOME_ACCESS_REVOKED_UPSTREAM: RetrievalOutcome
RETRIEVAL_OUTCOME_SOURCE_UNAVAILABLE: RetrievalOutcome
RETRIEVAL_OUTCOME_DOCUMENT_NO_LONGER_EXISTS: RetrievalOutcome
RETRIEVAL_OUTCOME_DOCUMENT_REF_UNRESOLVED: RetrievalOutcome

class ScopePath(_message.Message):
    __slots__ = ("org_id", "pillar_id", "team_id", "agent_id")
    ORG_ID_FIELD_NUMBER: _ClassVar[int]
    PILLAR_ID_FIELD_NUMBER: _ClassVar[int]
    TEAM_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    org_id: str
    pillar_id: str
    team_id: str
    agent_id: str
    def __init__(self, org_id: _Optional[str] = ..., pillar_id: _Optional[str] = ..., team_id: _Optional[str] = ..., agent_id: _Optional[str] = ...) -> None: ...

class AssembleContextRequest(_message.Message):
    __slots__ = ("scope", "session_id", "task_description", "token_budget", "model_id", "hints")
    class HintsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    HINTS_FIELD_NUMBER: _ClassVar[int]
    scope: ScopePath
    session_id: str
    task_description: str
    token_budget: int
    model_id: str
    hints: _containers.ScalarMap[str, str]
    def __init__(self, scope: _Optional[_Union[ScopePath, _Mapping]] = ..., session_id: _Optional[str] = ..., task_description: _Optional[str] = ..., token_budget: _Optional[int] = ..., model_id: _Optional[str] = ..., hints: _Optional[_Mapping[str, str]] = ...) -> None: ...

class AssembleContextResponse(_message.Message):
    __slots__ = ("prompt_id", "assembled_prompt", "cache_prefix_bytes", "assembled_tokens", "baseline_tokens", "savings_ratio", "version_hash", "chunk_ids", "quality")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    ASSEMBLED_PROMPT_FIELD_NUMBER: _ClassVar[int]
    CACHE_PREFIX_BYTES_FIELD_NUMBER: _ClassVar[int]
    ASSEMBLED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BASELINE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAVINGS_RATIO_FIELD_NUMBER: _ClassVar[int]
    VERSION_HASH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_IDS_FIELD_NUMBER: _ClassVar[int]
    QUALITY_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    assembled_prompt: str
    cache_prefix_bytes: int
    assembled_tokens: int
    baseline_tokens: int
    savings_ratio: float
    version_hash: str
    chunk_ids: _containers.RepeatedScalarFieldContainer[str]
    quality: QualityAttestation
    def __init__(self, prompt_id: _Optional[str] = ..., assembled_prompt: _Optional[str] = ..., cache_prefix_bytes: _Optional[int] = ..., assembled_tokens: _Optional[int] = ..., baseline_tokens: _Optional[int] = ..., savings_ratio: _Optional[float] = ..., version_hash: _Optional[str] = ..., chunk_ids: _Optional[_Iterable[str]] = ..., quality: _Optional[_Union[QualityAttestation, _Mapping]] = ...) -> None: ...

class CompactRequest(_message.Message):
    __slots__ = ("scope", "session_id", "strategy")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    scope: ScopePath
    session_id: str
    strategy: str
    def __init__(self, scope: _Optional[_Union[ScopePath, _Mapping]] = ..., session_id: _Optional[str] = ..., strategy: _Optional[str] = ...) -> None: ...

class CompactResponse(_message.Message):
    __slots__ = ("version_hash", "original_tokens", "compacted_tokens", "fact_retention_score")
    VERSION_HASH_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FACT_RETENTION_SCORE_FIELD_NUMBER: _ClassVar[int]
    version_hash: str
    original_tokens: int
    compacted_tokens: int
    fact_retention_score: float
    def __init__(self, version_hash: _Optional[str] = ..., original_tokens: _Optional[int] = ..., compacted_tokens: _Optional[int] = ..., fact_retention_score: _Optional[float] = ...) -> None: ...

class CreateShareRequest(_message.Message):
    __slots__ = ("scope", "resource_id", "resource_type", "grantee_scope", "grantee_scope_id", "permissions", "reason")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    GRANTEE_SCOPE_FIELD_NUMBER: _ClassVar[int]
    GRANTEE_SCOPE_ID_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    scope: ScopePath
    resource_id: str
    resource_type: str
    grantee_scope: str
    grantee_scope_id: str
    permissions: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, scope: _Optional[_Union[ScopePath, _Mapping]] = ..., resource_id: _Optional[str] = ..., resource_type: _Optional[str] = ..., grantee_scope: _Optional[str] = ..., grantee_scope_id: _Optional[str] = ..., permissions: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class CreateShareResponse(_message.Message):
    __slots__ = ("share_id", "created_at")
    SHARE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    share_id: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, share_id: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateSnapshotRequest(_message.Message):
    __slots__ = ("scope", "session_id", "snapshot_name")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_NAME_FIELD_NUMBER: _ClassVar[int]
    scope: ScopePath
    session_id: str
    snapshot_name: str
    def __init__(self, scope: _Optional[_Union[ScopePath, _Mapping]] = ..., session_id: _Optional[str] = ..., snapshot_name: _Optional[str] = ...) -> None: ...

class CreateSnapshotResponse(_message.Message):
    __slots__ = ("snapshot_id", "version_hash", "created_at")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_HASH_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: str
    version_hash: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, snapshot_id: _Optional[str] = ..., version_hash: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("scope", "texts", "model_version")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    scope: ScopePath
    texts: _containers.RepeatedScalarFieldContainer[str]
    model_version: str
    def __init__(self, scope: _Optional[_Union[ScopePath, _Mapping]] = ..., texts: _Optional[_Iterable[str]] = ..., model_version: _Optional[str] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embeddings", "model_version")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    embeddings: _containers.RepeatedCompositeFieldContainer[EmbeddingVector]
    model_version: str
    def __init__(self, embeddings: _Optional[_Iterable[_Union[EmbeddingVector, _Mapping]]] = ..., model_version: _Optional[str] = ...) -> None: ...

class EmbeddingVector(_message.Message):
    __slots__ = ("values", "cached")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    cached: bool
    def __init__(self, values: _Optional[_Iterable[float]] = ..., cached: _Optional[bool] = ...) -> None: ...

class GuardrailLayer(_message.Message):
    __slots__ = ("layer_level", "content_hash", "version", "effective_at")
    LAYER_LEVEL_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_AT_FIELD_NUMBER: _ClassVar[int]
    layer_level: int
    content_hash: str
    version: int
    effective_at: int
    def __init__(self, layer_level: _Optional[int] = ..., content_hash: _Optional[str] = ..., version: _Optional[int] = ..., effective_at: _Optional[int] = ...) -> None: ...

class IngestEventRequest(_message.Message):
    __slots__ = ("scope", "session_id", "event_type", "content", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    scope: ScopePath
    session_id: str
    event_type: str
    content: bytes
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, scope: _Optional[_Union[ScopePath, _Mapping]] = ..., session_id: _Optional[str] = ..., event_type: _Optional[str] = ..., content: _Optional[bytes] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class IngestEventResponse(_message.Message):
    __slots__ = ("event_id", "version_hash", "token_count")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_HASH_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    version_hash: str
    token_count: int
    def __init__(self, event_id: _Optional[str] = ..., version_hash: _Optional[str] = ..., token_count: _Optional[int] = ...) -> None: ...

class ListSharesRequest(_message.Message):
    __slots__ = ("scope", "page", "page_size")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    scope: ScopePath
    page: int
    page_size: int
    def __init__(self, scope: _Optional[_Union[ScopePath, _Mapping]] = ..., page: _Optional[int] = ..., page_size: _Optional[int] = ...) -> None: ...

class ListSharesResponse(_message.Message):
    __slots__ = ("shares", "total_count")
    SHARES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_COUNT_FIELD_NUMBER: _ClassVar[int]
    shares: _containers.RepeatedCompositeFieldContainer[ShareGrant]
    total_count: int
    def __init__(self, shares: _Optional[_Iterable[_Union[ShareGrant, _Mapping]]] = ..., total_count: _Optional[int] = ...) -> None: ...

class PullContextRequest(_message.Message):
    __slots__ = ("scope", "agent_id", "session_id", "snapshot_name")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_NAME_FIELD_NUMBER: _ClassVar[int]
    scope: ScopePath
    agent_id: str
    session_id: str
    snapshot_name: str
    def __init__(self, scope: _Optional[_Union[ScopePath, _Mapping]] = ..., agent_id: _Optional[str] = ..., session_id: _Optional[str] = ..., snapshot_name: _Optional[str] = ...) -> None: ...

class PullContextResponse(_message.Message):
    __slots__ = ("version_hash", "memory_type", "content", "created_at", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_HASH_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TYPE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    version_hash: str
    memory_type: str
    content: bytes
    created_at: _timestamp_pb2.Timestamp
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, version_hash: _Optional[str] = ..., memory_type: _Optional[str] = ..., content: _Optional[bytes] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PushContextRequest(_message.Message):
    __slots__ = ("scope", "session_id", "memory_type", "content", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TYPE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    scope: ScopePath
    session_id: str
    memory_type: str
    content: bytes
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, scope: _Optional[_Union[ScopePath, _Mapping]] = ..., session_id: _Optional[str] = ..., memory_type: _Optional[str] = ..., content: _Optional[bytes] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PushContextResponse(_message.Message):
    __slots__ = ("version_hash", "created_at")
    VERSION_HASH_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    version_hash: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, version_hash: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class QualityAttestation(_message.Message):
    __slots__ = ("confidence_score", "expansion_applied", "fallback_used", "fallback_reason", "retrieval_outcome", "effective_min_score", "results_below_threshold")
    CONFIDENCE_SCORE_FIELD_NUMBER: _ClassVar[int]
    EXPANSION_APPLIED_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_USED_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_REASON_FIELD_NUMBER: _ClassVar[int]
    RETRIEVAL_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_MIN_SCORE_FIELD_NUMBER: _ClassVar[int]
    RESULTS_BELOW_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    confidence_score: float
    expansion_applied: bool
    fallback_used: bool
    fallback_reason: str
    retrieval_outcome: RetrievalOutcome
    effective_min_score: float
    results_below_threshold: int
    def __init__(self, confidence_score: _Optional[float] = ..., expansion_applied: _Optional[bool] = ..., fallback_used: _Optional[bool] = ..., fallback_reason: _Optional[str] = ..., retrieval_outcome: _Optional[_Union[RetrievalOutcome, str]] = ..., effective_min_score: _Optional[float] = ..., results_below_threshold: _Optional[int] = ...) -> None: ...

class ResolveGuardrailLayersRequest(_message.Message):
    __slots__ = ("scope",)
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    scope: ScopePath
    def __init__(self, scope: _Optional[_Union[ScopePath, _Mapping]] = ...) -> None: ...

class ResolveGuardrailLayersResponse(_message.Message):
    __slots__ = ("layers",)
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    layers: _containers.RepeatedCompositeFieldContainer[GuardrailLayer]
    def __init__(self, layers: _Optional[_Iterable[_Union[GuardrailLayer, _Mapping]]] = ...) -> None: ...

class RevokeShareRequest(_message.Message):
    __slots__ = ("scope", "share_id", "reason")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SHARE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    scope: ScopePath
    share_id: str
    reason: str
    def __init__(self, scope: _Optional[_Union[ScopePath, _Mapping]] = ..., share_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RevokeShareResponse(_message.Message):
    __slots__ = ("revoked_at",)
    REVOKED_AT_FIELD_NUMBER: _ClassVar[int]
    revoked_at: _timestamp_pb2.Timestamp
    def __init__(self, revoked_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RollbackContextRequest(_message.Message):
    __slots__ = ("scope", "session_id", "target_version_hash")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_VERSION_HASH_FIELD_NUMBER: _ClassVar[int]
    scope: ScopePath
    session_id: str
    target_version_hash: str
    def __init__(self, scope: _Optional[_Union[ScopePath, _Mapping]] = ..., session_id: _Optional[str] = ..., target_version_hash: _Optional[str] = ...) -> None: ...

class RollbackContextResponse(_message.Message):
    __slots__ = ("restored_version_hash", "rolled_back_at")
    RESTORED_VERSION_HASH_FIELD_NUMBER: _ClassVar[int]
    ROLLED_BACK_AT_FIELD_NUMBER: _ClassVar[int]
    restored_version_hash: str
    rolled_back_at: _timestamp_pb2.Timestamp
    def __init__(self, restored_version_hash: _Optional[str] = ..., rolled_back_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SearchRequest(_message.Message):
    __slots__ = ("scope", "query", "domain", "top_k", "min_score")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_SCORE_FIELD_NUMBER: _ClassVar[int]
    scope: ScopePath
    query: str
    domain: str
    top_k: int
    min_score: float
    def __init__(self, scope: _Optional[_Union[ScopePath, _Mapping]] = ..., query: _Optional[str] = ..., domain: _Optional[str] = ..., top_k: _Optional[int] = ..., min_score: _Optional[float] = ...) -> None: ...

class SearchResponse(_message.Message):
    __slots__ = ("results", "effective_min_score", "results_below_threshold", "outcome")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_MIN_SCORE_FIELD_NUMBER: _ClassVar[int]
    RESULTS_BELOW_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SearchResult]
    effective_min_score: float
    results_below_threshold: int
    outcome: RetrievalOutcome
    def __init__(self, results: _Optional[_Iterable[_Union[SearchResult, _Mapping]]] = ..., effective_min_score: _Optional[float] = ..., results_below_threshold: _Optional[int] = ..., outcome: _Optional[_Union[RetrievalOutcome, str]] = ...) -> None: ...

class SearchResult(_message.Message):
    __slots__ = ("chunk_id", "content", "score", "source", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    chunk_id: str
    content: str
    score: float
    source: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, chunk_id: _Optional[str] = ..., content: _Optional[str] = ..., score: _Optional[float] = ..., source: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ShareGrant(_message.Message):
    __slots__ = ("share_id", "resource_id", "resource_type", "grantor_scope_id", "grantee_scope", "grantee_scope_id", "permissions", "reason", "created_at")
    SHARE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    GRANTOR_SCOPE_ID_FIELD_NUMBER: _ClassVar[int]
    GRANTEE_SCOPE_FIELD_NUMBER: _ClassVar[int]
    GRANTEE_SCOPE_ID_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    share_id: str
    resource_id: str
    resource_type: str
    grantor_scope_id: str
    grantee_scope: str
    grantee_scope_id: str
    permissions: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, share_id: _Optional[str] = ..., resource_id: _Optional[str] = ..., resource_type: _Optional[str] = ..., grantor_scope_id: _Optional[str] = ..., grantee_scope: _Optional[str] = ..., grantee_scope_id: _Optional[str] = ..., permissions: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ValidatePromptRequest(_message.Message):
    __slots__ = ("scope", "prompt", "layer_hashes")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    LAYER_HASHES_FIELD_NUMBER: _ClassVar[int]
    scope: ScopePath
    prompt: str
    layer_hashes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, scope: _Optional[_Union[ScopePath, _Mapping]] = ..., prompt: _Optional[str] = ..., layer_hashes: _Optional[_Iterable[str]] = ...) -> None: ...

class ValidatePromptResponse(_message.Message):
    __slots__ = ("valid", "violation_code", "violation_detail")
    VALID_FIELD_NUMBER: _ClassVar[int]
    VIOLATION_CODE_FIELD_NUMBER: _ClassVar[int]
    VIOLATION_DETAIL_FIELD_NUMBER: _ClassVar[int]
    valid: bool
    violation_code: str
    violation_detail: str
    def __init__(self, valid: _Optional[bool] = ..., violation_code: _Optional[str] = ..., violation_detail: _Optional[str] = ...) -> None: ...
