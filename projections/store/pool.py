"""Connection pools and the per-org transaction.

Who connects as whom:
- The API connects as the app role (`migrate.app_url(...)`), which has neither SUPERUSER nor
  BYPASSRLS: `create_pool(url)` (org_scoped=True) checks this and refuses otherwise. Every RPC
  runs its reads inside `org_transaction(pool, org_id)`, which sets `app.org_id` for that
  transaction only (SET LOCAL semantics), so a pooled connection never carries one tenant's
  setting into another's request, and a connection that forgot it sees zero rows.
- The projection worker and replay connect with the admin URL (`create_pool(url,
  org_scoped=False)`): they write every read model. `apply_batch` (projections/projector/batch.py)
  still sets `app.org_id` per org, so the worker also works as a table owner subject to FORCE ROW LEVEL
  SECURITY (no BYPASSRLS needed).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import orjson


class DatabaseRoleError(RuntimeError):
    """The pool's role would bypass row-level security where it must not."""


async def init_connection(conn: asyncpg.Connection) -> None:
    """Codecs every pooled connection gets: jsonb <-> Python objects (orjson), and pgvector's
    `vector` when the extension is installed."""
    await conn.set_type_codec("jsonb", schema="pg_catalog", format="text",
                              encoder=lambda v: orjson.dumps(v).decode(), decoder=orjson.loads)
    schema = await conn.fetchval(
        "SELECT n.nspname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
        "WHERE t.typname = 'vector' LIMIT 1")
    if schema is not None:
        from pgvector.asyncpg import register_vector

        await register_vector(conn, schema=schema)


async def create_pool(url: str | None, *, org_scoped: bool = True, min_size: int = 1, max_size: int = 10,
                      **kwargs: Any) -> asyncpg.Pool:
    """A pool whose connections have the codecs of `init_connection`. `url` None: asyncpg's
    defaults (libpq's PG* environment variables), as for a worker started without a database URL.

    org_scoped=True (the API) refuses a role that is superuser or has BYPASSRLS: row-level
    security is the last line of tenant isolation and must apply to every query."""
    if org_scoped:
        kwargs.setdefault("reset", transaction_state_only)
    pool = await asyncpg.create_pool(url, min_size=min_size, max_size=max_size,
                                     init=init_connection, **kwargs)
    if org_scoped:
        try:
            async with pool.acquire() as conn:
                row = await conn.fetchrow(
                    "SELECT current_user AS name, rolsuper, rolbypassrls FROM pg_roles "
                    "WHERE rolname = current_user")
        except BaseException:
            await pool.close()
            raise
        if row["rolsuper"] or row["rolbypassrls"]:
            await pool.close()
            raise DatabaseRoleError(
                f"role {row['name']!r} bypasses row-level security; the API must connect as the "
                "app role (projections.store.migrations.app_url)")
    return pool


_SETTING_NAME = re.compile(r"[a-z_]+(\.[a-z_]+)?")  # app.org_id, hnsw.ef_search, lock_timeout


async def transaction_state_only(conn: asyncpg.Connection) -> None:
    """Release hook of org-scoped pools and the worker's, instead of asyncpg's RESET ALL /
    UNLISTEN / CLOSE ALL query: their connections only ever change transaction-local state
    (`org_transaction`, `apply_batch`), which the transaction's end already discards, and asyncpg
    still rolls back an open transaction itself. Saves one round trip per call on the hot paths."""


def sql_literal(value: str) -> str:
    """`value` as a SQL string literal, for the few scripts that must go in one round trip with
    more than one statement (the extended protocol that carries parameters takes one). Safe only
    under standard_conforming_strings = on, PostgreSQL's default, which `require_standard_strings`
    checks: then a literal is ended only by a quote, and quotes are doubled."""
    if "\x00" in value:
        raise ValueError(f"a NUL character cannot be sent to PostgreSQL: {value!r}")
    return "'" + value.replace("'", "''") + "'"


def set_config_sql(settings: Mapping[str, str]) -> str:
    """One statement setting each of `settings` for the current transaction, the values as
    literals (`sql_literal`), so that it can open a script: `org_transaction`, the projector's
    batches."""
    if not all(_SETTING_NAME.fullmatch(n) for n in settings):  # names are code, never input
        raise ValueError(f"not a setting name: {list(settings)}")
    return "SELECT " + ", ".join(f"set_config('{n}', {sql_literal(v)}, true)" for n, v in settings.items())


def require_standard_strings(conn: asyncpg.Connection) -> None:
    if conn.get_settings().standard_conforming_strings != "on":
        raise DatabaseRoleError("standard_conforming_strings must be on (PostgreSQL's default): "
                                "SQL literals are built for it")


@asynccontextmanager
async def advisory_lock(conn: asyncpg.Connection, key: int) -> AsyncIterator[None]:
    """Hold PostgreSQL's session-level advisory lock `key` on `conn` for the block (waits for
    it; released however the block ends)."""
    await conn.execute("SELECT pg_advisory_lock($1)", key)
    try:
        yield
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", key)


# The app.org_id of reads across orgs: the system policies (migration 0016) open every org's rows
# under it, to members of context_engine_system only; no org id can start with '_'.
SYSTEM_ORG = "_system"


@asynccontextmanager
async def org_transaction(pool: asyncpg.Pool, org_id: str, *, readonly: bool = False, snapshot: bool = False,
                          local: Mapping[str, str] | None = None) -> AsyncIterator[asyncpg.Connection]:
    """A connection inside a transaction in which `app.org_id` = org_id (transaction-local),
    and each setting of `local` too (e.g. `hnsw.ef_search`, `lock_timeout`): BEGIN and the
    settings go in one script, one round trip (every RPC opens at least one of these); an
    exception rolls it back. Begun by a script, not by `conn.transaction()`: a block inside
    cannot open a nested `conn.transaction()` (asyncpg refuses one in a transaction it did not
    start); none does. `snapshot`: REPEATABLE READ, every statement reads the same state."""
    if not org_id:
        raise ValueError("org_id is required")
    isolation = " ISOLATION LEVEL REPEATABLE READ" if snapshot else ""
    opening = f"BEGIN{isolation}{' READ ONLY' if readonly else ''};\n" + set_config_sql(
        {"app.org_id": org_id, **(local or {})})
    async with pool.acquire() as conn:
        require_standard_strings(conn)
        await conn.execute(opening)
        try:
            yield conn
        except BaseException:
            # Rolled back here: the pool's release would do it too, but reports every such
            # connection to the loop's exception handler (logged as an error).
            # Nothing here may hide the error being raised: a connection the pool has already
            # taken back (its backend died) raises on every call, is_closed() included.
            with contextlib.suppress(Exception):  # e.g. a query cut off mid-flight: the release cleans up
                if not conn.is_closed() and conn.is_in_transaction():
                    await conn.execute("ROLLBACK")
            raise
        await conn.execute("COMMIT")
