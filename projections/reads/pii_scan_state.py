"""Reads of pushed memory's PII scan state (`memory_versions.pii_status`, `pii_scanned_by`): the
scanner's backlog and what a rescan asks for and follows.

Each function takes a connection on which the caller has set `app.org_id` for this transaction
(`projections.store.pool.org_transaction`); reads across orgs run under '_system'.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import asyncpg


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)


async def quarantined_memory(conn: asyncpg.Connection, org_id: str | None) -> list[tuple[str, str, str | None]]:
    """(org, memory event id, the scan that quarantined it) of quarantined memory, oldest first;
    of one org, or of every org when `org_id` is None."""
    rows = await conn.fetch(
        "SELECT org_id, event_id, pii_scanned_by FROM memory_versions "
        "WHERE pii_status = 'quarantined' AND ($1::text IS NULL OR org_id = $1) ORDER BY created_at",
        org_id)
    return [(r["org_id"], str(r["event_id"]), _str_or_none(r["pii_scanned_by"])) for r in rows]


async def scan_states(conn: asyncpg.Connection, org_id: str,
                      event_ids: Sequence[str]) -> list[tuple[str, str, str | None]]:
    """(memory event id, PII status, the scan that set it) of these memories of `org_id`."""
    rows = await conn.fetch(
        "SELECT event_id, pii_status, pii_scanned_by FROM memory_versions "
        "WHERE org_id = $1 AND event_id = ANY($2::uuid[])", org_id, event_ids)
    return [(str(r["event_id"]), r["pii_status"], _str_or_none(r["pii_scanned_by"])) for r in rows]


async def memory_in_states(conn: asyncpg.Connection, statuses: Sequence[str], *, older_than: dt.timedelta,
                           org_id: str | None, limit: int) -> list[tuple[str, str]]:
    """(org, memory event id) of memory in these PII states pushed before `older_than` ago, oldest
    first, at most `limit`; of one org, or of every org when `org_id` is None."""
    rows = await conn.fetch(
        "SELECT org_id, event_id FROM memory_versions "
        "WHERE pii_status = ANY($1::text[]) AND created_at < now() - $2::interval "
        "  AND ($3::text IS NULL OR org_id = $3) ORDER BY created_at LIMIT $4",
        list(statuses), older_than, org_id, limit)
    return [(r["org_id"], str(r["event_id"])) for r in rows]
