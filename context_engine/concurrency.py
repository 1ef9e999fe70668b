"""Running one piece of work beside another within a call, and background work below it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


@contextlib.asynccontextmanager
async def alongside(work: Awaitable[T]) -> AsyncIterator[asyncio.Future[T]]:
    """Start `work` as a task while the block runs; the block awaits it when it needs the result.
    On leaving, unfinished work is cancelled, and a failure of finished work counts as seen (the
    block either awaited it or failed first), so it is never logged as a lost exception."""
    task = asyncio.ensure_future(work)
    try:
        yield task
    finally:
        if not task.done():
            task.cancel()
        elif not task.cancelled():
            task.exception()


def background_thread(name: str, niceness: int, *, idle: bool = False) -> ThreadPoolExecutor:
    """One thread for CPU-heavy background work (the worker's batch embedder), below the
    process's priority: Linux schedules threads, not processes, and keeps a priority per thread,
    which threads it starts (onnxruntime's intra-op pool) inherit. Foreground work on the same
    cores (projecting the events a client waits for, PostgreSQL, the broker) then runs first, and
    the background thread takes what is left.

    `niceness` steps down (0 leaves the nice value alone); `idle` puts the thread in Linux's
    SCHED_IDLE class instead, which yields to every normal thread as soon as it wakes: a nice
    value only shrinks the thread's share, so a woken foreground thread can still wait behind it
    for a slice (measured: docs/operations.md, "Background embedding")."""

    def lower_priority() -> None:
        tid = threading.get_native_id()
        if niceness and hasattr(os, "setpriority"):
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + niceness))
        if idle and hasattr(os, "SCHED_IDLE"):
            with contextlib.suppress(OSError):  # a sandbox may refuse it: the nice value still holds
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread

    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name, initializer=lower_priority)
