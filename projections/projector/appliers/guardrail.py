"""guardrail.published: a signed layer (projections/projector/guardrail_layers.py decides)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from context_engine.events import Event
from projections.projector.guardrail_layers import apply_guardrail_published
from projections.projector.records import LogRecord

from ..outcome import Applied, applied

if TYPE_CHECKING:
    from ..org_state import OrgState


async def apply(org: OrgState, rec: LogRecord, ev: Event) -> Applied:
    return applied(rec, ev, await apply_guardrail_published(org.conn, org.org_id, ev))
