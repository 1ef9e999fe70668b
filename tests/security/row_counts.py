"""Every table's row count and a digest of its rows, read past row-level security: the proof that
a refusal wrote nothing — no row added, removed or changed."""

from __future__ import annotations

import contextlib

import asyncpg

TABLES_SQL = """
SELECT format('%I.%I', n.nspname, c.relname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND n.nspname = 'public'
ORDER BY 1
"""


# Rows a worker updates for every record it reads, forged or not: where its consumers are.
# audit_access: a refused attempt is meant to leave its denied row (docs/security.md, the audit trail).
BOOKKEEPING = ("public.projector_offsets", "public.audit_access")
_STATE = "SELECT count(*), md5(coalesce(string_agg(md5(t::text), '' ORDER BY md5(t::text)), '')) FROM {} t"


async def row_counts(admin_url: str) -> dict[str, tuple[int, str]]:
    """{table: (rows, digest of the rows' text)} for every table of the public schema but the
    BOOKKEEPING ones. `admin_url` must bypass row-level security (the test servers' superuser),
    or they would be one org's only."""
    conn = await asyncpg.connect(admin_url)
    try:
        bypasses = await conn.fetchval(
            "SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user")
        if not bypasses:
            raise AssertionError("row_counts needs a role that bypasses row-level security")
        tables = [r[0] for r in await conn.fetch(TABLES_SQL)]
        return {t: tuple(await conn.fetchrow(_STATE.format(t))) for t in tables if t not in BOOKKEEPING}
    finally:
        await conn.close()


def changed(before: dict, after: dict) -> dict:
    """Tables whose rows differ: {table: (before, after)}; empty when nothing was written."""
    return {t: (before.get(t), after.get(t)) for t in sorted(before.keys() | after.keys())
            if before.get(t) != after.get(t)}


@contextlib.asynccontextmanager
async def unchanged(admin_url: str):
    """`async with unchanged(url): <refused request>`: fails when any table's rows changed."""
    before = await row_counts(admin_url)
    yield
    assert changed(before, await row_counts(admin_url)) == {}
