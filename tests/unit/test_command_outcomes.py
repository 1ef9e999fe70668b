"""IngestEvent's answer for each thing the log and the projector can say, with the fakes at the
adapter seam (tests/fixtures/fakes.py: the Deps' `log`, `watch` and `read_back`): no broker, no
database.

The fake watch plays the projector: by default the in-memory read-back's own projector, whose
outcomes and rows are held to PostgreSQL's (tests/contracts/test_read_back_contract.py); a test
that needs another order of events (a race) decides the outcome itself.
"""

from __future__ import annotations

import dataclasses
import types
import uuid

import pytest

from commands.deps import Deps
from commands.idempotency import event_key
from commands.ingest_event import IngestEvent, ingest_event
from commands.push_context import PushContext, push_context
from commands.write_budget import WriteBudget
from context_engine.auth import Principal
from context_engine.errors import FailedPrecondition, PermissionDenied, Unavailable
from context_engine.events import EVENT_INGESTED, Event
from context_engine.hashing import sha256_hex
from context_engine.scope import Scope
from streams.acknowledgement import EventRejected
from streams.freshness import SessionFreshness
from tests.fixtures.fakes import AnyoneWrites, FakeLog, FakeWatch, InMemoryReadBack

ORG = "org-1"
WRITER = Scope(ORG, "pillar", "team", "bot-1")


@dataclasses.dataclass
class World:
    deps: Deps
    log: FakeLog
    watch: FakeWatch
    reads: InMemoryReadBack


@pytest.fixture
def world() -> World:
    reads, log = InMemoryReadBack(), FakeLog()
    watch = FakeWatch(log, reads.project)
    settings = types.SimpleNamespace(max_content_bytes=1 << 20, ack_timeout_seconds=1.0)
    deps = Deps(settings, log, watch, SessionFreshness(1.0), pool=None, owners=AnyoneWrites(), read_back=reads,
                embedder=None, query_vectors=None, write_budget=WriteBudget(0, 1))
    return World(deps, log, watch, reads)


def principal(scope: Scope = WRITER) -> Principal:
    return Principal("user-1", scope, 1)


def command(content: bytes = b"hello world", key: str = "", session: str = "s") -> IngestEvent:
    return IngestEvent(session, "message", content, {"n": "1"}, key)


async def first_call(world: World, cmd: IngestEvent) -> Event:
    """Run `cmd` once, as the winner of a race would have, and take its rows out again: the
    winner has not landed yet when the loser looks first. Returns the winner's event."""
    await ingest_event(world.deps, principal(), cmd)
    winner = world.log.appended[-1]
    world.reads.forget(winner)
    return winner


# -- the outcomes --------------------------------------------------------------------------------


async def test_applied_answers_with_the_new_event(world: World) -> None:
    done = await ingest_event(world.deps, principal(), command(b"hello world"))
    [ev] = world.log.appended
    assert ev.type == EVENT_INGESTED and ev.scope == WRITER and ev.payload["session_id"] == "s"
    assert (done.event_id, done.version_hash, done.token_count) == (
        ev.event_id, sha256_hex(b"hello world"), ev.payload["token_count"])
    assert not world.watch.waiting


async def test_out_of_scope_is_the_session_of_another_scope(world: World) -> None:
    """Another scope created the session between this call's check and its append."""
    sibling = Scope(ORG, "pillar", "other-team", "bot-2")

    def raced(ev: Event) -> str | None:
        world.reads.project(Event.of(ev.body, scope=sibling, actor="user-2", aggregate=ev.aggregate))
        return world.reads.project(ev)

    world.watch.decide = raced
    with pytest.raises(PermissionDenied) as refused:
        await ingest_event(world.deps, principal(), command())
    assert refused.value.reason == "SESSION_OUT_OF_SCOPE"


async def test_a_key_taken_by_a_concurrent_call_answers_with_the_winners_event(world: World) -> None:
    """Two calls with one idempotency key raced; the other's event won the key in the projector
    (IDEMPOTENCY_KEY_TAKEN): this call answers with the winner's event, read back."""
    winner = await first_call(world, command(key="k-1"))
    outcomes: list[str] = []

    def lost(ev: Event) -> str:
        world.reads.project(winner)
        outcomes.append(world.reads.project(ev))
        return outcomes[-1]

    world.watch.decide = lost
    done = await ingest_event(world.deps, principal(), command(key="k-1"))
    assert done.event_id == winner.event_id != world.log.appended[-1].event_id
    assert outcomes == ["IDEMPOTENCY_KEY_TAKEN"]


async def test_a_key_taken_with_other_content_is_refused_as_reused(world: World) -> None:
    winner = await first_call(world, command(b"first content", key="k-1"))
    world.watch.decide = lambda ev: (world.reads.project(winner), world.reads.project(ev))[1]
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
    # The refused append had reached the log after all: the first copy lands, the retry's is a DUPLICATE.
    world.watch.decide = lambda ev: (world.reads.project(ev), world.reads.project(ev))[1]
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


# -- PushContext's keys, read back through the same port ------------------------------------------


def push(content: bytes = b"prefers email", key: str = "") -> PushContext:
    return PushContext("s", "semantic", content, {"src": "t"}, key)


async def test_a_retried_push_answers_with_the_first_version_without_appending(world: World) -> None:
    first = await push_context(world.deps, principal(), push(key="p-1"))
    again = await push_context(world.deps, principal(), push(key="p-1"))
    assert again == first and len(world.log.appended) == 1


async def test_a_push_key_sent_with_other_content_is_refused_as_reused(world: World) -> None:
    await push_context(world.deps, principal(), push(b"prefers email", key="p-1"))
    with pytest.raises(FailedPrecondition) as refused:
        await push_context(world.deps, principal(), push(b"prefers phone", key="p-1"))
    assert refused.value.reason == "IDEMPOTENCY_KEY_REUSED"
    assert refused.value.metadata["event_id"] == world.log.appended[0].event_id and len(world.log.appended) == 1


async def test_a_sibling_push_with_the_same_key_is_another_request(world: World) -> None:
    """The key names a request of one writer: a sibling scope's push is its own event, refused
    by the session's owner scope (OUT_OF_SCOPE), never answered with the first push's version."""
    await push_context(world.deps, principal(), push(key="p-1"))
    sibling = principal(Scope(ORG, "pillar", "other-team", "bot-2"))
    with pytest.raises(PermissionDenied) as refused:
        await push_context(world.deps, sibling, push(key="p-1"))
    assert refused.value.reason == "SESSION_OUT_OF_SCOPE"
    assert len({ev.event_id for ev in world.log.appended}) == 2
