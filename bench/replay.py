"""Replay benchmark: rebuild every read model of a data directory's archive into an empty database.

Starts `context-engine up` on an existing data directory (for instance the 100,000-chunk one that
`bench/search.py --home DIR --keep` leaves), waits until it is idle, stops its worker's influence
by measuring only the replay process, then replays the archive (`streams.replay.read_archive`, the
order the projector applied it) into a scratch database with `streams.replay.replay`, exactly as
`context-engine replay` does, and prints events/s and where the time went: the statements by
total client-side time (statement time includes asyncpg encoding its arguments) and the rest,
which is Python (decoding, chunking, counting tokens, postings).

    .venv/bin/python bench/replay.py --home /tmp/ce100k
    .venv/bin/python bench/replay.py --home /tmp/ce100k --limit 20000
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import pathlib
import time
from collections.abc import AsyncIterator

from asyncpg.connection import Connection
from report import load_average, machine
from stack import Stack, wait_quiet

from context_engine.config import Settings
from projections.projector.records import LogRecord
from projections.store import admin
from streams.replay import read_archive, replay
from streams.topics import LogTopics

STATEMENTS: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])


def time_statements() -> None:
    """Count every statement's client-side time, by its first words."""
    for name in ("execute", "fetch", "fetchval", "fetchrow", "copy_records_to_table"):
        original = getattr(Connection, name)

        def timed(self, query, *args, _original=original, **kwargs):
            async def run():
                started = time.perf_counter()
                try:
                    return await _original(self, query, *args, **kwargs)
                finally:
                    entry = STATEMENTS[" ".join(str(query).split())[:70]]
                    entry[0] += 1
                    entry[1] += time.perf_counter() - started
            return run()

        setattr(Connection, name, timed)


async def first(batches: AsyncIterator[list[LogRecord]], limit: int | None) -> AsyncIterator[list[LogRecord]]:
    seen = 0
    async for batch in batches:
        if limit is not None:
            batch = batch[:limit - seen]
        seen += len(batch)
        if batch:
            yield batch
        if limit is not None and seen >= limit:
            return


async def run(database_url: str, topic: str, limit: int | None) -> tuple[int, int, float]:
    """(events archived, events replayed, seconds)."""
    target = await admin.create_database(database_url, admin.timestamped_name("bench_replay"))
    archived: list[int] = []
    try:
        STATEMENTS.clear()
        report = await replay(first(read_archive(database_url, topic, on_total=archived.append), limit), target)
        return archived[0], report.events, report.seconds
    finally:
        measured = dict(STATEMENTS)
        await admin.drop_database(database_url, admin.database_of(target))
        STATEMENTS.clear()
        STATEMENTS.update(measured)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=pathlib.Path, required=True, help="an existing data directory")
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N archived events")
    args = parser.parse_args()
    if not (args.home / "postgres").exists():
        parser.error(f"{args.home} holds no data directory of context-engine")

    topic = LogTopics.from_settings(Settings()).events
    stack = Stack(args.home)
    try:
        stack.wait_serving(timeout=600)
        wait_quiet(stack)
        database_url = stack.endpoints()["database_url"]
        load = load_average()
        time_statements()
        total, events, seconds = asyncio.run(run(database_url, topic, args.limit))
    finally:
        stack.stop()

    print(f"machine: {machine()}; load average before: {load}")
    print(f"archive: {total:,} events in {topic}; replayed {events:,} into an empty database")
    print(f"replay: {seconds:.1f} s, {events / seconds:,.0f} events/s")
    in_sql = sum(t for _, t in STATEMENTS.values())
    print(f"statements: {in_sql:.1f} s in all; the rest ({max(0.0, seconds - in_sql):.1f} s) is Python")
    for text, (n, t) in sorted(STATEMENTS.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"  {t:7.2f} s  {n:6d} x  {text}")


if __name__ == "__main__":
    main()
