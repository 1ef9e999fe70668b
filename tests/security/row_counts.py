"""Every table's row count, read past row-level security: the proof that a refusal wrote nothing."""

from __future__ import annotations

import contextlib

import asyncpg

TABLES_SQL = """
SELECT format('%I.%I', n.nspname, c.relname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND n.nspname = 'public'
ORDER BY 1
"""


async def row_counts(admin_url: str) -> dict[str, int]:
    """{table: rows} for every table of the public schema. `admin_url` must bypass row-level
    security (the test servers' superuser), or the counts would only be one org's."""
    conn = await asyncpg.connect(admin_url)
    try:
        bypasses = await conn.fetchval(
            "SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user")
        if not bypasses:
            raise AssertionError("row_counts needs a role that bypasses row-level security")
        tables = [r[0] for r in await conn.fetch(TABLES_SQL)]
        return {t: await conn.fetchval(f"SELECT count(*) FROM {t}") for t in tables}
    finally:
        await conn.close()


def changed(before: dict[str, int], after: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Tables whose count differs: {table: (before, after)}; empty when nothing was written."""
    return {t: (before.get(t, 0), after.get(t, 0)) for t in sorted(before.keys() | after.keys())
            if before.get(t, 0) != after.get(t, 0)}


@contextlib.asynccontextmanager
async def unchanged(admin_url: str):
    """`async with unchanged(url): <refused request>`: fails when any table's row count moved."""
    before = await row_counts(admin_url)
    yield
    assert changed(before, await row_counts(admin_url)) == {}
