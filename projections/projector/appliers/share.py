"""share.created / share.revoked -> share_grants: a grant row per share, ended by its first
revocation. A grant's events are keyed by the share, so on another partition than its resource's:
the projector does not check the resource (a rebuild reads the partitions in another
interleaving), and a grant row depends only on its own events; the reads check that a grant holds
(projections/reads/share_grants.py `held_sql`)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import asyncpg

from context_engine.events import SHARE_PERMISSIONS, SHARED_RESOURCE_TYPES, Event, ShareCreated, ShareRevoked
from context_engine.scope import LEVELS
from projections.projector.records import LogRecord

from ..outcome import Applied, ProjectionOutcome, applied

if TYPE_CHECKING:
    from ..org_state import OrgState


async def apply_created(org: OrgState, rec: LogRecord, ev: Event) -> Applied:
    return applied(rec, ev, await apply_share_created(org.conn, org.org_id, ev))


async def apply_revoked(org: OrgState, rec: LogRecord, ev: Event) -> Applied:
    return applied(rec, ev, await apply_share_revoked(org.conn, org.org_id, ev))


def _well_formed(body: ShareCreated) -> None:
    """ValueError for a payload no handler writes (the record is set aside)."""
    depth = len(body.grantee_path.split("/"))
    if (body.resource_type not in SHARED_RESOURCE_TYPES or not body.permissions
            or not set(body.permissions) <= set(SHARE_PERMISSIONS) or body.grantee_scope not in LEVELS
            or depth != LEVELS.index(body.grantee_scope) + 1):
        raise ValueError("share.created: resource_type, permissions or grantee out of range")


async def apply_share_created(conn: asyncpg.Connection, org_id: str, ev: Event) -> ProjectionOutcome:
    body = ev.body
    assert isinstance(body, ShareCreated)
    _well_formed(body)
    if ev.scope.org_id != org_id or body.grantee_path.split("/", 1)[0] != org_id:
        return ProjectionOutcome.OUT_OF_SCOPE
    inserted = await conn.fetchval(
        "INSERT INTO share_grants (org_id, share_id, resource_type, resource_id, grantor_path, created_by, "
        "  grantee_scope, grantee_path, permissions, reason, created_at, event_id) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) "
        "ON CONFLICT (org_id, share_id) DO NOTHING RETURNING true",
        org_id, uuid.UUID(body.share_id), body.resource_type, uuid.UUID(body.resource_id), ev.scope.path,
        ev.actor, body.grantee_scope, body.grantee_path, list(body.permissions), body.reason, ev.occurred,
        uuid.UUID(ev.event_id))
    return ProjectionOutcome.APPLIED if inserted else ProjectionOutcome.DUPLICATE


async def apply_share_revoked(conn: asyncpg.Connection, org_id: str, ev: Event) -> ProjectionOutcome:
    """The first revocation of a live grant ends it; a later one changes nothing (IGNORED)."""
    body = ev.body
    assert isinstance(body, ShareRevoked)
    status = await conn.fetchval(
        "WITH g AS (SELECT revoked_at FROM share_grants WHERE org_id = $1 AND share_id = $2), "
        "u AS (UPDATE share_grants SET revoked_at = $3, revoked_by = $4, revoke_reason = $5, revoked_event_id = $6 "
        "      WHERE org_id = $1 AND share_id = $2 AND revoked_at IS NULL RETURNING 1) "
        "SELECT CASE WHEN EXISTS (SELECT 1 FROM u) THEN 'revoked' "
        "            WHEN EXISTS (SELECT 1 FROM g) THEN 'already' ELSE 'unknown' END",
        org_id, uuid.UUID(body.share_id), ev.occurred, ev.actor, body.reason, uuid.UUID(ev.event_id))
    return {"revoked": ProjectionOutcome.APPLIED, "already": ProjectionOutcome.IGNORED}.get(
        status, ProjectionOutcome.UNKNOWN_TARGET)
