"""Read-your-writes within one API process.

Every append registers with the session it belongs to until it is acknowledged (archived and
projected) or fails. A query about a session first waits, bounded, for the appends this process
has in flight for that session, then answers from PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator

from context_engine.errors import Unavailable
from context_engine.events import SessionRef


class SessionFreshness:
    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._in_flight: dict[SessionRef, set[asyncio.Future]] = defaultdict(set)

    @contextlib.asynccontextmanager
    async def appending(self, session: SessionRef) -> AsyncIterator[None]:
        done = asyncio.get_running_loop().create_future()
        self._in_flight[session].add(done)
        try:
            yield
        finally:
            done.set_result(None)
            pending = self._in_flight[session]
            pending.discard(done)
            if not pending:
                del self._in_flight[session]

    async def wait(self, session: SessionRef) -> None:
        pending = list(self._in_flight.get(session, ()))
        if not pending:
            return
        _, still = await asyncio.wait(pending, timeout=self._timeout)
        if still:
            raise Unavailable(
                f"session {session.session_id!r} has {len(still)} write(s) from this "
                f"server not yet projected after {self._timeout:.1f}s; retry shortly",
                reason="PROJECTION_LAGGING")
