"""session.compaction_threshold: open (or close) the session's compaction request."""

from __future__ import annotations

from typing import TYPE_CHECKING

from context_engine.events import CompactionThreshold, Event
from projections.records import LogRecord

from ..job_requests import CompactSession
from ..outcome import Applied, Outcome, applied

if TYPE_CHECKING:
    from ..org_applier import OrgApplier


async def apply(org: OrgApplier, rec: LogRecord, ev: Event) -> Applied:
    """AssembleContext saw the session's history cross 80 % of its budget (or fall back under
    it). Only the event that opens a request asks for compaction, so there is one job per
    crossing whoever observed it."""
    body = CompactionThreshold.from_payload(ev.payload)
    sid = body.session_id
    if body.crossed:
        opened = await org.conn.fetchval(
            "INSERT INTO compaction_requests (org_id, session_id, opened_by, token_count, token_budget, opened_at) "
            "VALUES ($1, $2, $3, $4, $5, $6) "
            "ON CONFLICT (org_id, session_id) WHERE closed_by IS NULL DO NOTHING RETURNING opened_by",
            org.org_id, sid, ev.event_id, body.token_count, body.token_budget, ev.occurred)
        if opened is None:
            return applied(rec, ev, Outcome.IGNORED)
        job = CompactSession(ev.scope, sid, body.token_count, body.token_budget)
        return applied(rec, ev, Outcome.APPLIED, sid, jobs=(job,))
    closed = await org.conn.fetchval(
        "UPDATE compaction_requests SET closed_by = $3, closed_at = $4 "
        "WHERE org_id = $1 AND session_id = $2 AND closed_by IS NULL RETURNING opened_by",
        org.org_id, sid, ev.event_id, ev.occurred)
    return applied(rec, ev, Outcome.APPLIED if closed else Outcome.IGNORED, sid)
