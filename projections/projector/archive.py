"""A record's envelope, checked; and the event archive, which keeps every event once.

Log positions are recorded, not trusted as identity: after a memory-only broker is restored
from the archive, a record may sit at an offset another event had before the crash (an
unacknowledged produce can land first). Identity is the event_id; order is `archive_seq`."""

from __future__ import annotations

from typing import Any

import asyncpg

from context_engine.errors import InvalidArgument
from context_engine.events import GUARDRAIL_PUBLISHED, Event, EventDecodeError, decode
from context_engine.guardrails.signing import PLATFORM_ORG
from context_engine.hashing import is_sha256_hex
from context_engine.scope import Scope
from context_engine.validation import is_canonical_uuid
from projections.projector.records import LogRecord

from .outcome import ProjectionError, where


def decode_record(rec: LogRecord) -> Event:
    """Decode (and upcast) a record, and check the envelope fields the archive and the chain rely on."""
    try:
        ev = decode(rec.raw)
        if not is_canonical_uuid(ev.event_id):
            raise ValueError("event_id is not a UUID in its canonical form")
        ev.occurred  # noqa: B018 - parses occurred_at
        if not isinstance(ev.payload, dict):
            raise ValueError("payload is not an object")
        # What the API would have accepted as a caller's scope: every id the validator's shape
        # (no NUL, no '_system'), no gaps; and the fields the archive stores as text are text.
        sc = ev.scope
        ids = (sc.org_id, sc.pillar_id, sc.team_id, sc.agent_id)
        if not all(isinstance(x, str) for x in (*ids, ev.actor, ev.aggregate)):
            raise ValueError("scope ids, actor and aggregate must be strings")
        if not (ev.type == GUARDRAIL_PUBLISHED and ids == (PLATFORM_ORG, "", "", "")):
            Scope.parse(*ids)  # the platform's L1 layers are the one scope no caller can have
        if not is_sha256_hex(ev.content_hash):
            raise ValueError("content_hash is not a lowercase hex SHA-256")
    except (EventDecodeError, InvalidArgument, ValueError, TypeError, AttributeError, RecursionError) as exc:
        raise ProjectionError(f"cannot decode {where(rec)}: {getattr(exc, 'message', exc)}") from exc
    return ev


async def archive(conn: asyncpg.Connection, org_id: str, items: list[tuple[LogRecord, Event]]) -> set[str]:
    """Archive verbatim (the record's own bytes); return the event ids archived just now (an
    event_id archived before, at the same or another offset, is not)."""
    cols: list[list[Any]] = [[] for _ in range(11)]
    for rec, ev in items:
        for col, value in zip(cols, (ev.event_id, rec.topic, rec.partition, rec.offset, ev.aggregate,
                                     ev.type, ev.schema_version, ev.occurred, ev.actor,
                                     ev.content_hash, bytes(rec.raw))):
            col.append(value)
    try:
        rows = await conn.fetch(_ARCHIVE, org_id, *cols)
    except asyncpg.DataError as exc:
        raise ProjectionError(f"malformed event envelope in batch: {exc}") from exc
    return {str(r["event_id"]) for r in rows}


_ARCHIVE = """
INSERT INTO event_archive (event_id, org_id, topic, partition, "offset", aggregate, type,
                           schema_version, occurred_at, actor, content_hash, raw)
SELECT u.event_id, $1, u.topic, u.partition, u.off, u.aggregate, u.type, u.schema_version,
       u.occurred_at, u.actor, u.content_hash, u.raw
FROM unnest($2::uuid[], $3::text[], $4::int[], $5::bigint[], $6::text[], $7::text[], $8::int[],
            $9::timestamptz[], $10::text[], $11::text[], $12::bytea[])
     AS u(event_id, topic, partition, off, aggregate, type, schema_version, occurred_at, actor,
          content_hash, raw)
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id
"""
