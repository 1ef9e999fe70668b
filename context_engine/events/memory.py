"""The events of an agent's memory: a pushed version, and the PII scan's result for it.

As in session.py, `from_payload` reads what the projector has always read, with its defaults,
and `to_payload` writes exactly the dict the writer has always written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .registry import EventBody, Payload, carried_content, event_type


@event_type
@dataclass(frozen=True, slots=True)
class MemoryPushed(EventBody):
    """A new version of an agent's memory (PushContext). `session_id` "" = memory outside any
    session; `agent_id` "" = the event scope's agent."""

    TYPE = "memory.pushed"
    SCHEMA_VERSION = 1

    session_id: str
    agent_id: str
    memory_type: str  # "episodic" | "semantic" | "working"
    content_b64: str
    metadata: dict[str, str] = field(default_factory=dict)
    content_sha256: str = ""

    @property
    def content(self) -> bytes:
        return carried_content(self.content_b64)

    def to_payload(self) -> Payload:
        return {"session_id": self.session_id, "agent_id": self.agent_id, "memory_type": self.memory_type,
                "content_b64": self.content_b64, "metadata": self.metadata,
                "content_sha256": self.content_sha256}

    @classmethod
    def from_payload(cls, p: Payload) -> MemoryPushed:
        return cls(session_id=p.get("session_id") or "", agent_id=p.get("agent_id") or "",
                   memory_type=str(p["memory_type"]), content_b64=p["content_b64"],
                   metadata=p.get("metadata") or {}, content_sha256=p.get("content_sha256") or "")


@event_type
@dataclass(frozen=True, slots=True)
class MemoryScrubbed(EventBody):
    """The PII scan of pushed memory `memory_event_id`: its redacted content, and whether it may
    be searched (`status` "clear") or not ("quarantined")."""

    TYPE = "memory.scrubbed"
    SCHEMA_VERSION = 1

    memory_event_id: str
    content_b64: str
    status: str  # "clear" | "quarantined"
    spans_by_class: dict[str, int] = field(default_factory=dict)
    detector_version: str = ""
    fallback_reason: str = ""

    @property
    def content(self) -> bytes:
        return carried_content(self.content_b64)

    def to_payload(self) -> Payload:
        return {"memory_event_id": self.memory_event_id, "content_b64": self.content_b64,
                "status": self.status, "spans_by_class": self.spans_by_class,
                "detector_version": self.detector_version, "fallback_reason": self.fallback_reason}

    @classmethod
    def from_payload(cls, p: Payload) -> MemoryScrubbed:
        return cls(memory_event_id=p["memory_event_id"], content_b64=p["content_b64"], status=p["status"],
                   spans_by_class=p.get("spans_by_class") or {},
                   detector_version=str(p.get("detector_version") or ""),
                   fallback_reason=str(p.get("fallback_reason") or ""))
