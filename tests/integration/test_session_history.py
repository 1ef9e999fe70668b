"""`context-engine history`: a session's versions in chain order, each one a RollbackContext
target, through the real CLI beside the running engine (issue #23)."""

from __future__ import annotations

import orjson
import pytest

from tests.fixtures.engine import unique
from tests.fixtures.sessions import OLDER, active_turns, long_session
from upsquad.context.v1 import context_pb2 as pb

pytestmark = pytest.mark.integration


async def history(engine, org: str, sid: str) -> list[dict]:
    code, out = await engine.cli("history", "--org", org, "--session", sid, "--json")
    assert code == 0, out
    return orjson.loads(out[out.index("["):])


async def test_history_lists_every_version_and_a_listed_one_is_a_rollback_target(engine):
    org, sid = unique("org"), unique("s")
    lead = engine.caller(org, "sales", "emea", clearance=3)
    turns = [b"user: first", b"assistant: second", b"user: third"]
    ids = [(await lead("IngestEvent", pb.IngestEventRequest(session_id=sid, event_type="message",
                                                            content=t))).event_id for t in turns]
    items = await history(engine, org, sid)
    assert [i["kind"] for i in items] == ["genesis", "message", "message", "message"]
    assert [i["event_id"] for i in items[1:]] == ids and [i["seq"] for i in items] == [0, 1, 2, 3]
    assert [i["current"] for i in items] == [False, False, False, True] and all(i["active"] for i in items)
    assert len({i["version"] for i in items}) == 4

    await lead("RollbackContext", pb.RollbackContextRequest(session_id=sid, target_version_hash=items[1]["version"]))
    after = await history(engine, org, sid)
    assert await active_turns(engine, org, sid) == turns[:1]
    assert [i["current"] for i in after] == [False, True, False, False]
    assert [i["active"] for i in after] == [True, True, False, False]
    assert after[2]["removed_by"] == after[3]["removed_by"] is not None

    code, out = await engine.cli("history", "--org", org, "--session", "no-such-session")
    assert code == 1 and "no session 'no-such-session'" in out
    code, out = await engine.cli("history", "--org", unique("org"), "--session", sid)  # another org's
    assert code == 1


async def test_history_shows_a_compaction_and_the_turns_it_replaced(engine):
    org, sid, lead = await long_session(engine)
    await lead("Compact", pb.CompactRequest(session_id=sid, strategy="sliding_window"))
    items = await history(engine, org, sid)
    [summary] = [i for i in items if i["kind"] == "compaction"]
    assert summary["replaced"] == len(OLDER) and summary["current"] and summary["active"]
    replaced = [i for i in items if i["removed_by"] == summary["event_id"]]
    assert len(replaced) == len(OLDER) and not any(i["active"] for i in replaced)
