"""The projection store's contract, on every PostgreSQL (tests/contracts/backends.py): what
`apply_batch(conn, records, ...)` over the migrated schema promises the worker and the commands.

- idempotent on event id: a batch applied again, or its events redelivered at other offsets,
  changes no row, and each is DUPLICATE;
- projector_offsets holds the highest offset applied per partition, written in the batch's own
  transaction: a batch that fails leaves rows and offsets as they were;
- version hashes are the reference chain: `context_engine.hashing` genesis_version/next_version
  computed here from the events, rollbacks included, independently of the projector;
- rollback and snapshot outcomes: UNKNOWN_TARGET, OUT_OF_SCOPE (another scope), SNAPSHOT_NAME_TAKEN,
  none of which changes a read model;
- the batch's notification is heard only after its COMMIT, and never for a rolled-back batch.

Outcomes are compared with their strings, which are the contract (the waiting command reads them
off the notification). Cases of one projection rule each (poison records, upcasting, RLS, replay,
retrieval rows) stay in tests/integration/test_session_projector.py.
"""

from __future__ import annotations

import asyncio
import random
import uuid

import asyncpg
import pytest

from context_engine.events import (
    EVENT_INGESTED,
    MEMORY_PUSHED,
    SESSION_ROLLED_BACK,
    SNAPSHOT_CREATED,
    Event,
    session_aggregate,
)
from context_engine.hashing import genesis_version, next_version
from context_engine.scope import Scope
from projections.projector.batch import apply_batch
from projections.projector.records import LogRecord
from tests.fixtures.projector_log import Log, ingest, keyed, new_org, push, rollback, snapshot
from tests.security.row_counts import changed, row_counts

pytestmark = pytest.mark.integration


async def offsets(conn: asyncpg.Connection, topic: str) -> dict[int, int]:
    return {r["partition"]: r["offset"] for r in await conn.fetch(
        "SELECT partition, \"offset\" FROM projector_offsets WHERE projector = 'session' AND topic = $1", topic)}


def highest(records: list[LogRecord]) -> dict[int, int]:
    out: dict[int, int] = {}
    for r in records:
        out[r.partition] = max(out.get(r.partition, -1), r.offset)
    return out


def outcomes(applied) -> list[str]:
    return [str(getattr(a.outcome, "value", a.outcome)) for a in applied]


# -- the reference chain -----------------------------------------------------------------------


class ReferenceChain:
    """What the chain must be, from the events alone: v0 = genesis_version("org/session"); an
    ingest or push moves the version to next_version(version, content_hash); a rollback to a
    version the session has had makes it the version again (APPLIED), else changes nothing
    (UNKNOWN_TARGET)."""

    def __init__(self, org: str) -> None:
        self.org = org
        self.current: dict[str, str] = {}
        self.had: dict[str, set[str]] = {}

    def version(self, session: str) -> str:
        if session not in self.current:
            self.current[session] = genesis_version(f"{self.org}/{session}")
            self.had[session] = {self.current[session]}
        return self.current[session]

    def apply(self, ev: Event) -> tuple[str, str | None]:
        session = ev.payload["session_id"]
        now = self.version(session)
        if ev.type in (EVENT_INGESTED, MEMORY_PUSHED):
            self.current[session] = next_version(now, ev.content_hash)
            self.had[session].add(self.current[session])
            return "APPLIED", self.current[session]
        assert ev.type == SESSION_ROLLED_BACK
        target = ev.payload["target_version"]
        if target not in self.had[session]:
            return "UNKNOWN_TARGET", None
        self.current[session] = target
        return "APPLIED", target


class ProjectionStoreContract:
    """The cases; a subclass gives the migrated database (`database`, a superuser URL)."""

    @pytest.fixture
    def database(self) -> str:
        raise NotImplementedError("the factory hook: a subclass gives its database")


    async def test_version_hashes_equal_the_reference_chain(self, conn: asyncpg.Connection) -> None:
        """A random log of three sessions (ingests, pushes, rollbacks to versions each had, to another
        session's and to none), applied in batches of random cuts: every outcome and version is the
        reference's, and so is every session's final version and its chain of items."""
        rng, org, log = random.Random(20), new_org(), Log()
        ref, events, expected = ReferenceChain(org), [], []
        for i in range(80):
            session = rng.choice(["s0", "s1", "s2"])
            roll = rng.random() if session in ref.current else 0.0  # a session begins with an ingest
            if roll < 0.6:
                ev = ingest(org, session, f"event {i}")
            elif roll < 0.8:
                ev = push(org, session, f"memory {i}")
            elif roll < 0.9:
                ref.version(session)
                ev = rollback(org, session, rng.choice(sorted(ref.had[session])))
            else:
                other = next(s for s in ("s0", "s1", "s2") if s != session)
                ref.version(other)
                ev = rollback(org, session, rng.choice(sorted(ref.had[other] - ref.had.get(session, set()))
                                                       or ["0" * 64]))
            events.append(ev)
            expected.append(ref.apply(ev))
        assert {"UNKNOWN_TARGET"} <= {o for o, _ in expected}
        assert any(o == "APPLIED" and ev.type == SESSION_ROLLED_BACK for ev, (o, _) in zip(events, expected))
        records = log.append(*events)
        applied, start = [], 0
        while start < len(records):
            cut = rng.randint(1, 12)
            applied += await apply_batch(conn, records[start:start + cut])
            start += cut

        assert [(o, a.version if o == "APPLIED" else None) for o, a in zip(outcomes(applied), applied)] == expected
        for session, version in ref.current.items():
            assert await conn.fetchval("SELECT version FROM sessions WHERE org_id = $1 AND session_id = $2",
                                       org, session) == version
            # Every item's version is its chain's next step from its predecessor's (or genesis).
            items = await conn.fetch("SELECT seq, prev_seq, version, event_id FROM session_items "
                                     "WHERE org_id = $1 AND session_id = $2 ORDER BY seq", org, session)
            assert [r["version"] for r in items] == [
                v for ev, (o, v) in zip(events, expected)
                if ev.payload["session_id"] == session and ev.type != SESSION_ROLLED_BACK]
            by_seq = {r["seq"]: r["version"] for r in items}
            content_hash = {ev.event_id: ev.content_hash for ev in events}
            for r in items:
                before = by_seq[r["prev_seq"]] if r["prev_seq"] else genesis_version(f"{org}/{session}")
                assert r["version"] == next_version(before, content_hash[str(r["event_id"])])


    # -- idempotence -------------------------------------------------------------------------------

    async def test_a_batch_applied_again_or_redelivered_elsewhere_changes_nothing(
            self, conn: asyncpg.Connection, database: str) -> None:
        org, log = new_org(), Log()
        first = ingest(org, "s", "first")
        v1 = next_version(genesis_version(f"{org}/s"), first.content_hash)
        events = [first, push(org, "s", "a memory"), snapshot(org, "s", "kept"), rollback(org, "s", v1),
                  ingest(org, "s2", "another session"), keyed(org, "s", "keyed", "k-1")]
        records = log.append(*events)
        assert outcomes(await apply_batch(conn, records)) == ["APPLIED"] * len(events)
        before, offsets_before = await row_counts(database), await offsets(conn, log.topic)

        assert outcomes(await apply_batch(conn, records)) == ["DUPLICATE"] * len(events)
        assert changed(before, await row_counts(database)) == {}
        assert await offsets(conn, log.topic) == offsets_before

        elsewhere = log.append(*events)  # the same events at new offsets: a producer's retry, a restore
        assert outcomes(await apply_batch(conn, elsewhere)) == ["DUPLICATE"] * len(events)
        assert changed(before, await row_counts(database)) == {}
        assert await offsets(conn, log.topic) == highest(elsewhere)  # the partitions still move on

        twice = ingest(org, "s", "twice in one batch")
        assert outcomes(await apply_batch(conn, log.append(twice, twice))) == ["APPLIED", "DUPLICATE"]


    # -- offsets -----------------------------------------------------------------------------------

    async def test_offsets_are_the_highest_applied_per_partition(self, conn: asyncpg.Connection) -> None:
        org, log = new_org(), Log()
        records = log.append(*(ingest(org, f"s{i % 5}", f"event {i}") for i in range(30)))
        assert len({r.partition for r in records}) > 1
        for start in range(0, 30, 7):  # batches that cut across partitions
            await apply_batch(conn, records[start:start + 7])
            assert await offsets(conn, log.topic) == highest(records[:start + 7])
        await apply_batch(conn, records[:5])  # a redelivery from further back never moves them back
        assert await offsets(conn, log.topic) == highest(records)

    async def test_a_failed_batch_leaves_rows_and_offsets_as_they_were(
            self, conn: asyncpg.Connection, database: str) -> None:
        """The batch fails at its last moment, every row written and only the COMMIT to go (its
        announcement cannot be rendered): nothing of it stays, offsets included, and the retry applies
        it in full."""
        org, log = new_org(), Log()
        await apply_batch(conn, log.append(ingest(org, "s", "committed")))
        batch = log.append(ingest(org, "s", "lost with its batch"), push(org, "s", "m"), snapshot(org, "s", "n"))
        before, offsets_before = await row_counts(database), await offsets(conn, log.topic)

        def failing(applied):
            raise RuntimeError("the announcement failed")

        with pytest.raises(RuntimeError, match="the announcement failed"):
            await apply_batch(conn, batch, notify=failing)
        assert not conn.is_in_transaction()
        assert changed(before, await row_counts(database)) == {}
        assert await offsets(conn, log.topic) == offsets_before
        assert outcomes(await apply_batch(conn, batch)) == ["APPLIED"] * 3
        assert await offsets(conn, log.topic) == highest(log.records)


    # -- rollback and snapshot outcomes ------------------------------------------------------------

    async def test_rollback_outcomes(self, conn: asyncpg.Connection, database: str) -> None:
        """A rollback to a version the session never had, or from any scope but the session's owner,
        is archived and changes nothing else; the owner's to a version it had is APPLIED."""
        org, log = new_org(), Log()
        team = Scope(org, "pillar", "team")
        first = keyed(org, "s", "the team opens the session", "", at=team)
        v1 = next_version(genesis_version(f"{org}/s"), first.content_hash)
        other = ingest(org, "other", "another session")
        await apply_batch(conn, log.append(first, ingest(org, "s", "an agent of the team"), other))
        v_other = next_version(genesis_version(f"{org}/other"), other.content_hash)

        def back(at: Scope, target: str, session: str = "s") -> Event:
            return Event(SESSION_ROLLED_BACK, at, session_aggregate(org, session), "admin-1",
                         {"session_id": session, "target_version": target})

        before = await row_counts(database)
        refused = [back(team, "0" * 64), back(team, v_other), back(team, v1, "never-seen"),
                   back(Scope(org, "pillar", "other-team"), v1), back(Scope(org, "pillar", "team", "bot-1"), v1),
                   back(Scope(org, "pillar"), v1)]
        assert outcomes(await apply_batch(conn, log.append(*refused))) == ["UNKNOWN_TARGET"] * 3 + ["OUT_OF_SCOPE"] * 3
        assert set(changed(before, await row_counts(database))) == {"public.event_archive"}

        [done] = await apply_batch(conn, log.append(back(team, v1)))
        assert (str(getattr(done.outcome, "value", done.outcome)), done.version) == ("APPLIED", v1)

    async def test_snapshot_outcomes(self, conn: asyncpg.Connection, database: str) -> None:
        """A snapshot name is one per session and creator scope: the same scope taking it again is
        SNAPSHOT_NAME_TAKEN (the first stays), a scope below the owner has names of its own, a scope
        outside the session's is OUT_OF_SCOPE."""
        org, log = new_org(), Log()
        team, agent = Scope(org, "pillar", "team"), Scope(org, "pillar", "team", "bot-1")
        await apply_batch(conn, log.append(keyed(org, "s", "the team opens the session", "", at=team)))

        def snap(at: Scope, name: str = "before-deploy") -> Event:
            return Event(SNAPSHOT_CREATED, at, session_aggregate(org, "s"), "lead-1",
                         {"session_id": "s", "snapshot_id": str(uuid.uuid4()), "name": name})

        kept, taken, agents = snap(team), snap(team), snap(agent)
        outside = snap(Scope(org, "pillar", "other-team"))
        assert outcomes(await apply_batch(conn, log.append(kept, agents))) == ["APPLIED", "APPLIED"]
        before = await row_counts(database)
        assert outcomes(await apply_batch(conn, log.append(taken, outside))) == ["SNAPSHOT_NAME_TAKEN", "OUT_OF_SCOPE"]
        assert set(changed(before, await row_counts(database))) == {"public.event_archive"}
        assert {(str(r["snapshot_id"]), r["scope_path"]) for r in await conn.fetch(
            "SELECT snapshot_id, scope_path FROM snapshots WHERE org_id = $1", org)} == {
            (kept.payload["snapshot_id"], team.path), (agents.payload["snapshot_id"], agent.path)}


    # -- the announcement --------------------------------------------------------------------------

    async def test_a_batch_is_announced_only_after_its_commit_and_never_when_rolled_back(
            self, conn: asyncpg.Connection, database: str) -> None:
        org, log = new_org(), Log()
        channel = f"contract_{uuid.uuid4().hex[:8]}"
        heard: asyncio.Queue[str] = asyncio.Queue()
        listener = await asyncpg.connect(database)
        await listener.add_listener(channel, lambda *args: heard.put_nowait(args[3]))

        def notify(applied):
            return channel, [",".join(f"{a.event_id}:{o}" for a, o in zip(applied, outcomes(applied)))]

        def payload(events: list[Event], outcome: str) -> str:
            return ",".join(f"{e.event_id}:{outcome}" for e in events)

        try:
            committed = [ingest(org, "s", "one"), push(org, "s", "two")]
            async with conn.transaction():  # the caller's transaction: the batch commits with it
                await apply_batch(conn, log.append(*committed), notify=notify)
                await asyncio.sleep(0.3)
                assert heard.empty()  # written, announced, not committed: nobody hears it yet
            assert await asyncio.wait_for(heard.get(), 5) == payload(committed, "APPLIED")

            rolled_back = [ingest(org, "s", "three")]
            with pytest.raises(RuntimeError, match="the caller gives up"):
                async with conn.transaction():
                    await apply_batch(conn, log.append(*rolled_back), notify=notify)
                    raise RuntimeError("the caller gives up")

            # Notifications arrive in commit order: hearing the next batch's first proves the rolled
            # back one was never sent. A redelivery is announced too, as DUPLICATE.
            await apply_batch(conn, log.append(*committed), notify=notify)
            assert await asyncio.wait_for(heard.get(), 5) == payload(committed, "DUPLICATE")
            assert heard.empty()
        finally:
            await listener.close()


class TestEmbeddedProjectionStore(ProjectionStoreContract):
    """A database of the contract suites' own on the embedded server."""

    @pytest.fixture
    def database(self, embedded_database: str) -> str:
        return embedded_database


class TestExternalProjectionStore(ProjectionStoreContract):
    """A database of the contract suites' own on the server at CONTEXT_ENGINE_TEST_DATABASE_URL."""

    @pytest.fixture
    def database(self, external_database: str) -> str:
        return external_database
