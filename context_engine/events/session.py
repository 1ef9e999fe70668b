"""The events of a session's history: what was said, snapshots, rollbacks, compaction requests.

`from_payload` reads what the session projector has always read, with the same defaults (a
payload from the log may be old or hostile): a missing required key is a KeyError, a value the
projector coerces (`str`, `int`) is coerced, anything else is taken as written and checked
where it is used. `to_payload` writes exactly the dict the command has always written: the
payload's canonical bytes are hashed into the version chain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .registry import EventBody, Payload, carried_content, event_type


def _ingested_v1_to_v2(payload: Payload) -> Payload:
    """v1 called the category `kind` and had no metadata map."""
    upcast = {k: v for k, v in payload.items() if k != "kind"}
    upcast["event_type"] = payload["kind"]
    upcast.setdefault("metadata", {})
    return upcast


@event_type
@dataclass(frozen=True, slots=True)
class EventIngested(EventBody):
    """One conversation event of a session (IngestEvent). `content_sha256` is the SHA-256 of the
    raw content (= IngestEventResponse.version_hash); `idempotency_key` "" = none."""

    TYPE = "session.event_ingested"
    SCHEMA_VERSION = 2
    UPCASTERS = {1: _ingested_v1_to_v2}

    session_id: str
    event_type: str  # "message" | "tool_output" | "workflow_event"
    content_b64: str  # standard base64 of the raw content
    metadata: dict[str, str] = field(default_factory=dict)
    content_sha256: str = ""
    token_count: int = 0
    idempotency_key: str = ""

    @property
    def content(self) -> bytes:
        return carried_content(self.content_b64)

    def to_payload(self) -> Payload:
        return {"session_id": self.session_id, "event_type": self.event_type, "content_b64": self.content_b64,
                "metadata": self.metadata, "content_sha256": self.content_sha256,
                "token_count": self.token_count, "idempotency_key": self.idempotency_key}

    @classmethod
    def from_payload(cls, p: Payload) -> EventIngested:
        return cls(session_id=p["session_id"], event_type=str(p["event_type"]), content_b64=p["content_b64"],
                   metadata=p.get("metadata") or {}, content_sha256=p.get("content_sha256") or "",
                   token_count=int(p.get("token_count") or 0), idempotency_key=p.get("idempotency_key") or "")


@event_type
@dataclass(frozen=True, slots=True)
class SnapshotCreated(EventBody):
    """A name for the session's current version and state; `snapshot_id` is chosen by the handler."""

    TYPE = "session.snapshot_created"
    SCHEMA_VERSION = 1

    session_id: str
    snapshot_id: str  # a uuid
    name: str

    def to_payload(self) -> Payload:
        return {"session_id": self.session_id, "snapshot_id": self.snapshot_id, "name": self.name}

    @classmethod
    def from_payload(cls, p: Payload) -> SnapshotCreated:
        return cls(session_id=p["session_id"], snapshot_id=p["snapshot_id"], name=p["name"])


@event_type
@dataclass(frozen=True, slots=True)
class SessionRolledBack(EventBody):
    """The session's state and version become those of `target_version`, a version it has had."""

    TYPE = "session.rolled_back"
    SCHEMA_VERSION = 1

    session_id: str
    target_version: str

    def to_payload(self) -> Payload:
        return {"session_id": self.session_id, "target_version": self.target_version}

    @classmethod
    def from_payload(cls, p: Payload) -> SessionRolledBack:
        return cls(session_id=p["session_id"], target_version=p["target_version"])


@event_type
@dataclass(frozen=True, slots=True)
class CompactionThreshold(EventBody):
    """AssembleContext saw the session's history cross its compaction threshold (`crossed`), or
    fall back under it."""

    TYPE = "session.compaction_threshold"
    SCHEMA_VERSION = 1

    session_id: str
    crossed: bool
    token_count: int
    token_budget: int

    def to_payload(self) -> Payload:
        return {"session_id": self.session_id, "crossed": self.crossed, "token_count": self.token_count,
                "token_budget": self.token_budget}

    @classmethod
    def from_payload(cls, p: Payload) -> CompactionThreshold:
        crossed = bool(p["crossed"])
        counts: tuple[Any, Any] = (  # only an opening event's counts were ever read
            (int(p["token_count"]), int(p["token_budget"])) if crossed
            else (p.get("token_count", 0), p.get("token_budget", 0)))
        return cls(p["session_id"], crossed, *counts)


def _compacted_v1_to_v2(payload: Payload) -> Payload:
    """v1 had no id of its own (two equal compactions made one version) and did not say which
    turn each line of its summary stands for."""
    return {**payload, "compaction_id": "", "stands_for": [], "line_tokens": []}


def _id_list(p: Payload, key: str) -> tuple[str, ...]:
    values = p[key]
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"payload.{key} must be a list of event ids")
    return tuple(values)


@event_type
@dataclass(frozen=True, slots=True)
class SessionCompacted(EventBody):
    """Older turns of the session (`replaced`, event ids, all written at the session's owner
    scope) leave its history for a summary, while the session is at `base_version` (the projector
    refuses it otherwise: STALE). The summary is one line per kept turn: line i stands for the
    turn `stands_for[i]` and costs `line_tokens[i]` (cl100k). The replaced turns stay in the log,
    in the audit view and in retrieval; a rollback to a version before this one brings them back
    into the history. `compaction_id` (the event's id) gives every compaction its own version."""

    TYPE = "session.compacted"
    SCHEMA_VERSION = 2
    UPCASTERS = {1: _compacted_v1_to_v2}

    session_id: str
    base_version: str
    replaced: tuple[str, ...]
    summary_b64: str  # standard base64 of the summary's UTF-8 text, its lines joined by "\n"
    strategy: str
    summarizer: str
    fact_retention_score: float
    original_tokens: int
    compacted_tokens: int
    compaction_id: str = ""
    stands_for: tuple[str, ...] = ()  # per summary line; () in v1 events
    line_tokens: tuple[int, ...] = ()  # per summary line; () in v1 events

    @property
    def summary(self) -> bytes:
        return carried_content(self.summary_b64)

    def to_payload(self) -> Payload:
        return {"session_id": self.session_id, "base_version": self.base_version, "replaced": list(self.replaced),
                "summary_b64": self.summary_b64, "strategy": self.strategy, "summarizer": self.summarizer,
                "fact_retention_score": self.fact_retention_score, "original_tokens": self.original_tokens,
                "compacted_tokens": self.compacted_tokens, "compaction_id": self.compaction_id,
                "stands_for": list(self.stands_for), "line_tokens": list(self.line_tokens)}

    @classmethod
    def from_payload(cls, p: Payload) -> SessionCompacted:
        line_tokens = p["line_tokens"]
        if not isinstance(line_tokens, list) or not all(type(n) is int and n >= 0 for n in line_tokens):
            raise ValueError("payload.line_tokens must be a list of token counts")
        return cls(session_id=p["session_id"], base_version=p["base_version"], replaced=_id_list(p, "replaced"),
                   summary_b64=p["summary_b64"], strategy=str(p["strategy"]), summarizer=str(p["summarizer"]),
                   fact_retention_score=float(p["fact_retention_score"]),
                   original_tokens=int(p["original_tokens"]), compacted_tokens=int(p["compacted_tokens"]),
                   compaction_id=str(p["compaction_id"]), stands_for=_id_list(p, "stands_for"),
                   line_tokens=tuple(line_tokens))


@event_type
@dataclass(frozen=True, slots=True)
class CompactionRefused(EventBody):
    """The compaction worker will not compact for the request `request` (the event that opened
    it) at the session's version `at_version`, for `reason` (the refusal's lower-case code:
    nothing_to_compact, insufficient_savings, quality_guardrail_triggered, summary_too_large,
    disabled, expired): the request closes, and AssembleContext opens no new one for the session
    until its version changes."""

    TYPE = "session.compaction_refused"
    SCHEMA_VERSION = 1

    session_id: str
    request: str
    at_version: str
    reason: str
    detail: str = ""

    def to_payload(self) -> Payload:
        return {"session_id": self.session_id, "request": self.request, "at_version": self.at_version,
                "reason": self.reason, "detail": self.detail}

    @classmethod
    def from_payload(cls, p: Payload) -> CompactionRefused:
        return cls(session_id=p["session_id"], request=str(p["request"]), at_version=str(p["at_version"]),
                   reason=str(p["reason"]), detail=str(p.get("detail") or ""))
