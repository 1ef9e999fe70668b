"""The session projection: log records -> event archive + session read models.

One function, `apply_batch`, serves the live Faust agent (a batch per `stream.take`) and bulk
replay (batches read back from the archive or the log): the chain is a pure function of log
order, so both paths produce the same rows and the same version hashes.

Per batch, in ONE transaction:
1. decode every record (`context_engine.events.decode`, which upcasts older schema versions);
2. per org, in log order: archive the records (`INSERT ... ON CONFLICT (event_id) DO NOTHING`),
   and apply to the read models exactly the events that were archived now; an event_id already
   archived (a redelivery, at the same or another offset) or repeated within the batch changes
   nothing and is reported as DUPLICATE;
3. advance `projector_offsets` to the highest offset seen per topic/partition (written with
   the transaction's first statements; the batch's NOTIFYs go with its COMMIT).
So a crash between the write and the consumer's offset commit neither duplicates nor loses:
on restart the batch is redelivered and every event in it is a duplicate.

Log positions are recorded, not trusted as identity: after a memory-only broker is restored from
the archive, a record may sit at an offset another event had before the crash (an unacknowledged
produce can land first). Identity is the event_id; order is the archive's `archive_seq`.
A record that cannot be decoded or applied (malformed bytes, a payload PostgreSQL cannot store)
is set aside in `rejected_events` with the reason, reported REJECTED, and logged; the rest of
its batch commits and the partition moves on. A failure that is not the event's own (the
connection, the server) fails the whole batch instead, for the worker to retry.

Row-level security: the worker connects as the admin role (see projections/database.py) and
sets `app.org_id` (transaction-local) before writing each org's rows and '_system' before the
offsets, so the same code works whether or not its role bypasses RLS.

Payloads (built by the command handlers; every hash is lowercase hex SHA-256):

- `session.event_ingested` (schema 2):
    session_id: str, event_type: str ("message" | "tool_output" | "workflow_event"),
    content_b64: str (standard base64 of the raw content), metadata: dict[str, str],
    content_sha256: str (SHA-256 of the raw content = IngestEventResponse.version_hash),
    token_count: int, idempotency_key: str (optional; "" = none)
  -> session_events row, and a chain item (kind 'event'). If an earlier event of the same
     session and the same writer scope carries the same non-empty idempotency_key, nothing
     (outcome IDEMPOTENCY_KEY_TAKEN; the handler answers with `queries.event_by_idempotency_key`).
     Per writer: a key names one request of one scope, and another scope's never answers it.
     Per session, because every
     decision of the projector may depend only on the session's own (single-partition) history:
     across partitions there is no log order, and replay would decide differently.
- `memory.pushed` (schema 1):
    session_id: str ("" = memory outside any session: no chain item), agent_id: str (whose
    memory; "" defaults to scope.agent_id), memory_type: str ("episodic" | "semantic" |
    "working"), content_b64: str, metadata: dict[str, str], content_sha256: str
  -> memory_versions row, and a chain item (kind 'memory') when session_id is set.
- `session.snapshot_created` (schema 1):
    session_id: str, snapshot_id: str (uuid, chosen by the handler), name: str
  -> snapshots row with the session's current version and materialised state, unless the
     event's scope has taken the name in that session already (names are per creator scope;
     then nothing: outcome SNAPSHOT_NAME_TAKEN; the handler answers ALREADY_EXISTS unless its
     snapshot_id won).
     A session without items snapshots its genesis state.
- `session.rolled_back` (schema 1):
    session_id: str, target_version: str
  -> if the session has had target_version: the active items become exactly those of that
     state (the items on its chain back to genesis); items leaving the state get active=false
     and rolled_back_by = this event (also in session_events / memory_versions); the session's
     version and seq become the target's. For a target on the current chain this is "every
     item after the target becomes inactive"; for a target that was itself rolled back earlier,
     its items become active again. Unknown target: nothing changes (outcome UNKNOWN_TARGET).

Session ownership: a session belongs to the scope of the event that created it (its first
ingested event or pushed memory; sessions.scope_path). An event of any of the four types whose scope is not that owner scope or below it changes nothing (outcome
OUT_OF_SCOPE): the handlers check this before appending, and this is the guard for two scopes
racing to create the same session (the handler then finds no row for its event_id). A rollback
changes what every scope in the session sees, so it is applied only from the owner scope itself
(visibility.may_rewrite); from any other scope it is OUT_OF_SCOPE too.

Other event types that `context_engine.events` knows are archived and reported IGNORED (their
own projectors handle them); a type it does not know fails decoding, hence the batch.

For every session event, `Event.aggregate` must be `session_aggregate(org_id, session_id)`, the
partition key that makes the session's log order total.

Chain (context_engine.hashing): v0 = SessionRef(org_id, session_id).genesis; a new item gets
seq = max_seq + 1 (seq is monotonic and never reused) and version = next_version(current
version, Event.content_hash); after a rollback the next item chains from the target version.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import orjson
import structlog

from context_engine.events import (
    COMPACTION_THRESHOLD,
    EMBEDDING_RECORDED,
    EVENT_INGESTED,
    GUARDRAIL_PUBLISHED,
    MEMORY_PUSHED,
    MEMORY_SCRUBBED,
    SESSION_ROLLED_BACK,
    SNAPSHOT_CREATED,
    CompactionThreshold,
    EmbeddingRecorded,
    Event,
    EventDecodeError,
    EventIngested,
    MemoryPushed,
    MemoryScrubbed,
    SessionRef,
    SessionRolledBack,
    SnapshotCreated,
    decode,
)
from context_engine.errors import InvalidArgument, unavailable_cause
from context_engine.guardrails.signing import PLATFORM_ORG
from context_engine.hashing import is_sha256_hex, next_version, sha256_hex
from projections.database import require_standard_strings, set_config_sql, sql_literal
from context_engine.metrics import PROJECTOR_REJECTED_EVENTS
from context_engine.scope import Scope
from context_engine.visibility import may_rewrite
from context_engine.validation import is_canonical_uuid, is_identifier

from streams.jobs import JobMessage, compaction_job, embedding_job, indexing_job, pii_scan_job

from .chunk_projection import SEMANTIC, BulkLoad, ChunkProjection
from .guardrail_projection import apply_guardrail_published, refuse_layers
from .records import LogRecord
from .statement_batch import NOTHING, StatementBatch

log = structlog.get_logger("context_engine.projector")

PROJECTOR = "session"
SYSTEM_ORG = "_system"

# Applied.outcome values
APPLIED = "APPLIED"
DUPLICATE = "DUPLICATE"
SNAPSHOT_NAME_TAKEN = "SNAPSHOT_NAME_TAKEN"
UNKNOWN_TARGET = "UNKNOWN_TARGET"
IGNORED = "IGNORED"
OUT_OF_SCOPE = "OUT_OF_SCOPE"
IDEMPOTENCY_KEY_TAKEN = "IDEMPOTENCY_KEY_TAKEN"
REJECTED = "REJECTED"  # set aside: not archived, nothing applied (rejected_events)


# What announces a committed batch: its results -> (channel, payloads) for pg_notify.
Notify = Callable[[list["Applied"]], tuple[str, list[str]]]


class ProjectionError(RuntimeError):
    """A record cannot be projected; the batch's transaction is rolled back."""


@dataclass(frozen=True, slots=True)
class Applied:
    """What one record did. `version`/`seq`: the session's state version and the item seq after
    the event (the new item for ingest/push, the target for a rollback, the snapshot's for a
    snapshot); None for duplicates, unknown targets and memory outside a session."""

    event_id: str
    type: str
    org_id: str
    topic: str
    partition: int
    offset: int
    outcome: str
    session_id: str | None = None
    seq: int | None = None
    version: str | None = None
    # Work this event asks of the job streams, published by the worker after the commit:
    # (stream kind, JobMessage) — embedding of new chunks, the PII scan of a push, compaction.
    jobs: tuple[tuple[str, JobMessage], ...] = ()


async def apply_batch(conn: asyncpg.Connection, records: Sequence[LogRecord], *,
                      projector: str = PROJECTOR, bulk: BulkLoad | None = None,
                      notify: Notify | None = None) -> list[Applied]:
    """Archive and project `records` (in log order per partition) in one transaction.
    Returns one Applied per record, in input order. `notify` gives the (channel, payloads) that
    announce the batch: sent with the offsets, delivered at commit. `bulk`: a replay into an empty database,
    which looks for no chunks to embed (the log holds their vectors) and leaves the retrieval
    statistics to `recount_statistics`.

    A record that cannot be decoded or applied is set aside (`rejected_events`, outcome
    REJECTED) and takes nothing with it: each org's events run under a savepoint, and when one
    of them fails, the org's events are applied again one at a time, each under its own."""
    if not records:
        return []
    results: list[Applied | None] = [None] * len(records)
    rejections: list[Rejection] = []
    events: list[Event | None] = []
    for i, rec in enumerate(records):
        try:
            events.append(_decode(rec))
        except ProjectionError as exc:
            events.append(None)
            rejections.append(_rejection(rec, exc))
            results[i] = rejections[-1].applied
    by_org: dict[str, list[int]] = {}
    for i, ev in enumerate(events):
        if ev is not None:
            by_org.setdefault(ev.scope.org_id, []).append(i)
    first_org = next(iter(by_org), SYSTEM_ORG)

    def closing() -> str:  # the announcement needs every outcome, so it is written last
        return _closing(notify([r for r in results if r is not None]) if notify else None)

    async with _batch_transaction(conn, _opening(projector, records, first_org) + ";\nSAVEPOINT org_batch",
                                  closing):
        for org_id, indexes in by_org.items():
            if org_id != first_org:  # the opening statements set the first
                await conn.execute(f"RELEASE SAVEPOINT org_batch;\n{set_config_sql({'app.org_id': org_id})};\n"
                                   "SAVEPOINT org_batch")
            try:
                await _project_org(conn, org_id, records, events, indexes, results, bulk)
            except Exception as exc:  # noqa: BLE001 - whatever is not the infrastructure's is an event's
                if is_infrastructure_failure(exc):
                    raise
                await conn.execute("ROLLBACK TO SAVEPOINT org_batch")
                for i in indexes:  # the slow path: find the events that fail, keep the rest
                    await conn.execute("SAVEPOINT one_event")
                    try:
                        await _project_org(conn, org_id, records, events, [i], results, bulk)
                    except Exception as exc:  # noqa: BLE001
                        if is_infrastructure_failure(exc):
                            raise
                        await conn.execute("ROLLBACK TO SAVEPOINT one_event")
                        rejections.append(_rejection(records[i], exc, events[i]))
                        results[i] = rejections[-1].applied
                    await conn.execute("RELEASE SAVEPOINT one_event")
        new = await _set_aside(conn, rejections) if rejections else set()
    for r in rejections:  # said once it is committed, and only the first time
        if sha256_hex(r.raw) in new:
            PROJECTOR_REJECTED_EVENTS.inc()
            log.warning("event set aside", org_id=r.applied.org_id, event_id=r.applied.event_id or None,
                        position=_where(r.applied), reason=r.reason)
    return [r for r in results if r is not None]


def is_infrastructure_failure(exc: BaseException) -> bool:
    """A failure that is not the event's doing, so the batch is tried again instead of anything
    being set aside: PostgreSQL or the broker unreachable or going away, a serialization failure
    or deadlock, a cancelled statement, no memory. Anything else an event caused."""
    return (unavailable_cause(exc) is not None
            or isinstance(exc, (asyncpg.TransactionRollbackError, asyncpg.QueryCanceledError,
                                asyncpg.InsufficientResourcesError, asyncpg.InterfaceError,
                                asyncpg.InternalClientError, OSError, asyncio.TimeoutError, MemoryError)))


async def _project_org(conn: asyncpg.Connection, org_id: str, records: Sequence[LogRecord],
                       events: Sequence[Event | None], indexes: list[int],
                       results: list[Applied | None], bulk: BulkLoad | None) -> None:
    """Archive one org's records of the batch and apply the fresh ones, in log order."""
    # A guardrail layer the projection refuses (an untrusted key, a bad signature...) is neither
    # archived nor applied: the refusal writes nothing (projections/guardrail_projection.py).
    if refused := await refuse_layers(conn, org_id, [events[i] for i in indexes]):
        for i in indexes:
            if (why := refused.get(events[i].event_id)) is not None:
                results[i] = _applied(records[i], events[i], why.outcome)
        indexes = [i for i in indexes if events[i].event_id not in refused]
    fresh = await _archive(conn, org_id, [(records[i], events[i]) for i in indexes])
    applier = _OrgApplier(conn, org_id, bulk)
    todo = []
    for i in indexes:
        eid = str(uuid.UUID(events[i].event_id))  # as the archive returns it
        if eid in fresh:
            fresh.discard(eid)  # a repeat later in this batch is a duplicate
            todo.append(i)
        else:
            results[i] = _applied(records[i], events[i], DUPLICATE)
    await applier.load_sessions({sid for i in todo if (sid := _session_id(events[i]))})
    await applier.load_idempotency_keys(
        {(sid, events[i].scope.path, k) for i in todo if events[i].type == EVENT_INGESTED
         and (sid := _session_id(events[i])) and (k := _idempotency_key(events[i]))})
    for i in todo:
        try:
            results[i] = await applier.apply(records[i], events[i])
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise ProjectionError(f"cannot project {_where(records[i])} "
                                  f"({events[i].type} {events[i].event_id}): {exc!r}") from exc
    await applier.finish()
    if bulk:
        return
    unembedded, requested = applier.chunks.unembedded(), applier.chunks.requested
    for i in indexes:
        if (r := results[i]) is None or r.outcome != APPLIED:
            continue
        if r.event_id in unembedded:
            job = embedding_job(Scope(org_id), r.event_id, unembedded[r.event_id])
            results[i] = r = dataclasses.replace(r, jobs=(*r.jobs, ("embedding", job)))
        if r.event_id in requested:
            jobs = tuple(("indexing", indexing_job(Scope(org_id), source)) for source in requested[r.event_id])
            results[i] = dataclasses.replace(r, jobs=(*r.jobs, *jobs))


MAX_REASON_CHARS = 500


@dataclass(frozen=True, slots=True)
class Rejection:
    """A record set aside, and what the batch reports for it."""

    applied: Applied
    raw: bytes
    reason: str


def _rejection(rec: LogRecord, exc: BaseException, ev: Event | None = None) -> Rejection:
    org_id, event_id = (ev.scope.org_id, ev.event_id) if ev is not None else claimed_identity(rec.raw)
    reason = f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"[:MAX_REASON_CHARS]
    applied = Applied(event_id, ev.type if ev is not None else "", org_id, rec.topic, rec.partition,
                      rec.offset, REJECTED, _session_id(ev) if ev is not None else None)
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


_SET_ASIDE = """
INSERT INTO rejected_events (record_sha256, org_id, event_id, topic, partition, "offset", reason, raw)
SELECT u.* FROM unnest($1::text[], $2::text[], $3::uuid[], $4::text[], $5::int[], $6::bigint[],
                       $7::text[], $8::bytea[]) AS u
ON CONFLICT (record_sha256) DO NOTHING
RETURNING record_sha256
"""


async def _set_aside(conn: asyncpg.Connection, rejections: list[Rejection]) -> set[str]:
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
            stored = await conn.fetch(_SET_ASIDE, *_columns(rows, 8))
        except Exception as exc:  # noqa: BLE001
            if is_infrastructure_failure(exc):
                raise
            await conn.execute(f"ROLLBACK TO SAVEPOINT set_aside;\n{set_config_sql({'app.org_id': SYSTEM_ORG})}")
            stored = await conn.fetch(_SET_ASIDE, *_columns(
                ((d, SYSTEM_ORG, None, *rest) for d, _org, _id, *rest in rows), 8))
        await conn.execute("RELEASE SAVEPOINT set_aside")
        new.update(r["record_sha256"] for r in stored)
    return new


async def load_offsets(conn: asyncpg.Connection, projector: str = PROJECTOR) -> dict[tuple[str, int], int]:
    """Last applied offset per (topic, partition): seek to offset + 1 after a restart."""
    async with conn.transaction():
        await _set_org(conn, SYSTEM_ORG)
        rows = await conn.fetch(
            'SELECT topic, partition, "offset" FROM projector_offsets WHERE org_id = $1 AND projector = $2',
            SYSTEM_ORG, projector)
    return {(r["topic"], r["partition"]): r["offset"] for r in rows}


# -- internals ------------------------------------------------------------------------------


def _where(at: LogRecord | Applied) -> str:
    return f"{at.topic}[{at.partition}]@{at.offset}"


def _decode(rec: LogRecord) -> Event:
    """Decode and check the envelope fields the archive and the chain rely on."""
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
        raise ProjectionError(f"cannot decode {_where(rec)}: {getattr(exc, 'message', exc)}") from exc
    return ev





def _session_id(ev: Event) -> str | None:
    sid = ev.payload.get("session_id")
    return sid if isinstance(sid, str) and sid else None


def _idempotency_key(ev: Event) -> str | None:
    key = ev.payload.get("idempotency_key")
    return key if isinstance(key, str) and key else None


def _applied(rec: LogRecord, ev: Event, outcome: str, session_id: str | None = None,
             seq: int | None = None, version: str | None = None) -> Applied:
    return Applied(ev.event_id, ev.type, ev.scope.org_id, rec.topic, rec.partition, rec.offset,
                   outcome, session_id if session_id is not None else _session_id(ev), seq, version)


async def _set_org(conn: asyncpg.Connection, org_id: str) -> None:
    await conn.execute("SELECT set_config('app.org_id', $1, true)", org_id)


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


async def _archive(conn: asyncpg.Connection, org_id: str,
                   items: list[tuple[LogRecord, Event]]) -> set[str]:
    """Archive verbatim (the record's own bytes); return the event ids archived just now."""
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


@dataclass(slots=True)
class _Session:
    session_id: str
    scope_path: str
    pillar_id: str
    team_id: str
    scope_agent_id: str
    genesis: str
    version: str
    seq: int
    max_seq: int
    item_count: int
    active_count: int
    created_at: dt.datetime
    updated_at: dt.datetime
    last_event_id: str
    dirty: bool = False

    def owner(self, org_id: str) -> Scope:
        return Scope(org_id, self.pillar_id, self.team_id, self.scope_agent_id)

    def admits(self, scope: Scope) -> bool:
        """Whether an event written at `scope` may change this session: owner scope or below."""
        return scope.is_within(self.owner(scope.org_id))


@dataclass(slots=True)
class _Pending:
    items: list[tuple[Any, ...]] = field(default_factory=list)
    versions: dict[tuple[str, str], tuple[Any, ...]] = field(default_factory=dict)
    events: list[tuple[Any, ...]] = field(default_factory=list)
    memories: list[tuple[Any, ...]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.items or self.versions or self.events or self.memories)


def _columns(rows: Iterable[tuple[Any, ...]], width: int) -> list[list[Any]]:
    cols: list[list[Any]] = [[] for _ in range(width)]
    for row in rows:
        for col, value in zip(cols, row, strict=True):
            col.append(value)
    return cols


def _json_text(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _content(content_b64: str) -> bytes:
    return base64.b64decode(content_b64, validate=True)


_INSERT_ITEMS = """
INSERT INTO session_items (org_id, session_id, seq, event_id, kind, content_hash, prev_seq,
                           version, occurred_at)
SELECT $1, u.* FROM unnest($2::text[], $3::bigint[], $4::uuid[], $5::text[], $6::text[],
                           $7::bigint[], $8::text[], $9::timestamptz[]) AS u
"""
_INSERT_VERSIONS = """
INSERT INTO session_versions (org_id, session_id, version, seq, depth, introduced_by, at)
SELECT $1, u.* FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::uuid[],
                           $7::timestamptz[]) AS u
ON CONFLICT (org_id, session_id, version) DO UPDATE
SET seq = EXCLUDED.seq, depth = EXCLUDED.depth, introduced_by = EXCLUDED.introduced_by, at = EXCLUDED.at
"""
_INSERT_EVENTS = """
INSERT INTO session_events (event_id, org_id, session_id, seq, scope_path, pillar_id, team_id,
                            scope_agent_id, event_type, content, metadata, content_sha256,
                            token_count, version, occurred_at, idempotency_key)
SELECT u.event_id, $1, u.session_id, u.seq, u.scope_path, u.pillar_id, u.team_id,
       u.scope_agent_id, u.event_type, u.content, u.metadata::jsonb, u.content_sha256,
       u.token_count, u.version, u.occurred_at, u.idempotency_key
FROM unnest($2::uuid[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[],
            $9::text[], $10::bytea[], $11::text[], $12::text[], $13::int[], $14::text[],
            $15::timestamptz[], $16::text[])
     AS u(event_id, session_id, seq, scope_path, pillar_id, team_id, scope_agent_id, event_type,
          content, metadata, content_sha256, token_count, version, occurred_at, idempotency_key)
"""
_INSERT_MEMORIES = """
INSERT INTO memory_versions (event_id, org_id, scope_path, pillar_id, team_id, scope_agent_id,
                             agent_id, session_id, seq, memory_type, content, metadata,
                             content_sha256, session_version, created_at, pii_status)
SELECT u.event_id, $1, u.scope_path, u.pillar_id, u.team_id, u.scope_agent_id, u.agent_id,
       u.session_id, u.seq, u.memory_type, u.content, u.metadata::jsonb, u.content_sha256,
       u.session_version, u.created_at, 'pending'
FROM unnest($2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
            $9::bigint[], $10::text[], $11::bytea[], $12::text[], $13::text[], $14::text[],
            $15::timestamptz[])
     AS u(event_id, scope_path, pillar_id, team_id, scope_agent_id, agent_id, session_id, seq,
          memory_type, content, metadata, content_sha256, session_version, created_at)
"""
_UPSERT_SESSIONS = """
INSERT INTO sessions (org_id, session_id, scope_path, pillar_id, team_id, scope_agent_id, genesis,
                      version, seq, max_seq, item_count, active_count, created_at, updated_at,
                      last_event_id)
SELECT $1, u.* FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
                           $8::text[], $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[],
                           $13::timestamptz[], $14::timestamptz[], $15::uuid[]) AS u
ON CONFLICT (org_id, session_id) DO UPDATE
SET version = EXCLUDED.version, seq = EXCLUDED.seq, max_seq = EXCLUDED.max_seq,
    item_count = EXCLUDED.item_count, active_count = EXCLUDED.active_count,
    updated_at = EXCLUDED.updated_at, last_event_id = EXCLUDED.last_event_id
"""
# The state of version V = the items on V's chain back to genesis (prev_seq links); everything
# else of the session is inactive. Only rows whose flag changes are touched.
_ROLLBACK = """
WITH RECURSIVE path AS (
    SELECT seq, prev_seq FROM session_items WHERE org_id = $1 AND session_id = $2 AND seq = $3
    UNION ALL
    SELECT i.seq, i.prev_seq FROM session_items i JOIN path p ON i.seq = p.prev_seq
    WHERE i.org_id = $1 AND i.session_id = $2
), keep AS (SELECT array_agg(seq) AS seqs FROM path)
UPDATE session_items s
SET active = s.seq = ANY(coalesce(keep.seqs, '{}')),
    rolled_back_by = CASE WHEN s.seq = ANY(coalesce(keep.seqs, '{}')) THEN NULL ELSE $4::uuid END
FROM keep
WHERE s.org_id = $1 AND s.session_id = $2
  AND s.active <> (s.seq = ANY(coalesce(keep.seqs, '{}')))
RETURNING s.event_id, s.kind, s.active
"""


_SESSION_TYPES = frozenset({EVENT_INGESTED, MEMORY_PUSHED, SNAPSHOT_CREATED, SESSION_ROLLED_BACK})


class _OrgApplier:
    """Applies one org's fresh events in log order. Chain state lives in memory and rows are
    written in bulk; rollbacks and snapshots, which read rows back, flush first."""

    def __init__(self, conn: asyncpg.Connection, org_id: str, bulk: BulkLoad | None = None) -> None:
        self.conn = conn
        self.org_id = org_id
        self.sessions: dict[str, _Session] = {}
        self.used_keys: set[tuple[str, str, str]] = set()  # (session_id, writer scope path, idempotency_key)
        self.pending = _Pending()
        self.chunks = ChunkProjection(conn, org_id, bulk=bulk)

    async def load_sessions(self, session_ids: set[str]) -> None:
        if not session_ids:
            return
        rows = await self.conn.fetch(
            "SELECT * FROM sessions WHERE org_id = $1 AND session_id = ANY($2::text[]) FOR UPDATE",
            self.org_id, sorted(session_ids))
        for r in rows:
            self.sessions[r["session_id"]] = _Session(
                r["session_id"], r["scope_path"], r["pillar_id"], r["team_id"], r["scope_agent_id"],
                r["genesis"], r["version"], r["seq"], r["max_seq"], r["item_count"],
                r["active_count"], r["created_at"], r["updated_at"], str(r["last_event_id"]))

    async def load_idempotency_keys(self, keys: set[tuple[str, str, str]]) -> None:
        if keys:
            sessions, writers, values = _columns(sorted(keys), 3)
            rows = await self.conn.fetch(
                "SELECT e.session_id, e.scope_path, e.idempotency_key FROM session_events e "
                "JOIN unnest($2::text[], $3::text[], $4::text[]) AS u(session_id, scope_path, k) "
                "  ON e.session_id = u.session_id AND e.scope_path = u.scope_path AND e.idempotency_key = u.k "
                "WHERE e.org_id = $1",
                self.org_id, sessions, writers, values)
            self.used_keys.update((r["session_id"], r["scope_path"], r["idempotency_key"]) for r in rows)

    async def apply(self, rec: LogRecord, ev: Event) -> Applied:
        sid = _session_id(ev)
        if ev.type in _SESSION_TYPES and sid in self.sessions and not self.sessions[sid].admits(ev.scope):
            return _applied(rec, ev, OUT_OF_SCOPE)
        if ev.type == EVENT_INGESTED:
            key = _idempotency_key(ev)
            if key and (sid, ev.scope.path, key) in self.used_keys:
                return _applied(rec, ev, IDEMPOTENCY_KEY_TAKEN)
            body = EventIngested.from_payload(ev.payload)
            content = _content(body.content_b64)
            s = self._session(body.session_id, ev)
            seq, version = self._append(s, ev, "event")
            if key:
                self.used_keys.add((s.session_id, ev.scope.path, key))
            sc = ev.scope
            self.pending.events.append((
                ev.event_id, s.session_id, seq, sc.path, sc.pillar_id, sc.team_id, sc.agent_id,
                body.event_type, content, _json_text(body.metadata),
                body.content_sha256 or sha256_hex(content), body.token_count,
                version, ev.occurred, key))
            await self.chunks.add(event_id=ev.event_id, source_kind="event", session_id=s.session_id,
                                  scope_path=sc.path, content=content, metadata=body.metadata,
                                  created_at=ev.occurred)
            return _applied(rec, ev, APPLIED, s.session_id, seq, version)
        if ev.type == MEMORY_PUSHED:
            pushed = MemoryPushed.from_payload(ev.payload)
            content = _content(pushed.content_b64)
            sid = pushed.session_id or None
            seq = version = None
            if sid:
                seq, version = self._append(self._session(sid, ev), ev, "memory")
            sc = ev.scope
            self.pending.memories.append((
                ev.event_id, sc.path, sc.pillar_id, sc.team_id, sc.agent_id,
                pushed.agent_id or sc.agent_id, sid, seq, pushed.memory_type, content,
                _json_text(pushed.metadata), pushed.content_sha256 or sha256_hex(content),
                version, ev.occurred))
            return dataclasses.replace(_applied(rec, ev, APPLIED, sid, seq, version),
                                       jobs=(("pii", pii_scan_job(ev.scope, ev.event_id)),))
        if ev.type == SNAPSHOT_CREATED:
            return await self._snapshot(rec, ev)
        if ev.type == SESSION_ROLLED_BACK:
            return await self._rollback(rec, ev)
        if ev.type == COMPACTION_THRESHOLD:
            return await self._compaction_threshold(rec, ev)
        if ev.type == GUARDRAIL_PUBLISHED:
            return _applied(rec, ev, await apply_guardrail_published(self.conn, self.org_id, ev))
        if ev.type == MEMORY_SCRUBBED:
            return await self._scrubbed(rec, ev)
        if ev.type == EMBEDDING_RECORDED:
            recorded = EmbeddingRecorded.from_payload(ev.payload)
            await self.chunks.record_vectors(event_id=ev.event_id, model_version=recorded.model_version,
                                             vectors=recorded.vectors, recorded_at=ev.occurred)
            return _applied(rec, ev, APPLIED)
        return _applied(rec, ev, IGNORED)  # another projector's event: archived, nothing more

    async def finish(self) -> None:
        await self.flush(sessions=True)

    async def flush(self, *, sessions: bool = False) -> None:
        """Write the pending rows, and with `sessions` the sessions' chain state, in one round trip."""
        pending, self.pending = self.pending, _Pending()
        batch = StatementBatch()
        if pending.items:
            batch.add(_INSERT_ITEMS, self.org_id, *_columns(pending.items, 8))
        if pending.versions:
            batch.add(_INSERT_VERSIONS, self.org_id, *_columns(pending.versions.values(), 6))
        if pending.events:
            batch.add(_INSERT_EVENTS, self.org_id, *_columns(pending.events, 15))
        if pending.memories:
            batch.add(_INSERT_MEMORIES, self.org_id, *_columns(pending.memories, 14))
        dirty = [s for s in self.sessions.values() if s.dirty] if sessions else []
        if dirty:
            batch.add(_UPSERT_SESSIONS, self.org_id, *_columns(
                ((s.session_id, s.scope_path, s.pillar_id, s.team_id, s.scope_agent_id, s.genesis,
                  s.version, s.seq, s.max_seq, s.item_count, s.active_count, s.created_at,
                  s.updated_at, s.last_event_id) for s in dirty), 14))
        chunks = self.chunks.stage(batch)
        rows = await batch.run(self.conn, chunks or NOTHING)
        if chunks:
            await self.chunks.written(rows)

    # -- chain ------------------------------------------------------------------------------

    def _session(self, session_id: str, ev: Event) -> _Session:
        if not isinstance(session_id, str) or not session_id:
            raise ValueError("payload.session_id is empty")
        s = self.sessions.get(session_id)
        if s is None:
            v0 = SessionRef(self.org_id, session_id).genesis
            sc = ev.scope
            s = _Session(session_id, sc.path, sc.pillar_id, sc.team_id, sc.agent_id, v0, v0, 0, 0,
                         0, 0, ev.occurred, ev.occurred, ev.event_id, dirty=True)
            self.sessions[session_id] = s
            self.pending.versions[(session_id, v0)] = (session_id, v0, 0, 0, ev.event_id, ev.occurred)
        return s

    def _append(self, s: _Session, ev: Event, kind: str) -> tuple[int, str]:
        seq = s.max_seq + 1
        version = next_version(s.version, ev.content_hash)
        self.pending.items.append((s.session_id, seq, ev.event_id, kind, ev.content_hash, s.seq,
                                   version, ev.occurred))
        self.pending.versions[(s.session_id, version)] = (
            s.session_id, version, seq, s.active_count + 1, ev.event_id, ev.occurred)
        s.version, s.seq, s.max_seq = version, seq, seq
        s.item_count += 1
        s.active_count += 1
        s.updated_at, s.last_event_id, s.dirty = ev.occurred, ev.event_id, True
        return seq, version

    async def _rollback(self, rec: LogRecord, ev: Event) -> Applied:
        body = SessionRolledBack.from_payload(ev.payload)
        sid, target = body.session_id, body.target_version
        s = self.sessions.get(sid) if isinstance(sid, str) else None
        if s is None or not isinstance(target, str):
            return _applied(rec, ev, UNKNOWN_TARGET)
        if not may_rewrite(s.owner(self.org_id), ev.scope):
            return _applied(rec, ev, OUT_OF_SCOPE)
        await self.flush()
        row = await self.conn.fetchrow(
            "SELECT seq, depth FROM session_versions WHERE org_id = $1 AND session_id = $2 AND version = $3",
            self.org_id, sid, target)
        if row is None:
            return _applied(rec, ev, UNKNOWN_TARGET)
        changed = await self.conn.fetch(_ROLLBACK, self.org_id, sid, row["seq"], ev.event_id)
        for kind, table in (("event", "session_events"), ("memory", "memory_versions")):
            rows = [(r["event_id"], r["active"]) for r in changed if r["kind"] == kind]
            if rows:
                await self.conn.execute(
                    f"UPDATE {table} t SET active = u.active "
                    "FROM unnest($2::uuid[], $3::bool[]) AS u(event_id, active) "
                    "WHERE t.org_id = $1 AND t.event_id = u.event_id",
                    self.org_id, *_columns(rows, 2))
        await self.chunks.set_active([(r["event_id"], r["active"]) for r in changed])
        s.version, s.seq, s.active_count = target, row["seq"], row["depth"]
        s.updated_at, s.last_event_id, s.dirty = ev.occurred, ev.event_id, True
        return _applied(rec, ev, APPLIED, sid, s.seq, s.version)

    async def _scrubbed(self, rec: LogRecord, ev: Event) -> Applied:
        """The PII scan's result for a pushed memory: its redacted content replaces the raw one;
        semantic memory becomes chunks, searchable only when the status is 'clear'. A later scan
        (pii rescan) replaces an earlier one's chunks."""
        body = MemoryScrubbed.from_payload(ev.payload)
        status = body.status
        if status not in ("clear", "quarantined"):
            raise ValueError(f"memory.scrubbed status {status!r}")
        content = _content(body.content_b64)
        await self.flush()
        row = await self.conn.fetchrow(
            "UPDATE memory_versions SET content = $3, pii_status = $4, pii_spans = $5::text::jsonb, "
            "  pii_detector_version = $6, pii_fallback_reason = $7, pii_scanned_by = $8 "
            "WHERE org_id = $1 AND event_id = $2 "
            "RETURNING scope_path, session_id, memory_type, metadata::text AS metadata, created_at, active",
            self.org_id, uuid.UUID(body.memory_event_id), content, status,
            _json_text(body.spans_by_class), body.detector_version, body.fallback_reason, ev.event_id)
        if row is None:
            return _applied(rec, ev, UNKNOWN_TARGET)
        if row["memory_type"] == SEMANTIC:
            await self.chunks.remove_source(body.memory_event_id)
            await self.chunks.add(event_id=body.memory_event_id, source_kind="memory",
                                  session_id=row["session_id"], scope_path=row["scope_path"], content=content,
                                  metadata=orjson.loads(row["metadata"]), created_at=row["created_at"],
                                  pii_status=status, active=row["active"], added_by=ev.event_id)
        return _applied(rec, ev, APPLIED, row["session_id"])

    async def _compaction_threshold(self, rec: LogRecord, ev: Event) -> Applied:
        """AssembleContext saw the session's history cross 80 % of its budget (or fall back under
        it): open (close) the session's compaction request. Only the event that opens one asks
        for a CompactionJob, so there is one job per crossing whoever observed it."""
        body = CompactionThreshold.from_payload(ev.payload)
        sid = body.session_id
        if body.crossed:
            opened = await self.conn.fetchval(
                "INSERT INTO compaction_requests (org_id, session_id, opened_by, token_count, token_budget, opened_at) "
                "VALUES ($1, $2, $3, $4, $5, $6) "
                "ON CONFLICT (org_id, session_id) WHERE closed_by IS NULL DO NOTHING RETURNING opened_by",
                self.org_id, sid, ev.event_id, body.token_count, body.token_budget, ev.occurred)
            if opened is None:
                return _applied(rec, ev, IGNORED)
            job = compaction_job(ev.scope, sid, body.token_count, body.token_budget)
            return dataclasses.replace(_applied(rec, ev, APPLIED, sid), jobs=(("compaction", job),))
        closed = await self.conn.fetchval(
            "UPDATE compaction_requests SET closed_by = $3, closed_at = $4 "
            "WHERE org_id = $1 AND session_id = $2 AND closed_by IS NULL RETURNING opened_by",
            self.org_id, sid, ev.event_id, ev.occurred)
        return _applied(rec, ev, APPLIED if closed else IGNORED, sid)

    async def _snapshot(self, rec: LogRecord, ev: Event) -> Applied:
        body = SnapshotCreated.from_payload(ev.payload)
        sid, snapshot_id, name = body.session_id, str(uuid.UUID(body.snapshot_id)), body.name
        if not isinstance(sid, str) or not sid or not isinstance(name, str) or not name:
            raise ValueError("payload.session_id and payload.name must be non-empty strings")
        s = self.sessions.get(sid)
        await self.flush()
        if s is None:
            version, seq, items = SessionRef(self.org_id, sid).genesis, 0, []
        else:
            version, seq = s.version, s.seq
            items = [
                {"seq": r["seq"], "event_id": str(r["event_id"]), "kind": r["kind"],
                 "content_hash": r["content_hash"], "version": r["version"]}
                for r in await self.conn.fetch(
                    "SELECT seq, event_id, kind, content_hash, version FROM session_items "
                    "WHERE org_id = $1 AND session_id = $2 AND active ORDER BY seq",
                    self.org_id, sid)]
        state = {"version": version, "seq": seq, "items": items}
        won = await self.conn.fetchval(
            "INSERT INTO snapshots (snapshot_id, org_id, session_id, name, version, seq, state, "
            "                       event_id, created_at, created_by, scope_path) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb, $8, $9, $10, $11) "
            "ON CONFLICT (org_id, session_id, scope_path, name) DO NOTHING RETURNING snapshot_id",
            snapshot_id, self.org_id, sid, name, version, seq, _json_text(state), ev.event_id,
            ev.occurred, ev.actor, ev.scope.path)
        if won is None:
            return _applied(rec, ev, SNAPSHOT_NAME_TAKEN, sid)
        return _applied(rec, ev, APPLIED, sid, seq, version)


# A batch's transaction is opened and closed by two scripts of plain statements, one round trip
# each: under ingest load every round trip to PostgreSQL costs ~0.5 ms of waiting, and these
# were seven (BEGIN, two set_config, the offsets, the NOTIFY, COMMIT) of a batch's ~10.
def _opening(projector: str, records: Sequence[LogRecord], first_org: str) -> str:
    """The batch's projector offsets (per partition, the highest applied; applied at the start
    of the transaction, so atomically with the rest), and `app.org_id` set to the first org."""
    high: dict[tuple[str, int], int] = {}
    for r in records:
        key = (r.topic, r.partition)
        high[key] = max(high.get(key, -1), r.offset)
    rows = ", ".join(f"({sql_literal(SYSTEM_ORG)}, {sql_literal(projector)}, {sql_literal(t)}, {int(p)}, {int(o)})"
                     for (t, p), o in high.items())
    return ";\n".join((
        set_config_sql({"app.org_id": SYSTEM_ORG}),
        'INSERT INTO projector_offsets (org_id, projector, topic, partition, "offset") VALUES ' + rows
        + ' ON CONFLICT (org_id, projector, topic, partition) DO UPDATE'
        ' SET "offset" = GREATEST(projector_offsets."offset", EXCLUDED."offset"), updated_at = now()',
        set_config_sql({"app.org_id": first_org})))


def _closing(notifications: tuple[str, list[str]] | None) -> str:
    """The NOTIFYs announcing the batch (delivered at commit)."""
    if not notifications or not notifications[1]:
        return ""
    channel, payloads = notifications
    return "SELECT " + ", ".join(f"pg_notify({sql_literal(channel)}, {sql_literal(p)})" for p in payloads)


@contextlib.asynccontextmanager
async def _batch_transaction(conn: asyncpg.Connection, opening: str, closing: Callable[[], str]):
    """`opening` then the body then `closing`, in one transaction: begun and committed here,
    within the same scripts, unless the caller already holds one."""
    require_standard_strings(conn)
    own = not conn.is_in_transaction()
    try:
        await conn.execute(("BEGIN;\n" if own else "") + opening)
        yield
        if script := ";\n".join(s for s in (closing(), "COMMIT" if own else "") if s):
            await conn.execute(script)
    except BaseException:
        if own and not conn.is_closed() and conn.is_in_transaction():
            with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                await conn.execute("ROLLBACK")
        raise
