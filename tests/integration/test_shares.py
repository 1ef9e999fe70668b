"""Share grants through gRPC with real tokens, the real broker, the worker and PostgreSQL:
CreateShare's clearance rule, share-aware Search / AssembleContext / PullContext, RevokeShare,
ListShares' pages, the audit rows every cross-scope access leaves, and replay.

The world: org X with pillars sales (teams emea, apac) and support (team desk). The owner team
sales/emea writes a session whose turn becomes a chunk; the other scopes see it only through a
grant. Expectations come from the written rules (the spec's clearance rule, docs/security.md),
not from the engine's code."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import grpc
import pytest

from context_engine.auth import mint_token
from context_engine.events import Event, EventDecodeError, ShareCreated, decode, share_aggregate
from context_engine.scope import Scope
from context_engine.visibility import Visibility
from entrypoints.api.app import build_api_server, open_deps
from projections.projector.records import LogRecord
from projections.reads.share_grants import held_sql
from streams.replay import replay, verify
from streams.topics import LogTopics
from tests.fixtures.calls import admin_fetch, expect_error, wait_for
from tests.fixtures.databases import fresh_database
from tests.fixtures.engine import Caller, unique
from tests.fixtures.guardrails import publish
from tests.fixtures.replay import log_of
from tests.fixtures.settling import settled
from tests.security.world import may_share, sees
from upsquad.context.v1 import context_pb2 as pb
from upsquad.context.v1 import context_pb2_grpc

pytestmark = pytest.mark.integration

SECRET = "the harbour pilot's tide table for Kestrel Point"
QUERY = "harbour pilot tide table Kestrel"


@dataclass
class World:
    org: str
    session: str
    chunk_id: str

    def path(self, *ids: str) -> str:
        return "/".join((self.org, *ids))


def caller(engine, org: str, *ids: str, clearance: int = 3, subject: str | None = None) -> Caller:
    pillar, team, agent = (list(ids) + ["", "", ""])[:3]
    token = mint_token(engine.key, org=org, pillar=pillar, team=team, agent=agent, clearance=clearance,
                       subject=subject)
    return Caller(context_pb2_grpc.ContextEngineStub(engine.channel), token,
                  pb.ScopePath(org_id=org, pillar_id=pillar, team_id=team, agent_id=agent))


async def new_world(engine) -> World:
    org, session = unique("org"), unique("s")
    owner = caller(engine, org, "sales", "emea")
    await owner("IngestEvent", pb.IngestEventRequest(session_id=session, event_type="message",
                                                     content=SECRET.encode()))
    await settled(engine.settings.database_url, org)
    rows = await admin_fetch(engine, "SELECT chunk_id FROM chunks WHERE org_id = $1", org)
    assert len(rows) == 1
    return World(org, session, str(rows[0]["chunk_id"]))


def share(world: World, grantee_scope: str, grantee_path: str, *permissions: str,
          resource_id: str | None = None, resource_type: str = "chunk") -> pb.CreateShareRequest:
    return pb.CreateShareRequest(resource_id=resource_id or world.chunk_id, resource_type=resource_type,
                                 grantee_scope=grantee_scope, grantee_scope_id=grantee_path,
                                 permissions=list(permissions or ("read",)), reason="test")


async def found(who: Caller, chunk_id: str) -> pb.SearchResult | None:
    response = await who("Search", pb.SearchRequest(query=QUERY, top_k=50, min_score=0.01))
    return next((r for r in response.results if r.chunk_id == chunk_id), None)


async def assembled(who: Caller, world: World, session: str, **hints: str) -> list[str]:
    response = await who("AssembleContext", pb.AssembleContextRequest(
        session_id=session, task_description=QUERY, token_budget=2000, model_id="gpt-4o", hints=hints))
    return list(response.chunk_ids)


async def grant_rows(engine, org: str) -> int:
    return len(await admin_fetch(engine, "SELECT 1 FROM share_grants WHERE org_id = $1", org))


async def audit_rows_until(engine, org: str, sentinel_share: str, timeout: float = 300.0) -> list[asyncpg.Record]:
    """The org's audit rows once the row of the grant `sentinel_share` is stored. The org's
    messages share one partition (keyed by org) and are published in order, so every row
    recorded before the sentinel's is there too."""
    deadline = time.monotonic() + timeout
    while True:
        rows = await admin_fetch(engine, "SELECT * FROM audit_access WHERE org_id = $1 ORDER BY occurred_at", org)
        if any(r["share_id"] == sentinel_share for r in rows):
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"no audit row for {sentinel_share} after {timeout:.0f}s: {rows}")
        await asyncio.sleep(0.1)


async def sentinel(engine, world: World) -> str:
    """An allowed, audited act after the ones a test looks at: a grant of the chunk to the owner's
    own agent, by the owner team (L3)."""
    created = await caller(engine, world.org, "sales", "emea", clearance=3)(
        "CreateShare", share(world, "agent", world.path("sales", "emea", "sentinel")))
    return created.share_id


def required_clearance(grantor: tuple[str, ...], grantee: tuple[str, ...]) -> int:
    """The spec: sharing needs L3+, and L4+ when the grantee is in another pillar than the grantor
    (a grant to the org reaches every pillar)."""
    grantor_pillar = grantor[0] if grantor else ""
    grantee_pillar = grantee[0] if grantee else ""
    return 4 if grantee_pillar != grantor_pillar else 3


GRANTEES = {  # grantee scope -> its ids below the org
    "same pillar, sibling team": ("team", ("sales", "apac")),
    "same pillar, the pillar": ("pillar", ("sales",)),
    "other pillar's team": ("team", ("support", "desk")),
    "other pillar": ("pillar", ("support",)),
    "the org": ("org", ()),
    "an agent of the other pillar": ("agent", ("support", "desk", "bot")),
}


async def test_create_share_clearance_follows_the_written_rule(engine):
    world = await new_world(engine)
    grantor = ("sales", "emea")
    outcomes = {}
    for label, (level, ids) in GRANTEES.items():
        for clearance in (1, 2, 3, 4):
            who = caller(engine, world.org, *grantor, clearance=clearance)
            request = share(world, level, world.path(*ids))
            allowed = clearance >= required_clearance(grantor, ids)
            if allowed:
                created = await who("CreateShare", request)
                assert uuid.UUID(created.share_id) and created.created_at.seconds > 0
            else:
                err = await expect_error(grpc.StatusCode.PERMISSION_DENIED, who("CreateShare", request))
                assert "L3+" in err.details() or "L4+" in err.details(), err.details()
            outcomes[label, clearance] = allowed
    # Both answers for every grantee, and the four edges.
    assert outcomes["same pillar, sibling team", 2] is False and outcomes["same pillar, sibling team", 3] is True
    assert outcomes["other pillar's team", 3] is False and outcomes["other pillar's team", 4] is True
    granted = sum(outcomes.values())
    assert await grant_rows(engine, world.org) == granted


GRANTORS = {  # grantor -> its ids below the org; the chunk is owned by the team sales/emea
    "the org": (), "the owner's pillar": ("sales",), "the owner team": ("sales", "emea"),
    "an agent of the owner team": ("sales", "emea", "bot"), "a sibling team": ("sales", "apac"),
    "another pillar": ("support",),
}


async def test_only_the_owner_or_an_l4_ancestor_acting_for_it_shares(engine):
    """docs/security.md's rule (tests/security/world.may_share) over six grantors x four clearances,
    granting to the owner's sibling team: a scope below the owner sees the chunk and is refused as
    not its owner; an ancestor below L4, a sibling and another pillar get NOT_FOUND; what is refused
    writes nothing and leaves one denied row."""
    world = await new_world(engine)
    owner = Scope(world.org, "sales", "emea")
    expected_rows = []
    for label, ids in GRANTORS.items():
        grantee = ("team", world.path("sales", "apac"))
        for level in (1, 2, 3, 4):
            grantor = Scope(world.org, *ids)
            who = caller(engine, world.org, *ids, clearance=level)
            allowed_by_clearance = level >= required_clearance(ids, ("sales", "apac"))
            request = share(world, *grantee)
            if not allowed_by_clearance:
                await expect_error(grpc.StatusCode.PERMISSION_DENIED, who("CreateShare", request),
                                   reason="CLEARANCE_TOO_LOW")
                expected_rows.append((grantor.path, "denied", "create_share"))
            elif may_share(grantor, level, owner):
                await who("CreateShare", request)
                operation = "create_share" if grantor == owner else "create_share_for_owner"
                expected_rows.append((grantor.path, "allowed", operation))
            elif sees(grantor, owner):
                err = await expect_error(grpc.StatusCode.PERMISSION_DENIED, who("CreateShare", request),
                                         reason="NOT_RESOURCE_OWNER")
                assert owner.path in err.details(), (label, level, err.details())
                expected_rows.append((grantor.path, "denied", "create_share"))
            else:
                await expect_error(grpc.StatusCode.NOT_FOUND, who("CreateShare", request),
                                   reason="RESOURCE_NOT_FOUND")
                expected_rows.append((grantor.path, "denied", "create_share"))
    assert await grant_rows(engine, world.org) == sum(outcome == "allowed" for _, outcome, _ in expected_rows)
    rows = await audit_rows_until(engine, world.org, await sentinel(engine, world))
    recorded = [("/".join([world.org] + [r[f"actor_{k}"] for k in ("pillar", "team", "agent") if r[f"actor_{k}"]]),
                 r["outcome"], r["operation"]) for r in rows][:-1]  # the sentinel's last
    assert sorted(recorded) == sorted(expected_rows)


async def test_an_ancestor_acting_for_the_owner_shares_with_no_scope_that_would_see_it_as_its_own(engine):
    """A pillar does not see its teams' chunks; a grant to itself or the org would give it one."""
    world = await new_world(engine)
    pillar = caller(engine, world.org, "sales", clearance=4)
    for level, path in (("pillar", world.path("sales")), ("org", world.org)):
        await expect_error(grpc.StatusCode.PERMISSION_DENIED, pillar("CreateShare", share(world, level, path)),
                           reason="GRANTEE_IS_GRANTOR_OR_ABOVE")
    assert await grant_rows(engine, world.org) == 0
    assert await found(pillar, world.chunk_id) is None


async def test_an_owner_lists_every_grant_of_its_resources_whoever_made_it(engine):
    world = await new_world(engine)
    pillar = caller(engine, world.org, "sales", clearance=4)
    made = await pillar("CreateShare", share(world, "team", world.path("sales", "apac")))
    owner_team = caller(engine, world.org, "sales", "emea")
    listed = await owner_team("ListShares", pb.ListSharesRequest())
    assert [(g.share_id, g.grantor_scope_id) for g in listed.shares] == [(made.share_id, world.path("sales"))]
    assert listed.total_count == 1
    # The owner's agent sees the grant's resource, and is no owner: the grant is not listed for it.
    assert not (await caller(engine, world.org, "sales", "emea", "bot")("ListShares", pb.ListSharesRequest())).shares


async def test_a_grantee_searches_the_chunk_its_agents_too_and_no_other_scope_or_org(engine):
    world = await new_world(engine)
    apac, apac_bot = caller(engine, world.org, "sales", "apac"), caller(engine, world.org, "sales", "apac", "bot")
    desk = caller(engine, world.org, "support", "desk")
    same_ids_elsewhere = caller(engine, unique("org"), "sales", "apac")
    assert await found(apac, world.chunk_id) is None and await found(apac_bot, world.chunk_id) is None

    created = await caller(engine, world.org, "sales", "emea")("CreateShare", share(world, "team",
                                                                                    world.path("sales", "apac")))
    for who in (apac, apac_bot):
        hit = await found(who, world.chunk_id)
        assert hit is not None and hit.content == SECRET
        assert hit.metadata["engine.share_id"] == created.share_id
        assert hit.metadata["engine.scope"] == world.path("sales", "emea")  # still the owner's chunk
    assert await found(desk, world.chunk_id) is None
    assert await found(same_ids_elsewhere, world.chunk_id) is None
    # The owner sees it by ownership: no share named.
    own = await found(caller(engine, world.org, "sales", "emea"), world.chunk_id)
    assert own is not None and "engine.share_id" not in own.metadata

    await caller(engine, world.org, "sales", "emea")("RevokeShare", pb.RevokeShareRequest(share_id=created.share_id))
    assert await found(apac, world.chunk_id) is None and await found(apac_bot, world.chunk_id) is None


async def test_read_is_searchable_not_assembled_and_use_in_assembly_is_assembled(engine):
    world = await new_world(engine)
    owner = caller(engine, world.org, "sales", "emea")
    apac = caller(engine, world.org, "sales", "apac")
    own_session = unique("s")
    await apac("IngestEvent", pb.IngestEventRequest(session_id=own_session, event_type="message",
                                                    content=b"apac's own turn about lunch"))
    read_only = await owner("CreateShare", share(world, "team", world.path("sales", "apac"), "read"))
    assert await found(apac, world.chunk_id) is not None
    assert world.chunk_id not in await assembled(apac, world, own_session)
    await expect_error(grpc.StatusCode.NOT_FOUND,
                       assembled(apac, world, own_session, pinned_chunk_ids=world.chunk_id),
                       reason="PINNED_CHUNK_NOT_FOUND")

    for_assembly = await owner("CreateShare", share(world, "team", world.path("sales", "apac"), "use_in_assembly"))
    assert world.chunk_id in await assembled(apac, world, own_session)
    assert world.chunk_id in await assembled(apac, world, own_session, pinned_chunk_ids=world.chunk_id)

    await owner("RevokeShare", pb.RevokeShareRequest(share_id=for_assembly.share_id))
    assert world.chunk_id not in await assembled(apac, world, own_session)
    assert await found(apac, world.chunk_id) is not None  # the read grant still holds
    await owner("RevokeShare", pb.RevokeShareRequest(share_id=read_only.share_id))
    assert await found(apac, world.chunk_id) is None


async def test_revocation_holds_on_the_next_call_of_every_api_process(engine):
    """A second API process (its own pool, log client and archive watch) on the same deployment."""
    world = await new_world(engine)
    async with open_deps(engine.settings) as deps:
        server = build_api_server(engine.settings, deps, address="127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
        try:
            token = mint_token(engine.key, org=world.org, pillar="sales", team="apac", clearance=3)
            elsewhere = Caller(context_pb2_grpc.ContextEngineStub(channel), token,
                               pb.ScopePath(org_id=world.org, pillar_id="sales", team_id="apac"))
            session = unique("s")
            await elsewhere("IngestEvent", pb.IngestEventRequest(session_id=session, event_type="message",
                                                                 content=b"a turn"))
            owner = caller(engine, world.org, "sales", "emea")
            created = await owner("CreateShare", share(world, "team", world.path("sales", "apac"),
                                                       "read", "use_in_assembly"))
            assert await found(elsewhere, world.chunk_id) is not None
            assert world.chunk_id in await assembled(elsewhere, world, session)
            await owner("RevokeShare", pb.RevokeShareRequest(share_id=created.share_id))
            assert await found(elsewhere, world.chunk_id) is None
            assert world.chunk_id not in await assembled(elsewhere, world, session)
        finally:
            await channel.close()
            await server.stop(0)


async def test_revoke_by_the_creator_at_l2_and_not_by_another_l2(engine):
    world = await new_world(engine)
    creator = caller(engine, world.org, "sales", "emea", clearance=3, subject="alice")
    created = await creator("CreateShare", share(world, "team", world.path("sales", "apac")))
    request = pb.RevokeShareRequest(share_id=created.share_id, reason="done")
    # Another L2 of the grantor's own team, and the grantee at L2 and L4: refused.
    await expect_error(grpc.StatusCode.PERMISSION_DENIED,
                       caller(engine, world.org, "sales", "emea", clearance=2, subject="bob")("RevokeShare", request),
                       reason="CLEARANCE_TOO_LOW")
    for clearance in (2, 4):
        await expect_error(grpc.StatusCode.PERMISSION_DENIED,
                           caller(engine, world.org, "sales", "apac", clearance=clearance)("RevokeShare", request),
                           reason="NOT_SHARE_GRANTOR")
    # A scope that neither granted nor holds it cannot tell it exists.
    await expect_error(grpc.StatusCode.NOT_FOUND,
                       caller(engine, world.org, "support", "desk", clearance=4)("RevokeShare", request),
                       reason="SHARE_NOT_FOUND")
    await expect_error(grpc.StatusCode.NOT_FOUND,
                       caller(engine, unique("org"), "sales", "emea")("RevokeShare", request),
                       reason="SHARE_NOT_FOUND")
    assert await found(caller(engine, world.org, "sales", "apac"), world.chunk_id) is not None

    revoked = await caller(engine, world.org, "sales", "emea", clearance=2, subject="alice")("RevokeShare", request)
    assert revoked.revoked_at.seconds > 0
    again = await caller(engine, world.org, "sales", "emea", clearance=3)("RevokeShare", request)
    assert again.revoked_at == revoked.revoked_at  # idempotent: the first revocation's time, no new event
    events = await admin_fetch(engine, "SELECT type FROM event_archive WHERE org_id = $1 AND type LIKE 'share.%'",
                               world.org)
    assert sorted(r["type"] for r in events) == ["share.created", "share.revoked"]
    await expect_error(grpc.StatusCode.NOT_FOUND,
                       creator("RevokeShare", pb.RevokeShareRequest(share_id=str(uuid.uuid4()))),
                       reason="SHARE_NOT_FOUND")


@pytest.mark.parametrize("grants", [0, 1, 100, 101])
async def test_list_shares_pages(engine, grants):
    world = await new_world(engine)
    owner = caller(engine, world.org, "sales", "emea")
    made = [(await owner("CreateShare", share(world, "agent", world.path("sales", "emea", f"a{n}")))).share_id
            for n in range(grants)]
    for who in (owner, caller(engine, world.org, "sales", "emea", "a0")):  # the grantor, and one grantee
        first = await who("ListShares", pb.ListSharesRequest())
        expected = made if who is owner else made[:1]
        assert first.total_count == len(expected)
        assert [g.share_id for g in first.shares] == expected[:100]
        one_based = await who("ListShares", pb.ListSharesRequest(page=1, page_size=100))
        assert list(one_based.shares) == list(first.shares)
        second = await who("ListShares", pb.ListSharesRequest(page=2))
        assert [g.share_id for g in second.shares] == expected[100:200]
    pages, page = [], 1
    while chunk := (await owner("ListShares", pb.ListSharesRequest(page=page, page_size=7))).shares:
        pages += [g.share_id for g in chunk]
        page += 1
    assert pages == made  # stable: creation order, every grant once
    if grants:
        g = (await owner("ListShares", pb.ListSharesRequest(page_size=1))).shares[0]
        assert (g.resource_id, g.resource_type, g.grantor_scope_id, g.grantee_scope, g.grantee_scope_id,
                list(g.permissions), g.reason) == (world.chunk_id, "chunk", world.path("sales", "emea"), "agent",
                                                   world.path("sales", "emea", "a0"), ["read"], "test")
    for bad in (pb.ListSharesRequest(page_size=101), pb.ListSharesRequest(page_size=-1)):
        await expect_error(grpc.StatusCode.INVALID_ARGUMENT, owner("ListShares", bad), field="page_size")
    await expect_error(grpc.StatusCode.INVALID_ARGUMENT, owner("ListShares", pb.ListSharesRequest(page=-1)),
                       field="page")


async def test_hostile_create_share_requests_are_refused_naming_the_field_and_write_nothing(engine):
    world = await new_world(engine)
    owner = caller(engine, world.org, "sales", "emea", clearance=4)
    good = dict(resource_id=world.chunk_id, resource_type="chunk", grantee_scope="team",
                grantee_scope_id=world.path("sales", "apac"), permissions=["read"], reason="")
    cases = [
        ("resource_type", {"resource_type": ""}), ("resource_type", {"resource_type": "Chunk"}),
        ("resource_type", {"resource_type": "chunk\x00"}), ("resource_type", {"resource_type": "session"}),
        ("resource_id", {"resource_id": ""}), ("resource_id", {"resource_id": "x" * 10_000}),
        ("resource_id", {"resource_id": world.chunk_id + "\x00"}),
        ("grantee_scope", {"grantee_scope": "world"}), ("grantee_scope", {"grantee_scope": ""}),
        ("grantee_scope_id", {"grantee_scope_id": ""}), ("grantee_scope_id", {"grantee_scope_id": "sales/apac"}),
        ("grantee_scope_id", {"grantee_scope_id": world.path("sales", "apac", "bot")}),
        ("grantee_scope_id", {"grantee_scope_id": world.path("sales", "ap\x00ac")}),
        ("grantee_scope_id", {"grantee_scope_id": world.path("sales", "")}),
        ("grantee_scope_id", {"grantee_scope_id": "/" * 5000}),
        ("permissions", {"permissions": []}), ("permissions", {"permissions": ["read", "write"]}),
        ("permissions", {"permissions": ["READ"]}), ("permissions", {"permissions": ["read\x00"]}),
        ("reason", {"reason": "line\nbreak"}), ("reason", {"reason": "x" * 5000}),
    ]
    for field_name, change in cases:
        err = await expect_error(grpc.StatusCode.INVALID_ARGUMENT,
                                 owner("CreateShare", pb.CreateShareRequest(**(good | change))), field=field_name)
        if change.get("permissions") == ["read", "write"]:
            assert "'write'" in err.details()
    # Another org's grantee; a chunk id nobody has; a chunk of a sibling team: refused, no grant.
    await expect_error(grpc.StatusCode.PERMISSION_DENIED, owner("CreateShare", pb.CreateShareRequest(
        **(good | {"grantee_scope_id": "other-org/sales/apac"}))), reason="GRANTEE_OUTSIDE_ORG")
    await expect_error(grpc.StatusCode.NOT_FOUND, owner("CreateShare", pb.CreateShareRequest(
        **(good | {"resource_id": str(uuid.uuid4())}))), reason="RESOURCE_NOT_FOUND")
    sibling = caller(engine, world.org, "sales", "apac", clearance=4)
    await expect_error(grpc.StatusCode.NOT_FOUND, sibling("CreateShare", pb.CreateShareRequest(
        **(good | {"grantee_scope_id": world.path("sales", "apac")}))), reason="RESOURCE_NOT_FOUND")
    for resource_type in ("snapshot", "layer"):  # the chunk's id is no snapshot and no layer
        await expect_error(grpc.StatusCode.NOT_FOUND, owner("CreateShare", pb.CreateShareRequest(
            **(good | {"resource_type": resource_type}))), reason="RESOURCE_NOT_FOUND")
    assert await grant_rows(engine, world.org) == 0
    # Duplicated permissions are one.
    await owner("CreateShare", pb.CreateShareRequest(**(good | {"permissions": ["read", "read"]})))
    rows = await admin_fetch(engine, "SELECT permissions FROM share_grants WHERE org_id = $1", world.org)
    assert [list(r["permissions"]) for r in rows] == [["read"]]


async def test_a_grantee_cannot_reshare_what_it_sees_only_through_a_grant(engine):
    world = await new_world(engine)
    await caller(engine, world.org, "sales", "emea")("CreateShare", share(world, "team", world.path("sales", "apac")))
    await expect_error(grpc.StatusCode.NOT_FOUND, caller(engine, world.org, "sales", "apac")(
        "CreateShare", share(world, "agent", world.path("sales", "apac", "bot"))), reason="RESOURCE_NOT_FOUND")
    assert await grant_rows(engine, world.org) == 1


async def test_a_grant_of_what_its_grantor_does_not_own_widens_nothing(engine):
    """CreateShare refuses it (above); a share.created a trusted writer appended anyway (a handler
    bug, a replayed old log) is stored, and held by no read: a grant holds only what its grantor
    owns."""
    world = await new_world(engine)
    apac = Scope(world.org, "sales", "apac")
    share_id = str(uuid.uuid4())
    forged = Event.of(ShareCreated(share_id, "chunk", world.chunk_id, "team", apac.path, ("read", "use_in_assembly"),
                                   "not the owner's"),
                      scope=apac, actor="apac-lead", aggregate=share_aggregate(world.org, share_id))
    await engine.deps.log.append(forged)
    # Appended without an acknowledgement: wait until the projector archived it (in the transaction
    # that stores its grant), not for background work, which a loaded machine finishes first.
    await wait_for("the forged share.created archived", lambda: admin_fetch(
        engine, "SELECT 1 FROM event_archive WHERE org_id = $1 AND event_id = $2", world.org,
        uuid.UUID(forged.event_id)), engine)
    assert [str(r["share_id"]) for r in await admin_fetch(
        engine, "SELECT share_id FROM share_grants WHERE org_id = $1", world.org)] == [share_id]
    reader, own_session = caller(engine, world.org, "sales", "apac"), unique("s")
    await reader("IngestEvent", pb.IngestEventRequest(session_id=own_session, event_type="message",
                                                      content=b"apac's own turn about the tide"))
    assert await found(reader, world.chunk_id) is None
    assert world.chunk_id not in await assembled(reader, world, own_session)
    await expect_error(grpc.StatusCode.NOT_FOUND,
                       assembled(reader, world, own_session, pinned_chunk_ids=world.chunk_id),
                       reason="PINNED_CHUNK_NOT_FOUND")


async def test_a_shared_snapshot_is_pulled_by_the_grantee(engine):
    world = await new_world(engine)
    owner_bot = caller(engine, world.org, "sales", "emea", "bot", clearance=3)
    await owner_bot("PushContext", pb.PushContextRequest(session_id=world.session, memory_type="semantic",
                                                         content=b"the pilot boards at slack water"))
    snap = await owner_bot("CreateSnapshot", pb.CreateSnapshotRequest(session_id=world.session,
                                                                      snapshot_name="handover"))
    request = pb.PullContextRequest(agent_id="bot", session_id=world.session, snapshot_name="handover")
    apac = caller(engine, world.org, "sales", "apac")
    await expect_error(grpc.StatusCode.NOT_FOUND, apac("PullContext", request), reason="SNAPSHOT_NOT_FOUND")
    created = await owner_bot("CreateShare", share(world, "team", world.path("sales", "apac"),
                                                   resource_id=snap.snapshot_id, resource_type="snapshot"))
    pulled = await apac("PullContext", request)
    assert pulled.content == b"the pilot boards at slack water" and pulled.version_hash == snap.version_hash
    # An agent the shared snapshot holds nothing of: not found, and no row (the grant held; nothing crossed).
    await expect_error(grpc.StatusCode.NOT_FOUND, apac("PullContext", pb.PullContextRequest(
        agent_id="nobody", session_id=world.session, snapshot_name="handover")), reason="SNAPSHOT_NOT_FOUND")
    await expect_error(grpc.StatusCode.NOT_FOUND, caller(engine, world.org, "support", "desk")("PullContext", request),
                       reason="SNAPSHOT_NOT_FOUND")
    await owner_bot("RevokeShare", pb.RevokeShareRequest(share_id=created.share_id))
    await expect_error(grpc.StatusCode.NOT_FOUND, apac("PullContext", request), reason="SNAPSHOT_NOT_FOUND")
    # Its audit: the session apac never saw, then its read through the grant, a stranger's try at
    # the session, and the read after the revocation, recorded at the snapshot it was granted.
    rows = await audit_rows_until(engine, world.org, await sentinel(engine, world))
    assert [(r["actor_pillar"], r["actor_team"], r["resource_type"], r["resource_id"], r["outcome"],
             r["denial_reason"], r["share_id"]) for r in rows if r["operation"] == "read"] == [
        ("sales", "apac", "session", world.session, "denied", "not_visible", ""),
        ("sales", "apac", "snapshot", snap.snapshot_id, "allowed", "", created.share_id),
        ("support", "desk", "session", world.session, "denied", "not_visible", ""),
        ("sales", "apac", "snapshot", snap.snapshot_id, "denied", "grant_revoked", ""),
    ]


async def test_forgery_attempts_leave_one_denied_row_each_and_grant_reads_allowed_rows(engine):
    world = await new_world(engine)
    owner = caller(engine, world.org, "sales", "emea")
    apac = caller(engine, world.org, "sales", "apac", clearance=3)
    apac_session = unique("s")
    await apac("IngestEvent", pb.IngestEventRequest(session_id=apac_session, event_type="message", content=b"hi"))
    # Forgeries by a sibling team, each naming the owner's ids.
    await expect_error(grpc.StatusCode.NOT_FOUND,
                       assembled(apac, world, apac_session, pinned_chunk_ids=world.chunk_id))
    await expect_error(grpc.StatusCode.NOT_FOUND, assembled(apac, world, world.session))
    await expect_error(grpc.StatusCode.PERMISSION_DENIED, apac("IngestEvent", pb.IngestEventRequest(
        session_id=world.session, event_type="message", content=b"forged")))
    await expect_error(grpc.StatusCode.NOT_FOUND,
                       apac("CreateShare", share(world, "team", world.path("sales", "apac"))))
    await expect_error(grpc.StatusCode.PERMISSION_DENIED, caller(engine, world.org, "sales", "emea", clearance=2)(
        "CreateShare", share(world, "team", world.path("sales", "apac"))))
    # An id nobody has crossed no scope: no row.
    await expect_error(grpc.StatusCode.NOT_FOUND,
                       assembled(apac, world, apac_session, pinned_chunk_ids=str(uuid.uuid4())))
    # A grant, read through it, then its revocation and a pin through the revoked grant.
    created = await owner("CreateShare", share(world, "team", world.path("sales", "apac"), "read", "use_in_assembly"))
    assert await found(apac, world.chunk_id) is not None
    assert world.chunk_id in await assembled(apac, world, apac_session)
    await owner("RevokeShare", pb.RevokeShareRequest(share_id=created.share_id))
    await expect_error(grpc.StatusCode.NOT_FOUND,
                       assembled(apac, world, apac_session, pinned_chunk_ids=world.chunk_id))

    rows = await audit_rows_until(engine, world.org, await sentinel(engine, world))
    seen = [(r["actor_team"], r["resource_type"], r["resource_id"], r["operation"], r["outcome"], r["denial_reason"],
             r["share_id"]) for r in rows]
    chunk, session, share_id = world.chunk_id, world.session, created.share_id
    assert seen[:-1] == [
        ("apac", "chunk", chunk, "use_in_assembly", "denied", "not_visible", ""),
        ("apac", "session", session, "use_in_assembly", "denied", "not_visible", ""),
        ("apac", "session", session, "write", "denied", "session_out_of_scope", ""),
        ("apac", "chunk", chunk, "create_share", "denied", "not_visible", ""),
        ("emea", "chunk", chunk, "create_share", "denied", "clearance_too_low", ""),
        ("emea", "chunk", chunk, "create_share", "allowed", "", share_id),
        ("apac", "chunk", chunk, "read", "allowed", "", share_id),
        ("apac", "chunk", chunk, "use_in_assembly", "allowed", "", share_id),
        ("emea", "chunk", chunk, "revoke_share", "allowed", "", share_id),
        ("apac", "chunk", chunk, "use_in_assembly", "denied", "grant_revoked", ""),
    ]
    assert seen[-1][:5] == ("emea", "chunk", chunk, "create_share", "allowed")
    # Another org reads none of these rows under row-level security (the API's role).
    conn = await asyncpg.connect(engine.settings.database_url)
    try:
        async with conn.transaction():
            await conn.execute("SET LOCAL ROLE context_engine_api")
            await conn.execute("SELECT set_config('app.org_id', $1, true)", unique("org"))
            assert await conn.fetchval("SELECT count(*) FROM audit_access") == 0
            await conn.execute("SELECT set_config('app.org_id', $1, true)", world.org)
            assert await conn.fetchval("SELECT count(*) FROM audit_access") == len(rows)
    finally:
        await conn.close()


async def test_replay_rebuilds_the_grants(engine):
    """A grant's events are on its own partition (keyed by the share), its chunk's on the
    session's; a rebuild reads the partitions in another interleaving than the live projector
    applied them, so a grant may be rebuilt before its chunk. Eight grants, half revoked: with four
    partitions, some land ahead of the chunk's."""
    world = await new_world(engine)
    owner = caller(engine, world.org, "sales", "emea")
    grants = []
    for i in range(8):
        created = await owner("CreateShare", share(world, "agent", world.path("sales", "apac", f"bot-{i}"),
                                                   "read", "use_in_assembly"))
        if i % 2:
            await owner("RevokeShare", pb.RevokeShareRequest(share_id=created.share_id))
        grants.append((created.share_id, bool(i % 2)))
    await settled(engine.settings.database_url, world.org)
    topic = LogTopics.from_settings(engine.settings).events
    report, differences = await verify(log_of(engine.settings, topic), engine.settings.database_url)
    assert [d for d in differences if world.org in str(d)] == []
    assert report.events > 0
    live = await admin_fetch(engine, "SELECT share_id, revoked_at IS NOT NULL AS revoked FROM share_grants "
                                     "WHERE org_id = $1 ORDER BY created_at", world.org)
    assert [(str(r["share_id"]), r["revoked"]) for r in live] == grants


async def test_a_rebuild_that_reads_every_grant_before_its_resource_gives_the_same_grants(engine, postgres_url):
    """The interleaving the live projector never sees, made certain: every share event first (in
    log order, so each key's order is kept), then the rest. The grants and what they widen come
    out as live."""
    world = await new_world(engine)
    owner = caller(engine, world.org, "sales", "emea")
    kept = await owner("CreateShare", share(world, "team", world.path("sales", "apac"), "read", "use_in_assembly"))
    ended = await owner("CreateShare", share(world, "agent", world.path("sales", "emea", "bot")))
    await owner("RevokeShare", pb.RevokeShareRequest(share_id=ended.share_id))
    await settled(engine.settings.database_url, world.org)
    records = [r async for batch in log_of(engine.settings, LogTopics.from_settings(engine.settings).events)
               for r in batch]
    def is_share_event(r: LogRecord) -> bool:
        try:
            return decode(r.raw).type.startswith("share.")
        except EventDecodeError:  # other tests' malformed records: set aside in either order
            return False

    grants_first = sorted(records, key=lambda r: not is_share_event(r))  # stable

    async def once() -> AsyncIterator[list[LogRecord]]:
        yield grants_first

    columns = "share_id, resource_id, grantor_path, grantee_path, permissions, created_at, revoked_at, event_id"
    use_in_assembly = held_sql("chunk", org="$1", paths="$2::text[]", permission="'use_in_assembly'")
    held_by_apac = f"SELECT resource_id, share_id FROM ({use_in_assembly}) AS h"
    apac_paths = list(Visibility.of(Scope(world.org, "sales", "apac")).sql_paths)
    live = await admin_fetch(engine, f"SELECT {columns} FROM share_grants WHERE org_id = $1 ORDER BY share_id",
                             world.org)
    async with fresh_database(postgres_url, "ce_grants_first") as url:
        await replay(once(), url)
        conn = await asyncpg.connect(url)
        try:
            rebuilt = await conn.fetch(f"SELECT {columns} FROM share_grants WHERE org_id = $1 ORDER BY share_id",
                                       world.org)
            held_rebuilt = await conn.fetch(held_by_apac, world.org, apac_paths)
        finally:
            await conn.close()
    assert [tuple(r) for r in rebuilt] == [tuple(r) for r in live] and len(live) == 2
    assert [(str(r["resource_id"]), str(r["share_id"])) for r in held_rebuilt] == [(world.chunk_id, kept.share_id)]


async def test_a_layer_is_shared_by_its_chain_and_never_enters_the_grantees_chain(engine, tmp_path):
    world = await new_world(engine)
    await publish(engine, tmp_path, 3, "Emea rule: quote tide times in UTC.",
                  "--org", world.org, "--pillar", "sales", "--team", "emea")
    rows = await admin_fetch(engine, "SELECT event_id FROM guardrail_layers WHERE org_id = $1", world.org)
    layer_id = str(rows[0]["event_id"])
    apac = caller(engine, world.org, "sales", "apac")
    before = await apac("ResolveGuardrailLayers", pb.ResolveGuardrailLayersRequest())
    request = share(world, "team", world.path("sales", "apac"), resource_id=layer_id, resource_type="layer")
    await expect_error(grpc.StatusCode.NOT_FOUND, apac("CreateShare", request), reason="RESOURCE_NOT_FOUND")
    created = await caller(engine, world.org, "sales", "emea")("CreateShare", request)
    listed = await apac("ListShares", pb.ListSharesRequest())
    assert [(g.share_id, g.resource_type, g.resource_id) for g in listed.shares] == [
        (created.share_id, "layer", layer_id)]
    after = await apac("ResolveGuardrailLayers", pb.ResolveGuardrailLayersRequest())
    assert list(after.layers) == list(before.layers)
