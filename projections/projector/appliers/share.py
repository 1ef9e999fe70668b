"""share.created / share.revoked -> share_grants (projections/share_grants.py decides)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from context_engine.events import Event
from projections.records import LogRecord
from projections.share_grants import apply_share_created, apply_share_revoked

from ..outcome import Applied, applied

if TYPE_CHECKING:
    from ..org_applier import OrgApplier


async def apply_created(org: OrgApplier, rec: LogRecord, ev: Event) -> Applied:
    return applied(rec, ev, await apply_share_created(org.conn, org.org_id, ev))


async def apply_revoked(org: OrgApplier, rec: LogRecord, ev: Event) -> Applied:
    return applied(rec, ev, await apply_share_revoked(org.conn, org.org_id, ev))
