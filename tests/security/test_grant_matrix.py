"""The visibility matrix with share grants: grants to three grantees (a sibling team, another
pillar, a sibling agent) in four states (read, use_in_assembly, both, both but revoked), each
on its own chunk written by the team, x readers at every level x the paths a grant opens
(Search for `read`; AssembleContext's retrieval and pinned chunks for `use_in_assembly`).
What each reader gets must be what the written rule (tests.security.world.sees_through) says.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import asyncpg
import pytest

from context_engine.scope import Scope
from tests.fixtures.settling import settled
from tests.security.world import BUDGET, Grant, found_or_absent, new_marker, scopes, sees_through
from upsquad.context.v1 import context_pb2 as pb

pytestmark = pytest.mark.integration

LEVELS = list(scopes())
GRANTEES = ("sibling_team", "other_pillar", "sibling_agent")
STATES = {
    "read": (frozenset({"read"}), True),
    "use_in_assembly": (frozenset({"use_in_assembly"}), True),
    "both": (frozenset({"read", "use_in_assembly"}), True),
    "revoked": (frozenset({"read", "use_in_assembly"}), False),
}


@dataclass(frozen=True)
class Shared:
    owner: Scope
    grants: tuple[Grant, ...]
    marker: str
    chunk_id: str


@dataclass
class World:
    engine: object
    scopes: dict[str, Scope]
    shared: dict[tuple[str, str], Shared]

    def caller(self, level: str):
        s = self.scopes[level]
        return self.engine.caller(s.org_id, s.pillar_id, s.team_id, s.agent_id, clearance=4)


@pytest.fixture(scope="module")
async def world(quiet_engine) -> World:
    levels = scopes()
    w = World(quiet_engine, levels, {})
    team = w.caller("team")
    written = {}
    for grantee in GRANTEES:
        for state in STATES:
            marker = new_marker()
            reply = await team("IngestEvent", pb.IngestEventRequest(
                session_id=f"shared-{grantee}-{state}", event_type="message", content=marker.encode()))
            written[(grantee, state)] = (marker, reply.event_id)
    await settled(quiet_engine.settings.database_url)
    conn = await asyncpg.connect(quiet_engine.settings.database_url)
    try:
        for (grantee, state), (marker, event_id) in written.items():
            chunk_id = str(await conn.fetchval("SELECT chunk_id FROM chunks WHERE source_event_id = $1",
                                               uuid.UUID(event_id)))
            permissions, live = STATES[state]
            to = levels[grantee]
            created = await team("CreateShare", pb.CreateShareRequest(
                resource_id=chunk_id, resource_type="chunk", grantee_scope=to.level, grantee_scope_id=to.path,
                permissions=sorted(permissions)))
            if not live:
                await team("RevokeShare", pb.RevokeShareRequest(share_id=created.share_id))
            w.shared[(grantee, state)] = Shared(levels["team"], (Grant(to, permissions, live),), marker, chunk_id)
    finally:
        await conn.close()
    return w


async def search(w: World, reader: str, item: Shared) -> bool:
    return await found_or_absent(w.caller(reader)("Search", pb.SearchRequest(
        query=item.marker, top_k=50, min_score=0.01)), item.marker, item.chunk_id)


async def retrieved(w: World, reader: str, item: Shared) -> bool:
    return await found_or_absent(w.caller(reader)("AssembleContext", pb.AssembleContextRequest(
        session_id=f"grant-probe-{reader}", task_description=item.marker, token_budget=BUDGET)),
        item.marker, item.chunk_id)


async def pinned(w: World, reader: str, item: Shared) -> bool:
    return await found_or_absent(w.caller(reader)("AssembleContext", pb.AssembleContextRequest(
        session_id=f"grant-probe-{reader}", token_budget=BUDGET, hints={"pinned_chunk_ids": item.chunk_id})),
        item.marker, item.chunk_id)


PATHS = {  # path -> (how to read, the permission it needs)
    "search": (search, "read"),
    "assemble_retrieved": (retrieved, "use_in_assembly"),
    "assemble_pinned": (pinned, "use_in_assembly"),
}


@pytest.mark.parametrize("reader", LEVELS)
@pytest.mark.parametrize("state", list(STATES))
@pytest.mark.parametrize("grantee", GRANTEES)
@pytest.mark.parametrize("path", list(PATHS))
async def test_a_reader_gets_a_shared_item_exactly_when_the_rule_says(world: World, path, grantee, state,
                                                                      reader) -> None:
    read, permission = PATHS[path]
    item = world.shared[(grantee, state)]
    expected = sees_through(world.scopes[reader], item.owner, item.grants, permission)
    assert await read(world, reader, item) == expected, (
        f"{path}: {reader} ({world.scopes[reader].path}) reading the team's chunk granted to {grantee} ({state}): "
        f"expected {'visible' if expected else 'hidden'}")


def test_the_grant_matrix_holds_both_answers_on_every_path_and_grants_matter() -> None:
    """Every path has both answers, and on every path some reader gets an item only by its grant."""
    levels = scopes()
    for path, (_, permission) in PATHS.items():
        answers, by_grant = set(), False
        for grantee in GRANTEES:
            for permissions, live in STATES.values():
                grants = (Grant(levels[grantee], permissions, live),)
                for reader in levels.values():
                    answer = sees_through(reader, levels["team"], grants, permission)
                    answers.add(answer)
                    by_grant |= answer and not sees_through(reader, levels["team"], (), permission)
        assert answers == {True, False} and by_grant, path
