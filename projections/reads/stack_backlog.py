"""The background work a stack still owes, across orgs, for `context-engine status`: chunks
without a vector, indexing still asked for, memory waiting for its PII scan or quarantined, and
compaction requests still open. Run under '_system' (the system policies of each table)."""

from __future__ import annotations

import asyncpg


async def backlog(conn: asyncpg.Connection) -> dict[str, int]:
    row = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM chunks WHERE embedding IS NULL AND searchable) AS chunks_without_vector,"
        "       (SELECT count(*) FROM indexing_requests) AS indexing_requested,"
        "       (SELECT count(*) FROM memory_versions WHERE pii_status = 'pending') AS pii_scans_pending,"
        "       (SELECT count(*) FROM memory_versions WHERE pii_status = 'quarantined') AS memory_quarantined,"
        "       (SELECT count(*) FROM compaction_requests WHERE closed_by IS NULL) AS compaction_requests_open")
    return {k: int(v) for k, v in row.items()}
