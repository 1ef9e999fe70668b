"""Versioned SQL migrations, applied idempotently at start-up, and the API's database role.

Files `projections/store/sql/NNNN_name.sql` are applied in version order, each in its own
transaction, and recorded in `schema_migrations(version, checksum, applied_at)`. A file whose
checksum differs from the one recorded when it was applied is refused: applied migrations are
immutable, a change is a new file. Everything runs under a transaction-independent advisory
lock, so replicas starting together apply each file exactly once.

Roles (see also projections/store/pool.py):
- The *admin* role (the URL given to `migrate`) owns the schema. The projection worker connects
  with it too; it sets `app.org_id` per org anyway, so it works whether or not the admin role
  bypasses row-level security.
- `context_engine_api` is a NOLOGIN group role holding the API's privileges; migration files
  grant to it, so they never need to know the configured login name.
- The login role of the API (`app_role`, default `context_engine_app`) is created LOGIN,
  NOSUPERUSER, NOBYPASSRLS and made a member of the group. An existing role that is superuser or
  has BYPASSRLS is refused rather than silently altered. Its password, when one is given, is set
  as a SCRAM verifier computed here: the server (and its log) never sees the password itself.
- `context_engine_system` is a NOLOGIN role for the worker's reads across orgs: the policies that
  open every org's rows under `app.org_id = '_system'` apply to its members only (0016). It is
  granted (INHERIT) to the admin role, never to the app role or the group: migrate refuses to
  run when either holds it, or when the admin role is the app role.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg

from projections.store.admin import ensure_role, quote_identifier, set_password

MIGRATIONS_DIR = Path(__file__).parent / "sql"
API_GROUP_ROLE = "context_engine_api"
SYSTEM_ROLE = "context_engine_system"
APP_ROLE = "context_engine_app"
EXTENSIONS = ("vector", "pg_trgm")
# pg_advisory_lock key: "ctxengmg" as a big-endian int64.
ADVISORY_LOCK_KEY = int.from_bytes(b"ctxengmg", "big", signed=True)

_FILE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
_ROLE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class MigrationError(RuntimeError):
    """The schema cannot be brought to the version this code expects."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: str
    name: str
    sql: str
    checksum: str


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found: dict[str, Migration] = {}
    for path in sorted(directory.iterdir()):
        if not path.name.endswith(".sql"):
            continue
        match = _FILE.match(path.name)
        if not match:
            raise MigrationError(f"migration file {path.name!r} is not named NNNN_name.sql")
        data = path.read_bytes()
        version = match.group(1)
        if version in found:
            raise MigrationError(f"two migration files have version {version}")
        found[version] = Migration(version, path.name, data.decode(), hashlib.sha256(data).hexdigest())
    return [found[v] for v in sorted(found)]


def app_url(admin_url: str, role: str, password: str | None = None) -> str:
    """The admin URL with the credentials replaced by the app role's (host, port, db, query kept)."""
    parts = urlsplit(admin_url)
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    userinfo = quote(role, safe="")
    if password is not None:
        userinfo += ":" + quote(password, safe="")
    netloc = f"{userinfo}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


async def migrate(admin_url: str, *, app_role: str = APP_ROLE,
                  app_password: str | None = None, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Bring the database of `admin_url` to the current schema; return the versions applied now."""
    if not _ROLE.match(app_role):
        raise MigrationError(f"app role name {app_role!r} must match {_ROLE.pattern}")
    if app_role == API_GROUP_ROLE:
        raise MigrationError(f"the app role must be a login role other than {API_GROUP_ROLE!r}")
    migrations = load_migrations(directory)
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", ADVISORY_LOCK_KEY)
        try:
            for ext in EXTENSIONS:
                await conn.execute(f'CREATE EXTENSION IF NOT EXISTS "{ext}"')
            await _ensure_roles(conn, app_role, app_password)
            await conn.execute("""
                CREATE TABLE IF NOT EXISTS schema_migrations (
                    version    text PRIMARY KEY,
                    checksum   text NOT NULL,
                    applied_at timestamptz NOT NULL DEFAULT now()
                )""")
            applied = {r["version"]: r["checksum"]
                       for r in await conn.fetch("SELECT version, checksum FROM schema_migrations")}
            for m in migrations:
                if m.version in applied and applied[m.version] != m.checksum:
                    raise MigrationError(
                        f"migration {m.name} was changed after it was applied (recorded checksum "
                        f"{applied[m.version][:12]}…, file {m.checksum[:12]}…): add a new migration instead")
            done = []
            for m in migrations:
                if m.version in applied:
                    continue
                async with conn.transaction():
                    await conn.execute(m.sql)
                    await conn.execute("INSERT INTO schema_migrations (version, checksum) VALUES ($1, $2)",
                                       m.version, m.checksum)
                done.append(m.version)
            await _grant(conn, app_role)
            return done
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", ADVISORY_LOCK_KEY)
    finally:
        await conn.close()


async def _ensure_roles(conn: asyncpg.Connection, app_role: str, password: str | None) -> None:
    if await conn.fetchval("SELECT current_user") == app_role:
        raise MigrationError(f"the admin URL connects as the app role {app_role!r}: migrate and the "
                             "worker need their own role (the app role must not read across orgs)")
    # Roles are cluster-wide while the advisory lock is per database: tolerate a concurrent
    # creator in another database of the same server.
    for role, login in ((API_GROUP_ROLE, False), (SYSTEM_ROLE, False), (app_role, True)):
        await ensure_role(conn, role, login=login)
        row = await conn.fetchrow("SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = $1", role)
        if row["rolsuper"] or row["rolbypassrls"]:
            raise MigrationError(f"role {role!r} exists with SUPERUSER or BYPASSRLS: row-level "
                                 "security would not apply to the API; use another role name")
    for role in (API_GROUP_ROLE, app_role):
        if await conn.fetchval("SELECT pg_has_role($1, $2, 'MEMBER')", role, SYSTEM_ROLE):
            raise MigrationError(f"role {role!r} is a member of {SYSTEM_ROLE!r}, which reads every "
                                 f"org's rows: REVOKE {SYSTEM_ROLE} FROM {role}")
    # The admin reads across orgs through the role (a superuser would anyway; an owner subject
    # to FORCE ROW LEVEL SECURITY needs it). pg_has_role is true of every role for a superuser:
    # look at the grant itself.
    granted = await conn.fetchval("""
        SELECT EXISTS (SELECT FROM pg_auth_members m
                       JOIN pg_roles r ON r.oid = m.roleid JOIN pg_roles u ON u.oid = m.member
                       WHERE r.rolname = $1 AND u.rolname = current_user AND m.inherit_option)""",
                                  SYSTEM_ROLE)
    if not granted:
        try:
            await conn.execute(f'GRANT "{SYSTEM_ROLE}" TO CURRENT_USER WITH INHERIT TRUE, SET FALSE')
        except asyncpg.InsufficientPrivilegeError as exc:
            raise MigrationError(f"the admin role cannot grant itself {SYSTEM_ROLE!r} ({exc}); as a "
                                 f"superuser: GRANT {SYSTEM_ROLE} TO <admin role> WITH INHERIT TRUE") from exc
    if password is not None:
        await set_password(conn, app_role, password)


async def _grant(conn: asyncpg.Connection, app_role: str) -> None:
    database = await conn.fetchval("SELECT current_database()")
    await conn.execute(f'GRANT CONNECT ON DATABASE {quote_identifier(database)} TO "{API_GROUP_ROLE}"')
    await conn.execute(f'GRANT USAGE ON SCHEMA public TO "{API_GROUP_ROLE}"')
    member = await conn.fetchval(
        "SELECT pg_has_role($1, $2, 'USAGE')", app_role, API_GROUP_ROLE)
    if not member:
        await conn.execute(f'GRANT "{API_GROUP_ROLE}" TO {quote_identifier(app_role)} WITH INHERIT TRUE')
    await conn.execute(f'REVOKE ALL ON schema_migrations FROM PUBLIC, "{API_GROUP_ROLE}"')
