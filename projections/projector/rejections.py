"""Records set aside: what is an event's fault (it goes to `rejected_events`, with the reason,
and the rest of its batch commits), and what is not (the batch is tried again)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import asyncpg
import orjson

from context_engine.errors import unavailable_cause
from context_engine.events import Event
from context_engine.hashing import sha256_hex
from context_engine.validation import is_canonical_uuid, is_identifier
from projections.projector.records import LogRecord
from projections.store.pool import SYSTEM_ORG, set_config_sql

from .outcome import Applied, ProjectionOutcome, session_id_of
from .rows import columns

MAX_REASON_CHARS = 500


def is_infrastructure_failure(exc: BaseException) -> bool:
    """A failure that is not the event's doing, so the batch is tried again instead of anything
    being set aside: PostgreSQL or the broker unreachable or going away, a serialization failure
    or deadlock, a cancelled statement, no memory. Anything else an event caused."""
    return (unavailable_cause(exc) is not None
            or isinstance(exc, (asyncpg.TransactionRollbackError, asyncpg.QueryCanceledError,
                                asyncpg.InsufficientResourcesError, asyncpg.InterfaceError,
                                asyncpg.InternalClientError, OSError, asyncio.TimeoutError, MemoryError)))


@dataclass(frozen=True, slots=True)
class Rejection:
    """A record set aside, and what the batch reports for it."""

    applied: Applied
    raw: bytes
    reason: str


def rejection(rec: LogRecord, exc: BaseException, ev: Event | None = None) -> Rejection:
    org_id, event_id = (ev.scope.org_id, ev.event_id) if ev is not None else claimed_identity(rec.raw)
    reason = f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"[:MAX_REASON_CHARS]
    applied = Applied(event_id, ev.type if ev is not None else "", org_id, rec.topic, rec.partition,
                      rec.offset, ProjectionOutcome.REJECTED, session_id_of(ev) if ev is not None else None)
    return Rejection(applied, bytes(rec.raw), reason)


def claimed_identity(raw: bytes) -> tuple[str, str]:
    """The org and event id an undecodable record names, as far as they can be read, so that the
    waiting command (if any) gets its answer: (SYSTEM_ORG, "") when it names none."""
    try:
        data = orjson.loads(raw)
        org_id, event_id = data["scope"]["org_id"], data["event_id"]
    except Exception:  # noqa: BLE001 - anything at all may be on the topic
        return SYSTEM_ORG, ""
    event_id = event_id if is_canonical_uuid(event_id) else ""
    if not is_identifier(org_id):
        return SYSTEM_ORG, event_id
    return org_id, event_id


async def set_aside(conn: asyncpg.Connection, rejections: list[Rejection]) -> set[str]:
    """Store the batch's rejections; returns the digests of those not stored before. A rejection
    whose claimed identity PostgreSQL will not take is stored as nobody's (SYSTEM_ORG, no id)."""
    by_org: dict[str, list[Rejection]] = {}
    for r in rejections:
        by_org.setdefault(r.applied.org_id, []).append(r)
    new: set[str] = set()
    for org_id, items in by_org.items():
        rows = [(sha256_hex(r.raw), org_id, r.applied.event_id or None, r.applied.topic, r.applied.partition,
                 r.applied.offset, r.reason.replace("\x00", "\\0"), r.raw) for r in items]
        await conn.execute(f"{set_config_sql({'app.org_id': org_id})};\nSAVEPOINT set_aside")
        try:
            stored = await conn.fetch(_SET_ASIDE, *columns(rows, 8))
        except Exception as exc:  # noqa: BLE001
            if is_infrastructure_failure(exc):
                raise
            await conn.execute(f"ROLLBACK TO SAVEPOINT set_aside;\n{set_config_sql({'app.org_id': SYSTEM_ORG})}")
            stored = await conn.fetch(_SET_ASIDE, *columns(
                ((d, SYSTEM_ORG, None, *rest) for d, _org, _id, *rest in rows), 8))
        await conn.execute("RELEASE SAVEPOINT set_aside")
        new.update(r["record_sha256"] for r in stored)
    return new


_SET_ASIDE = """
INSERT INTO rejected_events (record_sha256, org_id, event_id, topic, partition, "offset", reason, raw)
SELECT u.* FROM unnest($1::text[], $2::text[], $3::uuid[], $4::text[], $5::int[], $6::bigint[],
                       $7::text[], $8::bytea[]) AS u
ON CONFLICT (record_sha256) DO NOTHING
RETURNING record_sha256
"""
