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

if TYPE_CHECKING:
    from ..org_applier import OrgApplier


def idempotency_key_of(ev: Event) -> str | None:
    """The ingest's idempotency key, read before its body (to load the batch's keys at once)."""
    key = ev.payload.get("idempotency_key")
    return key if isinstance(key, str) and key else None


async def apply(org: OrgApplier, rec: LogRecord, ev: Event) -> Applied:
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
    org.session_events.append((
        ev.event_id, s.session_id, seq, sc.path, sc.pillar_id, sc.team_id, sc.agent_id,
        body.event_type, content, json_text(body.metadata), body.content_sha256 or sha256_hex(content),
        body.token_count, version, ev.occurred, key, None, None))
    await org.chunks.add(event_id=ev.event_id, source_kind="event", session_id=s.session_id,
                         scope_path=sc.path, content=content, metadata=body.metadata, created_at=ev.occurred)
    return applied(rec, ev, ProjectionOutcome.APPLIED, s.session_id, seq, version)


INSERT_SESSION_EVENTS = """
INSERT INTO session_events (event_id, org_id, session_id, seq, scope_path, pillar_id, team_id,
                            scope_agent_id, event_type, content, metadata, content_sha256,
                            token_count, version, occurred_at, idempotency_key, summary_of, stands_for)
SELECT u.event_id, $1, u.session_id, u.seq, u.scope_path, u.pillar_id, u.team_id,
       u.scope_agent_id, u.event_type, u.content, u.metadata::jsonb, u.content_sha256,
       u.token_count, u.version, u.occurred_at, u.idempotency_key, u.summary_of, u.stands_for
FROM unnest($2::uuid[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[],
            $9::text[], $10::bytea[], $11::text[], $12::text[], $13::int[], $14::text[],
            $15::timestamptz[], $16::text[], $17::uuid[], $18::uuid[])
     AS u(event_id, session_id, seq, scope_path, pillar_id, team_id, scope_agent_id, event_type,
          content, metadata, content_sha256, token_count, version, occurred_at, idempotency_key,
          summary_of, stands_for)
"""
SESSION_EVENT_COLUMNS = 17
