"""Running one piece of work beside another within a call."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
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
