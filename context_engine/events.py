"""The domain-event envelope, its canonical byte form, and upcasting of older schema versions.

Every state change is one immutable `Event`. Its `content_hash` is the SHA-256 of the payload's
canonical bytes (orjson, sorted keys, no whitespace), so any party can recompute it. Events are
never rewritten: an event stored at an older `schema_version` is upcast on read, step by step,
by the functions registered in `UPCASTERS`.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from context_engine.hashing import sha256_hex
from context_engine.scope import Scope

# type -> current schema version
EVENT_INGESTED = "session.event_ingested"
MEMORY_PUSHED = "memory.pushed"
SNAPSHOT_CREATED = "session.snapshot_created"
SESSION_ROLLED_BACK = "session.rolled_back"
EMBEDDING_RECORDED = "embedding.recorded"
MEMORY_SCRUBBED = "memory.scrubbed"
COMPACTION_THRESHOLD = "session.compaction_threshold"
GUARDRAIL_PUBLISHED = "guardrail.published"

CURRENT_VERSIONS: dict[str, int] = {
    EVENT_INGESTED: 2,
    MEMORY_PUSHED: 1,
    SNAPSHOT_CREATED: 1,
    SESSION_ROLLED_BACK: 1,
    EMBEDDING_RECORDED: 1,
    MEMORY_SCRUBBED: 1,
    COMPACTION_THRESHOLD: 1,
    GUARDRAIL_PUBLISHED: 1,
}

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


def _ingested_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    """v1 called the category `kind` and had no metadata map."""
    upcast = {k: v for k, v in payload.items() if k != "kind"}
    upcast["event_type"] = payload["kind"]
    upcast.setdefault("metadata", {})
    return upcast


# (type, from_version) -> function producing from_version + 1
UPCASTERS: dict[tuple[str, int], Upcaster] = {
    (EVENT_INGESTED, 1): _ingested_v1_to_v2,
}


def canonical_bytes(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def session_aggregate(org_id: str, session_id: str) -> str:
    """The partition key of every event of one session: their log order is total."""
    return f"session/{org_id}/{session_id}"


def embedding_aggregate(org_id: str) -> str:
    """The partition key of an org's embedding.recorded events."""
    return f"embedding/{org_id}"


def _timestamp(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Event:
    type: str
    scope: Scope
    aggregate: str
    actor: str
    payload: dict[str, Any]
    schema_version: int = 0
    event_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    occurred_at: str = field(default_factory=lambda: _timestamp(dt.datetime.now(dt.UTC)))
    content_hash: str = ""

    def __post_init__(self) -> None:
        if not self.schema_version:
            object.__setattr__(self, "schema_version", CURRENT_VERSIONS[self.type])
        if not self.content_hash:
            object.__setattr__(self, "content_hash", sha256_hex(canonical_bytes(self.payload)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "type": self.type,
            "schema_version": self.schema_version,
            "scope": {"org_id": self.scope.org_id, "pillar_id": self.scope.pillar_id,
                      "team_id": self.scope.team_id, "agent_id": self.scope.agent_id},
            "aggregate": self.aggregate,
            "occurred_at": self.occurred_at,
            "actor": self.actor,
            "payload": self.payload,
            "content_hash": self.content_hash,
        }

    def to_bytes(self) -> bytes:
        """The canonical form written to the log and to the archive."""
        return canonical_bytes(self.to_dict())

    @property
    def occurred(self) -> dt.datetime:
        return dt.datetime.fromisoformat(self.occurred_at.replace("Z", "+00:00"))


class EventDecodeError(ValueError):
    pass


def decode(raw: bytes | dict[str, Any]) -> Event:
    """Parse a stored event and upcast it to the current schema of its type.

    `content_hash` stays the hash of the payload as it was written, so the version chain
    that replay recomputes never depends on how newer code reshapes old payloads."""
    try:
        data = orjson.loads(raw) if isinstance(raw, (bytes, bytearray, memoryview, str)) else raw
        kind, version, payload = data["type"], int(data["schema_version"]), data["payload"]
        if kind not in CURRENT_VERSIONS:
            raise EventDecodeError(f"unknown event type {kind!r}")
        while version < CURRENT_VERSIONS[kind]:
            payload = UPCASTERS[(kind, version)](payload)
            version += 1
        s = data["scope"]
        return Event(
            type=kind, schema_version=version,
            scope=Scope(s["org_id"], s.get("pillar_id", ""), s.get("team_id", ""), s.get("agent_id", "")),
            aggregate=data["aggregate"], actor=data["actor"], payload=payload,
            event_id=data["event_id"], occurred_at=data["occurred_at"], content_hash=data["content_hash"],
        )
    except (KeyError, TypeError, orjson.JSONDecodeError) as exc:
        raise EventDecodeError(f"malformed event: {exc}") from exc
