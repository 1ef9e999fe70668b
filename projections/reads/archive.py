"""Reads of the event archive (`event_archive`, the history the projector applied, in
`archive_seq` order) and of the records set aside instead (`rejected_events`): what the PII
scanner, restore, replay and verify read.

The archive's reads across orgs (restore, replay, verify) run on an admin connection; the PII
scanner's on one whose transaction has `app.org_id` set (`projections.store.pool.org_transaction`).
A cursor lives in a transaction: the caller of `archived_records` and `archived_partition`
holds one open while it iterates.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg

from projections.projector.records import LogRecord


async def archived_raw(conn: asyncpg.Connection, org_id: str, event_id: str) -> bytes | None:
    """The archived bytes of one event of `org_id` (the original, as pushed), None if not archived."""
    raw = await conn.fetchval("SELECT raw FROM event_archive WHERE org_id = $1 AND event_id = $2",
                              org_id, event_id)
    return None if raw is None else bytes(raw)


async def archive_holds_events(conn: asyncpg.Connection) -> bool:
    return await conn.fetchval("SELECT EXISTS (SELECT 1 FROM event_archive)")


async def archived_count(conn: asyncpg.Connection, topic: str) -> int:
    return await conn.fetchval("SELECT count(*) FROM event_archive WHERE topic = $1", topic)


async def archived_records(conn: asyncpg.Connection, topic: str, *, prefetch: int) -> AsyncIterator[LogRecord]:
    """Every archived record of `topic` in archive order (the order the projector applied them)."""
    async for r in conn.cursor('SELECT partition, "offset", raw FROM event_archive WHERE topic = $1 '
                               "ORDER BY archive_seq", topic, prefetch=prefetch):
        yield LogRecord(topic, r["partition"], r["offset"], bytes(r["raw"]))


async def archived_counts_by_partition(conn: asyncpg.Connection, topic: str) -> dict[int, int]:
    """partition -> how many events of `topic` the archive holds from it."""
    return {r["partition"]: r["n"] for r in await conn.fetch(
        "SELECT partition, count(*) AS n FROM event_archive WHERE topic = $1 GROUP BY partition",
        topic)}


async def archived_partition(conn: asyncpg.Connection, topic: str,
                             partition: int) -> AsyncIterator[tuple[str, bytes]]:
    """(aggregate, raw) of each archived event of one partition of `topic`, in archive order
    (= log order within the partition)."""
    async for row in conn.cursor("SELECT aggregate, raw FROM event_archive "
                                 "WHERE topic = $1 AND partition = $2 ORDER BY archive_seq",
                                 topic, partition):
        yield row["aggregate"], bytes(row["raw"])


async def last_archive_seq(conn: asyncpg.Connection, topic: str) -> int:
    """The archive position of the last event of `topic` archived so far (0: none)."""
    return await conn.fetchval("SELECT coalesce(max(archive_seq), 0) FROM event_archive WHERE topic = $1", topic)


async def archive_seqs_by_event(conn: asyncpg.Connection, topic: str) -> dict[str, int]:
    """event id -> archive position, of every archived event of `topic`."""
    return {str(r["event_id"]): r["archive_seq"] for r in await conn.fetch(
        "SELECT event_id, archive_seq FROM event_archive WHERE topic = $1", topic)}


async def set_aside_record_hashes(conn: asyncpg.Connection, topic: str) -> set[str]:
    """The sha256 of each record of `topic` set aside instead of archived (`rejected_events`)."""
    return {r["record_sha256"] for r in await conn.fetch(
        "SELECT record_sha256 FROM rejected_events WHERE topic = $1", topic)}
