"""guardrail.published: a signed layer (projections/guardrail_projection.py decides)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from context_engine.events import Event
from projections.guardrail_projection import apply_guardrail_published
from projections.records import LogRecord

from ..outcome import Applied, applied

if TYPE_CHECKING:
    from ..org_applier import OrgApplier


async def apply(org: OrgApplier, rec: LogRecord, ev: Event) -> Applied:
    return applied(rec, ev, await apply_guardrail_published(org.conn, org.org_id, ev))
