"""Domain events: the envelope (envelope.py), one class per event type (session.py, memory.py,
embedding.py, guardrail.py, share.py) registered by type name (registry.py), and the names of aggregates
(aggregates.py)."""

from .aggregates import SessionRef, embedding_aggregate, session_aggregate, share_aggregate
from .embedding import EmbeddingRecorded
from .envelope import Event, EventDecodeError, canonical_bytes, decode
from .guardrail import GuardrailPublished
from .memory import MemoryPushed, MemoryScrubbed
from .registry import (
                       BODY_TYPES,
                       CURRENT_VERSIONS,
                       UPCASTERS,
                       EventBody,
                       Payload,
                       Upcaster,
                       carried_content,
                       content_b64,
                       event_type,
)
from .session import (
                       CompactionRefused,
                       CompactionThreshold,
                       EventIngested,
                       SessionCompacted,
                       SessionRolledBack,
                       SnapshotCreated,
)
from .share import MAX_SHARE_REASON, SHARE_PERMISSIONS, SHARED_RESOURCE_TYPES, ShareCreated, ShareRevoked

EVENT_INGESTED = EventIngested.TYPE
MEMORY_PUSHED = MemoryPushed.TYPE
SNAPSHOT_CREATED = SnapshotCreated.TYPE
SESSION_ROLLED_BACK = SessionRolledBack.TYPE
EMBEDDING_RECORDED = EmbeddingRecorded.TYPE
MEMORY_SCRUBBED = MemoryScrubbed.TYPE
COMPACTION_THRESHOLD = CompactionThreshold.TYPE
COMPACTION_REFUSED = CompactionRefused.TYPE
SESSION_COMPACTED = SessionCompacted.TYPE
GUARDRAIL_PUBLISHED = GuardrailPublished.TYPE
SHARE_CREATED = ShareCreated.TYPE
SHARE_REVOKED = ShareRevoked.TYPE

__all__ = [
    "BODY_TYPES", "COMPACTION_REFUSED", "COMPACTION_THRESHOLD", "CURRENT_VERSIONS", "EMBEDDING_RECORDED",
    "EVENT_INGESTED",
    "GUARDRAIL_PUBLISHED", "MEMORY_PUSHED", "MEMORY_SCRUBBED", "SESSION_COMPACTED", "SESSION_ROLLED_BACK",
    "SNAPSHOT_CREATED",
    "UPCASTERS", "CompactionRefused", "CompactionThreshold", "EmbeddingRecorded", "Event", "EventBody",
    "EventDecodeError",
    "EventIngested", "GuardrailPublished", "MemoryPushed", "MemoryScrubbed", "Payload", "SessionRef",
    "MAX_SHARE_REASON", "SHARED_RESOURCE_TYPES", "SHARE_CREATED", "SHARE_PERMISSIONS", "SHARE_REVOKED",
    "SessionCompacted", "SessionRolledBack", "ShareCreated", "ShareRevoked",
    "SnapshotCreated",
    "Upcaster", "canonical_bytes", "carried_content", "content_b64", "decode",
    "embedding_aggregate",
    "event_type", "session_aggregate", "share_aggregate",
]
