"""Destructive operations stay inside the caller's subtree: RollbackContext from every level on a
session owned at every level is allowed exactly when the rule (tests.security.world.may_rewrite)
says, and a refusal changes no row of any table and nothing anyone reads."""

from __future__ import annotations

import grpc
import pytest

from context_engine.scope import Scope
from entrypoints.serving.status import error_info
from tests.fixtures.settling import settled
from tests.security.row_counts import unchanged
from tests.security.world import may_rewrite, scopes
from upsquad.context.v1 import context_pb2 as pb

pytestmark = pytest.mark.integration


def _caller(engine, scope: Scope, clearance: int = 4):
    return engine.caller(scope.org_id, scope.pillar_id, scope.team_id, scope.agent_id, clearance=clearance)


@pytest.fixture(scope="module")
async def sessions(quiet_engine):
    """One session owned at each level: a first turn (the rollback target) and a second one, both
    the owner's; {level: (scope, session_id, target version, second turn's text)}."""
    levels = scopes()
    out = {}
    for level, owner in levels.items():
        session = f"rollback-{level}"
        author = _caller(quiet_engine, owner)
        await author("IngestEvent", pb.IngestEventRequest(session_id=session, event_type="message", content=b"first"))
        target = (await author("CreateSnapshot", pb.CreateSnapshotRequest(
            session_id=session, snapshot_name="target"))).version_hash
        second = f"second turn of {level}"
        await author("IngestEvent", pb.IngestEventRequest(
            session_id=session, event_type="message", content=second.encode()))
        out[level] = (owner, session, target, second)
    await settled(quiet_engine.settings.database_url)
    return levels, out


async def _history(engine, owner: Scope, session: str) -> str:
    return (await _caller(engine, owner)("AssembleContext", pb.AssembleContextRequest(
        session_id=session, token_budget=2000))).assembled_prompt


async def _rollback(engine, caller: Scope, session: str, target: str, clearance: int = 4):
    try:
        await _caller(engine, caller, clearance)("RollbackContext", pb.RollbackContextRequest(
            session_id=session, target_version_hash=target))
    except grpc.aio.AioRpcError as err:
        return err.code(), error_info(err).reason
    return grpc.StatusCode.OK, ""


async def test_rollback_from_every_level_on_every_owner(quiet_engine, sessions) -> None:
    levels, owned = sessions
    refused, allowed = [], []
    for owner_level, (owner, session, target, second) in owned.items():
        for caller_level, caller in levels.items():
            if may_rewrite(caller, owner):
                allowed.append((caller_level, owner_level))
                continue
            async with unchanged(quiet_engine.settings.database_url):
                got = await _rollback(quiet_engine, caller, session, target)
            # Another org cannot even name the session; within the org it is refused outright.
            want = (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND") if caller.org_id != owner.org_id \
                else (grpc.StatusCode.PERMISSION_DENIED, "NOT_SESSION_OWNER")
            refused.append((caller_level, owner_level, got == want, got))
        assert second in await _history(quiet_engine, owner, session), f"{owner_level}'s session changed"
    assert [r for r in refused if not r[2]] == []
    assert len(refused) == len(levels) ** 2 - len(levels) and len(allowed) == len(levels)
    # The owner itself may, and then the second turn is gone from what it reads.
    for owner, session, target, second in owned.values():
        assert await _rollback(quiet_engine, owner, session, target) == (grpc.StatusCode.OK, "")
        assert second not in await _history(quiet_engine, owner, session)


async def test_a_refusal_is_no_version_oracle(quiet_engine, sessions) -> None:
    """Below the owner, a real and an invented target version get the same answer."""
    levels, owned = sessions
    owner, session, target, _ = owned["org"]
    async with unchanged(quiet_engine.settings.database_url):
        real = await _rollback(quiet_engine, levels["team"], session, target)
        invented = await _rollback(quiet_engine, levels["team"], session, "0" * 64)
    assert real == invented == (grpc.StatusCode.PERMISSION_DENIED, "NOT_SESSION_OWNER")


async def test_the_owner_needs_clearance_l3(quiet_engine, sessions) -> None:
    _, owned = sessions
    owner, session, target, _ = owned["team"]
    async with unchanged(quiet_engine.settings.database_url):
        got = await _rollback(quiet_engine, owner, session, target, clearance=2)
    assert got[0] == grpc.StatusCode.PERMISSION_DENIED and got[1] != "NOT_SESSION_OWNER"
