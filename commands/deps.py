"""What the command handlers share, built once per API process (the composition root is
entrypoints.api.app)."""

from __future__ import annotations

from dataclasses import dataclass, field

import asyncpg

from commands.read_back import ReadBack
from commands.refusal_budget import RefusalBudget
from commands.session_owners import SessionOwners
from commands.write_budget import WriteBudget
from context_engine.config import Settings
from context_engine.events import Event, SessionRef
from inference.embedder import Embedder
from inference.query_vectors import QueryVectors
from inference.summarizers import Summarizer
from inference.summarizers.extractive import ExtractiveSummarizer
from streams.access_attempts import AuditTrail, RecordedAudit
from streams.acknowledgement import APPENDS_AGAIN, ArchiveWatch, RetryAdvice, append_and_wait
from streams.freshness import SessionFreshness
from streams.log import EventLog


@dataclass
class Deps:
    settings: Settings
    log: EventLog
    watch: ArchiveWatch
    freshness: SessionFreshness
    pool: asyncpg.Pool
    owners: SessionOwners
    read_back: ReadBack  # what a write reads after its append (commands/read_back.py)
    embedder: Embedder
    query_vectors: QueryVectors
    write_budget: WriteBudget = field(default_factory=lambda: WriteBudget(0, 1))  # none unless given
    audit: AuditTrail = field(default_factory=RecordedAudit)
    summarizer: Summarizer = field(default_factory=ExtractiveSummarizer)  # Compact's
    refusals: RefusalBudget = field(default_factory=lambda: RefusalBudget(0, 1))  # none unless given

    async def append(self, event: Event, session: SessionRef | None, *,
                     retry: RetryAdvice = APPENDS_AGAIN) -> str | None:
        """Append and return once the event is archived and projected (streams/acknowledgement.py):
        the projector's outcome, or None when it must be read back; EventRejected when it was set aside.
        `session`: the session the event writes (its reads wait for it), None for an event of no session;
        `retry`: what a retry of the command does, told to a caller answered NOT_DURABLE_YET."""
        return await append_and_wait(self.log, self.watch, self.freshness, event, session,
                                     timeout=self.settings.ack_timeout_seconds, retry=retry)
