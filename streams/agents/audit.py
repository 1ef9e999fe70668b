"""`audit-writer`: AuditAccessEvents of the audit:access stream -> the audit trail's rows
(projections/audit_log.py), idempotent on message_id.

A record no publisher writes (it does not decode, or names no org or outcome) is skipped and
logged by position. A batch PostgreSQL does not take is retried, with backoff, until it does: the
stream waits rather than loses audit rows (its consumer lag shows the wait)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import asyncpg
import faust
import structlog
from faust.types import EventT, StreamT
from google.protobuf.message import DecodeError

from projections.audit_log import AuditRow, apply_audit_rows
from streams.agents import JOB_BATCH_MAX, JOB_BATCH_WITHIN_S, windowed
from streams.agents.resources import WorkerResources
from streams.jobs import audit_row

log = structlog.get_logger("context_engine.worker")

RETRY_MAX_S = 10.0


def register_audit_writer(app: faust.App, resources: WorkerResources) -> None:
    @app.agent(resources.job_topics["audit:access"], name="audit-writer")
    async def audit_agent(stream: StreamT) -> None:
        db = await resources.pool()
        async for batch in windowed(stream).take_events(JOB_BATCH_MAX, within=JOB_BATCH_WITHIN_S):
            if rows := readable_rows(resources.authentic(batch)):
                await store(db, rows)


def readable_rows(events: Sequence[EventT]) -> list[AuditRow]:
    rows = []
    for event in events:
        try:
            rows.append(audit_row(event.value))
        except (DecodeError, ValueError) as exc:
            m = event.message
            log.warning("audit record skipped: not an AuditAccessEvent a publisher writes", topic=m.topic,
                        partition=m.partition, offset=m.offset, error=str(exc))
    return rows


async def store(db: asyncpg.Pool, rows: list[AuditRow]) -> None:
    delay = 0.5
    while True:
        try:
            await apply_audit_rows(db, rows)
            return
        except Exception:
            log.exception("audit rows not stored; retrying", rows=len(rows), retry_in_s=delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, RETRY_MAX_S)
