"""Versioned migrations, the API role and row-level security, against the real PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

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
from context_engine.hashing import sha256_hex
from context_engine.scope import Scope
from projections.projector.batch import apply_batch
from projections.projector.records import LogRecord
from projections.reads import sessions as queries
from projections.store.migrations import (
    API_GROUP_ROLE,
    MIGRATIONS_DIR,
    MigrationError,
    app_url,
    load_migrations,
    migrate,
)
from projections.store.pool import DatabaseRoleError, create_pool, org_transaction
from tests.fixtures.databases import fresh_database, owned_database

pytestmark = pytest.mark.integration

APP_ROLE = "context_engine_app"
APP_PASSWORD = "app-test-password"  # ignored by trust auth (embedded), needed by testcontainers
CORE_TABLES = {"event_archive", "sessions", "session_items", "session_versions", "session_events",
               "memory_versions", "snapshots", "projector_offsets"}


@pytest.fixture
async def fresh_db(postgres_url: str) -> AsyncIterator[str]:
    """An empty database of its own on the session's server; dropped afterwards."""
    async with fresh_database(postgres_url, "ce_mig") as url:
        yield url


def _events(org: str) -> list[Event]:
    """One of each event type, so every core table gets a row for `org`."""
    scope = Scope(org, "p1", "t1", "bot")
    agg = session_aggregate(org, "s1")
    content = b"hello " + org.encode()
    b64 = base64.b64encode(content).decode()
    ingest = Event(EVENT_INGESTED, scope, agg, "user", {
        "session_id": "s1", "event_type": "message", "content_b64": b64, "metadata": {"k": "v"},
        "content_sha256": sha256_hex(content), "token_count": 2})
    push = Event(MEMORY_PUSHED, scope, agg, "user", {
        "session_id": "s1", "agent_id": "bot", "memory_type": "semantic", "content_b64": b64,
        "metadata": {}, "content_sha256": sha256_hex(content)})
    snap = Event(SNAPSHOT_CREATED, scope, agg, "user",
                 {"session_id": "s1", "snapshot_id": str(uuid.uuid4()), "name": "first"})
    back = Event(SESSION_ROLLED_BACK, scope, agg, "user",
                 {"session_id": "s1", "target_version": "0" * 64})  # unknown: a no-op, still archived
    return [ingest, push, snap, back]


async def _populate(url: str, orgs: list[str]) -> None:
    records = [LogRecord("domain", n, i, ev.to_bytes())
               for n, org in enumerate(orgs) for i, ev in enumerate(_events(org))]
    conn = await asyncpg.connect(url)
    try:
        await apply_batch(conn, records)
    finally:
        await conn.close()


async def test_migrate_twice_is_a_no_op_the_second_time(fresh_db: str) -> None:
    assert await migrate(fresh_db, app_password=APP_PASSWORD) == [m.version for m in load_migrations()]
    conn = await asyncpg.connect(fresh_db)
    try:
        before = await conn.fetch("SELECT version, checksum, applied_at FROM schema_migrations ORDER BY version")
        assert await migrate(fresh_db, app_password=APP_PASSWORD) == []
        after = await conn.fetch("SELECT version, checksum, applied_at FROM schema_migrations ORDER BY version")
        assert before == after
        extensions = {r["extname"] for r in await conn.fetch("SELECT extname FROM pg_extension")}
        assert {"vector", "pg_trgm"} <= extensions
        tables = {r["table_name"] for r in await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")}
        assert CORE_TABLES | {"schema_migrations"} <= tables
    finally:
        await conn.close()


async def test_concurrent_starters_apply_each_migration_once(fresh_db: str) -> None:
    results = await asyncio.gather(*(migrate(fresh_db, app_password=APP_PASSWORD) for _ in range(3)))
    assert sorted(results, key=len) == [[], [], [m.version for m in load_migrations()]]


async def test_processes_migrating_one_empty_database_at_once_apply_each_migration_once(
        fresh_db: str, tmp_path: Path) -> None:
    """`context-engine migrate` in 4 processes started together (compose's one-shot service, or
    replicas that each migrate): one applies everything, the others find it up to date."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXT_ENGINE_")}
    env["CONTEXT_ENGINE_HOME"] = str(tmp_path / "home")  # one app-password file for all of them
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, "-m", "context_engine", "migrate", "--database-url", fresh_db, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT) for _ in range(4)]
    outputs = [(await p.communicate())[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outputs
    everything = "schema migrations: " + ", ".join(m.version for m in load_migrations())
    assert sorted(o.strip() for o in outputs) == sorted([everything] + ["schema migrations: up to date"] * 3)
    conn = await asyncpg.connect(fresh_db)
    try:
        rows = await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")
        assert [r["version"] for r in rows] == [m.version for m in load_migrations()]
    finally:
        await conn.close()


async def test_a_changed_migration_is_refused(fresh_db: str, tmp_path: Path) -> None:
    directory = tmp_path / "sql"
    shutil.copytree(MIGRATIONS_DIR, directory)
    assert await migrate(fresh_db, app_password=APP_PASSWORD, directory=directory)
    first = sorted(directory.glob("*.sql"))[0]
    first.write_text(first.read_text() + "\n-- edited after it was applied\n")
    with pytest.raises(MigrationError, match="changed after it was applied"):
        await migrate(fresh_db, app_password=APP_PASSWORD, directory=directory)
    # A new file is the way to change the schema.
    (directory / "9999_more.sql").write_text("CREATE TABLE IF NOT EXISTS later (org_id text);")
    first.write_text(first.read_text().removesuffix("\n-- edited after it was applied\n"))
    assert await migrate(fresh_db, app_password=APP_PASSWORD, directory=directory) == ["9999"]


async def test_app_role_cannot_bypass_row_level_security(fresh_db: str) -> None:
    await migrate(fresh_db, app_password=APP_PASSWORD)
    conn = await asyncpg.connect(fresh_db)
    try:
        for role in (APP_ROLE, API_GROUP_ROLE):
            row = await conn.fetchrow(
                "SELECT rolsuper, rolbypassrls, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = $1", role)
            assert row is not None and not any(row.values()), (role, dict(row))
        # Membership must not lead to any role that bypasses RLS either.
        assert not await conn.fetchval(
            "SELECT bool_or(r.rolsuper OR r.rolbypassrls) FROM pg_roles r "
            "WHERE pg_has_role($1, r.oid, 'MEMBER') AND r.rolname <> $1", APP_ROLE)
        assert not await conn.fetchval("SELECT has_table_privilege($1, 'sessions', 'INSERT')", APP_ROLE)
        assert not await conn.fetchval("SELECT has_table_privilege($1, 'schema_migrations', 'SELECT')", APP_ROLE)
    finally:
        await conn.close()
    with pytest.raises(DatabaseRoleError):
        await create_pool(fresh_db)  # the admin URL is refused where RLS must apply
    pool = await create_pool(app_url(fresh_db, APP_ROLE, APP_PASSWORD), max_size=2)
    await pool.close()


async def test_without_org_setting_every_table_is_empty(fresh_db: str) -> None:
    await migrate(fresh_db, app_password=APP_PASSWORD)
    await _populate(fresh_db, ["org-a", "org-b"])
    admin = await asyncpg.connect(fresh_db)
    app = await asyncpg.connect(app_url(fresh_db, APP_ROLE, APP_PASSWORD))
    try:
        tables = [r["table_name"] for r in await admin.fetch(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY table_name")]
        assert CORE_TABLES <= set(tables)
        checked = []
        for table in tables:
            if not await admin.fetchval("SELECT has_table_privilege($1, $2, 'SELECT')", APP_ROLE, table):
                continue  # e.g. schema_migrations: not even readable
            flags = await admin.fetchrow(
                "SELECT relrowsecurity, relforcerowsecurity FROM pg_class WHERE oid = $1::regclass", table)
            assert flags["relrowsecurity"] and flags["relforcerowsecurity"], table
            orgs = {r["org_id"] for r in await admin.fetch(f'SELECT DISTINCT org_id FROM "{table}"')}
            if table in CORE_TABLES:
                assert orgs == ({"_system"} if table == "projector_offsets" else {"org-a", "org-b"}), table
            assert await app.fetchval(f'SELECT count(*) FROM "{table}"') == 0, table
            async with app.transaction():
                await app.execute("SELECT set_config('app.org_id', 'org-a', true)")
                seen = {r["org_id"] for r in await app.fetch(f'SELECT org_id FROM "{table}"')}
                assert seen <= {"org-a"}, table
                if table in CORE_TABLES - {"projector_offsets"}:
                    assert seen == {"org-a"}, table
            # transaction-local: gone after commit, on the same connection
            assert await app.fetchval(f'SELECT count(*) FROM "{table}"') == 0, table
            checked.append(table)
        assert CORE_TABLES <= set(checked)
    finally:
        await app.close()
        await admin.close()


async def test_app_role_cannot_write_another_orgs_rows(fresh_db: str) -> None:
    await migrate(fresh_db, app_password=APP_PASSWORD)
    await _populate(fresh_db, ["org-a", "org-b"])
    pool = await create_pool(app_url(fresh_db, APP_ROLE, APP_PASSWORD), max_size=2)
    admin = await asyncpg.connect(fresh_db)
    try:
        # Production grants are read-only ...
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied"):
            async with org_transaction(pool, "org-a") as conn:
                await conn.execute("DELETE FROM sessions")
        # ... so grant a write to see the WITH CHECK half of the policy at work.
        await admin.execute(f'GRANT INSERT, UPDATE ON snapshots TO "{API_GROUP_ROLE}"')
        row = ("s1", "x", "0" * 64, 0, "{}", str(uuid.uuid4()), "user")
        insert = ("INSERT INTO snapshots (snapshot_id, org_id, session_id, name, version, seq, state, "
                  "event_id, created_at, created_by, scope_path) "
                  "VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb, $8, now(), $9, $2)")
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security"):
            async with org_transaction(pool, "org-a") as conn:
                await conn.execute(insert, uuid.uuid4(), "org-b", *row)
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security"):
            async with org_transaction(pool, "org-a") as conn:
                await conn.execute("UPDATE snapshots SET org_id = 'org-b'")
        async with org_transaction(pool, "org-a") as conn:
            await conn.execute(insert, uuid.uuid4(), "org-a", *row)
            # Reads through the query module see org a only, whatever ids are asked for.
            assert await queries.get_session(conn, "org-b", "s1") is None
            assert (await queries.get_session(conn, "org-a", "s1")).active_count == 2
        assert await admin.fetchval("SELECT count(*) FROM snapshots WHERE org_id = 'org-b'") == 1
        assert await admin.fetchval("SELECT count(*) FROM snapshots WHERE org_id = 'org-a'") == 2
    finally:
        await admin.close()
        await pool.close()


async def test_an_org_transactions_settings_end_with_it_on_a_pooled_connection(fresh_db: str) -> None:
    """The API's pools skip asyncpg's RESET ALL on release: safe only because every setting
    `org_transaction` makes is transaction-local. One connection, two callers in turn."""
    await migrate(fresh_db, app_password=APP_PASSWORD)
    pool = await create_pool(app_url(fresh_db, APP_ROLE, APP_PASSWORD), min_size=1, max_size=1)
    try:
        ef_search = "SELECT current_setting('hnsw.ef_search', true)"  # NULL until pgvector is loaded
        default_ef = await pool.fetchval(ef_search)
        async with org_transaction(pool, "org-a", readonly=True, local={"hnsw.ef_search": "77"}) as conn:
            assert await conn.fetchval("SELECT current_setting('app.org_id')") == "org-a"
            assert await conn.fetchval(ef_search) == "77"
            first_pid = await conn.fetchval("SELECT pg_backend_pid()")
        async with pool.acquire() as conn:  # the same connection, outside any org transaction
            assert await conn.fetchval("SELECT pg_backend_pid()") == first_pid
            assert not await conn.fetchval("SELECT current_setting('app.org_id', true)")
            assert await conn.fetchval(ef_search) in (default_ef, "", None)  # not "77": reverted
        async with org_transaction(pool, "org-b", readonly=True) as conn:
            assert await conn.fetchval("SELECT current_setting('app.org_id')") == "org-b"
        with pytest.raises(ValueError, match="not a setting name"):
            async with org_transaction(pool, "org-a", local={"x'); DROP TABLE chunks; --": "1"}):
                pass
    finally:
        await pool.close()


async def test_an_org_transaction_opens_in_one_script_and_ends_on_failure(fresh_db: str) -> None:
    """BEGIN and the settings go as one script with the values as literals: a value holding
    quotes is set exactly, never run; READ ONLY holds; a failure inside leaves the pooled
    connection outside any transaction and without the org's setting."""
    await migrate(fresh_db, app_password=APP_PASSWORD)
    pool = await create_pool(app_url(fresh_db, APP_ROLE, APP_PASSWORD), min_size=1, max_size=1)
    tricky = "org'; SELECT pg_sleep(10); --"
    reported: list[dict] = []  # asyncpg reports a connection released inside a transaction here
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        async with org_transaction(pool, tricky, readonly=True, local={"lock_timeout": "1234ms"}) as conn:
            assert conn.is_in_transaction()
            assert await conn.fetchval("SELECT current_setting('app.org_id')") == tricky
            assert await conn.fetchval("SELECT current_setting('lock_timeout')") == "1234ms"
            with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
                await conn.execute("CREATE TEMP TABLE t (x int)")
        with pytest.raises(RuntimeError, match="inside"):
            async with org_transaction(pool, "org-a") as conn:
                await conn.execute("CREATE TEMP TABLE kept_if_committed (x int)")
                raise RuntimeError("a failure inside the block")
        async with pool.acquire() as conn:
            assert not conn.is_in_transaction()
            assert not await conn.fetchval("SELECT current_setting('app.org_id', true)")
            assert await conn.fetchval("SELECT to_regclass('pg_temp.kept_if_committed')") is None
        assert reported == []  # rolled back by org_transaction itself, not left to the release
        with pytest.raises(ValueError, match="NUL"):
            async with org_transaction(pool, "org\x00a"):
                pass
    finally:
        loop.set_exception_handler(previous)
        await pool.close()


@pytest.fixture(params=["superuser", "owner without BYPASSRLS"])
async def admin_db(request, fresh_db: str, postgres_url: str) -> AsyncIterator[str]:
    """An empty database and its admin's URL: the test server's superuser, or an owner that
    row-level security applies to (an external deployment's admin)."""
    if request.param == "superuser":
        yield fresh_db
        return
    app_role = f"ce_test_mig_app_{uuid.uuid4().hex[:6]}"
    async with owned_database(postgres_url, then_drop_roles=[app_role]) as (_, owner_url):
        request.node.app_role = app_role
        yield owner_url


async def migrate_before(version: str, admin_db: str, tmp_path: Path, request) -> str:
    """Bring the database to the schema just before `version`; the app role the test migrates with."""
    app_role = getattr(request.node, "app_role", APP_ROLE)
    before = tmp_path / "before"
    before.mkdir()
    for m in load_migrations():
        if m.version < version:
            shutil.copy(MIGRATIONS_DIR / m.name, before / m.name)
    await migrate(admin_db, app_role=app_role, app_password=APP_PASSWORD, directory=before)
    return app_role


async def test_snapshot_names_become_their_creators_with_the_archived_scope(admin_db: str, tmp_path: Path,
                                                                             request) -> None:
    """0019 gives snapshots made before it the scope of the event that made them; one whose
    event is missing, or does not read as JSON (a \\u0000 in its actor), becomes the org's."""
    app_role = await migrate_before("0019", admin_db, tmp_path, request)
    team = Scope("org-a", "sales", "emea")
    made = [Event(SNAPSHOT_CREATED, team, session_aggregate("org-a", "s"), actor,
                  {"session_id": "s", "snapshot_id": str(uuid.uuid4()), "name": name})
            for name, actor in (("n", "lead"), ("nul", "a\x00b"))]
    conn = await asyncpg.connect(admin_db)
    try:
        async with conn.transaction():
            await conn.execute("SELECT set_config('app.org_id', 'org-a', true)")
            for event in made:
                await conn.execute(
                    "INSERT INTO event_archive (event_id, org_id, topic, partition, \"offset\", aggregate, type, "
                    "schema_version, occurred_at, actor, content_hash, raw) "
                    "VALUES ($1, 'org-a', 't', 0, 0, $2, $3, 1, now(), 'lead', $4, $5)",
                    uuid.UUID(event.event_id), event.aggregate, event.type, event.content_hash, event.to_bytes())
            rows = [(uuid.UUID(e.payload["snapshot_id"]), e.payload["name"], uuid.UUID(e.event_id)) for e in made]
            rows.append((uuid.uuid4(), "orphan", uuid.uuid4()))
            await conn.executemany(
                "INSERT INTO snapshots (snapshot_id, org_id, session_id, name, version, seq, state, event_id, "
                "created_at, created_by) VALUES ($1, 'org-a', 's', $2, $3, 0, '{}', $4, now(), 'lead')",
                [(sid, name, "0" * 64, eid) for sid, name, eid in rows])
        assert await migrate(admin_db, app_role=app_role, app_password=APP_PASSWORD) == \
            [m.version for m in load_migrations() if m.version >= "0019"]
        async with conn.transaction():
            await conn.execute("SELECT set_config('app.org_id', 'org-a', true)")
            assert dict(await conn.fetch("SELECT name, scope_path FROM snapshots")) == \
                {"n": "org-a/sales/emea", "nul": "org-a", "orphan": "org-a"}
        assert await conn.fetchval(  # row-level security is forced again
            "SELECT bool_and(relforcerowsecurity) FROM pg_class WHERE relname IN ('snapshots', 'event_archive')")
    finally:
        await conn.close()


async def test_compactions_projected_before_0025_keep_their_turns_retrievable(admin_db: str, tmp_path: Path,
                                                                             request) -> None:
    """0025 makes the turns a compaction replaced retrievable again (recall storage) and the chunks
    of a summary written as one row shown only, with the statistics recounted over what is
    searchable now."""
    app_role = await migrate_before("0025", admin_db, tmp_path, request)
    turns, summary = [uuid.uuid4(), uuid.uuid4()], uuid.uuid4()
    chunk = {source: uuid.uuid4() for source in (*turns, summary)}
    conn = await asyncpg.connect(admin_db)
    try:
        async with conn.transaction():  # what the projector wrote before 0025
            await conn.execute("SELECT set_config('app.org_id', 'org-a', true)")
            for seq, (item, active, replaces) in enumerate(
                    ((turns[0], False, []), (turns[1], False, []), (summary, True, [1, 2])), start=1):
                await conn.execute(
                    "INSERT INTO session_items (org_id, session_id, seq, event_id, kind, content_hash, prev_seq, "
                    "version, active, occurred_at, replaces) VALUES ('org-a', 's', $1, $2, 'event', 'h', $3, 'v', $4, "
                    "now(), $5)", seq, item, seq - 1, active, replaces)
                await conn.execute(
                    "INSERT INTO session_events (event_id, org_id, session_id, seq, scope_path, event_type, content, "
                    "content_sha256, token_count, version, occurred_at, active) VALUES ($1, 'org-a', 's', $2, "
                    "'org-a', $3, 'text', 'h', 1, 'v', now(), $4)",
                    item, 1 if item == summary else seq, "compaction" if item == summary else "message", active)
                await conn.execute(
                    "INSERT INTO chunks (chunk_id, org_id, scope_path, source_event_id, source_kind, session_id, "
                    "chunk_index, content, content_hash, token_count, term_count, created_at, active) "
                    "VALUES ($1, 'org-a', 'org-a', $2, 'event', 's', 0, 'lisbon order', 'h', 2, 2, now(), $3)",
                    chunk[item], item, active)
                await conn.execute(
                    "INSERT INTO chunk_terms (org_id, term, chunk_id, tf, doc_length, scope_path, domain, searchable, "
                    "impact) VALUES ('org-a', 'lisbon', $1, 1, 2, 'org-a', '', $2, 1.0)", chunk[item], active)
            await conn.execute("INSERT INTO corpus_stats (org_id, scope_path, domain, n_docs, total_length, "
                               "token_total) VALUES ('org-a', 'org-a', '', 1, 2, 2)")
            await conn.execute("INSERT INTO term_stats (org_id, scope_path, domain, term, df) "
                               "VALUES ('org-a', 'org-a', '', 'lisbon', 1)")
        assert await migrate(admin_db, app_role=app_role, app_password=APP_PASSWORD) == \
            [m.version for m in load_migrations() if m.version >= "0025"]
        async with conn.transaction():
            await conn.execute("SELECT set_config('app.org_id', 'org-a', true)")
            rows = {r["source_event_id"]: (r["source_kind"], r["searchable"]) for r in await conn.fetch(
                "SELECT source_event_id, source_kind, searchable FROM chunks")}
            assert rows == {turns[0]: ("event", True), turns[1]: ("event", True), summary: ("summary", False)}
            assert dict(await conn.fetch("SELECT chunk_id, searchable FROM chunk_terms")) == {
                chunk[turns[0]]: True, chunk[turns[1]]: True, chunk[summary]: False}
            assert await conn.fetchval("SELECT n_docs FROM corpus_stats") == 2
            assert await conn.fetchval("SELECT df FROM term_stats WHERE term = 'lisbon'") == 2
        assert await conn.fetchval(  # row-level security is forced again
            "SELECT bool_and(relforcerowsecurity) FROM pg_class WHERE relname IN ('chunks', 'session_items')")
    finally:
        await conn.close()


async def test_chunks_projected_before_0026_get_their_turns_positions(admin_db: str, tmp_path: Path,
                                                                      request) -> None:
    """0026 gives a turn's chunks its seq (Search's adjacent-turn lift); a memory's chunk has none."""
    app_role = await migrate_before("0026", admin_db, tmp_path, request)
    turns, memory = {uuid.uuid4(): 7, uuid.uuid4(): 8}, uuid.uuid4()
    conn = await asyncpg.connect(admin_db)
    try:
        async with conn.transaction():
            await conn.execute("SELECT set_config('app.org_id', 'org-a', true)")
            for item, seq in turns.items():
                await conn.execute(
                    "INSERT INTO session_events (event_id, org_id, session_id, seq, scope_path, event_type, content, "
                    "content_sha256, token_count, version, occurred_at) VALUES ($1, 'org-a', 's', $2, 'org-a', "
                    "'message', 'text', 'h', 1, 'v', now())", item, seq)
            for item, kind in [*((t, "event") for t in turns), (memory, "memory")]:
                await conn.execute(
                    "INSERT INTO chunks (chunk_id, org_id, scope_path, source_event_id, source_kind, session_id, "
                    "chunk_index, content, content_hash, token_count, term_count, created_at) "
                    "VALUES ($1, 'org-a', 'org-a', $2, $3, 's', 0, 'text', 'h', 1, 1, now())", uuid.uuid4(), item, kind)
        assert await migrate(admin_db, app_role=app_role, app_password=APP_PASSWORD) == \
            [m.version for m in load_migrations() if m.version >= "0026"]
        async with conn.transaction():
            await conn.execute("SELECT set_config('app.org_id', 'org-a', true)")
            assert dict(await conn.fetch("SELECT source_event_id, seq FROM chunks")) == {**turns, memory: None}
        assert await conn.fetchval(  # row-level security is forced again
            "SELECT bool_and(relforcerowsecurity) FROM pg_class WHERE relname IN ('chunks', 'session_events')")
    finally:
        await conn.close()
