"""embedding.recorded: the vectors of contents, recorded for their chunks (chunk_projection)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from context_engine.events import EmbeddingRecorded, Event
from projections.projector.records import LogRecord

from ..outcome import Applied, ProjectionOutcome, applied

if TYPE_CHECKING:
    from ..org_state import OrgState


async def apply(org: OrgState, rec: LogRecord, ev: Event) -> Applied:
    recorded = EmbeddingRecorded.from_payload(ev.payload)
    await org.chunks.record_vectors(event_id=ev.event_id, model_version=recorded.model_version,
                                    vectors=recorded.vectors, recorded_at=ev.occurred)
    return applied(rec, ev, ProjectionOutcome.APPLIED)
