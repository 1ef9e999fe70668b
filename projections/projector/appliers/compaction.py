"""session.compaction_threshold: open (or close) the session's compaction request;
session.compaction_refused: the worker closes it, saying why; `close_request` for the other
events that close it (a compaction, a rollback)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from context_engine.events import CompactionRefused, CompactionThreshold, Event
from context_engine.visibility import may_rewrite
from projections.projector.records import LogRecord

from ..job_requests import CompactSession
from ..outcome import Applied, ProjectionOutcome, applied

if TYPE_CHECKING:
    from ..org_state import OrgState


async def apply(org: OrgState, rec: LogRecord, ev: Event) -> Applied:
    """AssembleContext saw the session's history cross 80 % of its budget (or fall back under
    it). Only the event that opens a request asks for compaction, so there is one job per
    crossing whoever observed it. Only the owner scope's events count (the API sends no other):
    a compaction rewrites what every reader of the session sees."""
    body = CompactionThreshold.from_payload(ev.payload)
    sid = body.session_id
    s = org.chain.sessions.get(sid) if isinstance(sid, str) else None
    if s is None or not may_rewrite(s.owner(org.org_id), ev.scope):
        return applied(rec, ev, ProjectionOutcome.OUT_OF_SCOPE)  # only the owner scope's crossing asks for a compaction
    if body.crossed:
        opened = await org.conn.fetchval(
            "INSERT INTO compaction_requests (org_id, session_id, opened_by, token_count, token_budget, opened_at) "
            "VALUES ($1, $2, $3, $4, $5, $6) "
            "ON CONFLICT (org_id, session_id) WHERE closed_by IS NULL DO NOTHING RETURNING opened_by",
            org.org_id, sid, ev.event_id, body.token_count, body.token_budget, ev.occurred)
        if opened is None:
            return applied(rec, ev, ProjectionOutcome.IGNORED)
        job = CompactSession(ev.scope, sid, body.token_count, body.token_budget)
        return applied(rec, ev, ProjectionOutcome.APPLIED, sid, jobs=(job,))
    closed = await close_request(org, sid, ev, "below_threshold")
    return applied(rec, ev, ProjectionOutcome.APPLIED if closed else ProjectionOutcome.IGNORED, sid)


async def apply_refused(org: OrgState, rec: LogRecord, ev: Event) -> Applied:
    """The worker refused the request it names (the event that opened it): it closes with the
    refusal and the session version it was refused at, if it is still the open one (a request
    closed meanwhile, or another opened since, is not this refusal's: IGNORED)."""
    body = CompactionRefused.from_payload(ev.payload)
    sid = body.session_id
    s = org.chain.sessions.get(sid) if isinstance(sid, str) else None
    if s is None or not may_rewrite(s.owner(org.org_id), ev.scope):
        return applied(rec, ev, ProjectionOutcome.OUT_OF_SCOPE)
    closed = await org.conn.fetchval(
        "UPDATE compaction_requests SET closed_by = $3, closed_at = $4, closed_reason = 'refused', "
        "  refusal = $5, closed_version = $6 "
        "WHERE org_id = $1 AND session_id = $2 AND closed_by IS NULL AND opened_by::text = $7 RETURNING true",
        org.org_id, sid, ev.event_id, ev.occurred, body.reason[:64], body.at_version[:64], body.request)
    return applied(rec, ev, ProjectionOutcome.APPLIED if closed else ProjectionOutcome.IGNORED, sid)


async def close_request(org: OrgState, session_id: str, ev: Event, reason: str) -> bool:
    """Close the session's open request, if any, naming the event and why ('below_threshold',
    'compacted', 'rolled_back'): a job still queued for it then finds nothing to do."""
    return await org.conn.fetchval(
        "UPDATE compaction_requests SET closed_by = $3, closed_at = $4, closed_reason = $5 "
        "WHERE org_id = $1 AND session_id = $2 AND closed_by IS NULL RETURNING true",
        org.org_id, session_id, ev.event_id, ev.occurred, reason) is not None
