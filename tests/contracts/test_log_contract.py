"""The log's contract, on every broker (tests/contracts/backends.py): what `EventLog`, `LogGuard`,
`ensure_topics` and `restore_if_behind` promise the rest of the engine.

- `append` returns the position the record is read back at;
- records of one key sit on one partition (the one the verifier expects) in append order;
- the log runs only on topics created before use with their partition counts, never on
  auto-created ones: a topic with another count stops the start;
- while the broker does not hold the log, the guard refuses appends UNAVAILABLE LOG_RECOVERING,
  and it opens again, on re-created topics, once the broker is back;
- restoring puts the archived events back on their partitions in archive order, signed, and
  restores nothing when the log is not behind.

Elsewhere, not repeated here: ensure_topics on an existing topic and its wrong-count message
(tests/integration/test_embedded.py); acknowledged events surviving a broker killed under load
(tests/integration/test_faults.py); forged, moved and copied records (tests/security/test_host_log.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from context_engine.errors import Unavailable
from context_engine.events import Event
from projections.projector.batch import apply_batch
from projections.projector.records import LogRecord
from streams.log import EventLog, LogPosition
from streams.record_auth import Keyring, RecordSigner, RecordVerifier, partition_for
from streams.restore import restore_if_behind
from streams.topics import LogTopics, TopicSetupError, ensure_topics
from tests.contracts.backends import FaultableBroker, contract_topics, external_or_skip
from tests.fixtures.infra import KAFKA_BOOTSTRAP_ENV
from tests.fixtures.projector_log import ingest, new_org

pytestmark = pytest.mark.integration


@pytest.fixture
def keyring(tmp_path) -> Keyring:
    return Keyring(tmp_path / "log.keyring")


@contextlib.asynccontextmanager
async def running_log(bootstrap: str, topics: LogTopics, keyring: Keyring, *,
                      recover: Callable[[], Awaitable[None]] | None = None,
                      hold_timeout: float = 5.0) -> AsyncIterator[EventLog]:
    """The log as the API runs it: started on topics its recovery creates."""
    async def create_topics() -> None:
        await ensure_topics(bootstrap, topics.partitions)

    log = EventLog(bootstrap, topics, recover or create_topics, signer=RecordSigner(keyring),
                   hold_timeout=hold_timeout)
    await log.start()
    try:
        yield log
    finally:
        await log.stop()


async def partition_counts(bootstrap: str) -> dict[str, int]:
    """Every topic's partitions, read with an all-topics request (which creates nothing)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(None) if t["error_code"] == 0}
    finally:
        await admin.close()


async def read_back(bootstrap: str, topic: str, partitions: int, count: int, *, linger: float = 0.0,
                    timeout: float = 15.0):
    """At least `count` records of `topic`, per partition, as a consumer reads them; and whatever
    more arrives within `linger` seconds after."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        got: dict[int, list] = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + timeout
        while sum(map(len, got.values())) < count:
            assert time.monotonic() < deadline, f"read {sum(map(len, got.values()))} of {count} records of {topic}"
            for tp, records in (await consumer.getmany(timeout_ms=200)).items():
                got[tp.partition] += records
        if linger:
            for tp, records in (await consumer.getmany(timeout_ms=int(linger * 1000))).items():
                got[tp.partition] += records
        return got
    finally:
        await consumer.stop()


def sessions_of(org: str, sessions: int, per_session: int) -> dict[str, list[Event]]:
    return {f"s{i}": [ingest(org, f"s{i}", f"session {i} event {n}") for n in range(per_session)]
            for i in range(sessions)}


class LogContract:
    """The cases; a subclass gives the broker (`broker`, and `faultable_broker` for the guard)."""

    @pytest.fixture
    def broker(self) -> str:
        raise NotImplementedError("the factory hook: a subclass gives its broker")

    @pytest.fixture
    def faultable_broker(self) -> FaultableBroker:
        raise NotImplementedError("the factory hook: a subclass gives a broker it may take the log from")


    # -- appending -------------------------------------------------------------------------------

    async def test_append_returns_the_position_the_record_is_read_back_at(self, broker: str, keyring: Keyring) -> None:
        topics = contract_topics()
        events = [ingest(new_org(), "s", f"event {i}") for i in range(12)]
        async with running_log(broker, topics, keyring) as log:
            positions = [await log.append(ev) for ev in events]
        n = topics.partitions[topics.events]
        assert all(isinstance(p, LogPosition) and p.topic == topics.events for p in positions)
        records = await read_back(broker, topics.events, n, len(events), linger=0.3)
        at = {(p, r.offset): r for p, rs in records.items() for r in rs}
        for ev, pos in zip(events, positions):
            record = at[(pos.partition, pos.offset)]
            assert (record.key, record.value) == (ev.aggregate.encode(), ev.to_bytes())
        assert sorted(at) == sorted((p.partition, p.offset) for p in positions)  # nothing else was written

    async def test_records_of_one_key_come_back_in_append_order_on_its_partition(
            self, broker: str, keyring: Keyring) -> None:
        """Sessions written concurrently, each by one writer in order: each session's events are on
        the partition its key maps to (the verifier refuses a record anywhere else), in append order."""
        topics = contract_topics()
        n = topics.partitions[topics.events]
        sessions = sessions_of(new_org(), 6, 15)
        async with running_log(broker, topics, keyring) as log:
            async def writer(events: list[Event]) -> list[LogPosition]:
                return [await log.append(ev) for ev in events]
            positions = dict(zip(sessions, await asyncio.gather(*(writer(evs) for evs in sessions.values()))))
        records = await read_back(broker, topics.events, n, sum(map(len, sessions.values())))
        verifier = RecordVerifier(keyring, topics.partitions)
        for session, events in sessions.items():
            key = events[0].aggregate.encode()
            partition = partition_for(key, n)
            assert {p.partition for p in positions[session]} == {partition}, session
            offsets = [p.offset for p in positions[session]]
            assert offsets == sorted(offsets), session
            assert [r.value for r in records[partition] if r.key == key] == [e.to_bytes() for e in events], session
        assert all(verifier.check(topics.events, p, r.key, r.value, r.headers) is None
                   for p, rs in records.items() for r in rs)


    # -- topics ----------------------------------------------------------------------------------

    async def test_the_log_runs_only_on_topics_created_with_their_partition_counts(
            self, broker: str, keyring: Keyring) -> None:
        """After a start, appends, publishes and the guard's probing (seconds of it), the deployment's
        topics are exactly the configured ones with their counts: nothing was auto-created on the way
        (the bundled broker makes any topic a Metadata request names, with 4 partitions)."""
        topics = contract_topics(events_partitions=3, job_partitions=2)
        prefix = topics.events.rsplit(".", 1)[0]
        assert not {t for t in await partition_counts(broker) if t.startswith(prefix)}
        async with running_log(broker, topics, keyring) as log:
            await log.append(ingest(new_org(), "s", "one"))
            await log.publish(topics.job_topic("compaction:org-1"), "org-1", b"job")
            await asyncio.sleep(0.5)  # ten probes of the guard
        ours = {t: n for t, n in (await partition_counts(broker)).items() if t.startswith(prefix)}
        assert ours == topics.partitions

    async def test_a_topic_with_another_partition_count_stops_the_start(self, broker: str, keyring: Keyring) -> None:
        """A domain topic made before the log with other partitions (by hand, or by a client's
        auto-creation) would send keys to other partitions than the log's records: the start fails."""
        topics = contract_topics(events_partitions=3)
        await ensure_topics(broker, {topics.events: 4})
        with pytest.raises(TopicSetupError, match=f"{topics.events}: has 4, wants 3"):
            async with running_log(broker, topics, keyring):
                pass


    # -- the guard -------------------------------------------------------------------------------

    async def test_the_guard_refuses_appends_while_the_log_is_lost_and_opens_when_it_is_back(
            self, faultable_broker: FaultableBroker, keyring: Keyring) -> None:
        """The broker loses the log (killed, so it comes back empty; or its topic deleted): the guard
        closes the gate and the appends meanwhile are refused UNAVAILABLE LOG_RECOVERING, never
        acknowledged; once the broker is back the guard re-creates the topics, and an append after
        that is durable on them (a record produced before its topic exists would be lost)."""
        topics = contract_topics()
        bootstrap = faultable_broker.bootstrap
        recovering, released = asyncio.Event(), asyncio.Event()
        starts = 0

        async def recover() -> None:  # held after the first, until the test lets it go on
            nonlocal starts
            starts += 1
            if starts > 1:
                recovering.set()
                await released.wait()
            await ensure_topics(bootstrap, topics.partitions, timeout=5.0)

        org = new_org()
        async with running_log(bootstrap, topics, keyring, recover=recover, hold_timeout=2.0) as log:
            before = await log.append(ingest(org, "s", "before"))
            await faultable_broker.lose_log(topics)
            await asyncio.wait_for(recovering.wait(), 10)

            refused = await asyncio.gather(*(log.append(ingest(org, "s", f"while lost {i}")) for i in range(3)),
                                           return_exceptions=True)
            assert [(type(r), getattr(r, "reason", None)) for r in refused] == [(Unavailable, "LOG_RECOVERING")] * 3

            await faultable_broker.bring_back()
            released.set()
            after_event = ingest(org, "s", "after")
            deadline = time.monotonic() + 20
            while True:
                try:
                    after = await log.append(after_event)
                    break
                except Unavailable as exc:
                    assert exc.reason in ("LOG_RECOVERING", "LOG_UNAVAILABLE"), exc
                    assert time.monotonic() < deadline, "the guard did not open again"
            assert log.guard.recoveries >= 1  # more if it saw the log lost again on its way back

        assert (await partition_counts(bootstrap))[topics.events] == topics.partitions[topics.events]
        n = topics.partitions[topics.events]
        records = await read_back(bootstrap, topics.events, n, 1, linger=0.3)  # the lost log's record is gone
        assert [(p, r.offset, r.value) for p, rs in records.items() for r in rs] == \
            [(after.partition, after.offset, after_event.to_bytes())]
        assert before.partition == after.partition  # one key, one partition, before and after


    # -- restoring -------------------------------------------------------------------------------

    async def test_restore_puts_the_archived_events_back_in_archive_order(
            self, broker: str, embedded_database: str, keyring: Keyring) -> None:
        """The archive (event_archive, as the projector writes it) holds a topic the broker has
        empty: restoring produces every archived event again to its partition, in archive order, at
        its archived offset and signed for the log; a second restore finds nothing behind."""
        topics = contract_topics()
        n = topics.partitions[topics.events]
        sessions = sessions_of(new_org(), 5, 8)
        next_offset = [0] * n
        records = []
        for events in zip(*sessions.values()):  # the sessions interleaved, as writers interleave them
            for ev in events:
                p = partition_for(ev.aggregate.encode(), n)
                records.append(LogRecord(topics.events, p, next_offset[p], ev.to_bytes()))
                next_offset[p] += 1
        conn = await asyncpg.connect(embedded_database)
        pool = await asyncpg.create_pool(embedded_database, min_size=1, max_size=2)
        try:
            for start in range(0, len(records), 9):
                await apply_batch(conn, records[start:start + 9])
            archived = await conn.fetch('SELECT partition, "offset", raw FROM event_archive WHERE topic = $1 '
                                        "ORDER BY archive_seq", topics.events)
            assert len(archived) == len(records)

            await ensure_topics(broker, topics.partitions)
            report = await restore_if_behind(broker, topics.events, pool, signer=RecordSigner(keyring))
            assert (report.partitions, report.records) == (len({r.partition for r in records}), len(records))

            back = await read_back(broker, topics.events, n, len(records))
            for p in range(n):
                assert [(r.offset, r.value) for r in back[p]] == \
                    [(a["offset"], bytes(a["raw"])) for a in archived if a["partition"] == p], p
            verifier = RecordVerifier(keyring, topics.partitions)
            assert all(verifier.check(topics.events, p, r.key, r.value, r.headers) is None
                       for p, rs in back.items() for r in rs)

            again = await restore_if_behind(broker, topics.events, pool, signer=RecordSigner(keyring))
            assert (again.partitions, again.records) == (0, 0)
        finally:
            await pool.close()
            await conn.close()


class TestEmbeddedLog(LogContract):
    """The bundled broker (the session's when infra started one)."""

    @pytest.fixture
    def broker(self, _contract_embedded_broker: str) -> str:
        return _contract_embedded_broker

    @pytest.fixture
    def faultable_broker(self, embedded_broker) -> FaultableBroker:
        return FaultableBroker("embedded", embedded_broker.bootstrap, embedded_broker)  # the test's own: starts in ms


class TestExternalLog(LogContract):
    """The broker at CONTEXT_ENGINE_TEST_KAFKA_BOOTSTRAP (`make test-external`)."""

    @pytest.fixture
    def broker(self) -> str:
        return external_or_skip(KAFKA_BOOTSTRAP_ENV)

    @pytest.fixture
    def faultable_broker(self) -> FaultableBroker:
        return FaultableBroker("external", external_or_skip(KAFKA_BOOTSTRAP_ENV))
