"""memory.pushed and memory.scrubbed: an agent's memory versions and their PII scan."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import orjson

from context_engine.events import Event, MemoryPushed, MemoryScrubbed
from context_engine.hashing import sha256_hex
from projections.projector.chunks import SEMANTIC
from projections.projector.records import LogRecord

from ..job_requests import ScanMemory
from ..outcome import Applied, ProjectionOutcome, applied
from ..rows import json_text
from ..session_rows import MemoryVersionRow

if TYPE_CHECKING:
    from ..org_state import OrgState


async def apply_pushed(org: OrgState, rec: LogRecord, ev: Event) -> Applied:
    """-> a memory_versions row (PII status 'pending', and a scan asked for), and a chain item
    (kind 'memory') when the memory is in a session."""
    pushed = MemoryPushed.from_payload(ev.payload)
    content = pushed.content
    sid = pushed.session_id or None
    seq = version = None
    if sid:
        seq, version = org.chain.append(org.chain.session(sid, ev), ev, "memory")
    sc = ev.scope
    org.memory_versions.append(MemoryVersionRow(
        ev.event_id, sc.path, sc.pillar_id, sc.team_id, sc.agent_id, pushed.agent_id or sc.agent_id, sid, seq,
        pushed.memory_type, content, json_text(pushed.metadata), pushed.content_sha256 or sha256_hex(content),
        version, ev.occurred))
    return applied(rec, ev, ProjectionOutcome.APPLIED, sid, seq, version, jobs=(ScanMemory(ev.scope, ev.event_id),))


async def apply_scrubbed(org: OrgState, rec: LogRecord, ev: Event) -> Applied:
    """The PII scan's result for a pushed memory: its redacted content replaces the raw one;
    semantic memory becomes chunks, searchable only when the status is 'clear'. A later scan
    (pii rescan) replaces an earlier one's chunks."""
    body = MemoryScrubbed.from_payload(ev.payload)
    status = body.status
    if status not in ("clear", "quarantined"):
        raise ValueError(f"memory.scrubbed status {status!r}")
    content = body.content
    await org.flush()
    row = await org.conn.fetchrow(
        "UPDATE memory_versions SET content = $3, pii_status = $4, pii_spans = $5::text::jsonb, "
        "  pii_detector_version = $6, pii_fallback_reason = $7, pii_scanned_by = $8 "
        "WHERE org_id = $1 AND event_id = $2 "
        "RETURNING scope_path, session_id, memory_type, metadata::text AS metadata, created_at, active",
        org.org_id, uuid.UUID(body.memory_event_id), content, status, json_text(body.spans_by_class),
        body.detector_version, body.fallback_reason, ev.event_id)
    if row is None:
        return applied(rec, ev, ProjectionOutcome.UNKNOWN_TARGET)
    if row["memory_type"] == SEMANTIC:
        await org.chunks.remove_source(body.memory_event_id)
        await org.chunks.add(event_id=body.memory_event_id, source_kind="memory",
                             session_id=row["session_id"], scope_path=row["scope_path"], content=content,
                             metadata=orjson.loads(row["metadata"]), created_at=row["created_at"],
                             pii_status=status, active=row["active"], added_by=ev.event_id)
    return applied(rec, ev, ProjectionOutcome.APPLIED, row["session_id"])
