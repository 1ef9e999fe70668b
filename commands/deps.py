"""What the command handlers share, built once per API process (the composition root is
context_engine.api.app)."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from context_engine.config import Settings
from context_engine.events import Event
from context_engine.streams.freshness import SessionFreshness
from context_engine.streams.log import ArchiveWatch, EventLog, LogPosition


@dataclass
class Deps:
    settings: Settings
    log: EventLog
    watch: ArchiveWatch
    freshness: SessionFreshness
    pool: asyncpg.Pool

    async def append(self, event: Event, session_key: str) -> LogPosition:
        """Append and return once the event is archived and projected: the acknowledgement point."""
        async with self.freshness.appending(session_key):
            self.watch.expect(event.event_id)
            try:
                position = await self.log.append(event)
            except BaseException:
                self.watch.forget(event.event_id)
                raise
            await self.watch.wait(event.event_id, event.scope.org_id, position,
                                  timeout=self.settings.ack_timeout_seconds)
        return position
