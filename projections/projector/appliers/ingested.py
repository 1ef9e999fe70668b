"""session.event_ingested -> a session_events row, a chain item (kind 'event') and its chunks.

If an earlier event of the same session and the same writer scope carries the same non-empty
idempotency_key, nothing (IDEMPOTENCY_KEY_TAKEN; the handler answers with
`queries.event_by_idempotency_key`). Per writer: a key names one request of one scope, and
another scope's never answers it. Per session, because every decision of the projector may
depend only on the session's own (single-partition) history: across partitions there is no log
order, and replay would decide differently."""

from __future__ import annotations

from typing import TYPE_CHECKING

from context_engine.events import Event, EventIngested
from context_engine.hashing import sha256_hex
from projections.projector.records import LogRecord

from ..outcome import Applied, ProjectionOutcome, applied, session_id_of
from ..rows import json_text
from ..session_rows import SessionEventRow

if TYPE_CHECKING:
    from ..org_state import OrgState


def idempotency_key_of(ev: Event) -> str | None:
    """The ingest's idempotency key, read before its body."""
    key = ev.payload.get("idempotency_key")
    return key if isinstance(key, str) and key else None


def preload(ev: Event) -> tuple[str, str, str] | None:
    """The (session, writer scope, idempotency key) the batch loads before any ingest applies, so
    that every key of the batch's sessions is known at once."""
    key, sid = idempotency_key_of(ev), session_id_of(ev)
    return (sid, ev.scope.path, key) if key and sid else None


async def apply(org: OrgState, rec: LogRecord, ev: Event) -> Applied:
    key = idempotency_key_of(ev)
    if key and (session_id_of(ev), ev.scope.path, key) in org.used_keys:
        return applied(rec, ev, ProjectionOutcome.IDEMPOTENCY_KEY_TAKEN)
    body = EventIngested.from_payload(ev.payload)
    content = body.content
    s = org.chain.session(body.session_id, ev)
    seq, version = org.chain.append(s, ev, "event")
    if key:
        org.used_keys.add((s.session_id, ev.scope.path, key))
    sc = ev.scope
    org.session_events.append(SessionEventRow(
        ev.event_id, s.session_id, seq, sc.path, sc.pillar_id, sc.team_id, sc.agent_id,
        body.event_type, content, json_text(body.metadata), body.content_sha256 or sha256_hex(content),
        body.token_count, version, ev.occurred, key))
    await org.chunks.add(event_id=ev.event_id, source_kind="event", session_id=s.session_id,
                         scope_path=sc.path, content=content, metadata=body.metadata, created_at=ev.occurred,
                         seq=seq)
    return applied(rec, ev, ProjectionOutcome.APPLIED, s.session_id, seq, version)
