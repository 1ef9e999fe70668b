"""session.compacted: one summary turn replaces an older prefix of the session's active turns.

Applied only from the session's owner scope itself (visibility.may_rewrite, as a rollback), only
while the session is at the event's base_version (else STALE: another write came first, and the
summary would drop it), and only when every replaced id is an active turn written at the owner
scope (else UNKNOWN_TARGET): a turn written below the owner is not the owner's to summarise, and
a summary at the owner scope would show it to scopes that do not see it.

The event is a chain item (kind 'event') whose row in session_items lists the items it replaced
(`replaces`; the rollback's state query leaves them out of every version on its chain); its
summary is a session_events row placed where the first replaced turn was (seq = that turn's
position, so history reads it before the kept turns) and is chunked like a turn. The replaced
turns become inactive, with their chunks, and stay in the log and in the audit view. The
compaction is recorded in `compactions` and closes the session's open compaction request.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from context_engine.events import Event, SessionCompacted
from context_engine.hashing import sha256_hex
from context_engine.visibility import may_rewrite
from projections.records import LogRecord

from ..outcome import Applied, Outcome, applied
from ..rows import json_text
from .compaction import close_request

if TYPE_CHECKING:
    from ..org_applier import OrgApplier

# Replaced turns as the projector sees them: each turn's chain seq and its position.
_REPLACED = """
SELECT i.seq, e.seq AS position, e.event_id
FROM session_items i JOIN session_events e ON e.org_id = i.org_id AND e.event_id = i.event_id
WHERE i.org_id = $1 AND i.session_id = $2 AND i.event_id = ANY($3::uuid[]) AND i.kind = 'event' AND i.active
  AND e.active AND e.scope_path = $4
"""


async def apply(org: OrgApplier, rec: LogRecord, ev: Event) -> Applied:
    body = SessionCompacted.from_payload(ev.payload)
    sid = body.session_id
    s = org.chain.sessions.get(sid) if isinstance(sid, str) else None
    if s is None:
        return applied(rec, ev, Outcome.UNKNOWN_TARGET)
    if not may_rewrite(s.owner(org.org_id), ev.scope):
        return applied(rec, ev, Outcome.OUT_OF_SCOPE)
    if s.version != body.base_version:
        return applied(rec, ev, Outcome.STALE, sid)
    try:
        ids = sorted({uuid.UUID(i) for i in body.replaced})
    except ValueError:
        return applied(rec, ev, Outcome.UNKNOWN_TARGET)
    await org.flush()
    rows = await org.conn.fetch(_REPLACED, org.org_id, sid, ids, s.scope_path)
    if not ids or len(rows) != len(ids):
        return applied(rec, ev, Outcome.UNKNOWN_TARGET)
    seq, version = org.chain.append(s, ev, "event", replacing=len(rows))
    summary = body.summary
    org.session_events.append((
        ev.event_id, sid, min(r["position"] for r in rows), s.scope_path, s.pillar_id, s.team_id, s.scope_agent_id,
        "compaction", summary, json_text({}), sha256_hex(summary), body.compacted_tokens, version, ev.occurred,
        None))
    await org.flush()
    replaced_seqs = sorted(r["seq"] for r in rows)
    await org.conn.execute(
        "UPDATE session_items SET replaces = CASE WHEN seq = $4 THEN $3 ELSE replaces END, active = (seq = $4) "
        "WHERE org_id = $1 AND session_id = $2 AND (seq = $4 OR seq = ANY($3::bigint[]))",
        org.org_id, sid, replaced_seqs, seq)
    await org.conn.execute("UPDATE session_events SET active = false WHERE org_id = $1 AND event_id = ANY($2::uuid[])",
                           org.org_id, ids)
    await org.chunks.set_active([(i, False) for i in ids])
    await org.chunks.add(event_id=ev.event_id, source_kind="event", session_id=sid, scope_path=s.scope_path,
                         content=summary, metadata={}, created_at=ev.occurred, summary=True)
    await org.conn.execute(
        "INSERT INTO compactions (org_id, event_id, session_id, actor, strategy, summarizer, replaced_turns, "
        "original_tokens, compacted_tokens, fact_retention_score, occurred_at) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT DO NOTHING",
        org.org_id, ev.event_id, sid, ev.actor, body.strategy, body.summarizer, len(rows), body.original_tokens,
        body.compacted_tokens, body.fact_retention_score, ev.occurred)
    await close_request(org, sid, ev, "compacted")
    return applied(rec, ev, Outcome.APPLIED, sid, seq, version)
