"""`pii-scanner`: PII scans of pushed memory -> `memory.scrubbed` events (streams/pii_scanner.py)."""

from __future__ import annotations

import faust
import structlog
from faust.types import StreamT

from streams.agents.resources import WorkerResources
from streams.jobs import open_pii_scan_job
from streams.pii_scanner import PiiScanner

log = structlog.get_logger("context_engine.worker")


def register_pii_scanner(app: faust.App, resources: WorkerResources) -> None:
    @app.agent(resources.job_topics["pii"], name="pii-scanner")
    async def pii_agent(stream: StreamT) -> None:
        s = await resources.scanner()
        async for event in stream.events():
            if not resources.authentic([event]):
                continue
            env, memory_event_id = open_pii_scan_job(event.value)
            await scan(s, {env.scope.org_id: [memory_event_id]})


async def scan(s: PiiScanner, memory_ids_by_org: dict[str, list[str]]) -> None:
    """A scan that cannot even fall back (the database or the log is down) stays pending; the
    sweep retries it."""
    for org_id, ids in memory_ids_by_org.items():
        for memory_event_id in ids:
            try:
                await s.scan(org_id, memory_event_id)
            except Exception:
                log.exception("pii scan failed; left for the sweep", org_id=org_id, memory_event_id=memory_event_id)
