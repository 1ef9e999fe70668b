import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from context_engine_client._proto.upsquad.context.v1 import context_pb2 as _context_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AuditAccessEvent(_message.Message):
    __slots__ = ("actor_scope", "target_resource_id", "target_resource_type", "operation", "share_id", "outcome", "denial_reason", "occurred_at")
    ACTOR_SCOPE_FIELD_NUMBER: _ClassVar[int]
    TARGET_RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    SHARE_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DENIAL_REASON_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    actor_scope: _context_pb2.ScopePath
    target_resource_id: str
    target_resource_type: str
    operation: str
    share_id: str
    outcome: str
    denial_reason: str
    occurred_at: _timestamp_pb2.Timestamp
    def __init__(self, actor_scope: _Optional[_Union[_context_pb2.ScopePath, _Mapping]] = ..., target_resource_id: _Optional[str] = ..., target_resource_type: _Optional[str] = ..., operation: _Optional[str] = ..., share_id: _Optional[str] = ..., outcome: _Optional[str] = ..., denial_reason: _Optional[str] = ..., occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class BaselineMetricEvent(_message.Message):
    __slots__ = ("prompt_id", "scope", "session_id", "assembled_tokens", "naive_tokens", "model_id", "sampled_at")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ASSEMBLED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NAIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_AT_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    scope: _context_pb2.ScopePath
    session_id: str
    assembled_tokens: int
    naive_tokens: int
    model_id: str
    sampled_at: _timestamp_pb2.Timestamp
    def __init__(self, prompt_id: _Optional[str] = ..., scope: _Optional[_Union[_context_pb2.ScopePath, _Mapping]] = ..., session_id: _Optional[str] = ..., assembled_tokens: _Optional[int] = ..., naive_tokens: _Optional[int] = ..., model_id: _Optional[str] = ..., sampled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CompactionJob(_message.Message):
    __slots__ = ("session_id", "scope", "current_token_count", "token_budget", "strategy", "triggered_at")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    TRIGGERED_AT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    scope: _context_pb2.ScopePath
    current_token_count: int
    token_budget: int
    strategy: str
    triggered_at: _timestamp_pb2.Timestamp
    def __init__(self, session_id: _Optional[str] = ..., scope: _Optional[_Union[_context_pb2.ScopePath, _Mapping]] = ..., current_token_count: _Optional[int] = ..., token_budget: _Optional[int] = ..., strategy: _Optional[str] = ..., triggered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class EmbeddingJob(_message.Message):
    __slots__ = ("event_id", "chunk_ids", "scope", "model_version", "queued_at")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_IDS_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    QUEUED_AT_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    chunk_ids: _containers.RepeatedScalarFieldContainer[str]
    scope: _context_pb2.ScopePath
    model_version: str
    queued_at: _timestamp_pb2.Timestamp
    def __init__(self, event_id: _Optional[str] = ..., chunk_ids: _Optional[_Iterable[str]] = ..., scope: _Optional[_Union[_context_pb2.ScopePath, _Mapping]] = ..., model_version: _Optional[str] = ..., queued_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ReindexJob(_message.Message):
    __slots__ = ("scope", "old_model_version", "new_model_version", "initiated_by", "initiated_at")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    OLD_MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    NEW_MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    INITIATED_BY_FIELD_NUMBER: _ClassVar[int]
    INITIATED_AT_FIELD_NUMBER: _ClassVar[int]
    scope: _context_pb2.ScopePath
    old_model_version: str
    new_model_version: str
    initiated_by: str
    initiated_at: _timestamp_pb2.Timestamp
    def __init__(self, scope: _Optional[_Union[_context_pb2.ScopePath, _Mapping]] = ..., old_model_version: _Optional[str] = ..., new_model_version: _Optional[str] = ..., initiated_by: _Optional[str] = ..., initiated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class StreamEnvelope(_message.Message):
    __slots__ = ("message_id", "stream", "scope", "created_at", "payload")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    stream: str
    scope: _context_pb2.ScopePath
    created_at: _timestamp_pb2.Timestamp
    payload: bytes
    def __init__(self, message_id: _Optional[str] = ..., stream: _Optional[str] = ..., scope: _Optional[_Union[_context_pb2.ScopePath, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., payload: _Optional[bytes] = ...) -> None: ...
