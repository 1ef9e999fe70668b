"""A session's history as its version chain: every item (turn, memory, compaction summary) in
chain order with the version it made, whether it is in the current state, and what took it out,
so a RollbackContext target can be found (`context-engine history`).

Takes a connection on which the caller has set `app.org_id` for this transaction
(`projections.store.pool.org_transaction`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import asyncpg


@dataclass(frozen=True)
class HistoryItem:
    seq: int  # 0: the empty session (genesis)
    version: str  # the session's version once this item was added: a RollbackContext target
    kind: str  # 'genesis', the session_events event_type ('message', ...), 'compaction' or 'memory'
    event_id: str | None
    active: bool  # in the current state
    removed_by: str | None  # the rollback event that took it out; a compaction's id for a replaced turn
    replaced: int  # turns this item (a compaction summary) replaced
    occurred_at: dt.datetime
    current: bool  # the session is at this item's version now


async def session_history(conn: asyncpg.Connection, org_id: str, session_id: str) -> list[HistoryItem] | None:
    """The session's items in chain order, genesis first; None if the org has no such session."""
    current = await conn.fetchval("SELECT seq FROM sessions WHERE org_id = $1 AND session_id = $2",
                                  org_id, session_id)
    if current is None:
        return None
    rows = await conn.fetch(_HISTORY, org_id, session_id)
    # The item the session's state was made by (not the version: two items can make equal states)
    return [HistoryItem(r["seq"], r["version"], r["kind"], None if r["event_id"] is None else str(r["event_id"]),
                        r["active"], None if r["removed_by"] is None else str(r["removed_by"]), r["replaced"],
                        r["occurred_at"], r["seq"] == current) for r in rows]


_HISTORY = """
SELECT 0::bigint AS seq, v.version, 'genesis' AS kind, NULL::uuid AS event_id, true AS active,
       NULL::uuid AS removed_by, 0 AS replaced, v.at AS occurred_at
FROM session_versions v WHERE v.org_id = $1 AND v.session_id = $2 AND v.seq = 0
UNION ALL
SELECT i.seq, i.version,
       CASE WHEN i.kind = 'memory' THEN 'memory' ELSE coalesce(e.event_type, 'compaction') END, i.event_id, i.active,
       coalesce(i.rolled_back_by, (SELECT c.event_id FROM session_items c WHERE c.org_id = i.org_id
                                   AND c.session_id = i.session_id AND i.seq = ANY(c.replaces) AND c.active LIMIT 1)),
       cardinality(i.replaces), i.occurred_at
FROM session_items i
LEFT JOIN session_events e ON e.org_id = i.org_id AND e.event_id = i.event_id
WHERE i.org_id = $1 AND i.session_id = $2
ORDER BY seq
"""
