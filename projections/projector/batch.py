"""One batch of log records, archived and projected in ONE transaction.

1. decode every record (archive.decode_record: upcast, envelope checked);
2. per org, in log order: archive the records, and apply to the read models exactly the events
   that were archived now (org_applier.py); an event_id already archived (a redelivery, at the
   same or another offset) or repeated within the batch changes nothing and is DUPLICATE;
3. advance `projector_offsets` to the highest offset seen per topic/partition (written with the
   transaction's first statements; the batch's NOTIFYs go with its COMMIT).
So a crash between the write and the consumer's offset commit neither duplicates nor loses: on
restart the batch is redelivered and every event in it is a duplicate.

A record that cannot be decoded or applied is set aside (rejections.py) and takes nothing with
it: each org's events run under a savepoint, and when one of them fails, the org's events are
applied again one at a time, each under its own.

Row-level security: the worker connects as the admin role (see projections/store/pool.py) and
sets `app.org_id` (transaction-local) before writing each org's rows and '_system' before the
offsets, so the same code works whether or not its role bypasses RLS.
"""

from __future__ import annotations

import binascii
import contextlib
import dataclasses
import uuid
from collections.abc import Callable, Sequence

import asyncpg
import structlog

from context_engine.events import Event
from context_engine.hashing import sha256_hex
from context_engine.metrics import PROJECTOR_REJECTED_EVENTS
from context_engine.scope import Scope
from projections.projector.chunks import BulkLoad
from projections.projector.guardrail_layers import refuse_layers
from projections.projector.records import LogRecord
from projections.store.pool import SYSTEM_ORG, require_standard_strings, set_config_sql, sql_literal

from .archive import archive, decode_record
from .job_requests import EmbedChunks, IndexSource
from .org_applier import OrgApplier
from .outcome import Applied, ProjectionError, ProjectionOutcome, applied, where
from .rejections import Rejection, is_infrastructure_failure, rejection, set_aside

log = structlog.get_logger("context_engine.projector")

PROJECTOR = "session"

# What announces a committed batch: its results -> (channel, payloads) for pg_notify.
Notify = Callable[[list[Applied]], tuple[str, list[str]]]


async def apply_batch(conn: asyncpg.Connection, records: Sequence[LogRecord], *,
                      projector: str = PROJECTOR, bulk: BulkLoad | None = None,
                      notify: Notify | None = None) -> list[Applied]:
    """Archive and project `records` (in log order per partition) in one transaction.
    Returns one Applied per record, in input order. `notify` gives the (channel, payloads) that
    announce the batch: sent with the offsets, delivered at commit. `bulk`: a replay into an empty database,
    which looks for no chunks to embed (the log holds their vectors) and leaves the retrieval
    statistics to `recount_statistics`."""
    if not records:
        return []
    results: list[Applied | None] = [None] * len(records)
    rejections: list[Rejection] = []
    events: list[Event | None] = []
    for i, rec in enumerate(records):
        try:
            events.append(decode_record(rec))
        except ProjectionError as exc:
            events.append(None)
            rejections.append(rejection(rec, exc))
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
            await _project_org_or_set_aside(conn, org_id, records, events, indexes, results, rejections, bulk)
        new = await set_aside(conn, rejections) if rejections else set()
    for r in rejections:  # said once it is committed, and only the first time
        if sha256_hex(r.raw) in new:
            PROJECTOR_REJECTED_EVENTS.inc()
            log.warning("event set aside", org_id=r.applied.org_id, event_id=r.applied.event_id or None,
                        position=where(r.applied), reason=r.reason)
    return [r for r in results if r is not None]


async def _project_org_or_set_aside(conn: asyncpg.Connection, org_id: str, records: Sequence[LogRecord],
                                    events: Sequence[Event | None], indexes: list[int],
                                    results: list[Applied | None], rejections: list[Rejection],
                                    bulk: BulkLoad | None) -> None:
    """Project one org's events under the savepoint `org_batch`; when one of them fails, apply
    them again one at a time, each under its own savepoint, and set aside those that fail."""
    try:
        await _project_org(conn, org_id, records, events, indexes, results, bulk)
        return
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
            rejections.append(rejection(records[i], exc, events[i]))
            results[i] = rejections[-1].applied
        await conn.execute("RELEASE SAVEPOINT one_event")


async def _project_org(conn: asyncpg.Connection, org_id: str, records: Sequence[LogRecord],
                       events: Sequence[Event | None], indexes: list[int],
                       results: list[Applied | None], bulk: BulkLoad | None) -> None:
    """Archive one org's records of the batch and apply the fresh ones, in log order."""
    decoded: dict[int, Event] = {}
    for i in indexes:
        event = events[i]
        assert event is not None  # apply_batch groups the decoded events only
        decoded[i] = event
    # A guardrail layer the projection refuses (an untrusted key, a bad signature...) is neither
    # archived nor applied: the refusal writes nothing (projections/projector/guardrail_layers.py).
    if refused := await refuse_layers(conn, org_id, [decoded[i] for i in indexes]):
        for i in indexes:
            if (why := refused.get(decoded[i].event_id)) is not None:
                results[i] = applied(records[i], decoded[i], why.outcome)
        indexes = [i for i in indexes if decoded[i].event_id not in refused]
    fresh = await archive(conn, org_id, [(records[i], decoded[i]) for i in indexes])
    org = OrgApplier(conn, org_id, bulk)
    todo = []
    for i in indexes:
        eid = str(uuid.UUID(decoded[i].event_id))  # as the archive returns it
        if eid in fresh:
            fresh.discard(eid)  # a repeat later in this batch is a duplicate
            todo.append(i)
        else:
            results[i] = applied(records[i], decoded[i], ProjectionOutcome.DUPLICATE)
    await org.preload([decoded[i] for i in todo])
    for i in todo:
        try:
            results[i] = await org.apply(records[i], decoded[i])
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise ProjectionError(f"cannot project {where(records[i])} "
                                  f"({decoded[i].type} {decoded[i].event_id}): {exc!r}") from exc
    await org.finish()
    if not bulk:
        _ask_for_indexing(org, indexes, results)


def _ask_for_indexing(org: OrgApplier, indexes: list[int], results: list[Applied | None]) -> None:
    """Add to each applied event the embedding of its new chunks and the indexing of its long
    contents that the chunk projection left for after the commit."""
    unembedded, requested = org.chunks.unembedded(), org.chunks.requested
    scope = Scope(org.org_id)
    for i in indexes:
        if (r := results[i]) is None or r.outcome != ProjectionOutcome.APPLIED:
            continue
        if r.event_id in unembedded:
            r = dataclasses.replace(r, jobs=(*r.jobs, EmbedChunks(scope, r.event_id, tuple(unembedded[r.event_id]))))
        if r.event_id in requested:
            r = dataclasses.replace(r, jobs=(*r.jobs, *(IndexSource(scope, s) for s in requested[r.event_id])))
        results[i] = r


async def load_offsets(conn: asyncpg.Connection, projector: str = PROJECTOR) -> dict[tuple[str, int], int]:
    """Last applied offset per (topic, partition): seek to offset + 1 after a restart."""
    async with conn.transaction():
        await conn.execute("SELECT set_config('app.org_id', $1, true)", SYSTEM_ORG)
        rows = await conn.fetch(
            'SELECT topic, partition, "offset" FROM projector_offsets WHERE org_id = $1 AND projector = $2',
            SYSTEM_ORG, projector)
    return {(r["topic"], r["partition"]): r["offset"] for r in rows}


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
