"""The audit trail's rows: AuditAccessEvents of the audit:access stream (streams/audit.py publishes
them, the worker's audit-writer stores them here) and the reads of `context-engine audit`.

Idempotent on the stream's message_id: a redelivered or replayed message adds nothing, so
consuming the stream again into an empty database gives the same rows. Each org's rows are
written and read under that org's `app.org_id` (row-level security, 0021_audit_access.sql)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from context_engine.scope import Scope
from projections.database import org_transaction

OUTCOMES = ("allowed", "denied")
DEFAULT_LIMIT = 100


@dataclass(frozen=True)
class AuditRow:
    message_id: str
    org_id: str
    actor_pillar: str
    actor_team: str
    actor_agent: str
    resource_type: str
    resource_id: str
    operation: str
    share_id: str
    outcome: str
    denial_reason: str
    occurred_at: dt.datetime

    def __post_init__(self) -> None:
        """ValueError for a row no publisher writes (the writer skips it)."""
        if not self.org_id:
            raise ValueError("audit row without an org")
        if self.outcome not in OUTCOMES:
            raise ValueError(f"audit outcome {self.outcome!r} is neither allowed nor denied")
        uuid.UUID(self.message_id)

    @property
    def actor(self) -> Scope:
        return Scope(self.org_id, self.actor_pillar, self.actor_team, self.actor_agent)


def _text(value: str) -> str:
    # PostgreSQL text cannot hold NUL; an id a caller sent with one is kept, visibly replaced.
    return value.replace("\x00", "\ufffd")


async def apply_audit_rows(pool: asyncpg.Pool, rows: Sequence[AuditRow]) -> int:
    """Store the rows not stored yet, one statement per org under its RLS setting; returns how many
    were new."""
    by_org: dict[str, list[AuditRow]] = {}
    for r in rows:
        by_org.setdefault(r.org_id, []).append(r)
    added = 0
    for org_id, group in by_org.items():
        async with org_transaction(pool, org_id) as conn:
            fresh = await conn.fetch(
                "INSERT INTO audit_access (org_id, message_id, actor_pillar, actor_team, actor_agent, "
                "  resource_type, resource_id, operation, share_id, outcome, denial_reason, occurred_at) "
                "SELECT $1, u.* FROM unnest($2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[], "
                "  $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::timestamptz[]) AS u "
                "ON CONFLICT (org_id, message_id) DO NOTHING RETURNING message_id",
                org_id, [uuid.UUID(r.message_id) for r in group],
                [_text(r.actor_pillar) for r in group], [_text(r.actor_team) for r in group],
                [_text(r.actor_agent) for r in group], [_text(r.resource_type) for r in group],
                [_text(r.resource_id) for r in group], [_text(r.operation) for r in group],
                [_text(r.share_id) for r in group], [r.outcome for r in group],
                [_text(r.denial_reason) for r in group], [r.occurred_at for r in group])
            added += len(fresh)
    return added


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
