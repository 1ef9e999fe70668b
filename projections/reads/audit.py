"""The reads of the audit trail (`context-engine audit`): an org's rows, filtered, newest first.
Each org's rows are read under its `app.org_id` (row-level security, 0021_audit_access.sql)."""

from __future__ import annotations

import datetime as dt

import asyncpg

from context_engine.scope import Scope
from projections.projector.audit_rows import AuditRow

DEFAULT_LIMIT = 100


async def audit_rows(conn: asyncpg.Connection, org_id: str, *, actor: Scope | None = None,
                     resource_id: str | None = None, operation: str | None = None, outcome: str | None = None,
                     since: dt.datetime | None = None, until: dt.datetime | None = None,
                     limit: int = DEFAULT_LIMIT) -> list[AuditRow]:
    """The org's rows, newest first (`conn` inside the org's transaction). `actor`: that scope and
    every scope below it; `since` inclusive, `until` exclusive."""
    if actor is not None and actor.org_id != org_id:
        return []
    ids = (actor.pillar_id, actor.team_id, actor.agent_id) if actor is not None else ("", "", "")
    records = await conn.fetch(
        "SELECT message_id::text, org_id, actor_pillar, actor_team, actor_agent, resource_type, resource_id, "
        "  operation, share_id, outcome, denial_reason, occurred_at FROM audit_access "
        "WHERE org_id = $1 AND ($2 = '' OR actor_pillar = $2) AND ($3 = '' OR actor_team = $3) "
        "  AND ($4 = '' OR actor_agent = $4) AND ($5::text IS NULL OR resource_id = $5) "
        "  AND ($6::text IS NULL OR operation = $6) AND ($7::text IS NULL OR outcome = $7) "
        "  AND ($8::timestamptz IS NULL OR occurred_at >= $8) AND ($9::timestamptz IS NULL OR occurred_at < $9) "
        "ORDER BY occurred_at DESC, message_id LIMIT $10",
        org_id, *ids, resource_id, operation, outcome, since, until, limit)
    return [AuditRow(*r.values()) for r in records]
