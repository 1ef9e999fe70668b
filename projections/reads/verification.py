"""What verify compares between the live read models and a rebuild (streams/replay.py
`compare`): per read model, every row as a key naming it, the values that must match, and the
event to blame for a difference.
"""

from __future__ import annotations

import asyncpg

_STATEMENTS = {
    "session item": ("SELECT org_id || '/' || session_id || ' seq ' || seq AS key, event_id::text AS event, "
                     "version || CASE WHEN active THEN ' (active)' ELSE ' (inactive)' END AS value "
                     "FROM session_items"),
    "session version": ("SELECT org_id || '/' || session_id AS key, last_event_id::text AS event, "
                        "version || ' at seq ' || seq AS value FROM sessions"),
    "snapshot": ("SELECT org_id || '/' || session_id || ' snapshot ' || name || ' by ' || scope_path AS key, "
                 "event_id::text AS event, version AS value FROM snapshots"),
    "ingested event": ("SELECT org_id || ' event ' || event_id AS key, event_id::text AS event, "
                       "content_sha256 || ' v ' || version AS value FROM session_events"),
    # Chunks, by id: a content whose chunks never came (an indexing request given up, a job
    # lost for good) is a difference; one whose indexing is still asked for is not yet.
    "chunk": ("SELECT org_id || ' chunk ' || chunk_id AS key, source_event_id::text AS event, "
              "content_hash || CASE WHEN searchable THEN ' (searchable)' ELSE ' (not searchable)' END AS value "
              "FROM chunks"),
    "memory version": ("SELECT org_id || ' memory ' || event_id AS key, event_id::text AS event, "
                       "content_sha256 || ' v ' || coalesce(session_version, '-') AS value FROM memory_versions"),
    # Grants, by id: what, to whom, and whether (and by which event) they ended.
    "share grant": ("SELECT org_id || ' share ' || share_id AS key, event_id::text AS event, "
                    "resource_type || ' ' || resource_id || ' to ' || grantee_path || ' ' "
                    "|| array_to_string(permissions, ',') "
                    "|| coalesce(' revoked by ' || revoked_event_id, '') AS value FROM share_grants"),
    "compaction": ("SELECT org_id || ' compaction ' || event_id AS key, event_id::text AS event, "
                   "session_id || ' replaced ' || replaced_turns || ' turns, ' || original_tokens || ' -> ' "
                   "|| compacted_tokens || ' tokens' AS value FROM compactions"),
    # Requests, by the event that opened them: open, or closed by which event and why.
    "compaction request": ("SELECT org_id || ' compaction request ' || opened_by AS key, opened_by::text AS event, "
                           "session_id || coalesce(' closed by ' || closed_by || ' (' || closed_reason || ')', "
                           "' open') AS value FROM compaction_requests"),
}

# The read models verify compares, in the order it compares them.
COMPARED = tuple(_STATEMENTS)


async def compared_rows(conn: asyncpg.Connection, what: str) -> dict[str, tuple[str, str]]:
    """key -> (event, value) of every row of the read model `what` (one of COMPARED)."""
    return {r["key"]: (r["event"], r["value"]) for r in await conn.fetch(_STATEMENTS[what])}
