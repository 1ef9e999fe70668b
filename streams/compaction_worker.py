"""The compaction worker: a CompactionJob (or a compaction request found open) in, a
session.compacted event out, by the code the Compact RPC runs (inference/compaction.py).

What a job asks for is read from the read model, not from the job: a session is compacted only
while its compaction request is open (compaction_requests), so a job for a session compacted,
rolled back or back under its threshold since is a no-op, as is a redelivered one; a message_id
already handled here is not even read. At most one compaction of a session runs in a process at
a time (the job and the sweep of open requests could otherwise race), and across processes the
event carries the version it was planned at: the projector refuses the later of two (STALE).

The event is written as the session's owner scope (a compaction changes what every scope in the
session sees, so only the owner may ask for one) with actor `compaction-worker`, and the worker
waits for the projector's verdict, so what it counts (context_engine_compactions{trigger="job"})
is what happened. When a write came first (`session_changed`) it plans again from the new state,
up to PLAN_ATTEMPTS times.

A compaction refused for what the same state would refuse again (too few turns, too little saved,
the quality gate, a summary too large) closes its request with a session.compaction_refused event
naming the reason and the session's version, and AssembleContext opens no new one until the
session changes. One that failed otherwise (the summarizer down, no verdict in time, an error)
stays open and is tried again by the sweep of requests older than 10 minutes, every 30 s, until
COMPACTION_REQUEST_EXPIRY_SECONDS after it opened, when it is closed as refused ('expired'). With
COMPACTION_ON_THRESHOLD off, a job or an open request is closed as refused ('disabled'): only the
Compact RPC compacts.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import structlog

from context_engine import metrics
from context_engine.errors import DomainError
from context_engine.events import CompactionRefused, Event, SessionRef
from context_engine.scope import Scope
from inference.compaction import STRATEGIES, plan_sliding_window
from inference.summarizers import Summarizer
from projections.reads import compaction as compaction_reads
from projections.reads import sessions as queries
from projections.reads.compaction import WORKER_ACTOR
from projections.store.pool import SYSTEM_ORG, org_transaction

log = structlog.get_logger("context_engine.compaction")

HANDLED_MESSAGES = 100_000  # message ids remembered against redelivery
VERDICT_POLL_S = 0.05
PLAN_ATTEMPTS = 3
# Refusals the same state would give again: they close the request.
SETTLED_REFUSALS = frozenset({"nothing_to_compact", "insufficient_savings", "quality_guardrail_triggered",
                              "summary_too_large"})

SendEvent = Callable[[Event], Awaitable[None]]


class CompactionWorker:
    def __init__(self, pool: asyncpg.Pool, summarizer: Summarizer, send: SendEvent, *, enabled: bool,
                 keep_recent: int, max_content_bytes: int, verdict_timeout_s: float, min_savings: float = 0.1,
                 request_expiry_s: float = 3600.0) -> None:
        self.pool = pool
        self.summarizer = summarizer
        self.send = send
        self.enabled = enabled  # COMPACTION_ON_THRESHOLD
        self.keep_recent = keep_recent
        self.max_content_bytes = max_content_bytes
        self.verdict_timeout_s = verdict_timeout_s
        self.min_savings = min_savings  # COMPACTION_MIN_SAVINGS
        self.request_expiry = dt.timedelta(seconds=request_expiry_s)
        self._running: set[tuple[str, str]] = set()
        self._handled: collections.OrderedDict[str, None] = collections.OrderedDict()

    async def job(self, message_id: str, org_id: str, session_id: str, strategy: str) -> str:
        """Handle one CompactionJob; returns the outcome counted."""
        if message_id in self._handled:
            return self._count("duplicate")
        self._handled[message_id] = None
        while len(self._handled) > HANDLED_MESSAGES:
            self._handled.popitem(last=False)
        if strategy not in STRATEGIES:
            log.warning("compaction job with an unsupported strategy", org_id=org_id, session_id=session_id[:128],
                        strategy=strategy[:64])
            return self._count("unsupported_strategy")
        return await self.compact(org_id, session_id)

    async def open_requests(self, *, older_than: dt.timedelta,
                            page: int = 1000) -> AsyncIterator[tuple[str, str, str, dt.datetime]]:
        """(org, session, opening event, opened at) of every open request opened more than
        `older_than` ago, oldest first, a page at a time."""
        after = None
        while True:
            async with org_transaction(self.pool, SYSTEM_ORG, readonly=True) as conn:
                rows = await compaction_reads.open_requests(conn, older_than=older_than, after=after, limit=page)
            for row in rows:
                yield row
            if len(rows) < page:
                return
            after = (rows[-1][3], rows[-1][2])

    async def sweep(self, older_than: dt.timedelta) -> None:
        """Compact the sessions of the requests open for more than `older_than`; close, as
        expired, those open for longer than the expiry."""
        now = dt.datetime.now(dt.UTC)
        async for org_id, session_id, _opened_by, opened_at in self.open_requests(older_than=older_than):
            if now - opened_at > self.request_expiry:
                await self.compact(org_id, session_id, refusal="expired")
            else:
                await self.compact(org_id, session_id)

    async def compact(self, org_id: str, session_id: str, *, refusal: str = "") -> str:
        """Compact the session if its request is still open (close it as refused for `refusal`
        instead, or 'disabled' with compaction on threshold off); returns the outcome counted."""
        refusal = refusal or ("" if self.enabled else "disabled")
        key = (org_id, session_id)
        if key in self._running:
            return self._count("duplicate")
        self._running.add(key)
        try:
            outcome = await (self._refuse_open(org_id, session_id, refusal) if refusal
                             else self._compact(org_id, session_id))
        except Exception:
            log.exception("compaction failed; the request stays open", org_id=org_id, session_id=session_id[:128])
            outcome = "failed"
        finally:
            self._running.discard(key)
        return self._count(outcome)

    async def _compact(self, org_id: str, session_id: str) -> str:
        for _ in range(PLAN_ATTEMPTS):
            outcome = await self._compact_once(org_id, session_id)
            if outcome != "session_changed":
                return outcome
        return outcome

    async def _compact_once(self, org_id: str, session_id: str) -> str:
        # One snapshot: the request, the session's version and its turns as of one moment, so a
        # compaction committed meanwhile cannot give a plan at its new version for a closed request.
        async with org_transaction(self.pool, org_id, readonly=True, snapshot=True) as conn:
            request = await compaction_reads.open_request(conn, org_id, session_id)
            session = await queries.get_session(conn, org_id, session_id) if request else None
            if request is None or session is None:
                return "already_closed"
            turns = await queries.owner_turns(conn, org_id, session_id, session.scope_path)
            session_tokens = await queries.active_tokens(conn, org_id, session_id)
        try:
            plan = await plan_sliding_window(self.summarizer, session_id, turns, keep_recent=self.keep_recent,
                                             max_content_bytes=self.max_content_bytes, session_tokens=session_tokens,
                                             min_savings=self.min_savings)
        except DomainError as exc:
            reason = exc.reason.lower()
            settled = reason in SETTLED_REFUSALS
            log.info("compaction refused", org_id=org_id, session_id=session_id[:128], reason=exc.reason,
                     request="closed" if settled else "stays open", detail=str(exc)[:500])
            if settled:
                await self._refuse(org_id, session_id, session.scope_path, request, session.version, reason,
                                   exc.message)
            return reason
        owner = Scope.from_path(session.scope_path)
        event = Event.of(plan.event_body(session.version, "sliding_window", self.summarizer.name),
                         scope=owner, actor=WORKER_ACTOR, aggregate=SessionRef(org_id, session_id).aggregate,
                         event_id=plan.compaction_id)
        await self.send(event)
        verdict = await self._verdict(org_id, event.event_id)
        if verdict is None:
            log.warning("compaction appended, the projector's verdict not seen in time", org_id=org_id,
                        session_id=session_id[:128], event_id=event.event_id)
            return "unconfirmed"
        return "compacted" if verdict else "session_changed"

    async def _refuse_open(self, org_id: str, session_id: str, reason: str) -> str:
        """Close the session's open request as refused for `reason`, at its current version."""
        async with org_transaction(self.pool, org_id, readonly=True, snapshot=True) as conn:
            request = await compaction_reads.open_request(conn, org_id, session_id)
            session = await queries.get_session(conn, org_id, session_id) if request else None
        if request is None or session is None:
            return "already_closed"
        detail = {"disabled": "compaction on threshold is off (COMPACTION_ON_THRESHOLD)",
                  "expired": "not served within COMPACTION_REQUEST_EXPIRY_SECONDS"}.get(reason, "")
        await self._refuse(org_id, session_id, session.scope_path, request, session.version, reason, detail)
        return reason

    async def _refuse(self, org_id: str, session_id: str, owner_path: str, request: str, version: str, reason: str,
                      detail: str) -> None:
        """Close the request with a session.compaction_refused event, written as the owner scope."""
        body = CompactionRefused(session_id, request, version, reason, detail[:1000])
        await self.send(Event.of(body, scope=Scope.from_path(owner_path), actor=WORKER_ACTOR,
                                 aggregate=SessionRef(org_id, session_id).aggregate))

    async def _verdict(self, org_id: str, event_id: str) -> bool | None:
        deadline = time.monotonic() + self.verdict_timeout_s
        while True:
            async with org_transaction(self.pool, org_id, readonly=True) as conn:
                verdict = await compaction_reads.compaction_applied(conn, org_id, event_id)
            if verdict is not None or time.monotonic() > deadline:
                return verdict
            await asyncio.sleep(VERDICT_POLL_S)

    @staticmethod
    def _count(outcome: str) -> str:
        metrics.COMPACTIONS.labels("job", outcome).inc()
        return outcome
