"""What one record did: its outcome, and the session state it left."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from context_engine.events import Event
from projections.projector.records import LogRecord

from .job_requests import JobRequest


class ProjectionOutcome(enum.StrEnum):
    """A StrEnum: each outcome is its own name as a string, so it compares equal to, formats as
    and serialises as the strings that cross process boundaries (the "event_id:OUTCOME" NOTIFY
    payloads, the guardrail projection's outcomes)."""

    APPLIED = "APPLIED"
    DUPLICATE = "DUPLICATE"
    SNAPSHOT_NAME_TAKEN = "SNAPSHOT_NAME_TAKEN"
    UNKNOWN_TARGET = "UNKNOWN_TARGET"
    IGNORED = "IGNORED"  # archived; another projector's event, or nothing to do
    OUT_OF_SCOPE = "OUT_OF_SCOPE"
    IDEMPOTENCY_KEY_TAKEN = "IDEMPOTENCY_KEY_TAKEN"
    STALE = "STALE"  # a compaction of a version the session has since left (another write came first)
    REJECTED = "REJECTED"  # set aside: not archived, nothing applied (rejected_events)
    # A guardrail layer refused by its projection (projections/projector/guardrail_layers.py): neither
    # archived nor applied.
    REJECTED_MALFORMED = "REJECTED_MALFORMED"
    REJECTED_SCOPE = "REJECTED_SCOPE"
    REJECTED_BAD_SIGNATURE = "REJECTED_BAD_SIGNATURE"
    REJECTED_UNTRUSTED_KEY = "REJECTED_UNTRUSTED_KEY"
    REJECTED_STALE = "REJECTED_STALE"


class ProjectionError(RuntimeError):
    """A record cannot be projected; the batch's transaction is rolled back."""


@dataclass(frozen=True, slots=True)
class Applied:
    """What one record did. `version`/`seq`: the session's state version and the item seq after
    the event (the new item for ingest/push, the target for a rollback, the snapshot's for a
    snapshot); None for duplicates, unknown targets and memory outside a session."""

    event_id: str
    type: str
    org_id: str
    topic: str
    partition: int
    offset: int
    outcome: ProjectionOutcome
    session_id: str | None = None
    seq: int | None = None
    version: str | None = None
    # Work this event asks for, published by the worker after the commit.
    jobs: tuple[JobRequest, ...] = ()


def session_id_of(ev: Event) -> str | None:
    """The session an event names, whatever its type (read before its body: to load the batch's
    sessions, and to report a record that cannot be read)."""
    sid = ev.payload.get("session_id")
    return sid if isinstance(sid, str) and sid else None


def applied(rec: LogRecord, ev: Event, outcome: ProjectionOutcome, session_id: str | None = None,
            seq: int | None = None, version: str | None = None, jobs: tuple[JobRequest, ...] = ()) -> Applied:
    return Applied(ev.event_id, ev.type, ev.scope.org_id, rec.topic, rec.partition, rec.offset,
                   ProjectionOutcome(outcome), session_id if session_id is not None else session_id_of(ev), seq,
                   version,
                   jobs)


def where(at: LogRecord | Applied) -> str:
    return f"{at.topic}[{at.partition}]@{at.offset}"
