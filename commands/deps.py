"""What the command handlers share, built once per API process (the composition root is
context_engine.api.app)."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from context_engine.commands.session_access import SessionOwners
from context_engine.config import Settings
from context_engine.events import Event
from context_engine.inference.embedder import Embedder
from context_engine.inference.query_vectors import QueryVectors
from context_engine.streams.freshness import SessionFreshness
from context_engine.streams.log import ArchiveWatch, EventLog


@dataclass
class Deps:
    settings: Settings
    log: EventLog
    watch: ArchiveWatch
    freshness: SessionFreshness
    pool: asyncpg.Pool
    owners: SessionOwners
    embedder: Embedder
    query_vectors: QueryVectors

    async def append(self, event: Event, session_key: str) -> str | None:
        """Append and return once the event is archived and projected: the acknowledgement point.
        Returns the projector's outcome (APPLIED, OUT_OF_SCOPE…), or None when it must be read back."""
        async with self.freshness.appending(session_key):
            self.watch.expect(event.event_id)
            try:
                position = await self.log.append(event)
            except BaseException:
                self.watch.forget(event.event_id)
                raise
            return await self.watch.wait(event.event_id, event.scope.org_id, position,
                                         timeout=self.settings.ack_timeout_seconds)
