"""Every refused cross-scope or under-clearance attempt leaves exactly one denied audit row (issue
#41, docs/security.md "The audit trail"): each RPC of ContextEngine that names another scope's
session, event or resource, from every scope of tests/security/world.py, its expectation computed
from the written rules (`sees`, `may_rewrite`, `may_share`, the clearance table); then the
refused-call budget: past it, RESOURCE_EXHAUSTED and one summary row with the count."""

from __future__ import annotations

import asyncio
import collections
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import pytest

from context_engine import clearance
from context_engine.scope import Scope
from entrypoints.serving.status import error_info
from tests.fixtures.calls import admin_fetch
from tests.fixtures.engine import running_engine
from tests.fixtures.settling import settled
from tests.security.world import may_rewrite, may_share, scopes, sees
from upsquad.context.v1 import context_pb2 as pb

pytestmark = pytest.mark.integration

# RPCs that name no session, event or resource of another scope: nothing there to refuse or audit.
NAME_NOTHING = {"Search", "ListShares", "ResolveGuardrailLayers", "ValidatePrompt", "Embed"}


@dataclass
class Owned:
    """What the owner scope (world's "team") holds: a session with a turn and its agent "bot"'s memory
    (owned at the agent's scope, below the team), a snapshot of both, the turn's chunk and event, and
    a grant of the chunk to the other pillar."""

    owner: Scope
    session: str
    snapshot: str
    chunk_id: str
    event_id: str
    share_id: str
    memory_event_id: str


def bot_of(owner: Scope) -> Scope:
    """The owner team's agent "bot", whose memory the PullContext probes ask for."""
    return Scope(owner.org_id, owner.pillar_id, owner.team_id, "bot")


@dataclass(frozen=True)
class Probe:
    rpc: str
    request: Callable[[Owned, Scope], object]
    # (resource_type, resource_id) of the caller's denied row; None: the refusal named nothing of the owner's
    resource: Callable[[Owned, Scope], tuple[str, str] | None]
    allowed: Callable[[Scope, Scope], bool]  # (caller, owner) -> the written rule allows it


def session_of(o: Owned, _caller: Scope) -> tuple[str, str]:
    return "session", o.session


def bots_memory(o: Owned, caller: Scope) -> tuple[str, str]:
    """The session when the caller does not see it, else the memory it reached for."""
    return session_of(o, caller) if not sees(caller, o.owner) else ("memory", o.memory_event_id)


def bots_memory_if_of_its_team(o: Owned, caller: Scope) -> tuple[str, str] | None:
    """An agent id names an agent beside or below the caller's scopes (docs/security.md): "bot" is
    the owner team's agent to a caller that sees the team, and no one's to the others."""
    return ("memory", o.memory_event_id) if sees(caller, o.owner) else None


def sees_bots_memory(caller: Scope, owner: Scope) -> bool:
    return sees(caller, bot_of(owner))


PROBES = (
    Probe("IngestEvent", lambda o, c: pb.IngestEventRequest(session_id=o.session, event_type="message", content=b"x"),
          session_of, lambda c, owner: sees(c, owner)),
    Probe("PushContext", lambda o, c: pb.PushContextRequest(session_id=o.session, memory_type="semantic",
                                                            content=b"x"),
          session_of, lambda c, owner: sees(c, owner)),
    Probe("PullContext", lambda o, c: pb.PullContextRequest(agent_id="bot", session_id=o.session),
          bots_memory, sees_bots_memory),
    Probe("PullContext", lambda o, c: pb.PullContextRequest(agent_id="bot", session_id=o.session,
                                                            snapshot_name="handover"),
          bots_memory, sees_bots_memory),
    Probe("PullContext", lambda o, c: pb.PullContextRequest(agent_id="bot"),  # no session named: the memory,
          bots_memory_if_of_its_team, sees_bots_memory),  # when "bot" can name the team's agent
    Probe("AssembleContext", lambda o, c: pb.AssembleContextRequest(session_id=o.session, token_budget=500),
          session_of, lambda c, owner: sees(c, owner)),
    Probe("AssembleContext", lambda o, c: pb.AssembleContextRequest(
        session_id=f"own-{c.path.replace('/', '-')}", token_budget=500, hints={"must_include": f"event:{o.event_id}"}),
        lambda o, c: ("event", o.event_id), lambda c, owner: sees(c, owner)),
    Probe("AssembleContext", lambda o, c: pb.AssembleContextRequest(
        session_id=f"own-{c.path.replace('/', '-')}", token_budget=500, hints={"pinned_chunk_ids": o.chunk_id}),
        lambda o, c: ("chunk", o.chunk_id), lambda c, owner: sees(c, owner)),
    Probe("CreateSnapshot", lambda o, c: pb.CreateSnapshotRequest(session_id=o.session,
                                                                  snapshot_name=f"s-{uuid.uuid4().hex[:8]}"),
          session_of, lambda c, owner: sees(c, owner)),
    Probe("RollbackContext", lambda o, c: pb.RollbackContextRequest(session_id=o.session,
                                                                    target_version_hash="0" * 64),
          session_of, may_rewrite),
    Probe("Compact", lambda o, c: pb.CompactRequest(session_id=o.session, strategy="sliding_window"),
          session_of, may_rewrite),
    Probe("CreateShare", lambda o, c: pb.CreateShareRequest(
        resource_id=o.chunk_id, resource_type="chunk", grantee_scope="org", grantee_scope_id=c.org_id,
        permissions=["read"]), lambda o, c: ("chunk", o.chunk_id), lambda c, owner: may_share(c, 4, owner)),
    Probe("RevokeShare", lambda o, c: pb.RevokeShareRequest(share_id=o.share_id),
          lambda o, c: ("share", o.share_id), lambda c, owner: sees(owner, c)),  # the grantor or above it
)

# (RPC, the clearance rule it needs, a request of the owner's own) for the under-clearance refusals.
CLEARANCE_PROBES = (
    ("CreateSnapshot", clearance.Action.CREATE_SNAPSHOT,
     lambda o: pb.CreateSnapshotRequest(session_id=o.session, snapshot_name="low")),
    ("RollbackContext", clearance.Action.ROLLBACK,
     lambda o: pb.RollbackContextRequest(session_id=o.session, target_version_hash="0" * 64)),
    ("Compact", clearance.Action.COMPACT, lambda o: pb.CompactRequest(session_id=o.session, strategy="sliding_window")),
    ("CreateShare", clearance.Action.CREATE_SHARE, lambda o: pb.CreateShareRequest(
        resource_id=o.chunk_id, resource_type="chunk", grantee_scope="team",
        grantee_scope_id=f"{o.owner.org_id}/sales/apac", permissions=["read"])),
)


def test_every_rpc_that_names_a_scope_is_probed() -> None:
    methods = {m.name for m in pb.DESCRIPTOR.services_by_name["ContextEngine"].methods}
    assert {p.rpc for p in PROBES} | {rpc for rpc, *_ in CLEARANCE_PROBES} | NAME_NOTHING == methods


def caller(engine, scope: Scope, level: int = 4, subject: str | None = None):
    return engine.caller(scope.org_id, scope.pillar_id, scope.team_id, scope.agent_id, clearance=level)


async def owned_world(engine) -> tuple[dict[str, Scope], Owned]:
    world = scopes()
    owner = world["team"]
    author = caller(engine, owner)
    session = f"audited-{uuid.uuid4().hex[:8]}"
    turn = await author("IngestEvent", pb.IngestEventRequest(session_id=session, event_type="message",
                                                             content=b"the quay closes at dusk"))
    await caller(engine, bot_of(owner))("PushContext", pb.PushContextRequest(
        session_id=session, memory_type="semantic", content=b"berth 4"))
    snapshot = await author("CreateSnapshot", pb.CreateSnapshotRequest(session_id=session, snapshot_name="handover"))
    await settled(engine.settings.database_url, owner.org_id)
    rows = await admin_fetch(engine, "SELECT chunk_id FROM chunks WHERE org_id = $1 AND source_event_id = $2",
                             owner.org_id, uuid.UUID(turn.event_id))
    grant = await author("CreateShare", pb.CreateShareRequest(
        resource_id=str(rows[0]["chunk_id"]), resource_type="chunk", grantee_scope="pillar",
        grantee_scope_id=f"{owner.org_id}/support", permissions=["read"]))
    memory = await admin_fetch(engine, "SELECT event_id FROM memory_versions WHERE org_id = $1 AND agent_id = 'bot'",
                               owner.org_id)
    return world, Owned(owner, session, snapshot.snapshot_id, str(rows[0]["chunk_id"]), turn.event_id,
                        grant.share_id, str(memory[0]["event_id"]))


async def outcome(call) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as err:
        return err.code(), error_info(err).reason
    return grpc.StatusCode.OK, ""


async def denied_rows(engine, org: str, expected: int, timeout: float = 120.0) -> list:
    """The org's denied rows once `expected` are stored (the writer stores them in order; a bound on
    the wait, not the verdict: the count is compared exactly after)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = await admin_fetch(engine, "SELECT * FROM audit_access WHERE org_id = $1 AND outcome = 'denied'", org)
        if len(rows) >= expected or time.monotonic() > deadline:
            await asyncio.sleep(1.0)  # what a double would add arrives with the rest: read once more
            return await admin_fetch(engine, "SELECT * FROM audit_access WHERE org_id = $1 AND outcome = 'denied'",
                                     org)
        await asyncio.sleep(0.2)


def actor(row) -> str:
    return "/".join([row["org_id"]] + [row[f"actor_{k}"] for k in ("pillar", "team", "agent") if row[f"actor_{k}"]])


async def test_every_refused_attempt_leaves_exactly_one_denied_row(engine) -> None:
    world, owned = await owned_world(engine)
    expected: collections.Counter[tuple[str, str, str]] = collections.Counter()
    refusals = []
    for name, scope in world.items():
        if scope.org_id != owned.owner.org_id:
            continue  # another org cannot name what the org holds
        for probe in PROBES:
            if probe.allowed(scope, owned.owner):
                continue  # allowed calls are the other tests' subject; here only what is refused
            code, reason = await outcome(caller(engine, scope)(probe.rpc, probe.request(owned, scope)))
            refusals.append((name, probe.rpc, code, reason))
            assert code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED), (name, probe.rpc, code)
            if (resource := probe.resource(owned, scope)) is not None:
                expected[(scope.path, *resource)] += 1
    for rpc, action, request in CLEARANCE_PROBES:
        code, reason = await outcome(caller(engine, owned.owner, action.level - 1)(rpc, request(owned)))
        assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "CLEARANCE_TOO_LOW"), rpc
        expected[(owned.owner.path, "chunk" if rpc == "CreateShare" else "session",
                  owned.chunk_id if rpc == "CreateShare" else owned.session)] += 1
    assert {rpc for _, rpc, _, _ in refusals} == {p.rpc for p in PROBES}  # every probe refused someone
    rows = await denied_rows(engine, owned.owner.org_id, sum(expected.values()))
    got = collections.Counter((actor(r), r["resource_type"], r["resource_id"]) for r in rows)
    assert got == expected, (got - expected, expected - got, refusals)


async def test_an_agent_id_names_no_other_teams_agent_and_ones_own_names_nothing(engine) -> None:
    world, owned = await owned_world(engine)
    namesake = Scope(owned.owner.org_id, "sales", "apac", "bot")  # "bot" of another team
    other_agent = caller(engine, Scope(owned.owner.org_id, "sales", "apac", "desk"))
    for request in (pb.PullContextRequest(), pb.PullContextRequest(agent_id="bot")):
        code, reason = await outcome(caller(engine, namesake)("PullContext", request))  # its own, none yet
        assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "MEMORY_NOT_FOUND")
    code, reason = await outcome(other_agent("PullContext", pb.PullContextRequest(agent_id="bot")))
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "MEMORY_NOT_FOUND")
    # Then one refusal that does cross (the team's session): the writer stores an org's rows in order.
    await outcome(other_agent("PullContext", pb.PullContextRequest(agent_id="bot", session_id=owned.session)))
    rows = await denied_rows(engine, owned.owner.org_id, 1)
    assert [(actor(r), r["resource_type"], r["resource_id"]) for r in rows] == [
        (f"{owned.owner.org_id}/sales/apac/desk", "session", owned.session)]


@pytest.fixture
async def budgeted_engine(postgres_url, kafka_bootstrap, tmp_path):
    """A deployment whose tokens may be refused 5 times, then once a second: a loop of refused calls
    outruns it on any machine."""
    env = {"CONTEXT_ENGINE_REFUSED_CALLS_PER_SECOND": "1", "CONTEXT_ENGINE_REFUSED_CALLS_BURST": "5"}
    async with running_engine(postgres_url, kafka_bootstrap, tmp_path, extra_env=env) as engine:
        yield engine


async def test_past_the_refused_call_budget_refusals_are_resource_exhausted_and_summarised(budgeted_engine) -> None:
    engine = budgeted_engine
    world, owned = await owned_world(engine)
    prober = caller(engine, world["sibling_team"])
    calls = 40
    outcomes: collections.Counter[tuple[grpc.StatusCode, str]] = collections.Counter()
    for _ in range(calls):
        code, reason = await outcome(prober("PullContext", pb.PullContextRequest(agent_id="bot",
                                                                                 session_id=owned.session)))
        outcomes[code, reason] += 1
    exhausted = outcomes[grpc.StatusCode.RESOURCE_EXHAUSTED, "REFUSED_CALL_RATE_EXCEEDED"]
    refused = outcomes[grpc.StatusCode.NOT_FOUND, "MEMORY_NOT_FOUND"]
    assert exhausted > 0 and refused + exhausted == calls, outcomes
    # One row per refusal answered as such, and the rest in summary rows that count them.
    deadline = time.monotonic() + 120
    while True:
        rows = await admin_fetch(engine, "SELECT * FROM audit_access WHERE org_id = $1 AND outcome = 'denied'",
                                 owned.owner.org_id)
        summaries = [r for r in rows if r["operation"] == "refused_attempts_not_recorded"]
        counted = sum(int(r["resource_id"].split()[0]) for r in summaries)
        if counted >= exhausted or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert counted == exhausted, summaries
    assert len([r for r in rows if r["operation"] == "read"]) == refused
    assert {actor(r) for r in rows} == {world["sibling_team"].path}
