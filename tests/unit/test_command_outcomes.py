"""IngestEvent's answer for each thing the log and the projector can say, with fakes at the adapter
seam (the Deps' `log` and `watch`, and a read model in memory): no broker, no database.

The fake watch plays the projector: it decides the appended event's outcome and, like the real
projector, writes what that outcome leaves (the winner's row for a race lost) before answering.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import itertools
import types
import uuid
from collections.abc import Callable

import pytest

from commands.deps import Deps
from commands.idempotency import event_key
from commands.ingest_event import IngestEvent, ingest_event
from commands.write_budget import WriteBudget
from context_engine.auth import Principal
from context_engine.errors import FailedPrecondition, PermissionDenied, Unavailable
from context_engine.events import EVENT_INGESTED, Event
from context_engine.hashing import sha256_hex
from context_engine.scope import Scope
from projections.reads import sessions
from streams.acknowledgement import EventRejected
from streams.freshness import SessionFreshness
from streams.log import LogPosition

ORG = "org-1"
WRITER = Scope(ORG, "pillar", "team", "bot-1")
NOW = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)


class ReadModel:
    """The rows the commands read back: projected events and the archive, by event id."""

    def __init__(self) -> None:
        self.events: dict[str, sessions.SessionEvent] = {}
        self.archived: dict[str, sessions.ArchivedEvent] = {}

    def project(self, ev: Event) -> None:
        """What APPLIED leaves: the archived event and its session_events row."""
        self.archive(ev)
        p = ev.payload
        self.events[ev.event_id] = sessions.SessionEvent(
            event_id=ev.event_id, org_id=ev.scope.org_id, session_id=p["session_id"], seq=len(self.events) + 1,
            scope_path=ev.scope.path, event_type=p["event_type"], content=base64.b64decode(p["content_b64"]),
            metadata=p["metadata"], content_sha256=p["content_sha256"], token_count=p["token_count"],
            version="v" * 64, occurred_at=NOW, active=True, idempotency_key=p.get("idempotency_key") or None)

    def archive(self, ev: Event) -> None:
        self.archived[ev.event_id] = sessions.ArchivedEvent(
            event_id=ev.event_id, org_id=ev.scope.org_id, topic="t", partition=0, offset=0,
            aggregate=ev.aggregate, type=ev.type, schema_version=1, occurred_at=NOW, actor=ev.actor,
            content_hash=ev.content_hash, raw=ev.to_bytes(), archived_at=NOW)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        async def event_by_id(conn, org_id, event_id):
            return self.events.get(event_id)

        async def archived_event(conn, org_id, event_id):
            return self.archived.get(event_id)

        async def event_by_idempotency_key(conn, org_id, key, session_id=None, writer_scope_path=None):
            return next((e for e in self.events.values() if e.idempotency_key == key
                         and session_id in (None, e.session_id) and writer_scope_path in (None, e.scope_path)),
                        None)

        monkeypatch.setattr(sessions, "event_by_id", event_by_id)
        monkeypatch.setattr(sessions, "archived_event", archived_event)
        monkeypatch.setattr(sessions, "event_by_idempotency_key", event_by_idempotency_key)


class FakeConnection:
    def get_settings(self):
        return types.SimpleNamespace(standard_conforming_strings="on")

    async def execute(self, sql: str, *args) -> str:
        return ""

    def is_closed(self) -> bool:
        return False

    def is_in_transaction(self) -> bool:
        return True


class FakePool:
    def acquire(self):
        class Acquired:
            async def __aenter__(self):
                return FakeConnection()

            async def __aexit__(self, *exc):
                return False

        return Acquired()


class FakeLog:
    """Appends in memory; `refuse` makes every append fail as the real log does when the broker is gone."""

    def __init__(self) -> None:
        self.appended: list[Event] = []
        self.refuse: Unavailable | None = None
        self._offsets = itertools.count()

    async def append(self, event: Event) -> LogPosition:
        if self.refuse is not None:
            raise self.refuse
        self.appended.append(event)
        return LogPosition("t.events", 0, next(self._offsets))


class FakeWatch:
    """The projector's word on each appended event: `decide(event)` returns its outcome (None: the
    caller must read back) after writing the rows that outcome leaves."""

    def __init__(self, log: FakeLog, decide: Callable[[Event], str | None]) -> None:
        self.log = log
        self.decide = decide
        self.waiting: set[str] = set()

    def expect(self, event_id: str) -> None:
        self.waiting.add(event_id)

    def forget(self, event_id: str) -> None:
        self.waiting.discard(event_id)

    async def wait(self, event_id: str, org_id: str, position: LogPosition, *, timeout: float, retry=None):
        self.waiting.discard(event_id)
        return self.decide(self.log.appended[-1])


class Owners:
    async def require_writable(self, caller: Scope, session_id: str) -> None:
        return None


@dataclasses.dataclass
class World:
    deps: Deps
    log: FakeLog
    watch: FakeWatch
    reads: ReadModel


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> World:
    reads, log = ReadModel(), FakeLog()
    watch = FakeWatch(log, lambda ev: (reads.project(ev), "APPLIED")[1])
    reads.install(monkeypatch)
    settings = types.SimpleNamespace(max_content_bytes=1 << 20, ack_timeout_seconds=1.0)
    deps = Deps(settings, log, watch, SessionFreshness(1.0), FakePool(), Owners(), embedder=None,
                query_vectors=None, write_budget=WriteBudget(0, 1))
    return World(deps, log, watch, reads)


def principal(scope: Scope = WRITER) -> Principal:
    return Principal("user-1", scope, 1)


def command(content: bytes = b"hello world", key: str = "", session: str = "s") -> IngestEvent:
    return IngestEvent(session, "message", content, {"n": "1"}, key)


async def first_call(world: World, cmd: IngestEvent) -> Event:
    """Run `cmd` once, as the winner of a race would have: projected; returns its event."""
    await ingest_event(world.deps, principal(), cmd)
    return world.log.appended[-1]


# -- the outcomes --------------------------------------------------------------------------------


async def test_applied_answers_with_the_new_event(world: World) -> None:
    done = await ingest_event(world.deps, principal(), command(b"hello world"))
    [ev] = world.log.appended
    assert ev.type == EVENT_INGESTED and ev.scope == WRITER and ev.payload["session_id"] == "s"
    assert (done.event_id, done.version_hash, done.token_count) == (
        ev.event_id, sha256_hex(b"hello world"), ev.payload["token_count"])
    assert not world.watch.waiting


async def test_out_of_scope_is_the_session_of_another_scope(world: World) -> None:
    world.watch.decide = lambda ev: (world.reads.archive(ev), "OUT_OF_SCOPE")[1]
    with pytest.raises(PermissionDenied) as refused:
        await ingest_event(world.deps, principal(), command())
    assert refused.value.reason == "SESSION_OUT_OF_SCOPE"


async def test_a_key_taken_by_a_concurrent_call_answers_with_the_winners_event(world: World) -> None:
    """Two calls with one idempotency key raced; the other's event won the key in the projector
    (IDEMPOTENCY_KEY_TAKEN): this call answers with the winner's event, read back."""
    winner = await first_call(world, command(key="k-1"))
    world.reads.events.pop(winner.event_id)  # not landed yet when the loser looks first

    def lost(ev: Event) -> str:
        world.reads.project(winner)
        world.reads.archive(ev)
        return "IDEMPOTENCY_KEY_TAKEN"

    world.watch.decide = lost
    done = await ingest_event(world.deps, principal(), command(key="k-1"))
    assert done.event_id == winner.event_id != world.log.appended[-1].event_id


async def test_a_key_taken_with_other_content_is_refused_as_reused(world: World) -> None:
    winner = await first_call(world, command(b"first content", key="k-1"))
    world.reads.events.pop(winner.event_id)
    world.watch.decide = lambda ev: (world.reads.project(winner), world.reads.archive(ev), "IDEMPOTENCY_KEY_TAKEN")[2]
    with pytest.raises(FailedPrecondition) as refused:
        await ingest_event(world.deps, principal(), command(b"other content", key="k-1"))
    assert refused.value.reason == "IDEMPOTENCY_KEY_REUSED"
    assert refused.value.metadata["event_id"] == winner.event_id


async def test_a_retry_of_a_landed_key_answers_without_appending(world: World) -> None:
    first = await ingest_event(world.deps, principal(), command(key="k-1"))
    again = await ingest_event(world.deps, principal(), command(key="k-1"))
    assert again == first and len(world.log.appended) == 1


async def test_a_retried_server_key_that_lands_as_a_duplicate_answers_with_the_first(world: World) -> None:
    """The caller sent no key, was told UNAVAILABLE with the server's key, and retries with it
    while its first append lands: the retry's copy is a DUPLICATE; the answer is the first's."""
    world.log.refuse = Unavailable("the event log is unavailable", reason="LOG_UNAVAILABLE")
    with pytest.raises(Unavailable) as refused:
        await ingest_event(world.deps, principal(), command())
    key = refused.value.metadata["idempotency_key"]
    event_id = refused.value.metadata["event_id"]
    assert key == event_key(event_id)

    world.log.refuse = None
    world.watch.decide = lambda ev: (world.reads.project(ev), "DUPLICATE")[1]  # the first landed meanwhile
    done = await ingest_event(world.deps, principal(), command(key=key))
    assert done.event_id == event_id == world.log.appended[-1].event_id


async def test_a_rejected_event_is_event_rejected(world: World) -> None:
    world.watch.decide = lambda ev: "REJECTED"
    with pytest.raises(EventRejected) as refused:
        await ingest_event(world.deps, principal(), command())
    assert refused.value.reason == "EVENT_REJECTED"
    assert refused.value.metadata["event_id"] == world.log.appended[-1].event_id


async def test_an_outcome_to_read_back_is_read_back(world: World) -> None:
    """The notification was missed and the archive said only 'archived' (None): the answer comes
    from the read model."""
    world.watch.decide = lambda ev: (world.reads.project(ev), None)[1]
    done = await ingest_event(world.deps, principal(), command(key="k-1"))
    assert done.event_id == world.log.appended[-1].event_id


async def test_an_unavailable_log_is_unavailable_with_what_a_retry_does(world: World) -> None:
    world.log.refuse = Unavailable("the event log is unavailable", reason="LOG_UNAVAILABLE")
    with pytest.raises(Unavailable) as refused:
        await ingest_event(world.deps, principal(), command(key="k-9"))
    assert refused.value.reason == "LOG_UNAVAILABLE"
    assert refused.value.metadata["idempotency_key"] == "k-9" and uuid.UUID(refused.value.metadata["event_id"])
    assert "retry with idempotency-key k-9" in refused.value.message
    assert not world.watch.waiting  # nobody is left waiting for it
