"""A process on the host against PostgreSQL (docs/security.md, "PostgreSQL").

1. Every role authenticates (SCRAM-SHA-256): no password, a wrong one or another role's is
   refused, over TCP and the unix socket, from asyncpg and from psql (libpq), and so is another
   local user, who cannot read the passwords either.
2. The secrets are files of mode 0600 in a 0700 directory, and appear in no log, no command line
   and no output of `up`.
3. The app role (the API's login role) cannot widen its view to several orgs: under
   app.org_id '_system' and every other attempt below it reads 0 rows of every table while
   several orgs have data, and cannot make itself a member of the role that can.
4. An external deployment whose admin is not a superuser still sweeps across orgs, through
   context_engine_system, and only through it.
5. A data directory initialised with trust by an earlier release is brought to scram by `up`.

Every refusal on the suite's quiet deployment is checked to have written nothing (`unchanged_rows`).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import io
import json
import os
import pathlib
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass

import asyncpg
import grpc
import pytest

from context_engine.events import EVENT_INGESTED, MEMORY_PUSHED, Event, session_aggregate
from context_engine.hashing import sha256_hex
from context_engine.scope import Scope
from entrypoints.embedded.postgres import (
    HBA_CONF,
    SUPERUSER,
    EmbeddedPostgres,
    _as_user,
    _make_traversable,
    pg_install_dir,
)
from entrypoints.embedded.process import free_port
from projections.projector import deferred_indexing
from projections.projector import savings as savings_projection
from projections.projector.batch import apply_batch
from projections.projector.chunks import pending_vector_assignments
from projections.projector.records import LogRecord
from projections.store import admin as db_admin
from projections.store.migrations import (
    API_GROUP_ROLE,
    APP_ROLE,
    MIGRATIONS_DIR,
    SYSTEM_ROLE,
    MigrationError,
    app_url,
    migrate,
)
from projections.store.pool import create_pool, org_transaction
from streams import pii_rescan
from tests.fixtures.databases import fresh_database, owned_database
from tests.fixtures.engine import unique
from tests.fixtures.infra import APP_PASSWORD, START_TIMEOUT_S, deployment_env
from upsquad.context.v1 import context_pb2 as pb

pytestmark = pytest.mark.integration

PSQL = str(pg_install_dir() / "bin" / "psql")
AUTH_REFUSED = re.compile(r"password authentication failed|no password supplied")


@pytest.fixture(autouse=True)
def _no_ambient_password(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    """A refusal must come from the server, not from a password the environment supplies."""
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-passfile"))


@pytest.fixture(scope="module")
def engine(quiet_engine):
    """This module attacks the suite's quiet deployment, where nothing writes a row unprompted
    (tests/security/deployment.py): `unchanged_rows` then judges every refusal."""
    return quiet_engine


async def _settled(admin_url: str) -> None:
    from tests.fixtures.settling import settled

    await settled(admin_url)


@pytest.fixture(scope="module")
async def settled_engine(engine):
    await _settled(engine.settings.database_url)
    return engine


# -- 1. authentication ------------------------------------------------------------------------

# (role, password); "<superuser>" / "<app>" stand for the real passwords, given to the wrong role.
REFUSED_CREDENTIALS = {
    "superuser, no password": (SUPERUSER, None),
    "superuser, empty password": (SUPERUSER, ""),
    "superuser, wrong password": (SUPERUSER, "wrong"),
    "superuser, the app role's password": (SUPERUSER, "<app>"),
    "app role, no password": (APP_ROLE, None),
    "app role, wrong password": (APP_ROLE, "wrong"),
    "app role, the superuser's password": (APP_ROLE, "<superuser>"),
    "system role (NOLOGIN), no password": (SYSTEM_ROLE, None),
    "system role (NOLOGIN), the superuser's password": (SYSTEM_ROLE, "<superuser>"),
    "API group (NOLOGIN), the app role's password": (API_GROUP_ROLE, "<app>"),
}
TRANSPORTS = ("tcp", "unix socket")
CLIENTS = ("asyncpg", "psql")


def _real(password: str | None, server: EmbeddedPostgres) -> str | None:
    return {"<superuser>": server.password, "<app>": APP_PASSWORD}.get(password, password)


def _host(server: EmbeddedPostgres, transport: str) -> str:
    if transport == "tcp":
        return "127.0.0.1"
    assert server.socket_dir is not None, "the session server has no unix socket"
    return str(server.socket_dir)


async def _login(client: str, host: str, port: int, role: str, password: str | None, database: str,
                 run_as: str | None = None) -> str:
    """current_user after logging in; raises PermissionError carrying the refusal otherwise."""
    if client == "asyncpg":
        try:
            conn = await asyncpg.connect(host=host, port=port, user=role, password=password, database=database)
        except (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError) as exc:
            raise PermissionError(str(exc)) from exc
        try:
            return await conn.fetchval("SELECT current_user")
        finally:
            await conn.close()
    env = {k: v for k, v in os.environ.items() if k != "PGPASSWORD"}
    if password is not None:
        env["PGPASSWORD"] = password
    cmd = [PSQL, "-X", "-w", "-A", "-t", "-h", host, "-p", str(port), "-U", role, "-d", database,
           "-c", "SELECT current_user"]
    res = await asyncio.to_thread(subprocess.run, cmd, env=env, capture_output=True, text=True, timeout=30,
                                  **({"user": run_as} if run_as else {}))
    if res.returncode != 0:
        raise PermissionError(res.stderr)
    return res.stdout.strip()


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("credentials", REFUSED_CREDENTIALS, ids=str)
async def test_a_login_without_the_roles_own_password_is_refused(
        credentials: str, transport: str, client: str, embedded_postgres: EmbeddedPostgres,
        settled_engine, unchanged_rows) -> None:
    engine = settled_engine
    role, password = REFUSED_CREDENTIALS[credentials]
    database = engine.settings.database_url.rsplit("/", 1)[1]
    async with unchanged_rows():
        with pytest.raises(PermissionError) as refused:
            await _login(client, _host(embedded_postgres, transport), embedded_postgres.port, role,
                         _real(password, embedded_postgres), database)
    assert AUTH_REFUSED.search(str(refused.value)), refused.value


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("role", (SUPERUSER, APP_ROLE))
async def test_the_roles_own_password_logs_in(role: str, transport: str, client: str,
                                              embedded_postgres: EmbeddedPostgres, engine) -> None:
    """The control: the refusals above are about the password, not the address or the client."""
    password = embedded_postgres.password if role == SUPERUSER else APP_PASSWORD
    database = engine.settings.database_url.rsplit("/", 1)[1]
    assert await _login(client, _host(embedded_postgres, transport), embedded_postgres.port, role,
                        password, database) == role


def _other_local_user() -> str:
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another local user")
    try:
        return pwd.getpwnam("nobody").pw_name
    except KeyError:
        pytest.skip("no user 'nobody' on this host")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_another_local_user_can_neither_log_in_nor_read_the_passwords(
        transport: str, embedded_postgres: EmbeddedPostgres, settled_engine, unchanged_rows) -> None:
    engine = settled_engine
    user = _other_local_user()
    database = engine.settings.database_url.rsplit("/", 1)[1]
    for path in (embedded_postgres.password_path, engine.settings.app_password_path):
        res = subprocess.run(["cat", str(path)], user=user, capture_output=True, text=True)
        assert res.returncode != 0 and "Permission denied" in res.stderr, (path, res.stdout, res.stderr)
    async with unchanged_rows():
        for role in (SUPERUSER, APP_ROLE):
            with pytest.raises(PermissionError) as refused:
                await _login("psql", _host(embedded_postgres, transport), embedded_postgres.port, role, None,
                             database, run_as=user)
            # Over the socket the data directory (0700) already stops it; over TCP the password does.
            assert re.search(AUTH_REFUSED.pattern + "|Permission denied", str(refused.value)), refused.value


# -- 2. secrets at rest and in logs -----------------------------------------------------------


def _mode(path: pathlib.Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _files_under(*roots: pathlib.Path) -> list[pathlib.Path]:
    found = []
    for root in roots:
        if root.is_file():
            found.append(root)
        elif root.is_dir():
            found += [p for p in root.rglob("*") if p.is_file()]
    return found


def _leaks(secrets_: dict[str, str], files: list[pathlib.Path], *texts: str) -> list[tuple[str, str]]:
    """(secret name, where) for every secret found in a file or a text."""
    out = []
    for path in files:
        data = path.read_bytes()
        out += [(name, str(path)) for name, value in secrets_.items() if value.encode() in data]
    for i, text in enumerate(texts):
        out += [(name, f"text {i}") for name, value in secrets_.items() if value in text]
    return out


async def test_the_session_servers_password_file_and_pg_hba(embedded_postgres: EmbeddedPostgres, engine) -> None:
    keys = embedded_postgres.password_path.parent
    assert (_mode(embedded_postgres.password_path), _mode(keys)) == (0o600, 0o700)
    assert embedded_postgres.password_path.stat().st_uid == os.geteuid()
    assert len(embedded_postgres.password) == 64 and int(embedded_postgres.password, 16) >= 0
    hba = embedded_postgres.data_dir / "pg_hba.conf"
    assert hba.read_text() == HBA_CONF and _mode(hba) == 0o600
    assert [line.split()[-1] for line in HBA_CONF.splitlines() if line and not line.startswith("#")] \
        == ["scram-sha-256"] * 3
    # The server's own view: every line it loaded asks for scram.
    conn = await asyncpg.connect(engine.settings.database_url)
    try:
        methods = {r["auth_method"] for r in await conn.fetch("SELECT auth_method FROM pg_hba_file_rules")}
        assert methods == {"scram-sha-256"}
        assert await conn.fetchval("SHOW password_encryption") == "scram-sha-256"
        # Every role that can log in has a SCRAM verifier, none a plaintext or md5 password.
        stored = {r["rolname"]: r["rolpassword"] for r in await conn.fetch(
            "SELECT rolname, rolpassword FROM pg_authid WHERE rolcanlogin")}
    finally:
        await conn.close()
    assert {SUPERUSER, APP_ROLE} <= stored.keys()
    assert all(p and p.startswith("SCRAM-SHA-256$4096:") for p in stored.values()), stored.keys()
    leaks = _leaks({"superuser": embedded_postgres.password, "app": APP_PASSWORD},
                   _files_under(embedded_postgres.log_path, engine.settings.home_dir))
    # The engine's home holds the app password file itself; every other file must not.
    assert [leak for leak in leaks if leak[1] != str(engine.settings.app_password_path)] == []


async def test_a_deleted_password_file_is_a_new_password(service_tmp_path: pathlib.Path) -> None:
    """Rotation (docs/security.md): stop, delete the file, start: the old password no longer logs in."""
    server = EmbeddedPostgres(service_tmp_path / "data", settings={"fsync": "off"})
    server.start()
    try:
        old = server.password
        server.stop()
        server.password_path.unlink()
        server.start()
        new = server.password
        assert new != old and _mode(server.password_path) == 0o600
        for password, logs_in in ((old, False), (new, True)):
            try:
                conn = await asyncpg.connect(host="127.0.0.1", port=server.port, user=SUPERUSER,
                                             password=password, database="postgres")
            except asyncpg.InvalidPasswordError:
                assert not logs_in
            else:
                await conn.close()
                assert logs_in
    finally:
        server.stop()
    assert old not in server.log_path.read_text() and new not in server.log_path.read_text()


def test_a_password_never_reaches_a_command_line(embedded_postgres: EmbeddedPostgres,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """psql is given the password in its environment: any local user reads a command line."""
    from entrypoints.embedded import postgres as module

    seen: list[list[str]] = []
    real_run = subprocess.run

    def spy(cmd, *args, **kwargs):
        seen.append(list(cmd))
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(module.subprocess, "run", spy)
    name = f"ce_test_cmdline_{uuid.uuid4().hex[:6]}"
    embedded_postgres.ensure_database(name)
    module.drop_database(embedded_postgres.dsn, name)
    monkeypatch.undo()
    assert len(seen) == 2 and all(cmd[0].endswith("psql") for cmd in seen)
    assert not [cmd for cmd in seen if embedded_postgres.password in " ".join(cmd)]


# -- 3. the app role cannot widen its view ----------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    statements: tuple[str, ...]
    refused: bool = False          # the last statement must be refused (insufficient privilege)
    in_transaction: bool = False   # run and count inside one transaction (SET LOCAL)
    count: str = "SELECT count(*) FROM {table}"


def widening_attempts(orgs: list[str]) -> dict[str, Attempt]:
    a, b = orgs[0], orgs[1]
    system = "SET app.org_id = '_system'"
    return {
        "SET app.org_id = '_system'": Attempt((system,)),
        "set_config(..., is_local => false)": Attempt(("SELECT set_config('app.org_id', '_system', false)",)),
        "set_config(..., is_local => true) in a transaction": Attempt(
            ("SELECT set_config('app.org_id', '_system', true)",), in_transaction=True),
        "SET LOCAL in a transaction": Attempt(("SET LOCAL app.org_id = '_system'",), in_transaction=True),
        "'_platform'": Attempt(("SET app.org_id = '_platform'",)),
        "an empty org": Attempt(("SET app.org_id = ''",)),
        "'*'": Attempt(("SET app.org_id = '*'",)),
        "'%'": Attempt(("SET app.org_id = '%'",)),
        "two orgs in one value": Attempt((f"SET app.org_id = '{a},{b}'",)),
        "a quoted OR in the value": Attempt((f"SET app.org_id = $${a}' OR ''='$$",)),
        "RESET after '_system'": Attempt((system, "RESET app.org_id")),
        "RESET ALL after '_system'": Attempt((system, "RESET ALL")),
        "no setting at all": Attempt(()),
        "SET ROLE context_engine_system": Attempt(("SET ROLE context_engine_system",), refused=True),
        "SET ROLE postgres": Attempt((system, "SET ROLE postgres"), refused=True),
        "SET SESSION AUTHORIZATION postgres": Attempt(("SET SESSION AUTHORIZATION postgres",), refused=True),
        "SET ROLE to the API group, then '_system'": Attempt(("SET ROLE context_engine_api", system)),
        "GRANT itself the system role": Attempt(("GRANT context_engine_system TO context_engine_app",), refused=True),
        "ALTER ROLE itself BYPASSRLS": Attempt(("ALTER ROLE context_engine_app BYPASSRLS",), refused=True),
        "ALTER ROLE itself SET app.org_id": Attempt(
            ("ALTER ROLE context_engine_app SET app.org_id = '_system'",), refused=True),
        "disable row-level security": Attempt((system, "ALTER TABLE chunks DISABLE ROW LEVEL SECURITY"), refused=True),
        "drop the org policy": Attempt(("DROP POLICY org_isolation ON chunks",), refused=True),
        "a policy of its own": Attempt(("CREATE POLICY mine ON chunks FOR SELECT USING (true)",), refused=True),
        "call enable_org_isolation": Attempt(("SELECT enable_org_isolation('chunks')",), refused=True),
        "a function in public": Attempt(
            ("CREATE FUNCTION public.all_chunks() RETURNS bigint LANGUAGE sql AS 'SELECT count(*) FROM chunks'",),
            refused=True),
        "row_security = off under '_system'": Attempt((system, "SET row_security = off")),
        "set_config('_system') inside the query, from a legitimate org": Attempt(
            (f"SET app.org_id = '{a}'",),
            count="SELECT count(*) FROM (SELECT set_config('app.org_id', '_system', false)) AS flip, {table} t "
                  "WHERE t.org_id <> '" + a + "'"),
        "current_setting read back through a sub-select": Attempt(
            (system,), count="SELECT count(*) FROM {table} WHERE current_setting('app.org_id', true) = '_system'"),
        "planner statistics (pg_stats) under '_system'": Attempt(
            (system,), count="SELECT count(*) FROM pg_stats WHERE schemaname = 'public' AND tablename = '{bare}'"),
    }


@pytest.fixture(scope="module")
async def several_orgs(engine) -> list[str]:
    """Three orgs with sessions, chunks and pushed memory, through the API; plus rows of the
    `_system`-guarded tables the worker never touches on its own (savings, rejections)."""
    orgs = [unique("host-pg-a"), unique("host-pg-b"), unique("host-pg-c")]
    for org in orgs:
        caller = engine.caller(org, clearance=4)
        for i in range(2):
            await caller("IngestEvent", pb.IngestEventRequest(
                session_id="s1", event_type="message", content=f"{org} note {i}: the launch is on Friday".encode()))
        await caller("PushContext", pb.PushContextRequest(session_id="s1", memory_type="semantic",
                                                          content=f"{org} semantic memory".encode()))
    conn = await asyncpg.connect(engine.settings.database_url)
    try:
        for org in orgs:
            async with conn.transaction():
                await conn.execute("SELECT set_config('app.org_id', $1, true)", org)
                await conn.execute(
                    "INSERT INTO savings_by_model (org_id, model_id, samples, assembled_tokens, naive_tokens, "
                    "updated_at) VALUES ($1, 'host-pg-model', 1, 10, 100, now())", org)
                await conn.execute(
                    "INSERT INTO rejected_events (record_sha256, org_id, event_id, topic, partition, \"offset\", "
                    "reason, raw) VALUES ($1, $2, NULL, 'host-pg-test', 0, 0, 'test', '\\x00')",
                    sha256_hex(org.encode()), org)
        await _settled(engine.settings.database_url)
        await conn.execute("ANALYZE")  # planner statistics exist for the pg_stats attempt
        for table in ("chunks", "memory_versions", "event_archive", "sessions", "savings_by_model", "rejected_events"):
            spread = await conn.fetchval(f"SELECT count(DISTINCT org_id) FROM {table} WHERE org_id = ANY($1)", orgs)
            assert spread == len(orgs), table
    finally:
        await conn.close()
    return orgs


async def _readable_tables(admin_url: str) -> list[str]:
    conn = await asyncpg.connect(admin_url)
    try:
        return [r[0] for r in await conn.fetch(
            "SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace "
            "AND c.relkind IN ('r', 'p') AND has_table_privilege($1, c.oid, 'SELECT') ORDER BY 1", APP_ROLE)]
    finally:
        await conn.close()


async def _counts(conn: asyncpg.Connection, tables: list[str], template: str) -> dict[str, int | str]:
    """Rows each query finds; 'refused' when PostgreSQL refuses it (row_security = off)."""
    out: dict[str, int | str] = {}
    for table in tables:
        try:
            async with conn.transaction():  # a savepoint when already inside one
                out[table] = await conn.fetchval(template.format(table=f'"{table}"', bare=table))
        except asyncpg.InsufficientPrivilegeError:
            out[table] = "refused"
    return out


async def test_the_app_roles_own_org_is_what_it_sees(engine, several_orgs: list[str]) -> None:
    """The control for the attempts below: the same counting finds the rows of the org it names."""
    org = several_orgs[0]
    tables = await _readable_tables(engine.settings.database_url)
    conn = await asyncpg.connect(app_url(engine.settings.database_url, APP_ROLE, APP_PASSWORD))
    try:
        await conn.execute(f"SET app.org_id = '{org}'")
        seen = await _counts(conn, tables, "SELECT count(*) FROM {table}")
        foreign = await _counts(conn, [t for t in ("chunks", "memory_versions", "event_archive", "sessions")],
                                "SELECT count(*) FROM {table} WHERE org_id <> current_setting('app.org_id')")
    finally:
        await conn.close()
    assert all(seen[t] > 0 for t in ("chunks", "memory_versions", "event_archive", "sessions",
                                     "savings_by_model", "rejected_events")), seen
    assert set(foreign.values()) == {0}


@pytest.mark.parametrize("name", list(widening_attempts(["a", "b"])))
async def test_the_app_role_cannot_widen_its_view(name: str, engine, several_orgs: list[str], unchanged_rows) -> None:
    attempt = widening_attempts(several_orgs)[name]
    tables = await _readable_tables(engine.settings.database_url)
    assert len(tables) > 20
    async with unchanged_rows():
        conn = await asyncpg.connect(app_url(engine.settings.database_url, APP_ROLE, APP_PASSWORD))
        try:
            transaction = conn.transaction()
            if attempt.in_transaction:
                await transaction.start()
            *setup, last = attempt.statements or ("SELECT 1",)
            for statement in setup:
                await conn.execute(statement)
            if attempt.refused:
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await conn.execute(last)
            else:
                await conn.execute(last)
            seen = await _counts(conn, tables, attempt.count)
            assert await conn.fetchval("SELECT current_user") in (APP_ROLE, API_GROUP_ROLE)
            if attempt.in_transaction:
                await transaction.rollback()
        finally:
            await conn.close()
    assert {t: n for t, n in seen.items() if n not in (0, "refused")} == {}


async def test_copy_under_system_copies_nothing(engine, several_orgs: list[str], unchanged_rows) -> None:
    async with unchanged_rows():
        conn = await asyncpg.connect(app_url(engine.settings.database_url, APP_ROLE, APP_PASSWORD))
        try:
            await conn.execute("SET app.org_id = '_system'")
            copied = {}
            for table in ("chunks", "memory_versions", "event_archive", "rejected_events", "savings_by_model"):
                out = io.BytesIO()
                await conn.copy_from_table(table, output=out)
                copied[table] = out.getvalue()
        finally:
            await conn.close()
    assert copied == dict.fromkeys(copied, b"")


async def test_every_system_policy_is_the_system_roles_only(engine) -> None:
    conn = await asyncpg.connect(engine.settings.database_url)
    try:
        system = await conn.fetch(
            "SELECT tablename, policyname, roles FROM pg_policies WHERE schemaname = 'public' "
            "AND qual LIKE '%''_system''%' ORDER BY 1")
        guarded = await conn.fetch(
            "SELECT c.relname, EXISTS (SELECT FROM pg_policies p WHERE p.schemaname = 'public' "
            "  AND p.tablename = c.relname AND p.policyname = 'api_names_one_org' AND p.permissive = 'RESTRICTIVE' "
            "  AND p.roles = ARRAY['context_engine_api']::name[]) AS restricted "
            "FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relrowsecurity")
        members = {r[0] for r in await conn.fetch(
            "SELECT u.rolname FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid "
            "JOIN pg_roles u ON u.oid = m.member WHERE r.rolname = $1", SYSTEM_ROLE)}
        system_role = await conn.fetchrow("SELECT rolcanlogin, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = $1",
                                          SYSTEM_ROLE)
    finally:
        await conn.close()
    assert {r["tablename"] for r in system} == {"chunks", "memory_versions", "savings_by_model", "vector_assignments",
                                                "rejected_events", "indexing_requests", "compaction_requests",
                                                "compactions"}
    assert {tuple(r["roles"]) for r in system} == {(SYSTEM_ROLE,)}
    assert len(guarded) > 20 and [r["relname"] for r in guarded if not r["restricted"]] == []
    assert APP_ROLE not in members and API_GROUP_ROLE not in members and SUPERUSER in members
    assert tuple(system_role) == (False, False, False)


# -- migrate refuses to open the door ---------------------------------------------------------


@pytest.fixture
async def fresh_db(postgres_url: str):
    async with fresh_database(postgres_url, "ce_host_pg") as url:
        yield url


@pytest.mark.parametrize("door", ["the app role holds the system role", "the app role holds it through a group",
                                  "the admin URL is the app role's"])
async def test_migrate_refuses_a_role_setup_that_widens_the_api(door: str, fresh_db: str, postgres_url: str) -> None:
    app_role = f"ce_test_app_{uuid.uuid4().hex[:6]}"  # the engine's own app role stays untouched
    admin = await asyncpg.connect(postgres_url)
    try:
        await db_admin.create_login_role(admin, app_role, f"x{uuid.uuid4().hex}")
        await migrate(fresh_db, app_role=app_role)
        if door == "the app role holds the system role":
            await admin.execute(f"GRANT {SYSTEM_ROLE} TO {app_role}")
            with pytest.raises(MigrationError, match=f"{app_role}.*member of 'context_engine_system'"):
                await migrate(fresh_db, app_role=app_role)
        elif door == "the app role holds it through a group":
            # Not the shared API group: no other test may see it widened, even for a moment.
            group = f"ce_test_group_{uuid.uuid4().hex[:6]}"
            await admin.execute(f"CREATE ROLE {group} NOLOGIN; GRANT {SYSTEM_ROLE} TO {group}; "
                                f"GRANT {group} TO {app_role}")
            try:
                with pytest.raises(MigrationError, match=f"{app_role}.*member of 'context_engine_system'"):
                    await migrate(fresh_db, app_role=app_role)
            finally:
                await db_admin.drop_role(admin, group)
        else:
            password = uuid.uuid4().hex
            await db_admin.set_password(admin, app_role, password)
            with pytest.raises(MigrationError, match="connects as the app role"):
                await migrate(app_url(fresh_db, app_role, password), app_role=app_role)
    finally:
        await db_admin.drop_role(admin, app_role)
        await admin.close()


# -- 4. an admin that is not a superuser --------------------------------------------------------


def _ingest(org: str, text: str) -> Event:
    content = text.encode()
    return Event(EVENT_INGESTED, Scope(org, "p", "t", "bot"), session_aggregate(org, "s"), "user-1", {
        "session_id": "s", "event_type": "message", "content_b64": base64.b64encode(content).decode(),
        "metadata": {}, "content_sha256": sha256_hex(content), "token_count": len(text.split())})


def _push(org: str, text: str) -> Event:
    content = text.encode()
    return Event(MEMORY_PUSHED, Scope(org, "p", "t", "bot"), session_aggregate(org, "s"), "user-1", {
        "session_id": "s", "agent_id": "bot", "memory_type": "semantic",
        "content_b64": base64.b64encode(content).decode(), "metadata": {}, "content_sha256": sha256_hex(content)})


@pytest.fixture
async def owned_deployment(postgres_url: str):
    """A database owned by a role with CREATEROLE but neither SUPERUSER nor BYPASSRLS (an external
    deployment's admin), migrated by it, with its own app role; roles dropped afterwards."""
    suffix = uuid.uuid4().hex[:6]
    app_role, app_password = f"ce_test_owned_app_{suffix}", uuid.uuid4().hex
    async with owned_database(postgres_url, then_drop_roles=[app_role]) as (owner, owner_url):
        await migrate(owner_url, app_role=app_role, app_password=app_password)
        yield owner, owner_url, app_url(owner_url, app_role, app_password)


async def test_an_admin_that_is_not_superuser_sweeps_every_org_through_the_system_role(
        owned_deployment, postgres_url: str) -> None:
    owner, owner_url, owned_app_url = owned_deployment
    orgs = [unique("owned-a"), unique("owned-b")]
    topic = f"host-pg-{uuid.uuid4().hex[:6]}"
    events = [e for org in orgs for e in (_ingest(org, f"{org} talks about rockets"), _push(org, f"{org} remembers"))]
    worker = await asyncpg.connect(owner_url)
    try:
        assert not await worker.fetchval("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user")
        # The projector's batch, as the worker runs it: every org's rows under its own app.org_id.
        await apply_batch(worker, [LogRecord(topic, 0, i, e.to_bytes()) for i, e in enumerate(events)])
        for i, org in enumerate(orgs):  # rows of the other `_system`-guarded tables, per org
            async with worker.transaction():
                await worker.execute("SELECT set_config('app.org_id', $1, true)", org)
                await worker.execute("INSERT INTO vector_assignments VALUES ($1, $2)", org, uuid.uuid4())
                await worker.execute(
                    "INSERT INTO indexing_requests (org_id, source_event_id, source_kind, added_by, requested_at) "
                    "VALUES ($1, $2, 'event', $2, now() - interval '1 hour')", org, uuid.uuid4())
                await worker.execute(
                    "INSERT INTO savings_by_model VALUES ($1, 'm', 1, 10, 100, now())", org)
                await worker.execute(
                    "INSERT INTO rejected_events (record_sha256, org_id, topic, partition, \"offset\", reason, raw) "
                    "VALUES ($1, $2, $3, 0, $4, 'test', '\\x00')", sha256_hex(org.encode()), org, topic, 100 + i)
                await worker.execute("UPDATE memory_versions SET pii_status = 'quarantined' WHERE org_id = $1", org)
    finally:
        await worker.close()
    guarded = ("chunks", "memory_versions", "savings_by_model", "vector_assignments", "rejected_events",
               "indexing_requests")

    async def spread(url: str) -> dict[str, int | str]:
        """Orgs seen in each table under '_system'; 'no privilege' for a table the role may not read."""
        conn = await asyncpg.connect(url)
        try:
            out: dict[str, int | str] = {}
            for table in guarded:
                try:
                    async with conn.transaction():
                        await conn.execute("SET LOCAL app.org_id = '_system'")
                        out[table] = await conn.fetchval(f"SELECT count(DISTINCT org_id) FROM {table}")
                except asyncpg.InsufficientPrivilegeError:
                    out[table] = "no privilege"
            return out
        finally:
            await conn.close()

    # The admin's sweeps see both orgs; the app role, under the same setting, nothing.
    assert await spread(owner_url) == dict.fromkeys(guarded, 2)
    assert await spread(owned_app_url) == {**dict.fromkeys(guarded, 0), "vector_assignments": "no privilege"}

    # The worker's own `_system` readers, over the owner's connections.
    pool = await create_pool(owner_url, org_scoped=False, min_size=1, max_size=2)
    try:
        async with pool.acquire() as conn:
            assert set(await deferred_indexing.backlog(conn, older_than=dt.timedelta(0))) == set(orgs)
        async with org_transaction(pool, "_system", readonly=True) as conn:
            assert {org for org, _ in await pending_vector_assignments(conn)} == set(orgs)
        assert {s.org_id for s in await savings_projection.savings(pool)} == set(orgs)
        assert {q.org_id for q in await pii_rescan.quarantined(pool, None)} == set(orgs)
    finally:
        await pool.close()

    # It is the role that opens them, not the setting: without it the admin sees nothing either.
    admin = await asyncpg.connect(postgres_url)
    try:
        await admin.execute(f"REVOKE {SYSTEM_ROLE} FROM {owner} GRANTED BY {owner}")
        assert not await admin.fetchval("SELECT pg_has_role($1, $2, 'USAGE')", owner, SYSTEM_ROLE)
    finally:
        await admin.close()
    assert await spread(owner_url) == dict.fromkeys(guarded, 0)


# -- 5. an earlier release's trust data directory, through `up` -----------------------------------


class EarlierRelease(EmbeddedPostgres):
    """The embedded server as releases before scram made it: initdb --auth=trust, no password."""

    def _init_data_dir(self, user) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if user is not None:
            _make_traversable(self.data_dir)
            os.chown(self.data_dir, user.pw_uid, user.pw_gid)
        self.data_dir.chmod(0o700)
        subprocess.run([str(self._bin / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER, "--auth=trust",
                        "--encoding=UTF8", "--locale=C.UTF-8", "--locale-provider=builtin",
                        "--builtin-locale=C.UTF-8"],
                       stdin=subprocess.DEVNULL, capture_output=True, check=True, **_as_user(user))

    def dsn_for(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"


def _earlier_release_home(home: pathlib.Path) -> None:
    """What `up` of an earlier release left: a trust data dir, the schema up to 0015, an app
    role without a password, a table of the user's."""
    old = EarlierRelease(home / "postgres")
    old.start()
    try:
        url = old.ensure_database("context_engine")
        old_migrations = home.parent / "migrations-0015"
        old_migrations.mkdir()
        for path in sorted(MIGRATIONS_DIR.glob("00*.sql")):
            if path.name < "0016":
                shutil.copy(path, old_migrations / path.name)
        asyncio.run(migrate(url, directory=old_migrations))
        asyncio.run(_run(url, "CREATE TABLE kept_across_the_upgrade (x int); "
                              "INSERT INTO kept_across_the_upgrade VALUES (42)"))
        assert "trust" in (home / "postgres" / "pg_hba.conf").read_text()
    finally:
        old.stop()
    assert not (home / "keys" / "postgres-superuser.password").exists()


async def _run(url: str, sql: str):
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(sql) if sql.lstrip().upper().startswith("SELECT") else await conn.execute(sql)
    finally:
        await conn.close()


def _all_cmdlines() -> list[str]:
    out = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
    return out


def test_up_brings_an_earlier_trust_data_directory_to_scram(service_tmp_path: pathlib.Path) -> None:
    home = service_tmp_path / "home"
    home.mkdir()
    _earlier_release_home(home)
    lines: list[str] = []
    env = deployment_env()
    api_port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "context_engine", "up", "--data-dir", str(home), "--api-port", str(api_port),
         "--detector-port", str(free_port()), "--metrics-port", "-1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not any("SERVING after" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "up did not serve:\n" + "".join(lines)
            time.sleep(0.2)
        keys = home / "keys"
        superuser_password = (keys / "postgres-superuser.password").read_text().strip()
        app_password = (keys / "postgres-app.password").read_text().strip()
        stack = home / "run" / "stack.json"
        database_url = json.loads(stack.read_text())["database_url"]
        port = int(database_url.rsplit(":", 1)[1].split("/")[0])
        secrets_ = {"superuser": superuser_password, "app": app_password,
                    "jwt": (keys / "jwt-hs256.key").read_text().strip()}

        # Files: every secret 0600 in a 0700 directory (a public key, .pub, is no secret); the
        # stack file holds the admin URL, 0600.
        modes = {p.name: _mode(p) for p in keys.iterdir() if p.suffix != ".pub"}
        assert {"postgres-superuser.password", "postgres-app.password", "jwt-hs256.key"} <= modes.keys()
        assert set(modes.values()) == {0o600}, modes
        assert _mode(keys) == 0o700 and _mode(stack) == 0o600
        assert superuser_password in database_url
        assert (home / "postgres" / "pg_hba.conf").read_text() == HBA_CONF

        # The old trust logins are refused now; the passwords log in; the user's data is there,
        # and the schema has 0016.
        for role, password in ((SUPERUSER, None), (APP_ROLE, None), (SUPERUSER, app_password),
                               (APP_ROLE, superuser_password)):
            for host in ("127.0.0.1", str(home / "postgres")):
                with pytest.raises(asyncpg.InvalidPasswordError):
                    asyncio.run(asyncpg.connect(host=host, port=port, user=role, password=password,
                                                database="context_engine"))
        assert asyncio.run(_run(database_url, "SELECT x FROM kept_across_the_upgrade")) == 42
        assert asyncio.run(_run(database_url, "SELECT count(*) FROM schema_migrations WHERE version = '0016'")) == 1
        app = app_url(database_url, APP_ROLE, app_password)
        assert asyncio.run(_run(app, "SELECT current_user")) == APP_ROLE
        # Nobody's command line carries a password (any local user reads them).
        assert [c for c in _all_cmdlines() if superuser_password in c or app_password in c] == []
        # The API serves with its password: an org's call is answered.
        from context_engine.auth import mint_token
        from upsquad.context.v1 import context_pb2_grpc

        token = mint_token(secrets_["jwt"].encode(), org="upgraded", clearance=2)
        with grpc.insecure_channel(f"127.0.0.1:{api_port}") as channel:
            stub = context_pb2_grpc.ContextEngineStub(channel)
            reply = stub.IngestEvent(pb.IngestEventRequest(scope=pb.ScopePath(org_id="upgraded"), session_id="s",
                                                           event_type="message", content=b"after the upgrade"),
                                     metadata=(("authorization", f"Bearer {token}"),), timeout=30)
        assert reply.event_id
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        reader.join(timeout=5)
        proc.stdout.close()
    output = "".join(lines)
    assert proc.returncode == 0, output
    assert re.search(r"PostgreSQL \(embedded, pid \d+\) at postgresql://postgres:\*\*\*@127\.0\.0\.1:", output), output
    # No secret in up's output, in any log, or anywhere in the home but the key files (the data
    # directory included: the server only ever got SCRAM verifiers).
    files = [p for p in _files_under(home) if p.parent != home / "keys"]
    assert any(p.name == "postgres.log" for p in files) and any(p.name == "worker.log" for p in files)
    assert _leaks(secrets_, files, output) == []
