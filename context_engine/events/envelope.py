"""The domain-event envelope, its canonical byte form, and upcasting of older schema versions.

Every state change is one immutable `Event`. Its `content_hash` is the SHA-256 of the payload's
canonical bytes (orjson, sorted keys, no whitespace), so any party can recompute it. Events are
never rewritten: an event stored at an older `schema_version` is upcast on read, step by step,
by the upcasters its body class keeps (registry.py). The envelope holds the payload as written
(or upcast); `Event.body` reads it as its type's class.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from context_engine.hashing import canonical_bytes, sha256_hex
from context_engine.scope import Scope

from .registry import BODY_TYPES, CURRENT_VERSIONS, UPCASTERS, EventBody


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

    @classmethod
    def of(cls, body: EventBody, *, scope: Scope, aggregate: str, actor: str, **envelope: Any) -> Event:
        """The event saying `body` (`envelope`: event_id, occurred_at when not new ones)."""
        return cls(type=body.TYPE, scope=scope, aggregate=aggregate, actor=actor, payload=body.to_payload(),
                   schema_version=body.SCHEMA_VERSION, **envelope)

    @property
    def body(self) -> EventBody:
        """The payload as its type's class (KeyError for a type without one; whatever its
        `from_payload` raises for a payload it cannot read)."""
        return BODY_TYPES[self.type].from_payload(self.payload)

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
