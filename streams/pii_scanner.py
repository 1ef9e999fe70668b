"""The PII scan of pushed memory: a job on the log in, a `memory.scrubbed` event out.

For a pushed memory the worker's `pii-scanner` agent reads the ORIGINAL content from the event
archive (never the read model, which a previous scan may already have redacted), scrubs every
string leaf with natid + DetectPII (`inference.pii_scrub`), and appends `memory.scrubbed` on the
memory's own aggregate, so it follows the push in the same partition:

    {"memory_event_id", "content_b64" (redacted), "status": "clear" | "quarantined",
     "spans_by_class": {class: count}, "detector_version", "fallback_reason"}

On ANY detector failure the scrub falls back to regex detection and the status is
'quarantined': the memory is kept (redacted as well as the regexes can) but is not searchable
until `context-engine pii rescan` scans it again with a healthy detector.

Scans asked for and not done are found again from the read model (`backlog`): memory still
'pending' after a while gets a new job, so a lost job loses no work.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable

import asyncpg
import structlog

from context_engine.events import Event, MemoryPushed, MemoryScrubbed, content_b64, decode
from inference import pii_scrub
from inference.pii_client import PiiClient
from projections.reads import archive as archive_reads
from projections.reads import pii_scan_state
from projections.store.pool import SYSTEM_ORG, org_transaction

log = structlog.get_logger("context_engine.pii")

ACTOR = "pii-scanner"
STATUS_OF_SCRUB = {"clean": "clear", "redacted": "clear", "quarantined": "quarantined"}

SendEvent = Callable[[Event], Awaitable[None]]


class PiiScanner:
    def __init__(self, pool: asyncpg.Pool, client: PiiClient, send: SendEvent) -> None:
        self.pool = pool
        self.client = client
        self.send = send

    async def scan(self, org_id: str, memory_event_id: str) -> str | None:
        """Scan one pushed memory; returns the status recorded, None if there is no such memory."""
        async with org_transaction(self.pool, org_id, readonly=True) as conn:
            raw = await archive_reads.archived_raw(conn, org_id, memory_event_id)
        if raw is None:
            return None
        pushed = decode(raw)
        content = MemoryPushed.from_payload(pushed.payload).content
        result = await pii_scrub.scrub_content(content, self.client.detect)
        status = STATUS_OF_SCRUB[result.status]
        if status == "quarantined":
            log.warning("pii scan fell back to regex; memory quarantined", org_id=org_id,
                        memory_event_id=memory_event_id, reason=result.fallback_reason)
        scrubbed = MemoryScrubbed(memory_event_id=pushed.event_id,
                                  content_b64=content_b64(result.content), status=status,
                                  spans_by_class=dict(result.spans_by_class),
                                  detector_version=result.detector_version, fallback_reason=result.fallback_reason)
        await self.send(Event.of(scrubbed, scope=pushed.scope, aggregate=pushed.aggregate, actor=ACTOR))
        return status

    async def backlog(self, *, older_than: dt.timedelta, statuses: tuple[str, ...] = ("pending",),
                      org_id: str | None = None, limit: int = 1024) -> dict[str, list[str]]:
        """Pushed memory in these PII states (default: scans asked for and not done), by org."""
        async with org_transaction(self.pool, SYSTEM_ORG, readonly=True) as conn:
            rows = await pii_scan_state.memory_in_states(conn, statuses, older_than=older_than, org_id=org_id,
                                                         limit=limit)
        out: dict[str, list[str]] = {}
        for row_org, event_id in rows:
            out.setdefault(row_org, []).append(event_id)
        return out
