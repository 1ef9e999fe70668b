"""The scopes the adversarial suite writes and reads as, and the written rule it checks them by.

`sees` is ARCHITECTURE.md section 6 in its own words, deliberately not the engine's code: "a
caller sees what is owned at its own scope and at its ancestors' scopes ... never a sibling's";
an item is owned by the scope that wrote it. `may_rewrite` is docs/security.md's rule for
destructive operations: only the session's owner scope. `sees_through` adds its share grants.
`may_share` is docs/security.md's rule for who publishes a resource: its owner, or an L4 scope
above the owner acting for it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import grpc

from context_engine.scope import Scope
from tests.fixtures.engine import unique


def scopes() -> dict[str, Scope]:
    """Writers and readers at every level, with fresh org ids. The other org reuses the pillar and
    team ids of ours, so an id alone can never be what grants access."""
    org, other = unique("acme"), unique("other")
    return {
        "org": Scope(org),
        "pillar": Scope(org, "sales"),
        "team": Scope(org, "sales", "emea"),
        "agent": Scope(org, "sales", "emea", "bot-1"),
        "sibling_team": Scope(org, "sales", "apac"),
        "sibling_agent": Scope(org, "sales", "emea", "bot-2"),
        "other_pillar": Scope(org, "support"),
        "other_org": Scope(other, "sales", "emea"),
    }


def sees(reader: Scope, owner: Scope) -> bool:
    """Whether `reader` may see an item owned at `owner`: the owner is the reader or one of its
    ancestors — the same org, and the owner's path a whole-segment prefix of the reader's."""
    reader_path = [reader.org_id, reader.pillar_id, reader.team_id, reader.agent_id]
    owner_path = [owner.org_id, owner.pillar_id, owner.team_id, owner.agent_id]
    depth = next((i for i, part in enumerate(owner_path) if not part), 4)
    return reader_path[:depth] == owner_path[:depth]


def may_rewrite(caller: Scope, session_owner: Scope) -> bool:
    return caller == session_owner


def may_share(grantor: Scope, clearance: int, owner: Scope) -> bool:
    """Whether `grantor` may publish an item owned at `owner`: it is the owner, or an ancestor of the
    owner (the owner sees what the grantor owns, and is not the grantor) at clearance L4."""
    return grantor == owner or (clearance >= 4 and sees(owner, grantor))


@dataclass(frozen=True)
class Grant:
    """A share grant as docs/security.md words it: a grantee scope, what it may do, live or revoked."""

    grantee: Scope
    permissions: frozenset[str]
    live: bool


def sees_through(reader: Scope, owner: Scope, grants: tuple[Grant, ...], permission: str) -> bool:
    """Whether `reader` may have an item owned at `owner` for `permission` ('read': Search and a
    snapshot's PullContext; 'use_in_assembly': AssembleContext): it sees it by ownership, or it
    holds a live grant with that permission — one to its own scope or an ancestor's (`sees` of
    the grantee: "a grant to a team holds for its agents")."""
    return sees(reader, owner) or any(g.live and permission in g.permissions and sees(reader, g.grantee)
                                      for g in grants)


BUDGET = 4000


def new_marker() -> str:
    return "zq" + uuid.uuid4().hex[:14]


async def found_or_absent(call, *needles: str) -> bool:
    """True when the call succeeds and its answer holds one of `needles` anywhere (the prompt,
    chunk_ids, results); False when it fails NOT_FOUND (how the engine refuses what the caller
    may not see) or succeeds without any."""
    try:
        reply = await call
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.NOT_FOUND, f"{err.code()}: {err.details()}"
        return False
    return any(needle in str(reply) for needle in needles)
