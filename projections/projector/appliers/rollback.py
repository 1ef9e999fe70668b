"""session.rolled_back: the session's active items become exactly those of the target state.

If the session has had target_version: the items on its chain back to genesis become the active
ones; items leaving the state get active=false and rolled_back_by = this event (also in
session_events / memory_versions); the session's version and seq become the target's. For a
target on the current chain this is "every item after the target becomes inactive"; for a
target that was itself rolled back earlier, its items become active again; items a compaction on
the target's chain replaced stay inactive, and those of a compaction after it come back; a
summary's lines (session_events rows with summary_of) follow their compaction's item. Chunks
follow the chain, not the history: a turn on the target's chain keeps its chunks searchable
even where a compaction replaced it (recall storage, docs/compaction.md). Unknown target:
nothing changes (UNKNOWN_TARGET). A rollback changes what every scope in the session sees, so
it is applied only from the owner scope itself (visibility.may_rewrite), OUT_OF_SCOPE otherwise.
It closes the session's open compaction request: the history that crossed the threshold is gone."""

from __future__ import annotations

from typing import TYPE_CHECKING

from context_engine.events import Event, SessionRolledBack
from context_engine.visibility import may_rewrite
from projections.projector.records import LogRecord

from ..outcome import Applied, ProjectionOutcome, applied
from ..rows import columns
from .compaction import close_request

if TYPE_CHECKING:
    from ..org_state import OrgState


async def apply(org: OrgState, rec: LogRecord, ev: Event) -> Applied:
    body = SessionRolledBack.from_payload(ev.payload)
    sid, target = body.session_id, body.target_version
    s = org.chain.sessions.get(sid) if isinstance(sid, str) else None
    if s is None or not isinstance(target, str):
        return applied(rec, ev, ProjectionOutcome.UNKNOWN_TARGET)
    if not may_rewrite(s.owner(org.org_id), ev.scope):
        return applied(rec, ev, ProjectionOutcome.OUT_OF_SCOPE)
    await org.flush()
    row = await org.conn.fetchrow(
        "SELECT seq, depth FROM session_versions WHERE org_id = $1 AND session_id = $2 AND version = $3",
        org.org_id, sid, target)
    if row is None:
        return applied(rec, ev, ProjectionOutcome.UNKNOWN_TARGET)
    changed = await org.conn.fetch(_ROLLBACK, org.org_id, sid, row["seq"], ev.event_id)
    for kind, table, key in (("event", "session_events", "event_id"), ("event", "session_events", "summary_of"),
                             ("memory", "memory_versions", "event_id")):
        rows = [(r["event_id"], r["active"]) for r in changed if r["kind"] == kind]
        if rows:
            await org.conn.execute(
                f"UPDATE {table} t SET active = u.active "
                "FROM unnest($2::uuid[], $3::bool[]) AS u(event_id, active) "
                f"WHERE t.org_id = $1 AND t.{key} = u.event_id",
                org.org_id, *columns(rows, 2))
    if changed:
        on_path = await org.conn.fetch(_ON_PATH, org.org_id, sid, row["seq"])
        await org.chunks.set_active([(r["source"], r["on_path"]) for r in on_path])
    org.chain.rolled_back(s, ev, target, row["seq"], row["depth"])
    await close_request(org, sid, ev, "rolled_back")  # the history it measured is gone
    return applied(rec, ev, ProjectionOutcome.APPLIED, sid, s.seq, s.version)


# The state of version V = the items on V's chain back to genesis (prev_seq links) but those a
# compaction on that chain replaced; everything else of the session is inactive. Only rows whose
# flag changes are touched.
_ROLLBACK = """
WITH RECURSIVE path AS (
    SELECT seq, prev_seq, replaces FROM session_items WHERE org_id = $1 AND session_id = $2 AND seq = $3
    UNION ALL
    SELECT i.seq, i.prev_seq, i.replaces FROM session_items i JOIN path p ON i.seq = p.prev_seq
    WHERE i.org_id = $1 AND i.session_id = $2
), keep AS (
    SELECT array_agg(p.seq) AS seqs FROM path p
    WHERE NOT EXISTS (SELECT 1 FROM path q WHERE p.seq = ANY(q.replaces))
)
UPDATE session_items s
SET active = s.seq = ANY(coalesce(keep.seqs, '{}')),
    rolled_back_by = CASE WHEN s.seq = ANY(coalesce(keep.seqs, '{}')) THEN NULL ELSE $4::uuid END
FROM keep
WHERE s.org_id = $1 AND s.session_id = $2
  AND s.active <> (s.seq = ANY(coalesce(keep.seqs, '{}')))
RETURNING s.event_id, s.kind, s.active
"""


# Every chunk source of the session and whether it is on the chain of version V (the item at seq
# $3) back to genesis, replaced by a compaction or not: a compaction's sources are its lines.
_ON_PATH = """
WITH RECURSIVE path AS (
    SELECT seq, prev_seq FROM session_items WHERE org_id = $1 AND session_id = $2 AND seq = $3
    UNION ALL
    SELECT i.seq, i.prev_seq FROM session_items i JOIN path p ON i.seq = p.prev_seq
    WHERE i.org_id = $1 AND i.session_id = $2
)
SELECT coalesce(e.event_id, i.event_id) AS source, i.seq IN (SELECT seq FROM path) AS on_path
FROM session_items i
LEFT JOIN session_events e ON e.org_id = i.org_id AND e.summary_of = i.event_id
WHERE i.org_id = $1 AND i.session_id = $2
"""
