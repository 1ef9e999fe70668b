"""What a replay does to the database around `apply_batch` while it is the only writer of an
empty one (streams/replay.py): the indexes it builds once after the last event instead of
maintaining row by row, and each org's vectors and retrieval statistics set in one pass at the
end (`projections/projector/chunks.py` keeps both row by row on the live path). All on the
replay's one admin connection.
"""

from __future__ import annotations

import asyncpg

from projections.projector.chunks import assign_recorded_vectors, recount_statistics


async def role_may_copy(conn: asyncpg.Connection) -> bool:
    """Whether the connection's role may COPY into tables under row-level security (superuser or
    BYPASSRLS): `BulkLoad.copy`."""
    return await conn.fetchval("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user")


async def deferred_indexes(conn: asyncpg.Connection) -> list[tuple[str, str]]:
    """(drop, create) for the indexes a replay builds once after the last event instead of
    maintaining row by row: building an HNSW graph or a B-tree over all rows at once is several
    times faster. The replay's own statements do not need them (postings keep their by-chunk
    index, which rollbacks use)."""
    rows = await conn.fetch(
        "SELECT format('DROP INDEX %I', indexname), indexdef FROM pg_indexes "
        "WHERE schemaname = current_schema() AND ((tablename = 'chunks' AND indexdef ILIKE '%USING hnsw%') "
        "  OR indexname = 'chunk_terms_impact') "
        "UNION ALL "
        "SELECT format('ALTER TABLE %s DROP CONSTRAINT %I', conrelid::regclass, conname), "
        "       format('ALTER TABLE %s ADD CONSTRAINT %I %s', conrelid::regclass, conname, pg_get_constraintdef(oid)) "
        "FROM pg_constraint WHERE conrelid = 'chunk_terms'::regclass AND contype = 'p'")
    return [(r[0], r[1]) for r in rows]


async def drop_indexes(conn: asyncpg.Connection, deferred: list[tuple[str, str]]) -> None:
    for drop, _create in deferred:
        await conn.execute(drop)


async def build_indexes(conn: asyncpg.Connection, deferred: list[tuple[str, str]], *, memory_mb: int) -> None:
    """Create the dropped indexes again, with `memory_mb` of maintenance_work_mem for the builds."""
    await conn.execute(f"SET maintenance_work_mem = '{int(memory_mb)}MB'")
    for _drop, create in deferred:
        await conn.execute(create)


async def finish_org(conn: asyncpg.Connection, org_id: str) -> None:
    """In one transaction under the org's `app.org_id`: every chunk gets the latest vector recorded
    for its content, and the retrieval statistics are counted from the rows."""
    async with conn.transaction():
        await conn.execute("SELECT set_config('app.org_id', $1, true)", org_id)
        await assign_recorded_vectors(conn, org_id)
        await recount_statistics(conn, org_id)
