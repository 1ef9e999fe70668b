"""Administering a PostgreSQL server as its admin role: databases, roles, passwords.

Every statement that creates or drops a database or a role, or sets a password, is written
here, whoever sends it: `migrate` (the API's roles), replay and verify (scratch databases), the
embedded server (`entrypoints/embedded/postgres.py` sends these statements through the
bundled psql, before any event loop runs) and the tests. Identifiers are quoted by
`quote_identifier`; a password reaches the server only as a SCRAM verifier (`scram_verifier`),
so neither the statement nor an error echoing it carries the password.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg


def quote_identifier(name: str) -> str:
    """`name` as a quoted SQL identifier (quotes doubled), whatever it contains."""
    if not name or "\x00" in name:
        raise ValueError(f"not an identifier: {name!r}")
    return '"' + name.replace('"', '""') + '"'


def with_database(url: str, database: str) -> str:
    """The same server URL pointing at another database (credentials and query options kept)."""
    return urlunsplit(urlsplit(url)._replace(path="/" + database))


def database_of(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def timestamped_name(prefix: str) -> str:
    """`<prefix>_<YYYYmmddHHMMSS>_<6 hex>`: a scratch database's name an operator can date."""
    return f"{prefix}_{time.strftime('%Y%m%d%H%M%S')}_{uuid.uuid4().hex[:6]}"


def scram_verifier(password: str, iterations: int = 4096) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for `password` (RFC 7677; the server's own
    format and default iteration count). `ALTER ROLE ... PASSWORD '<verifier>'` sets the
    password without the statement carrying it. The password must be ASCII (SASLprep leaves
    printable ASCII unchanged, so the verifier is the server's own); ours are hex."""
    if not password.isascii():
        raise ValueError("scram_verifier takes ASCII passwords only")
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
    return (f"SCRAM-SHA-256${iterations}:{b64(salt)}$"
            f"{b64(hashlib.sha256(client_key).digest())}:{b64(server_key)}")


# -- statements --------------------------------------------------------------------------------

def create_database_sql(name: str, *, owner: str | None = None) -> str:
    return f"CREATE DATABASE {quote_identifier(name)}" + (f" OWNER {quote_identifier(owner)}" if owner else "")


def drop_database_sql(name: str) -> str:
    """Drops it even with sessions connected (they are ended)."""
    return f"DROP DATABASE IF EXISTS {quote_identifier(name)} WITH (FORCE)"


DATABASE_EXISTS_SQL = "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)"


def set_password_sql(role: str, password: str) -> str:
    """ALTER ROLE ... PASSWORD with a fresh SCRAM verifier of `password`, not the password."""
    return f"ALTER ROLE {quote_identifier(role)} PASSWORD '{scram_verifier(password)}'"


# -- databases ---------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def _connected(url: str) -> AsyncIterator[asyncpg.Connection]:
    """One admin connection for one operation, closed after it."""
    conn = await asyncpg.connect(url)
    try:
        yield conn
    finally:
        await conn.close()


async def create_database(admin_url: str, name: str, *, owner: str | None = None) -> str:
    """Create database `name` (an error if it exists) on the server of `admin_url`; its URL."""
    async with _connected(admin_url) as conn:
        await conn.execute(create_database_sql(name, owner=owner))
    return with_database(admin_url, name)


async def ensure_database(admin_url: str, name: str) -> str:
    """Create database `name` if missing; its URL."""
    async with _connected(admin_url) as conn:
        if not await conn.fetchval(DATABASE_EXISTS_SQL, name):
            try:
                await conn.execute(create_database_sql(name))
            except asyncpg.DuplicateDatabaseError:  # created meanwhile by another client
                pass
    return with_database(admin_url, name)


async def drop_database(admin_url: str, name: str) -> None:
    """Drop database `name` if it exists, ending its sessions."""
    async with _connected(admin_url) as conn:
        await conn.execute(drop_database_sql(name))


async def create_extensions(url: str, extensions: tuple[str, ...]) -> None:
    """CREATE EXTENSION IF NOT EXISTS each of `extensions` in the database of `url` (pgvector's
    `vector` is not a trusted extension: only a superuser creates it)."""
    async with _connected(url) as conn:
        for extension in extensions:
            await conn.execute(f"CREATE EXTENSION IF NOT EXISTS {quote_identifier(extension)}")


# -- roles -------------------------------------------------------------------------------------

async def ensure_role(conn: asyncpg.Connection, role: str, *, login: bool) -> None:
    """Create `role` if missing, NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE INHERIT; an
    existing role is left as it is. Roles are cluster-wide: a client creating it at the same
    time from another database is tolerated. Call it outside a transaction: that race's error
    would abort an enclosing one."""
    if await conn.fetchval("SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1)", role):
        return
    try:
        await conn.execute(f"CREATE ROLE {quote_identifier(role)} {'LOGIN' if login else 'NOLOGIN'} "
                           "NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE INHERIT")
    except (asyncpg.DuplicateObjectError, asyncpg.UniqueViolationError):
        pass


async def create_login_role(conn: asyncpg.Connection, role: str, password: str, *,
                            attributes: str = "NOSUPERUSER NOBYPASSRLS") -> None:
    """Create login role `role` with `attributes` (role options, written by code, never input)
    and `password` (sent as its SCRAM verifier); an error if it exists."""
    await conn.execute(f"CREATE ROLE {quote_identifier(role)} LOGIN {attributes} "
                       f"PASSWORD '{scram_verifier(password)}'")


async def set_password(conn: asyncpg.Connection, role: str, password: str) -> None:
    await conn.execute(set_password_sql(role, password))


async def drop_role(conn: asyncpg.Connection, role: str) -> None:
    await conn.execute(f"DROP ROLE IF EXISTS {quote_identifier(role)}")
