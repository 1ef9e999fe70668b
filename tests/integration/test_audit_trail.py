"""The audit trail end to end on the real broker and PostgreSQL: the API's AuditPublisher (built by
open_deps) -> the audit:access topic -> the worker's audit-writer -> audit_access rows; idempotent
on message_id; rebuilt identically from the stream into an empty database; one org's rows hidden
from every other org by row-level security; `context-engine audit` over them; and a record no
trusted writer signed stores nothing."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from context_engine.scope import Scope
from projections.projector.audit_rows import AuditRow
from projections.reads.audit import audit_rows
from projections.store.migrations import migrate
from projections.store.pool import create_pool, org_transaction
from streams.access_attempts import AccessAttempt
from streams.agents.audit import write_from_log
from streams.audit import AuditPublisher
from streams.jobs import audit_access
from streams.kafka_security import client_security
from streams.record_auth import verifier_from_settings
from streams.topics import LogTopics
from tests.fixtures.databases import fresh_database
from tests.fixtures.engine import unique
from tests.fixtures.infra import APP_PASSWORD

pytestmark = pytest.mark.integration

T0 = dt.datetime(2026, 1, 5, 9, 0, tzinfo=dt.UTC)
SHARE = str(uuid.uuid4())
CHUNK, SNAPSHOT = str(uuid.uuid4()), str(uuid.uuid4())


def trail(org: str) -> list[AccessAttempt]:
    """One of each kind of cross-scope access of an org, a minute apart."""
    s = [Scope(org, "p1", "t1", "a1"), Scope(org, "p1"), Scope(org, "p2", "t9"), Scope(org, "p1", "t2")]
    return [
        AccessAttempt(s[0], "chunk", CHUNK, "read", True, share_id=SHARE, occurred_at=T0),
        AccessAttempt(s[0], "chunk", CHUNK, "use_in_assembly", False, share_id=SHARE,
                      denial_reason="no_use_in_assembly", occurred_at=T0 + dt.timedelta(minutes=1)),
        AccessAttempt(s[2], "session", "sess-of-p1", "read", False, denial_reason="not_visible",
                      occurred_at=T0 + dt.timedelta(minutes=2)),
        AccessAttempt(s[1], "chunk", CHUNK, "create_share", True, share_id=SHARE,
                      occurred_at=T0 + dt.timedelta(minutes=3)),
        AccessAttempt(s[3], "snapshot", SNAPSHOT, "read", False, share_id=SHARE, denial_reason="revoked_grant",
                      occurred_at=T0 + dt.timedelta(minutes=4)),
        AccessAttempt(s[1], "chunk", CHUNK, "revoke_share", True, share_id=SHARE,
                      occurred_at=T0 + dt.timedelta(minutes=5)),
    ]


def as_stored(a: AccessAttempt) -> tuple:
    return (a.actor, a.resource_type, a.resource_id, a.operation, a.share_id,
            "allowed" if a.allowed else "denied", a.denial_reason, a.occurred_at)


def stored(r: AuditRow) -> tuple:
    return (r.actor, r.resource_type, r.resource_id, r.operation, r.share_id, r.outcome, r.denial_reason,
            r.occurred_at)


@pytest.fixture(scope="module")
async def admin(engine) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(engine.settings.database_url, org_scoped=False, min_size=1, max_size=2)
    yield pool
    await pool.close()


async def rows_of(pool: asyncpg.Pool, org: str, **filters) -> list[AuditRow]:
    async with org_transaction(pool, org, readonly=True) as conn:
        return await audit_rows(conn, org, limit=10_000, **filters)


async def eventually_rows(pool: asyncpg.Pool, org: str, n: int, timeout: float = 300.0) -> list[AuditRow]:
    deadline = time.monotonic() + timeout
    while len(rows := await rows_of(pool, org)) < n:
        assert time.monotonic() < deadline, f"{len(rows)} of {n} audit rows of {org} after {timeout:.0f}s"
        await asyncio.sleep(0.1)
    return rows


def audit_topic(engine) -> str:
    return LogTopics.from_settings(engine.settings).jobs["audit:access"]


@pytest.fixture(scope="module")
async def recorded(engine, admin) -> tuple[str, list[AccessAttempt], list[AuditRow]]:
    """An org whose trail the API's own publisher recorded, once the writer has stored all of it."""
    assert isinstance(engine.deps.audit, AuditPublisher)
    org = unique("audit")
    attempts = trail(org)
    for a in attempts:
        engine.deps.audit.record(a)
    return org, attempts, await eventually_rows(admin, org, len(attempts))


async def test_what_the_api_records_the_writer_stores(recorded, engine):
    org, attempts, rows = recorded
    assert sorted(map(stored, rows), key=lambda t: t[-1]) == sorted(map(as_stored, attempts), key=lambda t: t[-1])
    assert [r.occurred_at for r in rows] == sorted((a.occurred_at for a in attempts), reverse=True)
    assert len({r.message_id for r in rows}) == len(attempts)
    assert engine.deps.audit.health().ok


async def test_the_same_message_twice_is_one_row(engine, admin):
    org = unique("audit-dup")
    twice = audit_access(AccessAttempt(Scope(org, "p1"), "chunk", CHUNK, "read", False, denial_reason="not_visible"))
    after = audit_access(AccessAttempt(Scope(org, "p2"), "chunk", CHUNK, "read", False, denial_reason="not_visible"))
    for job in (twice, twice, after):  # one key, one partition: in this order
        await engine.deps.log.publish(audit_topic(engine), org, job.value)
    rows = await eventually_rows(admin, org, 2)
    assert sorted(r.message_id for r in rows) == sorted([twice.message_id, after.message_id])


async def test_the_stream_rebuilds_the_same_rows_in_an_empty_database(recorded, engine, postgres_url):
    org, _, rows = recorded
    settings = engine.settings
    async with fresh_database(postgres_url, "ce_audit_replay") as url:
        await migrate(url, app_password=APP_PASSWORD)
        pool = await create_pool(url, org_scoped=False, min_size=1, max_size=2)
        try:
            added = await write_from_log(settings.kafka_bootstrap, audit_topic(engine), pool,
                                         verifier=verifier_from_settings(settings),
                                         security=client_security(settings))
            rebuilt = await rows_of(pool, org)
            assert await write_from_log(settings.kafka_bootstrap, audit_topic(engine), pool,
                                        verifier=verifier_from_settings(settings),
                                        security=client_security(settings)) == 0  # again: nothing new
        finally:
            await pool.close()
    assert added >= len(rows)
    assert rebuilt == rows


async def test_context_engine_replay_rebuilds_the_rows_too(recorded, engine, postgres_url):
    org, _, rows = recorded
    async with fresh_database(postgres_url, "ce_audit_cli_replay") as url:
        code, out = await engine.cli("replay", "--into", url, timeout=300)
        assert code == 0, out
        pool = await create_pool(url, org_scoped=False, min_size=1, max_size=1)
        try:
            assert await rows_of(pool, org) == rows
        finally:
            await pool.close()


async def test_an_orgs_rows_are_visible_to_that_org_only(recorded, engine):
    org, attempts, _ = recorded
    api_pool = engine.deps.pool  # the app role: no BYPASSRLS
    other = unique("audit-other")
    async with org_transaction(api_pool, other, readonly=True) as conn:
        assert await conn.fetchval("SELECT count(*) FROM audit_access WHERE org_id = $1", org) == 0
        assert await audit_rows(conn, org) == []
    async with org_transaction(api_pool, org, readonly=True) as conn:
        assert await conn.fetchval("SELECT count(*) FROM audit_access WHERE org_id = $1", org) == len(attempts)
        assert {r.org_id for r in await audit_rows(conn, org, limit=1000)} == {org}
    async with api_pool.acquire() as conn:  # no org setting: nothing
        assert await conn.fetchval("SELECT count(*) FROM audit_access") == 0


def as_json(r: AuditRow) -> dict:
    return {"message_id": r.message_id, "org_id": r.org_id, "actor": r.actor.path, "actor_pillar": r.actor_pillar,
            "actor_team": r.actor_team, "actor_agent": r.actor_agent, "resource_type": r.resource_type,
            "resource_id": r.resource_id, "operation": r.operation, "share_id": r.share_id, "outcome": r.outcome,
            "denial_reason": r.denial_reason, "occurred_at": r.occurred_at.isoformat()}


async def cli_json(engine, *args: str) -> list[dict]:
    code, out = await engine.cli("audit", *args, "--json")
    assert code == 0, out
    return json.loads(out)


async def test_the_cli_filters_the_orgs_rows(recorded, engine):
    org, attempts, rows = recorded
    assert await cli_json(engine, "--org", org) == [as_json(r) for r in rows]
    denied_in_p1 = [r for r in rows if r.outcome == "denied" and r.actor_pillar == "p1"]
    assert await cli_json(engine, "--org", org, "--outcome", "denied", "--actor", f"{org}/p1") == [
        as_json(r) for r in denied_in_p1]
    window = (T0 + dt.timedelta(minutes=1), T0 + dt.timedelta(minutes=4))
    on_the_chunk = [r for r in rows if r.resource_id == CHUNK and window[0] <= r.occurred_at < window[1]]
    assert await cli_json(engine, "--org", org, "--resource", CHUNK, "--since", window[0].isoformat(),
                          "--until", window[1].isoformat().replace("+00:00", "Z")) == [
        as_json(r) for r in on_the_chunk]
    assert await cli_json(engine, "--org", org, "--operation", "create_share", "--limit", "1") == [
        as_json(r) for r in rows if r.operation == "create_share"][:1]
    assert await cli_json(engine, "--org", unique("audit-nobody")) == []

    code, table = await engine.cli("audit", "--org", org, "--outcome", "denied")
    assert code == 0, table
    lines = table.splitlines()
    denied = [r for r in rows if r.outcome == "denied"]
    assert lines[0].split()[:3] == ["occurred_at", "outcome", "operation"] and len(lines) == 1 + len(denied)
    for line, r in zip(lines[1:], denied, strict=True):
        assert line.split()[:4] == [r.occurred_at.isoformat(), "denied", r.operation, r.actor.path]
        assert line.rstrip().endswith(r.denial_reason)

    code, out = await engine.cli("audit", "--org", org, "--actor", "another-org/p1")
    assert code == 2 and "--actor" in out


async def test_an_unsigned_record_on_the_audit_topic_writes_nothing(engine, admin):
    org = unique("audit-forged")
    forged = audit_access(AccessAttempt(Scope(org, "p1"), "chunk", CHUNK, "read", True, share_id=SHARE))
    genuine = audit_access(AccessAttempt(Scope(org, "p2"), "chunk", CHUNK, "read", False, denial_reason="not_visible"))
    producer = AIOKafkaProducer(bootstrap_servers=engine.settings.kafka_bootstrap, acks="all",
                                **client_security(engine.settings))
    await producer.start()
    try:
        await producer.send_and_wait(audit_topic(engine), forged.value, key=forged.key)  # no authenticator
    finally:
        await producer.stop()
    await engine.deps.log.publish(audit_topic(engine), org, genuine.value)  # same key: after the forgery
    rows = await eventually_rows(admin, org, 1)
    assert [r.message_id for r in rows] == [genuine.message_id]
