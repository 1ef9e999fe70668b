"""`audit-writer`: AuditAccessEvents of the audit:access stream -> the audit trail's rows
(projections/projector/audit_rows.py), idempotent on message_id.

A record no publisher writes (it does not decode, or names no org or outcome) is skipped and
logged by position. A batch PostgreSQL does not take is retried, with backoff, until it does: the
stream waits rather than loses audit rows (its consumer lag shows the wait).

`write_from_log` does the writer's work over the whole stream at once, e.g. into an empty database
(the rows are rebuilt identically: they are the stream's messages, not derived from anything)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg
import faust
import structlog
from faust.types import EventT, StreamT
from google.protobuf.message import DecodeError

from projections.projector.audit_rows import AuditRow, apply_audit_rows
from projections.projector.records import LogRecord
from streams.agents import JOB_BATCH_MAX, JOB_BATCH_WITHIN_S, windowed
from streams.agents.resources import WorkerResources
from streams.jobs import audit_row
from streams.record_auth import RecordVerifier
from streams.replay import read_log

log = structlog.get_logger("context_engine.worker")

RETRY_MAX_S = 10.0


def register_audit_writer(app: faust.App, resources: WorkerResources) -> None:
    @app.agent(resources.job_topics["audit:access"], name="audit-writer")
    async def audit_agent(stream: StreamT) -> None:
        db = await resources.pool()
        async for batch in windowed(stream).take_events(JOB_BATCH_MAX, within=JOB_BATCH_WITHIN_S):
            if rows := readable_rows([_record(e) for e in resources.authentic(batch)]):
                await store(db, rows)


def _record(event: EventT) -> LogRecord:
    m = event.message
    return LogRecord(m.topic, m.partition, m.offset, event.value)


def readable_rows(records: Sequence[LogRecord]) -> list[AuditRow]:
    rows = []
    for r in records:
        try:
            rows.append(audit_row(r.raw))
        except (DecodeError, ValueError) as exc:
            log.warning("audit record skipped: not an AuditAccessEvent a publisher writes", topic=r.topic,
                        partition=r.partition, offset=r.offset, error=str(exc))
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


async def write_from_log(bootstrap: str, topic: str, db: asyncpg.Pool, *, verifier: RecordVerifier,
                         security: Mapping[str, Any] | None = None) -> int:
    """Every authentic record of the audit topic, up to its end now, stored as the writer would;
    returns how many rows were new."""
    added = 0
    async for records in read_log(bootstrap, topic, verifier=verifier, security=security):
        added += await apply_audit_rows(db, readable_rows(records))
    return added
