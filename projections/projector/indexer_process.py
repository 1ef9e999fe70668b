"""What the chunk indexer's background process runs: `index_source`, the whole of
`deferred_indexing.index_requested` on a connection and an event loop of the process's own.

Only the source's id goes in and the new chunks' ids come out. Handing the built rows back to
the worker instead cost its event loop, which the projector shares, 10-40 ms of unpickling a
megabyte's rows and a few ms of encoding each slice of them, every one holding the GIL: org B's
projection waited behind org A's megabytes although the work was done elsewhere
(bench/hostile_tenant.py, docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor

import asyncpg
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from context_engine.concurrency import background_thread
from projections.projector import deferred_indexing
from projections.projector.rejections import is_infrastructure_failure
from projections.store.pool import init_connection

APPLICATION_NAME = "context-engine-indexer"  # its connection in pg_stat_activity

_loop: asyncio.AbstractEventLoop | None = None
_conn: asyncpg.Connection | None = None
_conn_url: str | None = None
_builder: ThreadPoolExecutor | None = None


class IndexingFailed(Exception):
    """A try that failed in the process, as the worker reads it back (an asyncpg exception need
    not survive pickling): its description, and whether the infrastructure failed rather than
    the content (`is_infrastructure_failure`: not counted as an attempt)."""

    def __init__(self, description: str, infrastructure: bool) -> None:
        super().__init__(description, infrastructure)
        self.description, self.infrastructure = description, infrastructure

    def __str__(self) -> str:
        return self.description


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def index_source(database_url: str | None, org_id: str, source_event_id: str, *,
                 build_niceness: int = 0, build_idle: bool = False) -> dict[str, list[str]]:
    """Index one requested source (`deferred_indexing.index_requested`); returns its chunks still
    without a vector, by the event that asked. `database_url` None: libpq's PG* environment.

    The rows are built on a thread `build_niceness` steps down (or in SCHED_IDLE), before the
    writing transaction, which runs at the process's priority: it holds row locks the projector
    takes too (the org's statistics, till the commit), and a SCHED_IDLE writer could wait long
    for a slice between its last statement and its COMMIT while the projector waited for it.
    The thread is started by the process's first call, with that call's priority. A connection
    found dead is replaced once within the call."""
    global _loop, _builder
    if _loop is None:
        _loop = asyncio.new_event_loop()
        # its own thread, not the loop's default executor, which getaddrinfo uses when connecting
        _builder = background_thread("chunk-builder", build_niceness, idle=build_idle)
    try:
        return _loop.run_until_complete(_index(database_url, org_id, source_event_id))
    except Exception as exc:
        infrastructure = is_infrastructure_failure(exc)
        if infrastructure:
            _loop.run_until_complete(_disconnect())
        raise IndexingFailed(describe(exc), infrastructure) from None


async def _index(database_url: str | None, org_id: str, source_event_id: str) -> dict[str, list[str]]:
    reused = _kept(database_url)
    try:
        return await _index_on(await _connection(database_url), org_id, source_event_id)
    except Exception as exc:
        if not (reused and is_infrastructure_failure(exc)):
            raise
    # The connection died while the process waited (PostgreSQL restarted, an idle timeout): this
    # loop runs only during a call, so nothing noticed. Once more on a new one.
    await _disconnect()
    return await _index_on(await _connection(database_url), org_id, source_event_id)


async def _index_on(conn: asyncpg.Connection, org_id: str, source_event_id: str) -> dict[str, list[str]]:
    async for attempt in AsyncRetrying(retry=retry_if_exception_type(asyncpg.TransactionRollbackError),
                                       stop=stop_after_attempt(3), reraise=True):
        with attempt:  # a deadlock with the projector, which PostgreSQL broke: again
            return await deferred_indexing.index_requested(conn, org_id, source_event_id, builder=_builder)
    raise AssertionError("unreachable: the retry loop returns or raises")


def _kept(database_url: str | None) -> bool:
    """Whether the process holds a connection to `database_url` it believes open."""
    return _conn is not None and not _conn.is_closed() and _conn_url == database_url


async def _connection(database_url: str | None) -> asyncpg.Connection:
    global _conn, _conn_url
    if not _kept(database_url):
        await _disconnect()
        conn = await asyncpg.connect(database_url, server_settings={"application_name": APPLICATION_NAME})
        try:
            await init_connection(conn)
        except BaseException:
            await conn.close()
            raise
        _conn, _conn_url = conn, database_url
    return _conn


async def _disconnect() -> None:
    """After PostgreSQL went away or the connection broke: the next source connects afresh."""
    global _conn
    conn, _conn = _conn, None
    if conn is not None:
        with contextlib.suppress(Exception):
            await conn.close(timeout=1)
