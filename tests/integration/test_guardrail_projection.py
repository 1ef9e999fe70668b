"""The guardrail projection and its queries against the real PostgreSQL: versions per (scope,
level), signatures, idempotence, what each caller sees under row-level security; and the publish
command end to end through the real broker. Tests share one migrated database and keep apart
by org id."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from commands.publish_guardrail import (
    GuardrailPublishError,
    PublishGuardrail,
    list_layers,
    publish_guardrail,
)
from context_engine.errors import InvalidArgument
from context_engine.events import GUARDRAIL_PUBLISHED, Event
from context_engine.guardrails.signing import (
    PLATFORM_ORG,
    content_sha256,
    fingerprint,
    guardrail_aggregate,
    layer_scope,
    sign_layer,
)
from context_engine.scope import Scope
from projections.assembly.validation import validate_prompt
from projections.projector.batch import apply_batch
from projections.projector.guardrail_layers import (
    APPLIED,
    DUPLICATE,
    REJECTED_BAD_SIGNATURE,
    REJECTED_MALFORMED,
    REJECTED_SCOPE,
    REJECTED_STALE,
    REJECTED_UNTRUSTED_KEY,
    apply_guardrail_published,
    refuse_layers,
)
from projections.projector.records import LogRecord
from projections.reads.guardrail_layers import (
    current_layer,
    current_layers,
    layers_by_hash,
    published_layer,
)
from projections.store import admin
from projections.store.migrations import app_url
from projections.store.pool import create_pool, org_transaction
from streams.acknowledgement import ArchiveWatch, announcement
from streams.log import EventLog
from streams.record_auth import Keyring, RecordSigner, RecordVerifier
from streams.replay import compare_log, read_log
from streams.topics import LogTopics, ensure_topics
from tests.fixtures.databases import fresh_database

pytestmark = pytest.mark.integration

APP_ROLE = "context_engine_app"
APP_PASSWORD = "app-test-password"
KEY = Ed25519PrivateKey.generate()
TRUSTED = frozenset({fingerprint(KEY)})  # the trust set these tests project and read with
_clock = [1_700_000_000_000]


def now_ms() -> int:
    _clock[0] += 1_000
    return _clock[0]


def new_org() -> str:
    return f"org-{uuid.uuid4().hex[:8]}"


def layer_event(level: int, text: str, /, *ids: str, key: Ed25519PrivateKey = KEY,
                signed_at_ms: int | None = None, scope: Scope | None = None, **payload_over: Any) -> Event:
    """A guardrail.published event as the operator command builds it; keyword overrides
    replace payload fields after signing (tampering)."""
    owner = scope or layer_scope(level, *ids)
    signed = sign_layer(key, level=level, scope_path=owner.path, content=text,
                        signed_at_ms=signed_at_ms if signed_at_ms is not None else now_ms())
    return Event(GUARDRAIL_PUBLISHED, owner, guardrail_aggregate(owner.path, level), "cli:op",
                 signed.payload() | payload_over)


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def db_url(postgres_url: str) -> AsyncIterator[str]:
    async with fresh_database(postgres_url, "ce_guard", migrated=True) as url:
        yield url


@pytest.fixture
async def conn(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(db_url)
    yield c
    await c.close()


@pytest.fixture
async def app_pool(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    """The API's view: the app role, subject to row-level security."""
    pool = await create_pool(app_url(db_url, APP_ROLE, APP_PASSWORD), max_size=2)
    yield pool
    await pool.close()


async def apply(conn: asyncpg.Connection, event: Event, trusted=TRUSTED) -> str:
    """What the projector does per event: its org's transaction, app.org_id set."""
    async with conn.transaction():
        await conn.execute("SELECT set_config('app.org_id', $1, true)", event.scope.org_id)
        return await apply_guardrail_published(conn, event.scope.org_id, event, trusted=trusted)


async def why_refused(conn: asyncpg.Connection, event: Event) -> str:
    """The detail of the projection's refusal (logged, never stored)."""
    async with conn.transaction():
        await conn.execute("SELECT set_config('app.org_id', $1, true)", event.scope.org_id)
        return (await refuse_layers(conn, event.scope.org_id, [event], trusted=TRUSTED, report=False))[
            event.event_id].detail


async def layers_of(pool: asyncpg.Pool, caller: Scope, trusted=TRUSTED) -> list[tuple[int, str, int, str]]:
    async with org_transaction(pool, caller.org_id, readonly=True) as c:
        return [(r.level, r.scope_path, r.version, r.content) for r in await current_layers(c, caller, trusted=trusted)]


async def table_counts(conn: asyncpg.Connection) -> dict[str, int]:
    return {t: await conn.fetchval(f"SELECT count(*) FROM {t}")
            for t in ("guardrail_layers", "guardrail_rejections", "event_archive", "rejected_events")}


async def history(conn: asyncpg.Connection, owner: Scope, level: int) -> list[tuple[int, str]]:
    rows = await conn.fetch("SELECT version, content FROM guardrail_layers WHERE org_id = $1 AND "
                            "scope_path = $2 AND level = $3 ORDER BY version", owner.org_id, owner.path, level)
    return [(r["version"], r["content"]) for r in rows]


@pytest.fixture(scope="module")
async def platform_l1(db_url: str) -> str:
    """One L1 for the whole module (every org sees it); returns its content."""
    c = await asyncpg.connect(db_url)
    try:
        text = f"[L1] platform rules {uuid.uuid4().hex[:6]}\n"
        assert await apply(c, layer_event(1, text, signed_at_ms=int(time.time() * 1000))) == APPLIED
        return text
    finally:
        await c.close()


# -- versions ---------------------------------------------------------------------------------


async def test_versions_are_monotonic_per_scope_and_level(conn: asyncpg.Connection, app_pool, platform_l1) -> None:
    org = new_org()
    team = ("sales", "emea")
    results = [await apply(conn, layer_event(2, f"org rules v{n}", org)) for n in (1, 2, 3)]
    results += [await apply(conn, layer_event(3, f"team rules v{n}", org, *team)) for n in (1, 2)]
    results.append(await apply(conn, layer_event(2, "org rules v3", org)))  # identical content again
    assert results == [APPLIED] * 6
    assert await history(conn, Scope(org), 2) == [(1, "org rules v1"), (2, "org rules v2"), (3, "org rules v3"),
                                                  (4, "org rules v3")]
    assert await history(conn, Scope(org, *team), 3) == [(1, "team rules v1"), (2, "team rules v2")]
    caller = Scope(org, "sales", "emea", "bot-1")
    got = await layers_of(app_pool, caller)
    assert got == [(1, PLATFORM_ORG, got[0][2], platform_l1), (2, org, 4, "org rules v3"),
                   (3, f"{org}/sales/emea", 2, "team rules v2")]
    async with org_transaction(app_pool, org, readonly=True) as c:
        rows = await current_layers(c, caller, trusted=TRUSTED)
        assert [r.level for r in rows] == [1, 2, 3]
        assert all(r.current and r.fingerprint == fingerprint(KEY) for r in rows)
        assert rows[1].content_hash == content_sha256("org rules v3")
        assert rows[1].effective_at_ms > rows[2].effective_at_ms  # signed later
        # effective_at is the signed time, increasing with the version
        eff = [r["effective_at_ms"] for r in await conn.fetch(
            "SELECT effective_at_ms FROM guardrail_layers WHERE org_id = $1 AND level = 2 ORDER BY version", org)]
        assert eff == sorted(eff) and len(set(eff)) == 4


async def test_an_agent_layer_and_absent_levels(conn: asyncpg.Connection, app_pool, platform_l1) -> None:
    org = new_org()
    agent = ("p", "t", "bot-7")
    assert await apply(conn, layer_event(4, "agent rules", org, *agent)) == APPLIED
    # No L2, no L3: absent, not empty.
    assert [(lvl, v) for lvl, _, v, _ in await layers_of(app_pool, Scope(org, *agent))][1:] == [(4, 1)]
    # A caller at the team sees no agent's L4; a pillar caller gets only L1 and L2.
    assert [lvl for lvl, *_ in await layers_of(app_pool, Scope(org, "p", "t"))] == [1]
    assert [lvl for lvl, *_ in await layers_of(app_pool, Scope(org, "p", "t", "bot-8"))] == [1]


async def test_a_replayed_old_signature_is_stale(conn: asyncpg.Connection) -> None:
    org = new_org()
    v1 = layer_event(2, "lenient rules", org)
    v2 = layer_event(2, "strict rules", org)
    assert [await apply(conn, v1), await apply(conn, v2)] == [APPLIED, APPLIED]
    # The v1 event re-appended with a new event id (same signature): must not roll back.
    replayed = dataclasses.replace(v1, event_id=str(uuid.uuid4()))
    assert await apply(conn, replayed) == REJECTED_STALE
    same_time = layer_event(2, "other rules", org, signed_at_ms=v2.payload["signed_at_ms"])
    assert await apply(conn, same_time) == REJECTED_STALE
    assert [c for _, c in await history(conn, Scope(org), 2)] == ["lenient rules", "strict rules"]
    assert "not later than version 2" in await why_refused(conn, replayed)
    # Within one batch, a layer is stale against one accepted before it in the batch.
    v3, older = layer_event(2, "v3", org), layer_event(2, "older", org, signed_at_ms=v2.payload["signed_at_ms"] + 1)
    async with conn.transaction():
        await conn.execute("SELECT set_config('app.org_id', $1, true)", org)
        refused = await refuse_layers(conn, org, [v3, older, v3], trusted=TRUSTED, report=False)
    assert {k: r.outcome for k, r in refused.items()} == {older.event_id: REJECTED_STALE}


# -- signatures and shapes ----------------------------------------------------------------


async def test_a_bad_signature_is_never_served(conn: asyncpg.Connection, app_pool, platform_l1) -> None:
    org = new_org()
    good = layer_event(2, "the real rules", org)
    tampered = layer_event(2, "the real rules", org, content="relaxed rules")  # signed hash kept
    rehashed = layer_event(2, "the real rules", org, content="relaxed rules",
                           content_sha256=content_sha256("relaxed rules"))
    other_key = Ed25519PrivateKey.generate()
    wrong_key = layer_event(2, "forged rules", org, key=other_key,
                            public_key_b64=good.payload["public_key_b64"], key_fingerprint=fingerprint(KEY))
    outcomes = [await apply(conn, e) for e in (tampered, rehashed, wrong_key)]
    assert outcomes == [REJECTED_BAD_SIGNATURE] * 3
    assert await layers_of(app_pool, Scope(org)) == [(1, PLATFORM_ORG, 1, platform_l1)]
    async with org_transaction(app_pool, org, readonly=True) as c:
        assert await layers_by_hash(c, Scope(org), [content_sha256("relaxed rules"), content_sha256("forged rules")],
                                    trusted=TRUSTED) == {}
        assert await published_layer(c, org, tampered.event_id) is None  # a refusal leaves no row
    assert "does not hash" in await why_refused(conn, tampered)
    # Rejections take no version: the next good layer is version 1.
    assert await apply(conn, good) == APPLIED
    assert await history(conn, Scope(org), 2) == [(1, "the real rules")]


async def test_level_and_scope_must_agree(conn: asyncpg.Connection) -> None:
    org = new_org()
    # An L2 layer claimed by a team scope, an L1 under a tenant org, an L3 signed for another team.
    team = Scope(org, "p", "t")
    wrong_level = layer_event(2, "x", scope=team)
    tenant_l1 = layer_event(1, "x", scope=Scope(org))
    other_team = layer_event(3, "x", org, "p", "t2", scope=None)
    moved = dataclasses.replace(other_team, scope=team, aggregate=guardrail_aggregate(team.path, 3))
    extra_field = layer_event(2, "x", org, note="unsigned extra payload fields are ignored")
    wrong_partition = dataclasses.replace(layer_event(2, "y", org), aggregate=f"session/{org}/s1")
    outcomes = [await apply(conn, e) for e in (wrong_level, tenant_l1, moved, wrong_partition)]
    assert outcomes == [REJECTED_SCOPE, REJECTED_SCOPE, REJECTED_SCOPE, REJECTED_MALFORMED]
    malformed = Event(GUARDRAIL_PUBLISHED, Scope(org), guardrail_aggregate(org, 2), "op", {"level": 2, "content": 7})
    assert await apply(conn, malformed) == REJECTED_MALFORMED
    assert "payload." in await why_refused(conn, malformed)
    big = layer_event(2, "z" * (64 * 1024 + 1), org)
    assert await apply(conn, big) == REJECTED_MALFORMED
    assert await apply(conn, extra_field) == APPLIED
    assert await conn.fetchval("SELECT count(*) FROM guardrail_layers WHERE org_id = $1", org) == 1


async def test_only_trusted_keys(conn: asyncpg.Connection, app_pool, monkeypatch) -> None:
    org = new_org()
    stranger = Ed25519PrivateKey.generate()
    before = await table_counts(conn)
    assert await apply(conn, layer_event(2, "x", org, key=stranger)) == REJECTED_UNTRUSTED_KEY
    assert await apply(conn, layer_event(2, "x", org), trusted=frozenset()) == REJECTED_UNTRUSTED_KEY
    assert await table_counts(conn) == before  # a refusal writes nothing
    assert await apply(conn, layer_event(2, "x", org)) == APPLIED
    # Without a set given, the process's configured one (here: the stranger only).
    monkeypatch.setenv("CONTEXT_ENGINE_GUARDRAIL_TRUSTED_KEYS", f'["{fingerprint(stranger)}"]')
    assert await apply(conn, layer_event(2, "y", org), trusted=None) == REJECTED_UNTRUSTED_KEY
    assert await apply(conn, layer_event(2, "y", org, key=stranger), trusted=None) == APPLIED
    # Served only while trusted: taking KEY out of the set takes its version out at once, and
    # the stranger's later version is what a caller trusting only KEY never sees.
    assert [(v, c) for _, _, v, c in await layers_of(app_pool, Scope(org))][1:] == [(1, "x")]
    assert [(v, c) for _, _, v, c in await layers_of(app_pool, Scope(org), frozenset({fingerprint(stranger)}))] == [
        (2, "y")]
    assert await layers_of(app_pool, Scope(org), frozenset()) == []


async def test_a_duplicate_delivery_changes_nothing(conn: asyncpg.Connection) -> None:
    org = new_org()
    first = layer_event(2, "rules", org)
    rejected = layer_event(2, "rules", org, content="tampered")
    assert [await apply(conn, first), await apply(conn, rejected)] == [APPLIED, REJECTED_BAD_SIGNATURE]
    before = (await conn.fetch("SELECT * FROM guardrail_layers WHERE org_id = $1", org), await table_counts(conn))
    # A refusal left no trace, so a redelivery is decided again, the same way.
    assert [await apply(conn, first), await apply(conn, rejected), await apply(conn, first)] == [
        DUPLICATE, REJECTED_BAD_SIGNATURE, DUPLICATE]
    after = (await conn.fetch("SELECT * FROM guardrail_layers WHERE org_id = $1", org), await table_counts(conn))
    assert before == after


async def test_apply_batch_dispatches_guardrail_events(conn: asyncpg.Connection, monkeypatch) -> None:
    """Through the session projector, with the trust set of the process's settings, as the worker."""
    monkeypatch.setenv("CONTEXT_ENGINE_GUARDRAIL_TRUSTED_KEYS", f'["{fingerprint(KEY)}"]')
    org = new_org()
    stranger = Ed25519PrivateKey.generate()
    events = [layer_event(2, "v1", org), layer_event(2, "v2", org)]
    records = [LogRecord("guardrail-test", 0, i, e.to_bytes()) for i, e in enumerate(events)]
    results = await apply_batch(conn, records + [LogRecord("guardrail-test", 0, 9, events[0].to_bytes())])
    assert [r.outcome for r in results] == [APPLIED, APPLIED, "DUPLICATE"]
    assert await history(conn, Scope(org), 2) == [(1, "v1"), (2, "v2")]
    assert [r.outcome for r in await apply_batch(conn, records)] == ["DUPLICATE", "DUPLICATE"]
    # A refused layer is neither archived nor applied: only the offsets move.
    forged = [layer_event(2, "forged", org, key=stranger), layer_event(2, "v2", org, content="tampered"),
              dataclasses.replace(events[0], event_id=str(uuid.uuid4()))]
    before = await table_counts(conn)
    refused = await apply_batch(
        conn, [LogRecord("guardrail-test", 0, 10 + i, e.to_bytes()) for i, e in enumerate(forged)])
    assert [r.outcome for r in refused] == [REJECTED_UNTRUSTED_KEY, REJECTED_BAD_SIGNATURE, REJECTED_STALE]
    assert await table_counts(conn) == before
    assert await conn.fetchval("SELECT count(*) FROM event_archive WHERE event_id = ANY($1::uuid[])",
                               [uuid.UUID(e.event_id) for e in forged]) == 0


# -- visibility -------------------------------------------------------------------------------


async def test_l1_is_visible_to_every_org(conn: asyncpg.Connection, app_pool, platform_l1) -> None:
    a, b = new_org(), new_org()
    for org in (a, b):
        assert await apply(conn, layer_event(2, f"rules of {org}", org)) == APPLIED
    for org, other in ((a, b), (b, a)):
        got = await layers_of(app_pool, Scope(org))
        assert [(lvl, path, content) for lvl, path, _, content in got] == [
            (1, PLATFORM_ORG, platform_l1), (2, org, f"rules of {org}")]
        async with org_transaction(app_pool, org, readonly=True) as c:
            # Every platform row is readable (L1 only exists there), no other org's row is.
            orgs = {r["org_id"] for r in await c.fetch("SELECT DISTINCT org_id FROM guardrail_layers")}
            assert orgs == {PLATFORM_ORG, org}
            assert await c.fetchval("SELECT count(*) FROM guardrail_rejections WHERE org_id <> $1", org) == 0
            hashes = await layers_by_hash(c, Scope(org),
                                          [content_sha256(platform_l1), content_sha256(f"rules of {other}")],
                                          trusted=TRUSTED)
            assert list(hashes) == [content_sha256(platform_l1)] and hashes[content_sha256(platform_l1)].level == 1


async def test_a_teams_layer_is_invisible_to_another_team(conn: asyncpg.Connection, app_pool) -> None:
    org = new_org()
    assert await apply(conn, layer_event(3, "team A rules", org, "p", "team-a")) == APPLIED
    assert await apply(conn, layer_event(4, "bot A rules", org, "p", "team-a", "bot")) == APPLIED
    team_b = Scope(org, "p", "team-b", "bot")
    assert [lvl for lvl, *_ in await layers_of(app_pool, team_b)] == [1]
    async with org_transaction(app_pool, org, readonly=True) as c:
        assert await layers_by_hash(c, team_b, [content_sha256("team A rules"), content_sha256("bot A rules")],
                                    trusted=TRUSTED) == {}
        mine = await layers_by_hash(c, Scope(org, "p", "team-a", "bot"), [content_sha256("team A rules")],
                                    trusted=TRUSTED)
        assert mine[content_sha256("team A rules")].scope_path == f"{org}/p/team-a"
    # Same team id under another pillar is another team.
    assert [lvl for lvl, *_ in await layers_of(app_pool, Scope(org, "q", "team-a"))] == [1]


async def test_without_app_org_id_nothing_is_visible(conn: asyncpg.Connection, app_pool, platform_l1) -> None:
    org = new_org()
    assert await apply(conn, layer_event(2, "rules", org)) == APPLIED
    assert await apply(conn, layer_event(2, "rules", org, content="bad")) == REJECTED_BAD_SIGNATURE
    assert await conn.fetchval("SELECT count(*) FROM guardrail_layers WHERE org_id = $1", PLATFORM_ORG) >= 1
    async with app_pool.acquire() as c:
        for table in ("guardrail_layers", "guardrail_rejections"):
            assert await c.fetchval(f"SELECT count(*) FROM {table}") == 0, table
        async with c.transaction():
            await c.execute("SELECT set_config('app.org_id', $1, true)", org)
            assert await c.fetchval("SELECT count(*) FROM guardrail_layers") >= 2
        # The transaction-local setting is now '' on this connection: still nothing.
        assert await c.fetchval("SELECT current_setting('app.org_id', true)") == ""
        assert await c.fetchval("SELECT count(*) FROM guardrail_layers") == 0
        assert await current_layers(c, Scope(org), trusted=TRUSTED) == []


async def test_an_org_cannot_write_platform_rows(conn: asyncpg.Connection, db_url: str) -> None:
    """The L1 policy only reads; writes stay confined to the org in app.org_id."""
    role = "ce_test_guardrail_writer"
    await admin.ensure_role(conn, role, login=False)
    await conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON guardrail_layers TO {role}")
    writer = await asyncpg.connect(db_url)
    try:
        await writer.execute(f"SET ROLE {role}")
        row = ("x", content_sha256("x"), 1, b"s", b"k", "f", "op")
        insert = ("INSERT INTO guardrail_layers (org_id, scope_path, level, version, event_id, content, "
                  "content_hash, effective_at_ms, signature, public_key, key_fingerprint, published_by, "
                  "published_at) VALUES ($1, $1, 1, 999, $2, $3, $4, $5, $6, $7, $8, $9, now())")
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security"):
            async with writer.transaction():
                await writer.execute("SELECT set_config('app.org_id', 'acme', true)")
                await writer.execute(insert, PLATFORM_ORG, uuid.uuid4(), *row)
        async with writer.transaction():
            await writer.execute("SELECT set_config('app.org_id', 'acme', true)")
            assert await writer.fetchval(
                "SELECT count(*) FROM guardrail_layers WHERE org_id = $1", PLATFORM_ORG) >= 1  # readable
            assert await writer.execute("UPDATE guardrail_layers SET content = 'evil' WHERE org_id = $1",
                                        PLATFORM_ORG) == "UPDATE 0"
            assert await writer.execute("DELETE FROM guardrail_layers WHERE org_id = $1", PLATFORM_ORG) == "DELETE 0"
    finally:
        await writer.close()


async def test_validate_prompt_over_the_read_model(conn: asyncpg.Connection, app_pool, platform_l1) -> None:
    """The ValidatePrompt flow: hashes -> layers_by_hash under the caller's org -> validate."""
    org = new_org()
    caller = Scope(org, "p", "t", "bot")
    v1 = "[L2] Org policy: be careful with refunds (revision 1).\n"
    v2 = "[L2] Org policy: be careful with refunds (revision 2).\n"
    for event in (layer_event(2, v1, org), layer_event(3, "[L3] Team rules for p/t.\n", org, "p", "t"),
                  layer_event(2, v2, org)):
        assert await apply(conn, event) == APPLIED
    async with org_transaction(app_pool, org, readonly=True) as c:
        current = await current_layers(c, caller, trusted=TRUSTED)
        hashes = [r.content_hash for r in current]
        rows = await layers_by_hash(c, caller, hashes + [content_sha256(v1)], trusted=TRUSTED)
    assert not rows[content_sha256(v1)].current and rows[hashes[1]].current
    layers = {h: r.content for h, r in rows.items()}
    levels = {h: r.level for h, r in rows.items()}
    text = "".join(r.content for r in current) + "User: hello\n"
    assert validate_prompt(text, hashes, layers, levels=levels).valid
    # A prompt pinned to the earlier L2 still validates against that version's hash.
    old = [hashes[0], content_sha256(v1), hashes[2]]
    assert validate_prompt(text.replace(v2, v1), old, layers, levels=levels).valid
    stale = validate_prompt(text.replace(v2, v1), hashes, layers, levels=levels)
    assert stale.violation_code == "LAYER_HASH_MISMATCH" and stale.violation_detail.startswith("L2 (")


# -- the operator command, through the broker ---------------------------------------------------


@contextlib.asynccontextmanager
async def projecting(bootstrap: str, topic: str, db_url: str) -> AsyncIterator[None]:
    """A stand-in worker: reads the topic and projects its batches as the worker does
    (`apply_batch`, announcing each one's outcomes; the trust set from the process's settings)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", group_id=None)
    await consumer.start()
    conn = await asyncpg.connect(db_url)

    async def run() -> None:
        while True:
            for records in (await consumer.getmany(timeout_ms=100)).values():
                await apply_batch(conn, [LogRecord(r.topic, r.partition, r.offset, r.value) for r in records],
                                  notify=announcement)

    task = asyncio.create_task(run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await consumer.stop()
        await conn.close()


@pytest.fixture
async def own_db(postgres_url: str) -> AsyncIterator[str]:
    """A database of its own: this test publishes L1, which every org of a database sees."""
    async with fresh_database(postgres_url, "ce_guard_cli", migrated=True) as url:
        yield url


async def test_publish_command_end_to_end(kafka_bootstrap: str, own_db: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CONTEXT_ENGINE_GUARDRAIL_TRUSTED_KEYS", f'["{fingerprint(KEY)}"]')  # the worker's set
    db_url = own_db
    topics = LogTopics(f"guardrail-{uuid.uuid4().hex[:6]}", events_partitions=2, job_partitions=1)
    topic = topics.events
    signer = RecordSigner(Keyring(tmp_path / "log-hmac.keyring"))

    async def recover() -> None:
        await ensure_topics(kafka_bootstrap, {topic: 2})

    org = new_org()
    pool = await create_pool(db_url, org_scoped=False, max_size=2)
    app_pool = await create_pool(app_url(db_url, APP_ROLE, APP_PASSWORD), max_size=1)
    owner = layer_scope(3, org, "sales", "emea")
    log = EventLog(kafka_bootstrap, topics, recover, signer=signer)
    watch = ArchiveWatch(db_url, pool)
    await log.start()
    await watch.start()
    publish = dict(key=KEY, pool=pool, log=log, watch=watch, actor="cli:test", timeout=20)
    try:
        async with projecting(kafka_bootstrap, topic, db_url):
            first = await publish_guardrail(PublishGuardrail(3, owner, "Quote prices in EUR.\n"), **publish)
            assert (first.level, first.scope_path, first.version, first.unchanged) == (3, owner.path, 1, False)
            assert first.content_hash == content_sha256("Quote prices in EUR.\n")
            assert first.fingerprint == fingerprint(KEY) and first.event_id
            again = await publish_guardrail(PublishGuardrail(3, owner, "Quote prices in EUR.\n"), **publish)
            assert (again.version, again.unchanged, again.event_id) == (1, True, "")
            forced = await publish_guardrail(PublishGuardrail(3, owner, "Quote prices in EUR.\n", force=True),
                                             **publish)
            assert (forced.version, forced.unchanged) == (2, False)
            assert forced.effective_at_ms > first.effective_at_ms
            changed = await publish_guardrail(PublishGuardrail(3, owner, "Quote prices in EUR or GBP.\n"),
                                              **publish)
            assert changed.version == 3
            platform = await publish_guardrail(PublishGuardrail(1, layer_scope(1), f"L1 {org}\n"), **publish)
            assert platform.level == 1 and platform.scope_path == PLATFORM_ORG
            # Another key: refused by the command before anything is appended, when it is given
            # the trust set; refused by the projection, and said so, when it is not.
            stranger = publish | {"key": Ed25519PrivateKey.generate()}
            with pytest.raises(InvalidArgument, match="not a trusted guardrail key"):
                await publish_guardrail(PublishGuardrail(1, layer_scope(1), "forged\n"), trusted=TRUSTED, **stranger)
            with pytest.raises(GuardrailPublishError, match="refused the layer .REJECTED_UNTRUSTED_KEY."):
                await publish_guardrail(PublishGuardrail(1, layer_scope(1), "forged\n"), **stranger)
        # verify: the refused layer is on the log and rightly neither archived nor set aside.
        records = read_log(kafka_bootstrap, topic, verifier=RecordVerifier(signer.keyring))
        assert await compare_log(records, topic, db_url) == []
        got = await list_layers(app_pool, Scope(org, "sales", "emea", "bot"), trusted=TRUSTED)
        assert [(r.level, r.version, r.content) for r in got] == [
            (1, platform.version, f"L1 {org}\n"), (3, 3, "Quote prices in EUR or GBP.\n")]
        async with org_transaction(pool, org) as c:
            assert (await current_layer(c, owner, 3)).version == 3
        # Nobody projecting: appended, but the command says it was not projected in time.
        with pytest.raises(GuardrailPublishError, match="not projected within"):
            await publish_guardrail(PublishGuardrail(2, layer_scope(2, org), "late\n"),
                                    **(publish | {"timeout": 1.0}))
    finally:
        await watch.stop()
        await log.stop()
        await pool.close()
        await app_pool.close()
