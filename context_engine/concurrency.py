"""Running one piece of work beside another within a call, and background work below it."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import multiprocessing
import multiprocessing.connection
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

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

    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name,
                              initializer=functools.partial(_lower_priority, niceness, idle))


def _lower_priority(niceness: int, idle: bool) -> None:
    """The calling thread `niceness` steps down, or into SCHED_IDLE (see `background_thread`)."""
    tid = threading.get_native_id()
    if niceness and hasattr(os, "setpriority"):
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + niceness))
    if idle and hasattr(os, "SCHED_IDLE"):
        with contextlib.suppress(OSError):  # a sandbox may refuse it: the nice value still holds
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread


def _name_process(name: str) -> None:
    """The name ps and top show for the calling thread and the threads it starts (Linux's
    /proc/<pid>/comm, 15 bytes); elsewhere nothing."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # 15: PR_SET_NAME


def _start_background_process(niceness: int, idle: bool, name: str) -> None:
    """In a `BackgroundProcess`: below the parent's priority, and gone when the parent is. Its work
    queue's pipe would not tell it: the queue's pickle gives the child both ends, so a parent killed
    by SIGKILL left it waiting on the pipe forever; the parent's sentinel becomes readable when the
    parent dies."""
    _name_process(name)
    _lower_priority(niceness, idle)
    parent = multiprocessing.parent_process()
    if parent is not None:
        def exit_with_parent() -> None:
            multiprocessing.connection.wait([parent.sentinel])
            os._exit(0)

        threading.Thread(target=exit_with_parent, name="exit-with-parent", daemon=True).start()


class BackgroundProcess:
    """One process for CPU-heavy pure-Python background work (cutting a long content into
    chunks), below the caller's priority as `background_thread` is. A thread would share the
    caller's GIL: a SCHED_IDLE thread that holds it while preempted stalls every other thread of
    the process (a priority inversion), and Python work in a thread slows the event loop even at
    equal priority. A process has a GIL of its own.

    Started by spawn (the caller has threads, which a fork would copy half-held), on first use;
    a process that died (killed, out of memory) is replaced at the next call, and the call it
    took with it fails with `BrokenProcessPool`. The process exits with its parent, even one killed
    (`_start_background_process`)."""

    def __init__(self, niceness: int, *, idle: bool = False, name: str = "background") -> None:
        """`name`: what ps and top call the process."""
        self._niceness, self._idle, self._name = niceness, idle, name
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start_background_process, initargs=(self._niceness, self._idle, self._name))
            return self._pool

    async def run(self, fn: Callable[..., T], /, *args: Any) -> T:
        """`fn(*args)` in the process (`fn` and its arguments picklable)."""
        pool = self._executor()
        try:
            return await asyncio.wrap_future(pool.submit(fn, *args))
        except BrokenProcessPool:
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False)
            raise

    def shutdown(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
