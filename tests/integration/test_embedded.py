"""The embedded PostgreSQL and tansu processes, the infra fixtures and ensure_topics."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg
import psutil
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from entrypoints.embedded.broker import EmbeddedBroker
from entrypoints.embedded.postgres import EmbeddedPostgres, EmbeddedProcessError
from streams.topics import TopicSetupError, ensure_topics

pytestmark = pytest.mark.integration


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids: list[int], timeout: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (alive := [p for p in pids if not gone(p)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return alive


def server_tree(pid: int) -> list[int]:
    return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]


async def topic_partitions(bootstrap: str) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(None)}
    finally:
        await admin.close()


# -- PostgreSQL ---------------------------------------------------------------------------


async def test_session_database_has_vector_and_trgm(postgres_url: str) -> None:
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS vector; CREATE EXTENSION IF NOT EXISTS pg_trgm")
        assert await conn.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        assert await conn.fetchval("SELECT '[1,0]'::vector <=> '[0,1]'::vector") == pytest.approx(1.0)
        # Non-ASCII letters count for trigrams (the cluster's LC_CTYPE is not plain "C").
        assert await conn.fetchval("SELECT similarity('Ölé', 'ölé')") == pytest.approx(1.0)
        # "  ö", " öl", "ölé", "lé " (under "C" only "  l", " l " would remain)
        assert await conn.fetchval("SELECT cardinality(show_trgm('Ölé'))") == 4
    finally:
        await conn.close()


async def test_postgres_persists_across_restarts_and_leaves_no_process(service_tmp_path: Path) -> None:
    tmp_path = service_tmp_path
    pg = EmbeddedPostgres(tmp_path / "data")
    started = time.monotonic()
    pg.start()
    print(f"postgres initdb+start {time.monotonic() - started:.2f}s")
    assert pg.ensure_database("app") == pg.ensure_database("app") == pg.dsn_for("app")
    conn = await asyncpg.connect(pg.dsn_for("app"))
    await conn.execute("CREATE TABLE t (x int); INSERT INTO t VALUES (42)")
    await conn.close()
    tree = server_tree(pg.pid or 0)
    assert len(tree) > 1  # the postmaster and its auxiliary processes

    pg.stop()
    assert not pg.is_running() and wait_gone(tree, 0) == []
    pg.stop()  # idempotent

    port = pg.port
    started = time.monotonic()
    pg.start()
    print(f"postgres restart {time.monotonic() - started:.2f}s")
    assert pg.port == port
    assert pg.socket_dir == tmp_path / "data"
    conn = await asyncpg.connect(user="postgres", password=pg.password, database="app",
                                 host=str(pg.socket_dir), port=pg.port)
    assert await conn.fetchval("SELECT x FROM t") == 42
    await conn.close()

    tree = server_tree(pg.pid or 0)
    pg.kill()
    assert not pg.is_running() and wait_gone(tree) == []
    pg.start()  # crash recovery
    conn = await asyncpg.connect(pg.dsn_for("app"))
    assert await conn.fetchval("SELECT x FROM t") == 42
    await conn.close()
    tree = server_tree(pg.pid or 0)
    pg.stop()
    assert wait_gone(tree, 0) == []
    assert (tmp_path / "postgres.log").stat().st_size > 0


def test_postgres_start_failure_shows_log(service_tmp_path: Path) -> None:
    tmp_path = service_tmp_path
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        pg = EmbeddedPostgres(tmp_path / "data", port=taken.getsockname()[1])
        with pytest.raises(EmbeddedProcessError, match="could not bind|could not create"):
            pg.start(timeout=10)
        assert not pg.is_running()


# -- broker --------------------------------------------------------------------------------


async def test_ensure_topics_and_round_trip(kafka_bootstrap: str) -> None:
    events, jobs = f"events-{uuid.uuid4().hex[:6]}", f"jobs-{uuid.uuid4().hex[:6]}"
    await ensure_topics(kafka_bootstrap, {events: 3, jobs: 1})
    await ensure_topics(kafka_bootstrap, {events: 3, jobs: 1})  # existing topics are fine
    counts = await topic_partitions(kafka_bootstrap)
    assert (counts[events], counts[jobs]) == (3, 1)
    with pytest.raises(TopicSetupError, match=f"{events}: has 3, wants 5"):
        await ensure_topics(kafka_bootstrap, {events: 5})

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(3):
            await producer.send_and_wait(events, f"v{i}".encode(), key=b"k", partition=2)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(events, 2)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        got: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                got += [r.value for r in records if r.value is not None]
        assert got == [b"v0", b"v1", b"v2"]
    finally:
        await consumer.stop()


async def test_broker_start_kill_restart(tmp_path: Path) -> None:
    broker = EmbeddedBroker(log_path=tmp_path / "tansu.log")
    started = time.monotonic()
    broker.start()
    print(f"tansu start {time.monotonic() - started:.3f}s")
    try:
        assert broker.bootstrap == f"127.0.0.1:{broker.port}"
        assert await topic_partitions(broker.bootstrap) == {}  # readiness created no topic
        await ensure_topics(broker.bootstrap, {"t": 2})
        first = broker.pid or 0
        broker.kill()
        assert not broker.is_running() and wait_gone([first]) == []
        broker.restart()
        assert broker.pid != first
        assert await topic_partitions(broker.bootstrap) == {}  # memory storage: back empty
        second = broker.pid or 0
    finally:
        broker.stop()
    broker.stop()
    assert wait_gone([second], 0) == []


async def test_fault_tests_get_a_broker_of_their_own(
        embedded_broker: EmbeddedBroker, kafka_bootstrap: str) -> None:
    assert embedded_broker.bootstrap != kafka_bootstrap
    await ensure_topics(embedded_broker.bootstrap, {"before-kill": 2})
    embedded_broker.kill()
    embedded_broker.restart()
    assert "before-kill" not in await topic_partitions(embedded_broker.bootstrap)  # memory storage
    await ensure_topics(embedded_broker.bootstrap, {"after-restart": 2})
    assert (await topic_partitions(embedded_broker.bootstrap))["after-restart"] == 2


# -- parent death ----------------------------------------------------------------------------

_PARENT = """
import pathlib, sys, time
from entrypoints.embedded.broker import EmbeddedBroker
from entrypoints.embedded.postgres import EmbeddedPostgres
broker, pg = EmbeddedBroker(), EmbeddedPostgres(pathlib.Path(sys.argv[1]))
broker.start(); pg.start()
print(broker.pid, pg.pid, flush=True)
time.sleep(60)
"""


def test_children_die_with_their_parent(service_tmp_path: Path) -> None:
    tmp_path = service_tmp_path
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(tmp_path / "data")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2, "the parent did not start its children"
        tree = pids[:1] + server_tree(pids[1])
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        parent.stdout.close()
    # The postgres server runs as another uid when we are root: PDEATHSIG must survive that.
    assert wait_gone(tree, 10) == []
