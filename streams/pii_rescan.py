"""`context-engine pii rescan`: scan quarantined memory again, and report what it cleared.

Quarantine is what the fail-closed fallback leaves behind when the detector could not be used.
A rescan publishes a PII scan job per quarantined memory (the worker scans the ORIGINAL content
from the archive again) and follows each memory until a newer `memory.scrubbed` was applied:
'clear' when the detector is healthy now, 'quarantined' again when it is not.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg

from context_engine.scope import Scope
from projections.reads import pii_scan_state
from projections.store.pool import SYSTEM_ORG, org_transaction
from streams.jobs import pii_scan_job, publish
from streams.record_auth import RecordSigner
from streams.topics import LogTopics


@dataclass(frozen=True)
class Quarantined:
    org_id: str
    event_id: str
    scanned_by: str | None  # the memory.scrubbed event that quarantined it


@dataclass(frozen=True)
class RescanReport:
    asked: int
    cleared: int
    still_quarantined: int
    unfinished: int


async def quarantined(pool: asyncpg.Pool, org_id: str | None) -> list[Quarantined]:
    async with org_transaction(pool, org_id or SYSTEM_ORG, readonly=True) as conn:
        rows = await pii_scan_state.quarantined_memory(conn, org_id)
    return [Quarantined(*row) for row in rows]


async def request(bootstrap: str, topics: LogTopics, items: list[Quarantined], *, signer: RecordSigner,
                  security: Mapping[str, Any] | None = None) -> None:
    await publish(bootstrap, topics.jobs["pii"], [pii_scan_job(Scope(q.org_id), q.event_id) for q in items],
                  signer=signer, security=security)


async def follow(pool: asyncpg.Pool, items: list[Quarantined], *, timeout: float,
                 progress=None) -> RescanReport:
    """Wait until every item was scanned again (or the timeout); count the outcomes."""
    left = {(q.org_id, q.event_id): q for q in items}
    cleared = again = 0
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        for org_id in {k[0] for k in left}:
            ids = [k[1] for k in left if k[0] == org_id]
            async with org_transaction(pool, org_id, readonly=True) as conn:
                rows = await pii_scan_state.scan_states(conn, org_id, ids)
            for event_id, pii_status, scanned_by in rows:
                key = (org_id, event_id)
                if scanned_by != left[key].scanned_by:
                    del left[key]
                    if pii_status == "clear":
                        cleared += 1
                    else:
                        again += 1
                    if progress:
                        progress(1)
        if left:
            await asyncio.sleep(0.1)
    return RescanReport(len(items), cleared, again, len(left))
