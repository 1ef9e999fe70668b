"""session.snapshot_created -> a snapshots row with the session's current version and state.

Unless the event's scope has taken the name in that session already (names are per creator
scope; then nothing: SNAPSHOT_NAME_TAKEN, and the handler answers ALREADY_EXISTS unless its
snapshot_id won). A session without items snapshots its genesis state."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from context_engine.events import Event, SessionRef, SnapshotCreated
from projections.projector.records import LogRecord

from ..outcome import Applied, ProjectionOutcome, applied
from ..rows import json_text

if TYPE_CHECKING:
    from ..org_state import OrgState


async def apply(org: OrgState, rec: LogRecord, ev: Event) -> Applied:
    body = SnapshotCreated.from_payload(ev.payload)
    sid, snapshot_id, name = body.session_id, str(uuid.UUID(body.snapshot_id)), body.name
    if not isinstance(sid, str) or not sid or not isinstance(name, str) or not name:
        raise ValueError("payload.session_id and payload.name must be non-empty strings")
    s = org.chain.sessions.get(sid)
    await org.flush()
    if s is None:
        version, seq, items = SessionRef(org.org_id, sid).genesis, 0, []
    else:
        version, seq = s.version, s.seq
        items = [
            {"seq": r["seq"], "event_id": str(r["event_id"]), "kind": r["kind"],
             "content_hash": r["content_hash"], "version": r["version"]}
            for r in await org.conn.fetch(
                "SELECT seq, event_id, kind, content_hash, version FROM session_items "
                "WHERE org_id = $1 AND session_id = $2 AND active ORDER BY seq",
                org.org_id, sid)]
    state = {"version": version, "seq": seq, "items": items}
    won = await org.conn.fetchval(
        "INSERT INTO snapshots (snapshot_id, org_id, session_id, name, version, seq, state, "
        "                       event_id, created_at, created_by, scope_path) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb, $8, $9, $10, $11) "
        "ON CONFLICT (org_id, session_id, scope_path, name) DO NOTHING RETURNING snapshot_id",
        snapshot_id, org.org_id, sid, name, version, seq, json_text(state), ev.event_id,
        ev.occurred, ev.actor, ev.scope.path)
    if won is None:
        return applied(rec, ev, ProjectionOutcome.SNAPSHOT_NAME_TAKEN, sid)
    return applied(rec, ev, ProjectionOutcome.APPLIED, sid, seq, version)
