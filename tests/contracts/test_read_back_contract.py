"""The read-back port's contract (commands/read_back.py): what IngestEvent and PushContext read
after an append, and the outcomes that leave those rows, on every backend.

`ReadBackContract` holds the cases; each subclass supplies its backend through the `backend`
factory hook: the in-memory fake the handlers' unit tests use (tests/fixtures/fakes.py), the
PostgreSQL read models on the embedded server, and on an external one
(CONTEXT_ENGINE_TEST_DATABASE_URL; `make test-external`). On PostgreSQL the events go through
the real projector (`apply_batch`) and are read back as the API reads them: the app role, under
row-level security, in the org's transaction.

- an event is archived whatever its outcome, and read back only in its own org;
- APPLIED leaves the row the handler answers with; DUPLICATE, OUT_OF_SCOPE (a session created by
  a scope the writer is not within) and IDEMPOTENCY_KEY_TAKEN leave none for their event;
- a client's key is read back per session and writer scope, as the projector scopes it;
- ids that are not UUIDs, and empty keys, read back nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass

import asyncpg
import pytest

from commands.read_back import PostgresReadBack, ReadBack
from context_engine.events import Event
from context_engine.scope import Scope
from projections.projector.batch import apply_batch
from projections.store.migrations import APP_ROLE, app_url
from projections.store.pool import create_pool
from tests.fixtures.fakes import InMemoryReadBack
from tests.fixtures.infra import APP_PASSWORD
from tests.fixtures.projector_log import Log, ingest, keyed, new_org, push


@dataclass
class Backend:
    read_back: ReadBack
    project: Callable[[Event], Awaitable[str]]  # the projector: archive and apply; the outcome


def at(org: str, team: str, agent: str = "") -> Scope:
    """A team's scope, or with `agent` an agent's below it."""
    return Scope(org, "pillar", team, agent)


def moved(ev: Event, scope: Scope) -> Event:
    """The same request written at another scope (a new event id)."""
    return Event.of(ev.body, scope=scope, actor=ev.actor, aggregate=ev.aggregate)


class ReadBackContract:
    @pytest.fixture
    def backend(self) -> Iterator[Backend] | AsyncIterator[Backend]:
        raise NotImplementedError("the factory hook: a subclass gives its backend")

    async def test_an_applied_ingest_is_archived_and_read_back_as_written(self, backend: Backend) -> None:
        org = new_org()
        ev = keyed(org, "s", "hello there", "k-1")
        assert await backend.project(ev) == "APPLIED"
        archived = await backend.read_back.archived(org, ev.event_id)
        assert archived is not None
        assert (archived.event_id, archived.type, archived.aggregate, archived.content_hash) == (
            ev.event_id, ev.type, ev.aggregate, ev.content_hash)
        row = await backend.read_back.ingested(org, ev.event_id)
        assert row is not None
        p = ev.payload
        assert (row.event_id, row.session_id, row.scope_path, row.event_type, row.content, row.metadata,
                row.content_sha256, row.token_count, row.idempotency_key) == (
            ev.event_id, "s", ev.scope.path, p["event_type"], b"hello there", p["metadata"],
            p["content_sha256"], p["token_count"], "k-1")
        assert await backend.read_back.ingested_with_key(org, "k-1", "s", ev.scope.path) == row

    async def test_a_pushed_memory_is_read_back_as_written(self, backend: Backend) -> None:
        org = new_org()
        ev = push(org, "s", "prefers email")
        assert await backend.project(ev) == "APPLIED"
        row = await backend.read_back.pushed(org, ev.event_id)
        assert row is not None
        assert (row.event_id, row.scope_path, row.session_id, row.memory_type, row.content_sha256, row.metadata) == (
            ev.event_id, ev.scope.path, "s", "semantic", ev.payload["content_sha256"], {"src": "test"})
        assert await backend.read_back.ingested(org, ev.event_id) is None  # a memory is not a session event

    async def test_nothing_is_read_back_in_another_org(self, backend: Backend) -> None:
        org, other = new_org(), new_org()
        ingested, pushed = keyed(org, "s", "mine", "k-1"), push(org, "s2", "mine too")
        for ev in (ingested, pushed):
            assert await backend.project(ev) == "APPLIED"
        assert await backend.read_back.archived(other, ingested.event_id) is None
        assert await backend.read_back.ingested(other, ingested.event_id) is None
        assert await backend.read_back.ingested_with_key(other, "k-1", "s", ingested.scope.path) is None
        assert await backend.read_back.pushed(other, pushed.event_id) is None

    async def test_a_duplicate_changes_nothing(self, backend: Backend) -> None:
        org = new_org()
        ev = ingest(org, "s", "once")
        assert [await backend.project(ev), await backend.project(ev)] == ["APPLIED", "DUPLICATE"]
        row = await backend.read_back.ingested(org, ev.event_id)
        assert row is not None and row.content == b"once"

    @pytest.mark.parametrize("kind", ["ingest", "push"])
    async def test_a_write_outside_the_sessions_owner_scope_is_archived_not_applied(
            self, backend: Backend, kind: str) -> None:
        org = new_org()
        first = ingest(org, "s", "created by team a") if kind == "ingest" else push(org, "s", "created by team a")
        first = moved(first, at(org, "team-a"))
        assert await backend.project(first) == "APPLIED"
        below, sibling = moved(first, at(org, "team-a", "bot-2")), moved(first, at(org, "team-b"))
        assert [await backend.project(below), await backend.project(sibling)] == ["APPLIED", "OUT_OF_SCOPE"]
        projected = backend.read_back.ingested if kind == "ingest" else backend.read_back.pushed
        assert await backend.read_back.archived(org, sibling.event_id) is not None
        assert await projected(org, sibling.event_id) is None
        assert await projected(org, below.event_id) is not None

    async def test_a_key_is_taken_once_per_session_and_writer_scope(self, backend: Backend) -> None:
        org = new_org()
        won = keyed(org, "s", "first", "k-1", at=at(org, "team"))
        lost = keyed(org, "s", "second", "k-1", at=at(org, "team"))
        below = keyed(org, "s", "third", "k-1", at=at(org, "team", "bot-2"))
        elsewhere = keyed(org, "s2", "fourth", "k-1", at=at(org, "team"))
        outcomes = [await backend.project(ev) for ev in (won, lost, below, elsewhere)]
        assert outcomes == ["APPLIED", "IDEMPOTENCY_KEY_TAKEN", "APPLIED", "APPLIED"]
        assert await backend.read_back.archived(org, lost.event_id) is not None
        assert await backend.read_back.ingested(org, lost.event_id) is None
        for ev in (won, below, elsewhere):
            row = await backend.read_back.ingested_with_key(org, "k-1", ev.payload["session_id"], ev.scope.path)
            assert row is not None and row.event_id == ev.event_id
        assert await backend.read_back.ingested_with_key(org, "k-1", "s3", won.scope.path) is None
        assert await backend.read_back.ingested_with_key(org, "k-1", "s", at(org, "team-b").path) is None

    @pytest.mark.parametrize("event_id", ["", "not-a-uuid", "\x00", "x" * 10_000, str(uuid.uuid4())])
    async def test_unknown_or_malformed_ids_and_empty_keys_read_back_nothing(
            self, backend: Backend, event_id: str) -> None:
        org = new_org()
        ev = ingest(org, "s", "something")
        assert await backend.project(ev) == "APPLIED"
        assert await backend.read_back.archived(org, event_id) is None
        assert await backend.read_back.ingested(org, event_id) is None
        assert await backend.read_back.pushed(org, event_id) is None
        assert await backend.read_back.ingested_with_key(org, "", "s", ev.scope.path) is None


class TestInMemoryReadBack(ReadBackContract):
    @pytest.fixture
    def backend(self) -> Iterator[Backend]:
        fake = InMemoryReadBack()

        async def project(ev: Event) -> str:
            return fake.project(ev)

        yield Backend(fake, project)


class PostgresReadBackContract(ReadBackContract):
    """The real projector writing as the worker does, the port reading as the API does, on the
    database a subclass gives (`database`, a migrated database's superuser URL)."""

    @pytest.fixture
    def database(self) -> str:
        raise NotImplementedError("the factory hook: a subclass gives its database")

    @pytest.fixture
    async def backend(self, database: str) -> AsyncIterator[Backend]:
        log = Log()
        conn = await asyncpg.connect(database)
        pool = await create_pool(app_url(database, APP_ROLE, APP_PASSWORD), max_size=2)
        try:
            async def project(ev: Event) -> str:
                [applied] = await apply_batch(conn, log.append(ev))
                return str(getattr(applied.outcome, "value", applied.outcome))

            yield Backend(PostgresReadBack(pool), project)
        finally:
            await pool.close()
            await conn.close()


@pytest.mark.integration
class TestEmbeddedPostgresReadBack(PostgresReadBackContract):
    @pytest.fixture
    def database(self, embedded_database: str) -> str:
        return embedded_database


@pytest.mark.integration
class TestExternalPostgresReadBack(PostgresReadBackContract):
    @pytest.fixture
    def database(self, external_database: str) -> str:
        return external_database
