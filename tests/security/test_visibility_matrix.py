"""The visibility matrix: writers at every level x readers at every level x every read path.

Each writer writes one turn and one memory version into two sessions: one owned by its org (an
item in a session owned higher up) and one of its own. Then each reader tries every read path
on each of them, and what it gets must be what the written rule (tests.security.world.sees)
says: the item is returned exactly when its writer's scope is the reader's or an ancestor's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import asyncpg
import grpc
import pytest

from context_engine.scope import Scope
from tests.fixtures.settling import settled
from tests.security.world import BUDGET, found_or_absent, new_marker, scopes, sees
from upsquad.context.v1 import context_pb2 as pb

pytestmark = pytest.mark.integration

LEVELS = list(scopes())
FAMILIES = ("org_session", "own_session")
SNAPSHOT = "after-writes"


@dataclass(frozen=True)
class Written:
    writer: Scope
    session_id: str
    session_owner: Scope
    marker: str          # the turn's whole content: one term, so Search and retrieval find it
    memory_marker: str   # the memory version's content
    event_id: str
    chunk_id: str


@dataclass
class World:
    engine: object
    scopes: dict[str, Scope]
    written: dict[tuple[str, str], Written]

    def caller(self, level: str):
        s = self.scopes[level]
        return self.engine.caller(s.org_id, s.pillar_id, s.team_id, s.agent_id, clearance=4)


@pytest.fixture(scope="module")
async def world(quiet_engine) -> World:
    levels = scopes()
    w = World(quiet_engine, levels, {})
    for level, writer in levels.items():
        author = w.caller(level)
        org_writer = quiet_engine.caller(writer.org_id, clearance=4)
        for family in FAMILIES:
            session = f"{family}-{level}"
            owner = Scope(writer.org_id) if family == "org_session" else writer
            if family == "org_session":  # the org creates the session; the writer writes into it
                await org_writer("IngestEvent", pb.IngestEventRequest(
                    session_id=session, event_type="message", content=b"session opened by the org"))
            marker, memory_marker = new_marker(), new_marker()
            reply = await author("IngestEvent", pb.IngestEventRequest(
                session_id=session, event_type="message", content=marker.encode()))
            await author("PushContext", pb.PushContextRequest(
                session_id=session, memory_type="working", content=memory_marker.encode()))
            owner_caller = quiet_engine.caller(owner.org_id, owner.pillar_id, owner.team_id, owner.agent_id,
                                               clearance=4)
            await owner_caller("CreateSnapshot", pb.CreateSnapshotRequest(session_id=session, snapshot_name=SNAPSHOT))
            w.written[(level, family)] = Written(writer, session, owner, marker, memory_marker, reply.event_id, "")
    await settled(quiet_engine.settings.database_url)
    conn = await asyncpg.connect(quiet_engine.settings.database_url)
    try:
        for key, item in w.written.items():
            chunk = await conn.fetchval("SELECT chunk_id FROM chunks WHERE source_event_id = $1",
                                        uuid.UUID(item.event_id))
            assert chunk is not None, f"the turn of {key} has no chunk"
            w.written[key] = Written(**{**item.__dict__, "chunk_id": str(chunk)})
    finally:
        await conn.close()
    return w


async def search(w: World, reader: str, item: Written) -> bool:
    return await found_or_absent(w.caller(reader)("Search", pb.SearchRequest(
        query=item.marker, top_k=50, min_score=0.01)), item.marker, item.chunk_id)


async def history(w: World, reader: str, item: Written) -> bool:
    return await found_or_absent(w.caller(reader)("AssembleContext", pb.AssembleContextRequest(
        session_id=item.session_id, token_budget=BUDGET)), item.marker, item.chunk_id)


async def retrieved(w: World, reader: str, item: Written) -> bool:
    # The reader's own empty session: whatever holds the marker came from retrieval.
    return await found_or_absent(w.caller(reader)("AssembleContext", pb.AssembleContextRequest(
        session_id=f"probe-{reader}", task_description=item.marker, token_budget=BUDGET)), item.marker, item.chunk_id)


async def pinned(w: World, reader: str, item: Written) -> bool:
    return await found_or_absent(w.caller(reader)("AssembleContext", pb.AssembleContextRequest(
        session_id=f"probe-{reader}", token_budget=BUDGET, hints={"pinned_chunk_ids": item.chunk_id})),
        item.marker, item.chunk_id)


async def must_include(w: World, reader: str, item: Written) -> bool:
    return await found_or_absent(w.caller(reader)("AssembleContext", pb.AssembleContextRequest(
        session_id=item.session_id, token_budget=BUDGET, hints={"must_include": f"event:{item.event_id}"})),
        item.marker, item.chunk_id)


async def pull_latest(w: World, reader: str, item: Written) -> bool:
    return await found_or_absent(w.caller(reader)("PullContext", pb.PullContextRequest(
        session_id=item.session_id, agent_id=item.writer.agent_id)), item.memory_marker)


async def pull_snapshot(w: World, reader: str, item: Written) -> bool:
    return await found_or_absent(w.caller(reader)("PullContext", pb.PullContextRequest(
        session_id=item.session_id, agent_id=item.writer.agent_id, snapshot_name=SNAPSHOT)), item.memory_marker)


async def snapshot_lookup(w: World, reader: str, item: Written) -> bool:
    """CreateSnapshot names the session's version: the session itself must be visible."""
    name = f"by-{reader}-{uuid.uuid4().hex[:6]}"
    try:
        reply = await w.caller(reader)("CreateSnapshot", pb.CreateSnapshotRequest(
            session_id=item.session_id, snapshot_name=name))
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.NOT_FOUND, f"{err.code()}: {err.details()}"
        return False
    return bool(reply.version_hash)


async def embed_cached(w: World, reader: str, item: Written) -> bool:
    """Embed of the writer's exact text: `cached` says whether a vector of it was known, which must
    tell the reader nothing of content it does not see."""
    reply = await w.caller(reader)("Embed", pb.EmbedRequest(texts=[item.marker]))
    return reply.embeddings[0].cached


def memory_addressed(reader: Scope, writer: Scope) -> bool:
    """PullContext asks for an agent's memory: the writer's agent id, or (when that is empty) the
    reader's own. Memory a non-agent scope pushed is addressable only by non-agent readers."""
    return bool(writer.agent_id) or not reader.agent_id


# path -> (how to read, what the rule expects from (reader, written item))
PATHS = {
    "search": (search, lambda r, item: sees(r, item.writer)),
    "assemble_history": (history, lambda r, item: sees(r, item.writer)),
    "assemble_retrieved": (retrieved, lambda r, item: sees(r, item.writer)),
    "assemble_pinned": (pinned, lambda r, item: sees(r, item.writer)),
    "assemble_must_include": (must_include, lambda r, item: sees(r, item.writer)),
    "pull_latest": (pull_latest, lambda r, item: sees(r, item.writer) and memory_addressed(r, item.writer)),
    "pull_snapshot": (pull_snapshot, lambda r, item: sees(r, item.writer) and memory_addressed(r, item.writer)),
    "snapshot_lookup": (snapshot_lookup, lambda r, item: sees(r, item.session_owner)),
    "embed_cached": (embed_cached, lambda r, item: sees(r, item.writer)),
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("reader", LEVELS)
@pytest.mark.parametrize("writer", LEVELS)
@pytest.mark.parametrize("path", list(PATHS))
async def test_a_reader_gets_an_item_exactly_when_the_rule_says(world: World, path, writer, reader, family) -> None:
    read, rule = PATHS[path]
    item = world.written[(writer, family)]
    expected = rule(world.scopes[reader], item)
    assert await read(world, reader, item) == expected, (
        f"{path}: {reader} ({world.scopes[reader].path}) reading {writer}'s item "
        f"({item.writer.path}) in {item.session_id} owned by {item.session_owner.path}: "
        f"expected {'visible' if expected else 'hidden'}")


def test_the_matrix_holds_both_answers_on_every_path() -> None:
    """A matrix whose expectations were all one way would prove nothing."""
    levels = scopes()
    for path, (_, rule) in PATHS.items():
        answers = {rule(levels[r], Written(levels[w], "s", levels[w], "", "", "", ""))
                   for r in levels for w in levels}
        assert answers == {True, False}, path
