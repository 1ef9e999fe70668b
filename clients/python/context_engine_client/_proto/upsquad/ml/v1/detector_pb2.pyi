import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ClassifyRequest(_message.Message):
    __slots__ = ("text", "tenant_id", "session_id", "agent_id", "model_hint", "warn_threshold", "block_threshold")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_HINT_FIELD_NUMBER: _ClassVar[int]
    WARN_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    BLOCK_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    text: str
    tenant_id: str
    session_id: str
    agent_id: str
    model_hint: str
    warn_threshold: float
    block_threshold: float
    def __init__(self, text: _Optional[str] = ..., tenant_id: _Optional[str] = ..., session_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., model_hint: _Optional[str] = ..., warn_threshold: _Optional[float] = ..., block_threshold: _Optional[float] = ...) -> None: ...

class ClassifyResponse(_message.Message):
    __slots__ = ("jailbreak_score", "indirect_injection_score", "verdict", "latency_ms", "model_version", "classified_at")
    JAILBREAK_SCORE_FIELD_NUMBER: _ClassVar[int]
    INDIRECT_INJECTION_SCORE_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CLASSIFIED_AT_FIELD_NUMBER: _ClassVar[int]
    jailbreak_score: float
    indirect_injection_score: float
    verdict: str
    latency_ms: int
    model_version: str
    classified_at: _timestamp_pb2.Timestamp
    def __init__(self, jailbreak_score: _Optional[float] = ..., indirect_injection_score: _Optional[float] = ..., verdict: _Optional[str] = ..., latency_ms: _Optional[int] = ..., model_version: _Optional[str] = ..., classified_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class DetectPIIRequest(_message.Message):
    __slots__ = ("text", "tenant_id", "session_id", "agent_id", "model_hint")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_HINT_FIELD_NUMBER: _ClassVar[int]
    text: str
    tenant_id: str
    session_id: str
    agent_id: str
    model_hint: str
    def __init__(self, text: _Optional[str] = ..., tenant_id: _Optional[str] = ..., session_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., model_hint: _Optional[str] = ...) -> None: ...

class DetectPIIResponse(_message.Message):
    __slots__ = ("spans", "latency_ms", "model_version", "detected_at", "canary_healthy")
    SPANS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    DETECTED_AT_FIELD_NUMBER: _ClassVar[int]
    CANARY_HEALTHY_FIELD_NUMBER: _ClassVar[int]
    spans: _containers.RepeatedCompositeFieldContainer[PIISpan]
    latency_ms: int
    model_version: str
    detected_at: _timestamp_pb2.Timestamp
    canary_healthy: bool
    def __init__(self, spans: _Optional[_Iterable[_Union[PIISpan, _Mapping]]] = ..., latency_ms: _Optional[int] = ..., model_version: _Optional[str] = ..., detected_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., canary_healthy: _Optional[bool] = ...) -> None: ...

class ModerateRequest(_message.Message):
    __slots__ = ("text", "tenant_id", "session_id", "agent_id")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    text: str
    tenant_id: str
    session_id: str
    agent_id: str
    def __init__(self, text: _Optional[str] = ..., tenant_id: _Optional[str] = ..., session_id: _Optional[str] = ..., agent_id: _Optional[str] = ...) -> None: ...

class ModerateResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PIISpan(_message.Message):
    __slots__ = ("pattern_class", "start", "end", "score")
    PATTERN_CLASS_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    pattern_class: str
    start: int
    end: int
    score: float
    def __init__(self, pattern_class: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., score: _Optional[float] = ...) -> None: ...
