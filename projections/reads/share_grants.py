"""The reads of share grants (commands/create_share.py, revoke_share.py, list_shares.py; the
share-aware reads); projections/projector/appliers/share.py writes them.

A resource is shared by its owner: the scope that wrote it (a chunk, a snapshot, a guardrail
layer), or an L4 scope above the owner acting for it (commands/create_share.py checks the
clearance). A scope below the owner sees the resource but does not publish it, and what a scope
sees only through a grant it cannot grant on.

CreateShare checks this before it appends; the reads check it again (`held_sql`: a grant holds
a resource only while it is owned at its grantor's scope or below). The projector does not: a grant's
events are keyed by the share, so on another partition than its resource's, and a rebuild reads
the partitions in another interleaving than the live projector applied them. A grant row depends
only on its own events, and any interleaving rebuilds the same rows.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from context_engine.visibility import Visibility

# Each resource type's table and id column: where a grant's resource and its owner are.
_RESOURCE_TABLES = {"chunk": ("chunks", "chunk_id"), "snapshot": ("snapshots", "snapshot_id"),
                    "layer": ("guardrail_layers", "event_id")}


def _by_type(type_param: str, exists_where: str) -> str:
    """A CASE on the resource type `type_param`: whether its table has the row `$2` of org `$1`
    for which `exists_where` holds (false for another type)."""
    arms = "\n".join(f"    WHEN '{t}' THEN EXISTS (SELECT 1 FROM {table} WHERE org_id = $1 AND {column} = $2 "
                     f"AND {exists_where})" for t, (table, column) in _RESOURCE_TABLES.items())
    return f"CASE {type_param}\n{arms}\n    ELSE false END"


def _owner_by_type(type_param: str) -> str:
    """A CASE on the resource type `type_param`: the scope path that owns resource `$2` of org `$1`."""
    arms = "\n".join(f"    WHEN '{t}' THEN (SELECT scope_path FROM {table} WHERE org_id = $1 AND {column} = $2 LIMIT 1)"
                     for t, (table, column) in _RESOURCE_TABLES.items())
    return f"CASE {type_param}\n{arms}\n    END"


_OWNER = f"SELECT {_owner_by_type('$3::text')}"


async def owner(conn: asyncpg.Connection, org_id: str, resource_type: str, resource_id: str) -> str | None:
    """The scope path that owns the resource, or None when the org holds no such resource."""
    return await conn.fetchval(_OWNER, org_id, uuid.UUID(resource_id), resource_type)


@dataclass(frozen=True, slots=True)
class Grant:
    share_id: str
    resource_type: str
    resource_id: str
    grantor_path: str
    created_by: str
    grantee_scope: str
    grantee_path: str
    permissions: tuple[str, ...]
    reason: str
    created_at: dt.datetime
    revoked_at: dt.datetime | None
    event_id: str

    @property
    def live(self) -> bool:
        return self.revoked_at is None


_GRANT_COLUMNS = ("share_id, resource_type, resource_id, grantor_path, created_by, grantee_scope, grantee_path, "
                  "permissions, reason, created_at, revoked_at, event_id")


def _grant(r: asyncpg.Record) -> Grant:
    return Grant(str(r["share_id"]), r["resource_type"], str(r["resource_id"]), r["grantor_path"], r["created_by"],
                 r["grantee_scope"], r["grantee_path"], tuple(r["permissions"]), r["reason"], r["created_at"],
                 r["revoked_at"], str(r["event_id"]))


async def grant_by_id(conn: asyncpg.Connection, org_id: str, share_id: str) -> Grant | None:
    row = await conn.fetchrow(f"SELECT {_GRANT_COLUMNS} FROM share_grants WHERE org_id = $1 AND share_id = $2",
                              org_id, uuid.UUID(share_id))
    return _grant(row) if row else None


async def grant_by_event(conn: asyncpg.Connection, org_id: str, event_id: str) -> Grant | None:
    row = await conn.fetchrow(f"SELECT {_GRANT_COLUMNS} FROM share_grants WHERE org_id = $1 AND event_id = $2",
                              org_id, uuid.UUID(event_id))
    return _grant(row) if row else None


# ListShares: the live grants the caller created (grantor = its scope), holds (grantee = its
# scope or an ancestor's), or whose resource it owns (whoever made them), oldest first, ties by id.
_OWNED_BY_CALLER = "\n".join(
    f"        WHEN '{t}' THEN EXISTS (SELECT 1 FROM {table} r WHERE r.org_id = g.org_id "
    f"AND r.{column} = g.resource_id AND r.scope_path = $2)" for t, (table, column) in _RESOURCE_TABLES.items())
_LISTED = f"""
FROM share_grants AS g
WHERE g.org_id = $1 AND g.revoked_at IS NULL
  AND (g.grantor_path = $2 OR g.grantee_path = ANY($3::text[])
       OR CASE g.resource_type
{_OWNED_BY_CALLER}
        ELSE false END)
"""


async def listed_grants(conn: asyncpg.Connection, org_id: str, viewer: Visibility, *, offset: int,
                        limit: int) -> tuple[list[Grant], int]:
    """One page of the grants the caller made, holds or owns the resource of, and how many in all."""
    args = (org_id, viewer.viewer.path, viewer.sql_paths)
    total = await conn.fetchval(f"SELECT count(*) {_LISTED}", *args)
    rows = await conn.fetch(f"SELECT {_GRANT_COLUMNS} {_LISTED} ORDER BY created_at, share_id OFFSET $4 LIMIT $5",
                            *args, offset, limit)
    return [_grant(r) for r in rows], int(total)


def held_sql(resource_type: str, *, org: str, paths: str, permission: str, resource_filter: str = "true",
             columns: str = "") -> str:
    """A subquery of the resources of `resource_type` shared with the viewer whose visible paths
    are `paths` (a grant to its scope or an ancestor's: Visibility.holds) by a live grant with
    `permission` whose grantor owns the resource (at its scope, or below it for an L4 grantor acting
    for the owner: CreateShare checked the clearance), each once, by
    its oldest such grant: columns resource_id, share_id, and `columns` of the resource's row
    (alias `r`), keeping the resources `resource_filter` (on `r`) holds for. The arguments are SQL
    expressions (parameters) of the statement it goes in. One join of grant and resource: a read
    pays for its grants once (bench/search.py --grants)."""
    table, id_column = _RESOURCE_TABLES[resource_type]
    extra = f", {columns}" if columns else ""
    # The resource by its key, one lookup per grant (LIMIT 1 keeps the planner from turning the
    # lookups into a scan of the org's resources, which grows with the org, not with the grants).
    return (f"SELECT DISTINCT ON (g.resource_id) g.resource_id, g.share_id{extra} FROM share_grants AS g "
            f"CROSS JOIN LATERAL (SELECT * FROM {table} WHERE org_id = g.org_id AND {id_column} = g.resource_id "
            f"LIMIT 1) AS r "
            f"WHERE g.org_id = {org} AND g.resource_type = '{resource_type}' AND g.grantee_path = ANY({paths}) "
            f"AND g.revoked_at IS NULL AND {permission} = ANY(g.permissions) "
            f"AND (r.scope_path = g.grantor_path OR starts_with(r.scope_path, g.grantor_path || '/')) "
            f"AND ({resource_filter}) "
            f"ORDER BY g.resource_id, g.created_at, g.share_id")


async def held(conn: asyncpg.Connection, org_id: str, viewer: Visibility, resource_type: str, permission: str,
               resource_ids: Sequence[str]) -> dict[str, str]:
    """Of `resource_ids`, those the viewer holds a live grant of with `permission`: id -> share id."""
    grants = held_sql(resource_type, org="$1", paths="$2::text[]", permission="$3::text")
    rows = await conn.fetch(
        f"SELECT h.resource_id, h.share_id FROM ({grants}) AS h WHERE h.resource_id = ANY($4::uuid[])",
        org_id, viewer.sql_paths, permission, [uuid.UUID(i) for i in resource_ids])
    return {str(r["resource_id"]): str(r["share_id"]) for r in rows}


# Why a caller that does not see resource `$2` of type `$3` (visible paths `$4`) was refused it
# for `$5`, if the resource is another scope's: through a grant since revoked, a live grant
# without that permission, or neither. NULL: no such resource, or one the caller owns-sees.
_DENIAL = f"""
SELECT CASE
    WHEN NOT ({_by_type("$3::text", "NOT scope_path = ANY($4::text[])")}) THEN NULL
    WHEN EXISTS (SELECT 1 FROM share_grants WHERE org_id = $1 AND resource_id = $2 AND resource_type = $3
                   AND grantee_path = ANY($4::text[]) AND revoked_at IS NULL) THEN 'permission_missing'
    WHEN EXISTS (SELECT 1 FROM share_grants WHERE org_id = $1 AND resource_id = $2 AND resource_type = $3
                   AND grantee_path = ANY($4::text[]) AND revoked_at IS NOT NULL
                   AND $5 = ANY(permissions)) THEN 'grant_revoked'
    ELSE 'not_visible' END
"""


# The denial reasons that say the caller holds (or held) a grant of the resource.
GRANT_DENIALS = ("permission_missing", "grant_revoked")


async def denial_reason(conn: asyncpg.Connection, org_id: str, viewer: Visibility, resource_type: str,
                        resource_id: str, permission: str) -> str | None:
    """The audit's denial reason for a resource the caller asked for and may not have, or None
    when the org holds no such resource of another scope (then the request crossed no scope:
    nothing to audit)."""
    return await conn.fetchval(_DENIAL, org_id, uuid.UUID(resource_id), resource_type, viewer.sql_paths, permission)
