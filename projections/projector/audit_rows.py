"""The audit trail's rows: AuditAccessEvents of the audit:access stream (streams/audit.py publishes
them, the worker's audit-writer stores them here; `context-engine audit` reads them:
projections/reads/audit.py).

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
from projections.store.pool import org_transaction

OUTCOMES = ("allowed", "denied")


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
