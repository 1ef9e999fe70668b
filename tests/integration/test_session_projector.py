"""The session projection against the real PostgreSQL: chain, idempotence, rollback, snapshots,
replay. Tests share one migrated database and keep apart by org id; replay gets its own."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import functools
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import numpy as np
import orjson
import pytest

from context_engine import events as events_module
from context_engine.events import (
    EVENT_INGESTED,
    MEMORY_PUSHED,
    SESSION_ROLLED_BACK,
    SNAPSHOT_CREATED,
    Event,
    session_aggregate,
)
from context_engine.hashing import chain, genesis_version, next_version, sha256_hex
from context_engine.scope import Scope
from context_engine.visibility import Visibility
from projections.projector.batch import apply_batch, load_offsets
from projections.projector.chunks import assign_vectors_recorded_by
from projections.projector.outcome import ProjectionOutcome
from projections.projector.records import LogRecord
from projections.reads import sessions as queries
from projections.store import admin as db_admin
from projections.store.pool import create_pool, init_connection
from streams.embedding_pipeline import recorded_event
from streams.jobs import job_message
from streams.vector_assigner import VectorAssigner
from tests.fixtures.databases import fresh_database
from tests.fixtures.projector_log import Log, ingest, keyed, new_org, push, rollback, scope, snapshot

APPLIED, DUPLICATE, REJECTED = ProjectionOutcome.APPLIED, ProjectionOutcome.DUPLICATE, ProjectionOutcome.REJECTED

pytestmark = pytest.mark.integration


# -- building events ------------------------------------------------------------------------


def key(org: str, session: str) -> str:
    return f"{org}/{session}"


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def db_url(postgres_url: str) -> AsyncIterator[str]:
    async with fresh_database(postgres_url, "ce_proj", migrated=True) as url:
        yield url


@pytest.fixture
async def conn(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(db_url)
    yield c
    await c.close()


async def in_org(conn: asyncpg.Connection, org: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a query function the way the API does: inside a transaction with app.org_id set."""
    async with conn.transaction():
        await conn.execute("SELECT set_config('app.org_id', $1, true)", org)
        return await fn(conn, org, *args, **kwargs)


async def counts(conn: asyncpg.Connection, org: str) -> dict[str, int]:
    out = {}
    for table in ("event_archive", "sessions", "session_items", "session_versions", "session_events",
                  "memory_versions", "snapshots"):
        out[table] = await conn.fetchval(f"SELECT count(*) FROM {table} WHERE org_id = $1", org)
    return out


async def item_versions(conn: asyncpg.Connection, org: str, session: str) -> list[tuple[int, str, bool]]:
    rows = await conn.fetch("SELECT seq, version, active FROM session_items WHERE org_id = $1 AND "
                            "session_id = $2 ORDER BY seq", org, session)
    return [(r["seq"], r["version"], r["active"]) for r in rows]


# -- tests ----------------------------------------------------------------------------------


async def test_versions_follow_the_hash_chain_in_log_order(conn: asyncpg.Connection) -> None:
    org, log = new_org(), Log()
    sessions = ["s1", "s2", "s3"]
    events = []
    for i in range(30):
        s = sessions[i % 3]
        events.append(push(org, s, f"memory {i}") if i % 5 == 4 else ingest(org, s, f"event {i} text", n=str(i)))
    records = log.append(*events)
    applied = []
    for start in range(0, len(records), 7):  # batches cut across sessions and partitions
        applied += await apply_batch(conn, records[start:start + 7])
    assert [a.outcome for a in applied] == [ProjectionOutcome.APPLIED] * 30
    assert [a.event_id for a in applied] == [e.event_id for e in events]

    for s in sessions:
        mine = [e for e in events if e.payload["session_id"] == s]
        expected = chain(key(org, s), [e.content_hash for e in mine])
        assert [a.version for a in applied if a.session_id == s] == expected[1:]
        assert await item_versions(conn, org, s) == [(n + 1, v, True) for n, v in enumerate(expected[1:])]
        session = await in_org(conn, org, queries.get_session, s)
        assert (session.version, session.seq, session.item_count, session.active_count) == (
            expected[-1], 10, 10, 10)
        assert session.genesis == expected[0] == genesis_version(key(org, s))
        versions = {r["version"] for r in await conn.fetch(
            "SELECT version FROM session_versions WHERE org_id = $1 AND session_id = $2", org, s)}
        assert versions == set(expected)
        for n, v in enumerate(expected):
            assert await in_org(conn, org, queries.session_has_version, s, v) == n
        assert await in_org(conn, org, queries.session_has_version, s, "f" * 64) is None

    # Read models carry what the handlers need to answer.
    first = events[0]
    row = await in_org(conn, org, queries.event_by_id, first.event_id)
    assert row["content_sha256"] == row.content_sha256  # handlers may read rows as mappings
    assert (row.content, row.metadata, row.token_count, row.event_type) == (b"event 0 text", {"n": "0"}, 3, "message")
    assert row.content_sha256 == sha256_hex(b"event 0 text") and row.scope_path == scope(org).path
    archived = await in_org(conn, org, queries.archived_event, first.event_id)
    assert archived.raw == first.to_bytes() and archived.decode() == first
    assert (await in_org(conn, org, queries.memory_by_event_id, events[4].event_id)).content == b"memory 4"
    assert ((archived.topic, archived.partition, archived.offset)
            == (records[0].topic, records[0].partition, records[0].offset))
    assert await in_org(conn, org, queries.applied_event_ids, [e.event_id for e in events[:3]] + [str(uuid.uuid4())]) \
        == {e.event_id for e in events[:3]}

    visible = Visibility.of(scope(org))
    latest = await in_org(conn, org, queries.latest_memory, "bot-1", "s2", visible)
    assert latest.content == b"memory 19" and latest.memory_type == "semantic" and latest.seq == 7
    assert (await in_org(conn, org, queries.latest_memory, "bot-1", None, visible)).content == b"memory 29"
    # owned below org
    assert await in_org(conn, org, queries.latest_memory, "bot-1", "s2", Visibility.of(Scope(org))) is None
    assert await in_org(conn, org, queries.latest_memory, "bot-2", "s2", visible) is None

    assert (await load_offsets(conn))[(log.topic, records[-1].partition)] == log.next[records[-1].partition] - 1


async def test_duplicate_delivery_changes_nothing(conn: asyncpg.Connection) -> None:
    org, log = new_org(), Log()
    events = [ingest(org, "s", f"e{i}") for i in range(5)] + [push(org, "s", "m")]
    records = log.append(*events)
    await apply_batch(conn, records[:4])
    await apply_batch(conn, records[2:])  # overlapping redelivery after a crash before commit
    before = (await counts(conn, org), await item_versions(conn, org, "s"),
              await in_org(conn, org, queries.get_session, "s"))
    assert before[0]["session_items"] == 6

    again = await apply_batch(conn, records)  # same offsets
    assert {a.outcome for a in again} == {ProjectionOutcome.DUPLICATE}
    moved = log.append(*events)  # same events at new offsets (e.g. a producer retry)
    assert {a.outcome for a in await apply_batch(conn, moved)} == {ProjectionOutcome.DUPLICATE}
    after = (await counts(conn, org), await item_versions(conn, org, "s"),
             await in_org(conn, org, queries.get_session, "s"))
    assert after == before
    assert before[2].version == chain(key(org, "s"), [e.content_hash for e in events])[-1]

    # Within one batch, the second copy is the duplicate.
    extra = ingest(org, "s", "e-extra")
    twice = log.append(extra, extra)
    assert [a.outcome for a in await apply_batch(conn, twice)] == [APPLIED, DUPLICATE]
    assert (await counts(conn, org))["session_items"] == 7
    offsets = await load_offsets(conn)
    assert offsets[(log.topic, twice[-1].partition)] == twice[-1].offset


async def test_positions_are_recorded_not_identity(conn: asyncpg.Connection) -> None:
    org, log = new_org(), Log()
    [first] = log.append(ingest(org, "s", "one"))
    await apply_batch(conn, [first])
    # A restored broker may hold a new event at a position an archived one had before the crash.
    other = ingest(org, "s", "another event at the same offset")
    assert [a.outcome for a in await apply_batch(
        conn, [LogRecord(first.topic, first.partition, first.offset, other.to_bytes())])] == [ProjectionOutcome.APPLIED]


def _poison(org: str) -> dict[str, bytes | Event]:
    """Records the projector cannot apply, each of a different failure: what anyone who can reach
    the topic may append."""
    nul_metadata = ingest(org, "s", "metadata with a NUL", note="a\x00b")
    no_content = Event(EVENT_INGESTED, scope(org), session_aggregate(org, "s"), "u", {"session_id": "s"})
    bad_base64 = Event(EVENT_INGESTED, scope(org), session_aggregate(org, "s"), "u",
                       {**ingest(org, "s", "x").payload, "content_b64": "%%%not base64%%%"})
    return {
        "not JSON": b"not an event",
        "random bytes": bytes(random.Random(7).randrange(256) for _ in range(300)),
        "JSON, not an event": b'{"type": "session.event_ingested"}',
        "unknown type": orjson.dumps({**ingest(org, "s", "y").to_dict(), "type": "no.such.type"}),
        "NUL in metadata": nul_metadata,
        "no content": no_content,
        "content not base64": bad_base64,
        "org id with a NUL": orjson.dumps({**ingest(org, "s", "z").to_dict(), "scope": {"org_id": "a\u0000b"}}),
        "org id a number": orjson.dumps({**ingest(org, "s", "z").to_dict(), "scope": {"org_id": 7}}),
        "org id a list": orjson.dumps({**ingest(org, "s", "z").to_dict(), "scope": {"org_id": ["x"]}}),
        "org id with a quote": orjson.dumps({**ingest(org, "s", "z").to_dict(), "scope": {"org_id": "o'brien"}}),
        "the system org": orjson.dumps({**ingest(org, "s", "z").to_dict(), "scope": {"org_id": "_system"}}),
        "event id in braces": orjson.dumps({**ingest(org, "s", "z").to_dict(),
                                           "event_id": "{" + str(uuid.uuid4()) + "}"}),
        "event id as a URN": orjson.dumps({**ingest(org, "s", "z").to_dict(), "event_id": uuid.uuid4().urn}),
    }


async def test_a_record_that_cannot_be_applied_is_set_aside_and_takes_nothing_with_it(
        conn: asyncpg.Connection) -> None:
    """Every poison record in the middle of a batch of two orgs' valid events: each is set aside
    (rejected_events, outcome REJECTED), every other event of the batch is applied, and the
    offsets move past all of them."""
    victim, attacker, log = new_org(), new_org(), Log()
    for what, poison in _poison(attacker).items():
        before = await counts(conn, victim)
        valid = [ingest(victim, "v", f"before {what}"), ingest(attacker, "s", f"attacker's own {what}"),
                 ingest(victim, "v", f"after {what}")]
        records = log.append(valid[0], valid[1]) + log.append(poison, aggregate=session_aggregate(attacker, "s")) \
            + log.append(valid[2])
        applied = await apply_batch(conn, records)
        assert [a.outcome for a in applied] == [
            APPLIED, APPLIED, REJECTED, APPLIED], what
        after = await counts(conn, victim)
        assert after["session_events"] == before["session_events"] + 2, what
        rejected = await conn.fetchrow("SELECT org_id, event_id, reason, raw, topic, partition, \"offset\" "
                                       "FROM rejected_events WHERE record_sha256 = $1",
                                       sha256_hex(records[2].raw))
        assert rejected is not None and rejected["raw"] == records[2].raw, what
        assert (rejected["topic"], rejected["partition"], rejected["offset"]) == \
            (records[2].topic, records[2].partition, records[2].offset)
        if isinstance(poison, Event):  # it names its org and id: its command gets REJECTED
            assert (rejected["org_id"], str(rejected["event_id"])) == (attacker, poison.event_id)
            assert applied[2].event_id == poison.event_id
            assert not await conn.fetchval("SELECT count(*) FROM event_archive WHERE event_id = $1",
                                           uuid.UUID(poison.event_id))
        offsets = await load_offsets(conn)
        assert offsets[(log.topic, records[-1].partition)] >= records[-1].offset
        # Redelivered: rejected again, nothing doubles.
        again = await apply_batch(conn, records)
        assert [a.outcome for a in again] == [
            DUPLICATE, DUPLICATE, REJECTED, DUPLICATE], what
        assert await counts(conn, victim) == after
    assert await conn.fetchval("SELECT count(*) FROM session_events WHERE org_id = $1", attacker) \
        == len(_poison(attacker))


async def test_json_nested_deeper_than_a_parser_goes_is_indexed_as_text(conn: asyncpg.Connection) -> None:
    """Content starting with "[" is read as JSON; nested thousands deep, json.loads or the walk of
    its leaves gives up with a RecursionError, which stalled the partition. Now it is text, inline
    and deferred alike."""
    from projections.projector import deferred_indexing

    org, log = new_org(), Log()
    deep = [b"[" * n + b"]" * n for n in (2_000, 40_000)]  # 4 KB inline; 80 KB after the commit
    events = []
    for content in deep:
        ev = ingest(org, "s", "x")
        events.append(Event(ev.type, ev.scope, ev.aggregate, ev.actor,
                            {**ev.payload, "content_b64": base64.b64encode(content).decode(),
                             "content_sha256": sha256_hex(content)}))
    assert [a.outcome for a in await apply_batch(conn, log.append(*events))] == [APPLIED, APPLIED]
    await deferred_indexing.index_requested(conn, org, events[1].event_id)
    sources = await in_org(conn, org, lambda c, o: c.fetch(
        "SELECT source_event_id, count(*) AS n, min(content) AS first FROM chunks WHERE org_id = $1 "
        "GROUP BY source_event_id", o))
    assert {str(r["source_event_id"]) for r in sources} == {e.event_id for e in events}
    assert all(r["first"].startswith("[[[") for r in sources)


async def test_content_with_nul_and_binary_bytes_is_stored_verbatim(conn: asyncpg.Connection) -> None:
    org, log = new_org(), Log()
    contents = [b"a\x00b\x00c", bytes(range(256)), "naïve \x07 bell".encode()]
    events = []
    for c in contents:
        ev = ingest(org, "s", "x")
        events.append(Event(ev.type, ev.scope, ev.aggregate, ev.actor,
                            {**ev.payload, "content_b64": base64.b64encode(c).decode(),
                             "content_sha256": sha256_hex(c)}))
    assert [a.outcome for a in await apply_batch(conn, log.append(*events))] == [ProjectionOutcome.APPLIED] * 3
    rows = await conn.fetch("SELECT e.content, array_agg(c.content) FILTER (WHERE c.content IS NOT NULL) AS chunks "
                            "FROM session_events e LEFT JOIN chunks c "
                            "ON c.org_id = e.org_id AND c.source_event_id = e.event_id "
                            "WHERE e.org_id = $1 GROUP BY e.event_id, e.seq ORDER BY e.seq", org)
    assert [r["content"] for r in rows] == contents
    assert [r["chunks"] for r in rows] == [["a b c"], None, ["naïve   bell"]]


async def test_a_batch_of_several_orgs_with_quotes_in_its_names_is_written_and_announced(
        conn: asyncpg.Connection, db_url: str) -> None:
    """The batch's offsets, org settings and NOTIFYs are sent as literals: quotes must not matter."""
    orgs = [new_org(), new_org()]  # an org id cannot hold a quote (the validator), a topic can
    topic = f"it's-{uuid.uuid4().hex[:6]}"
    events = [ingest(orgs[0], "s", "first"), ingest(orgs[1], "s", "second"), ingest(orgs[0], "s", "third")]
    records = [LogRecord(topic, 0, 7, events[0].to_bytes()), LogRecord(topic, 1, 3, events[1].to_bytes()),
               LogRecord(topic, 0, 8, events[2].to_bytes())]
    heard: list[str] = []
    listener = await asyncpg.connect(db_url)
    await listener.add_listener("projected'channel", lambda *args: heard.append(args[3]))
    try:
        applied = await apply_batch(conn, records, notify=lambda done: (
            "projected'channel", [",".join(f"{a.event_id}'{a.outcome}" for a in done)]))
        for _ in range(100):
            if heard:
                break
            await asyncio.sleep(0.02)
    finally:
        await listener.close()
    assert [a.outcome for a in applied] == [ProjectionOutcome.APPLIED] * 3
    assert heard == [",".join(f"{e.event_id}'{ProjectionOutcome.APPLIED}" for e in events)]
    assert [(await counts(conn, o))["session_items"] for o in orgs] == [2, 1]
    offsets = await load_offsets(conn)
    assert (offsets[(topic, 0)], offsets[(topic, 1)]) == (8, 3)
    assert not conn.is_in_transaction()


async def test_a_batch_inside_the_callers_transaction_commits_and_rolls_back_with_it(
        conn: asyncpg.Connection) -> None:
    org, log = new_org(), Log()
    with pytest.raises(RuntimeError, match="caller gives up"):
        async with conn.transaction():
            applied = await apply_batch(conn, log.append(ingest(org, "s", "one")))
            assert [a.outcome for a in applied] == [ProjectionOutcome.APPLIED]
            assert conn.is_in_transaction()  # the batch did not commit the caller's transaction
            raise RuntimeError("caller gives up")
    assert (await counts(conn, org))["event_archive"] == 0
    async with conn.transaction():
        await apply_batch(conn, log.append(ingest(org, "s", "two")))
    assert (await counts(conn, org))["session_items"] == 1


async def test_other_event_types_are_archived_and_ignored(conn: asyncpg.Connection,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(events_module.CURRENT_VERSIONS, "share.granted", 1)
    org, log = new_org(), Log()
    share = Event("share.granted", scope(org), f"share/{org}/x", "u", {"share_id": "x"})
    [a] = await apply_batch(conn, log.append(share))
    assert a.outcome == ProjectionOutcome.IGNORED
    assert (await counts(conn, org)) == {**dict.fromkeys(_DUMP, 0), "event_archive": 1}


async def test_an_older_schema_version_is_upcast_and_archived_verbatim(conn: asyncpg.Connection) -> None:
    org, log = new_org(), Log()
    content = b"from a v1 producer"
    v1 = {"event_id": str(uuid.uuid4()), "type": EVENT_INGESTED, "schema_version": 1,
          "scope": {"org_id": org, "pillar_id": "", "team_id": "", "agent_id": ""},
          "aggregate": session_aggregate(org, "s"), "occurred_at": "2026-01-02T03:04:05.000000Z",
          "actor": "old", "payload": {"session_id": "s", "kind": "tool_output",
                                      "content_b64": base64.b64encode(content).decode(),
                                      "content_sha256": sha256_hex(content), "token_count": 4}}
    v1["content_hash"] = sha256_hex(orjson.dumps(v1["payload"], option=orjson.OPT_SORT_KEYS))
    raw = orjson.dumps(v1, option=orjson.OPT_SORT_KEYS)
    [applied] = await apply_batch(conn, log.append(raw))
    assert applied.version == next_version(genesis_version(key(org, "s")), v1["content_hash"])
    row = await in_org(conn, org, queries.event_by_id, v1["event_id"])
    assert (row.event_type, row.metadata, row.content) == ("tool_output", {}, content)
    assert (await in_org(conn, org, queries.archived_event, v1["event_id"])).raw == raw


async def test_rollback_deactivates_later_items_and_chains_from_the_target(conn: asyncpg.Connection) -> None:
    org, log = new_org(), Log()
    events = [ingest(org, "s", f"e{i}") for i in range(1, 4)] + [push(org, "s", "m4"), ingest(org, "s", "e5")]
    v = chain(key(org, "s"), [e.content_hash for e in events])  # v[0] .. v[5]
    await apply_batch(conn, log.append(*events))
    visible = Visibility.of(scope(org))
    assert (await in_org(conn, org, queries.latest_memory, "bot-1", "s", visible)).content == b"m4"

    back = rollback(org, "s", v[2])
    [r] = await apply_batch(conn, log.append(back))
    assert (r.outcome, r.version, r.seq) == (ProjectionOutcome.APPLIED, v[2], 2)
    items = await in_org(conn, org, queries.session_items, "s")
    assert [(i.seq, i.active, i.rolled_back_by) for i in items] == [
        (1, True, None), (2, True, None),
        (3, False, back.event_id), (4, False, back.event_id), (5, False, back.event_id)]
    assert [i.seq for i in await in_org(conn, org, queries.session_items, "s", active_only=True)] == [1, 2]
    assert not (await in_org(conn, org, queries.event_by_id, events[2].event_id)).active
    assert await in_org(conn, org, queries.latest_memory, "bot-1", "s", visible) is None
    session = await in_org(conn, org, queries.get_session, "s")
    assert ((session.version, session.seq, session.active_count, session.item_count, session.max_seq)
            == (v[2], 2, 2, 5, 5))

    # The next item chains from the target, with a fresh seq; the rolled-back items stay.
    e6, e7 = ingest(org, "s", "e6"), ingest(org, "s", "e7")
    a6, a7 = await apply_batch(conn, log.append(e6, e7))
    assert (a6.seq, a6.version) == (6, next_version(v[2], e6.content_hash))
    assert a7.version == chain(key(org, "s"), [events[0].content_hash, events[1].content_hash,
                                                e6.content_hash, e7.content_hash])[-1]
    assert [(i.seq, i.prev_seq) for i in await in_org(conn, org, queries.session_items, "s", active_only=True)] \
        == [(1, 0), (2, 1), (6, 2), (7, 6)]

    # Rolling back to a version that was itself rolled back restores exactly its state.
    [r] = await apply_batch(conn, log.append(rollback(org, "s", v[4])))
    assert (r.outcome, r.version) == (ProjectionOutcome.APPLIED, v[4])
    assert [i.seq for i in await in_org(conn, org, queries.session_items, "s", active_only=True)] == [1, 2, 3, 4]
    assert (await in_org(conn, org, queries.latest_memory, "bot-1", "s", visible)).content == b"m4"
    assert (await in_org(conn, org, queries.get_session, "s")).active_count == 4

    # Back to genesis, and rollback + append inside one batch.
    e8 = ingest(org, "s", "e8")
    results = await apply_batch(conn, log.append(rollback(org, "s", v[0]), e8))
    assert results[1].version == next_version(v[0], e8.content_hash)
    assert [i.seq for i in await in_org(conn, org, queries.session_items, "s", active_only=True)] == [8]
    assert (await in_org(conn, org, queries.session_has_version, "s", results[1].version)) == 8


async def test_a_rollback_from_any_scope_but_the_owner_changes_nothing(conn: asyncpg.Connection) -> None:
    """The rule of visibility.may_rewrite holds in the projector too, for events already on the log."""
    org, log = new_org(), Log()
    owner = Scope(org, "pillar")
    first = Event(EVENT_INGESTED, owner, session_aggregate(org, "s"), "u", ingest(org, "s", "a").payload)
    second = Event(EVENT_INGESTED, owner, session_aggregate(org, "s"), "u", ingest(org, "s", "b").payload)
    [a, _] = await apply_batch(conn, log.append(first, second))
    before = (await item_versions(conn, org, "s"), await in_org(conn, org, queries.get_session, "s"))
    below, sibling, above = Scope(org, "pillar", "team"), Scope(org, "other"), Scope(org)
    results = await apply_batch(conn, log.append(*(
        Event(SESSION_ROLLED_BACK, at, session_aggregate(org, "s"), "admin-1",
              {"session_id": "s", "target_version": a.version}) for at in (below, sibling, above))))
    assert [r.outcome for r in results] == [ProjectionOutcome.OUT_OF_SCOPE] * 3
    assert (await item_versions(conn, org, "s"), await in_org(conn, org, queries.get_session, "s")) == before
    [done] = await apply_batch(conn, log.append(Event(SESSION_ROLLED_BACK, owner, session_aggregate(org, "s"),
                                                      "admin-1", {"session_id": "s", "target_version": a.version})))
    assert (done.outcome, done.version) == (ProjectionOutcome.APPLIED, a.version)


async def test_rollback_to_an_unknown_target_changes_nothing(conn: asyncpg.Connection) -> None:
    org, log = new_org(), Log()
    await apply_batch(conn, log.append(ingest(org, "s", "a"), ingest(org, "s", "b")))
    before = (await counts(conn, org), await item_versions(conn, org, "s"),
              await in_org(conn, org, queries.get_session, "s"))
    other_session_version = chain(key(org, "other"), [ingest(org, "other", "x").content_hash])[1]
    results = await apply_batch(conn, log.append(
        rollback(org, "s", "0" * 64), rollback(org, "s", other_session_version),
        rollback(org, "never-seen", "1" * 64)))
    assert [r.outcome for r in results] == [ProjectionOutcome.UNKNOWN_TARGET] * 3
    after = (await counts(conn, org), await item_versions(conn, org, "s"),
             await in_org(conn, org, queries.get_session, "s"))
    assert after[1:] == before[1:]
    assert after[0] == {**before[0], "event_archive": before[0]["event_archive"] + 3}


async def test_snapshot_name_collision_keeps_the_first(conn: asyncpg.Connection) -> None:
    org, log = new_org(), Log()
    e1, m2 = ingest(org, "s", "one"), push(org, "s", "memory two")
    await apply_batch(conn, log.append(e1, m2))
    v = chain(key(org, "s"), [e1.content_hash, m2.content_hash])
    first, second = snapshot(org, "s", "before-deploy"), snapshot(org, "s", "before-deploy")
    e3 = ingest(org, "s", "three")
    results = await apply_batch(conn, log.append(first, e3, second, snapshot(org, "other", "before-deploy")))
    assert [r.outcome for r in results] == [
        APPLIED, APPLIED, ProjectionOutcome.SNAPSHOT_NAME_TAKEN, APPLIED]

    snap = await in_org(conn, org, queries.snapshot_by_name, "s", "before-deploy", Visibility.of(scope(org)))
    assert snap.snapshot_id == first.payload["snapshot_id"] and snap.version == v[2] and results[0].version == v[2]
    assert snap.state == {"version": v[2], "seq": 2, "items": [
        {"seq": 1, "event_id": e1.event_id, "kind": "event", "content_hash": e1.content_hash, "version": v[1]},
        {"seq": 2, "event_id": m2.event_id, "kind": "memory", "content_hash": m2.content_hash, "version": v[2]}]}
    assert snap.created_by == "lead-1"
    assert await in_org(conn, org, queries.snapshot_by_id, second.payload["snapshot_id"]) is None
    assert (await in_org(conn, org, queries.snapshot_by_id, first.payload["snapshot_id"])) == snap
    # A session without items snapshots its genesis state.
    empty = await in_org(conn, org, queries.snapshot_by_name, "other", "before-deploy", Visibility.of(scope(org)))
    assert (empty.version, empty.state["items"]) == (genesis_version(key(org, "other")), [])

    # The snapshot's memory survives a later rollback and a newer push.
    visible = Visibility.of(scope(org))
    await apply_batch(conn, log.append(rollback(org, "s", v[0]), push(org, "s", "memory later")))
    assert (await in_org(conn, org, queries.latest_memory, "bot-1", "s", visible)).content == b"memory later"
    old = await in_org(conn, org, queries.snapshot_memory, snap, "bot-1", visible)
    assert old.content == b"memory two" and not old.active
    assert await in_org(conn, org, queries.snapshot_by_name, "s", "no-such", visible) is None


async def test_memory_outside_a_session_has_no_chain(conn: asyncpg.Connection) -> None:
    org, log = new_org(), Log()
    [a] = await apply_batch(conn, log.append(push(org, "", "standalone", agent="bot-9")))
    assert (a.outcome, a.session_id, a.version) == (ProjectionOutcome.APPLIED, None, None)
    assert (await counts(conn, org))["session_items"] == 0
    got = await in_org(conn, org, queries.latest_memory, "bot-9", None,
                       Visibility.of(scope(org, "bot-9")))
    assert got.content == b"standalone" and got.session_id is None


async def test_a_worker_role_subject_to_rls_projects_the_same(conn: asyncpg.Connection, db_url: str) -> None:
    """apply_batch sets app.org_id per org: it must not depend on bypassing RLS."""
    role = "ce_test_rls_worker"
    await db_admin.ensure_role(conn, role, login=False)
    await conn.execute(f"GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO {role}")
    orgs, log = [new_org(), new_org()], Log()
    events = [ingest(o, "s", f"{o} {i}") for i in range(3) for o in orgs] + [rollback(orgs[0], "s", "0" * 64)]
    worker = await asyncpg.connect(db_url)
    try:
        await worker.execute(f"SET ROLE {role}")
        assert not await worker.fetchval("SELECT rolbypassrls OR rolsuper FROM pg_roles WHERE rolname = current_user")
        results = await apply_batch(worker, log.append(*events))
        assert [r.outcome for r in results] == [ProjectionOutcome.APPLIED] * 6 + [ProjectionOutcome.UNKNOWN_TARGET]
        assert await load_offsets(worker)
    finally:
        await worker.close()
    for o in orgs:
        mine = [e.content_hash for e in events if e.scope.org_id == o and e.type == EVENT_INGESTED]
        assert (await in_org(conn, o, queries.get_session, "s")).version == chain(key(o, "s"), mine)[-1]


async def test_an_idempotency_key_belongs_to_its_writer(conn: asyncpg.Connection) -> None:
    """Two teams writing into their org's session with the same key write two events; each one's
    retry is answered with its own."""
    org, log = new_org(), Log()
    emea, apac = Scope(org, "pillar", "emea"), Scope(org, "pillar", "apac")
    opened = keyed(org, "s", "opened", "", at=Scope(org))
    mine, theirs = keyed(org, "s", "x", "k-1", at=emea), keyed(org, "s", "x", "k-1", at=apac)
    retry = keyed(org, "s", "x", "k-1", at=emea)
    results = await apply_batch(conn, log.append(opened, mine, theirs, retry))
    assert [r.outcome for r in results] == [
        APPLIED, APPLIED, APPLIED, ProjectionOutcome.IDEMPOTENCY_KEY_TAKEN]
    for writer, event in ((emea, mine), (apac, theirs)):
        found = await in_org(conn, org, queries.event_by_idempotency_key, "k-1", "s", writer.path)
        assert found.event_id == event.event_id


async def test_an_idempotency_key_is_projected_once_per_session(conn: asyncpg.Connection) -> None:
    org, log = new_org(), Log()
    first, retry, later = keyed(org, "s", "x", "k-1"), keyed(org, "s", "x", "k-1"), keyed(org, "s", "x", "k-1")
    fresh = keyed(org, "s", "z", "k-2")
    results = await apply_batch(conn, log.append(first, retry))
    results += await apply_batch(conn, log.append(later, fresh))
    assert [r.outcome for r in results] == [
        APPLIED, ProjectionOutcome.IDEMPOTENCY_KEY_TAKEN, ProjectionOutcome.IDEMPOTENCY_KEY_TAKEN, APPLIED]
    won = await in_org(conn, org, queries.event_by_idempotency_key, "k-1", "s")
    assert won.event_id == first.event_id and won["token_count"] == 1
    # Per session: another session's history cannot decide (it may sit in another partition).
    [other] = await apply_batch(conn, log.append(keyed(org, "s2", "y", "k-1")))
    assert other.outcome == ProjectionOutcome.APPLIED
    assert (await in_org(conn, org, queries.event_by_idempotency_key, "k-1", "s2")).event_id == other.event_id
    assert (await in_org(conn, org, queries.event_by_idempotency_key, "k-1")).event_id == first.event_id
    assert await in_org(conn, org, queries.event_by_id, retry.event_id) is None  # archived, not projected
    assert await in_org(conn, org, queries.archived_event, retry.event_id) is not None
    assert (await in_org(conn, org, queries.get_session, "s")).version == chain(
        key(org, "s"), [first.content_hash, fresh.content_hash])[-1]
    # Another org has its own keys.
    org_b = new_org()
    [b] = await apply_batch(conn, log.append(keyed(org_b, "s", "x", "k-1")))
    assert b.outcome == ProjectionOutcome.APPLIED


async def test_only_the_owner_scope_and_below_change_a_session(conn: asyncpg.Connection) -> None:
    org, log = new_org(), Log()
    team = Scope(org, "pillar", "team")
    owner_first = keyed(org, "s", "created by the team", "", at=team)
    below = ingest(org, "s", "from an agent of that team")  # scope(org) = pillar/team/bot-1
    sibling = keyed(org, "s", "from another team", "", at=Scope(org, "pillar", "other-team"))
    above = keyed(org, "s", "from the pillar", "", at=Scope(org, "pillar"))
    sibling_push = Event(MEMORY_PUSHED, Scope(org, "pillar", "other-team", "bot-2"), session_aggregate(org, "s"),
                         "u", {**push(org, "s", "m").payload, "agent_id": "bot-2"})
    sibling_snap = Event(SNAPSHOT_CREATED, Scope(org, "pillar", "other-team"), session_aggregate(org, "s"), "u",
                         {"session_id": "s", "snapshot_id": str(uuid.uuid4()), "name": "n"})
    genesis = genesis_version(key(org, "s"))
    sibling_back = Event(SESSION_ROLLED_BACK, Scope(org, "pillar", "other-team"), session_aggregate(org, "s"),
                         "u", {"session_id": "s", "target_version": genesis})
    results = await apply_batch(conn, log.append(owner_first, below, sibling, above, sibling_push,
                                                 sibling_snap, sibling_back))
    assert [r.outcome for r in results] == [APPLIED, APPLIED] + [ProjectionOutcome.OUT_OF_SCOPE] * 5
    session = await in_org(conn, org, queries.get_session, "s")
    assert session.scope_path == team.path and session.item_count == 2
    assert session.version == chain(key(org, "s"), [owner_first.content_hash, below.content_hash])[-1]
    assert await in_org(conn, org, queries.memory_by_event_id, sibling_push.event_id) is None
    assert await in_org(conn, org, queries.snapshot_by_name, "s", "n", Visibility.of(scope(org))) is None
    assert (await counts(conn, org))["event_archive"] == 7  # every event is archived regardless


# -- replay ---------------------------------------------------------------------------------


def _random_log(orgs: list[str], n: int, seed: int) -> Log:
    rng, log = random.Random(seed), Log()
    seen: dict[tuple[str, str], list[str]] = {}
    sent: list[Event] = []
    for i in range(n):
        org, s = rng.choice(orgs), f"s{rng.randrange(6)}"
        roll = rng.random()
        versions = seen.get((org, s), [])
        if roll < 0.06 and versions:
            target = rng.choice(versions)
            ev = rollback(org, s, target)
            versions.append(target)  # the state version is the target again
        elif roll < 0.10:
            ev = snapshot(org, s, f"snap-{rng.randrange(4)}")
        elif roll < 0.30:
            ev = push(org, s, f"memory {i}", memory_type=rng.choice(["episodic", "semantic", "working"]))
        elif roll < 0.33:  # a racing sibling scope, or a retried idempotency key: not projected
            ev = keyed(org, s, f"keyed {i}", f"k{rng.randrange(8)}",
                       at=Scope(org, "pillar", "other") if roll < 0.31 else None)
        else:
            ev = ingest(org, s, f"event {i} " + "word " * rng.randrange(5), i=str(i))
        if roll >= 0.10 and ev.scope.team_id == "team":  # the version this append produces: a later rollback target
            versions.append(next_version(versions[-1] if versions else genesis_version(key(org, s)), ev.content_hash))
            seen[(org, s)] = versions
        log.append(ev)
        sent.append(ev)
        if rng.random() < 0.05:  # a redelivery at a new offset
            log.append(rng.choice(sent))
    return log


_DUMP = {
    "sessions": "SELECT org_id, session_id, scope_path, genesis, version, seq, max_seq, item_count, active_count, "
                "created_at, updated_at, last_event_id FROM sessions ORDER BY 1, 2",
    "session_items": "SELECT org_id, session_id, seq, event_id, kind, content_hash, prev_seq, version, active, "
                     "rolled_back_by, occurred_at FROM session_items ORDER BY 1, 2, 3",
    "session_versions": "SELECT * FROM session_versions ORDER BY 1, 2, 3",
    "session_events": "SELECT * FROM session_events ORDER BY event_id",
    "memory_versions": "SELECT * FROM memory_versions ORDER BY event_id",
    "snapshots": "SELECT * FROM snapshots ORDER BY snapshot_id",
    "event_archive": "SELECT event_id, org_id, topic, partition, \"offset\", aggregate, type, schema_version, "
                     "occurred_at, actor, content_hash, raw FROM event_archive ORDER BY event_id",
}


async def _dump(conn: asyncpg.Connection) -> dict[str, list[tuple[Any, ...]]]:
    return {table: [tuple(r.values()) for r in await conn.fetch(sql)] for table, sql in _DUMP.items()}


async def test_replay_of_the_archive_into_a_fresh_database_is_identical(postgres_url: str) -> None:
    orgs = [new_org(), new_org()]
    log = _random_log(orgs, 600, seed=7)
    async with contextlib.AsyncExitStack() as databases:
        live_url = await databases.enter_async_context(fresh_database(postgres_url, "ce_live", migrated=True))
        live = await asyncpg.connect(live_url)
        try:
            rng = random.Random(1)
            records, i = log.records, 0
            while i < len(records):  # live: small, uneven batches, as the agent takes them
                step = rng.randrange(1, 40)
                await apply_batch(live, records[i:i + step])
                i += step
            want = await _dump(live)
            archived = [LogRecord(r["topic"], r["partition"], r["offset"], bytes(r["raw"])) for r in await live.fetch(
                'SELECT topic, partition, "offset", raw FROM event_archive ORDER BY archive_seq')]
        finally:
            await live.close()
        assert len(archived) == len({orjson.loads(r.raw)["event_id"] for r in log.records})
        assert len(want["snapshots"]) > 0 and any(not row[8] for row in want["session_items"])  # rollbacks happened

        replay_url = await databases.enter_async_context(fresh_database(postgres_url, "ce_replay", migrated=True))
        fresh = await asyncpg.connect(replay_url)
        try:
            for start in range(0, len(archived), 500):  # replay: big batches, partition by partition
                await apply_batch(fresh, archived[start:start + 500])
            got = await _dump(fresh)
        finally:
            await fresh.close()
        assert {t: len(rows) for t, rows in got.items()} == {t: len(rows) for t, rows in want.items()}
        assert got == want


async def test_identical_content_is_embedded_once(conn: asyncpg.Connection) -> None:
    """A chunk asks for an embedding only when no vector is recorded for its content: a later
    chunk with that content is written with the recorded vector, and a vector recorded later in
    the same batch answers the job before it is asked."""
    await init_connection(conn)  # pgvector's codec, as the worker's pool has it
    org, log = new_org(), Log()
    vector = np.linspace(-1, 1, 384, dtype=np.float32)

    def jobs(applied) -> dict[str, list[str]]:
        return {a.event_id: [kind for kind, _ in map(job_message, a.jobs)] for a in applied}

    first = ingest(org, "s1", "the same words")
    assert jobs(await apply_batch(conn, log.append(first))) == {first.event_id: ["embedding"]}
    recorded = recorded_event(org, "model-x", [(sha256_hex(b"the same words"), vector)])
    again, other = ingest(org, "s2", "the same words"), ingest(org, "s3", "other words")
    assert jobs(await apply_batch(conn, log.append(recorded, again, other))) == {
        recorded.event_id: [], again.event_id: [], other.event_id: ["embedding"]}
    # The chunk written before the vector was recorded gets it after the commit, as the worker's
    # VectorAssigner does; the one written after took it on insert.
    assert await in_org(conn, org, assign_vectors_recorded_by, recorded.event_id) == 1
    late = ingest(org, "s4", "words recorded in the same batch")
    answer = recorded_event(org, "model-x", [(sha256_hex(b"words recorded in the same batch"), vector)])
    assert jobs(await apply_batch(conn, log.append(late, answer))) == {late.event_id: [], answer.event_id: []}
    assert await in_org(conn, org, assign_vectors_recorded_by, answer.event_id) == 0  # written with it

    async with conn.transaction():
        await conn.execute("SELECT set_config('app.org_id', $1, true)", org)
        rows = await conn.fetch("SELECT content, embedding_model, embedding IS NOT NULL AS has FROM chunks "
                                "WHERE org_id = $1 ORDER BY content", org)
    assert [tuple(r) for r in rows] == [
        ("other words", None, False), ("the same words", "model-x", True), ("the same words", "model-x", True),
        ("words recorded in the same batch", "model-x", True)]


async def test_the_vector_assigner_gives_way_to_a_locked_chunk(conn: asyncpg.Connection, db_url: str) -> None:
    """The worker's VectorAssigner never holds up the projector: a chunk another transaction has
    locked (say, a rollback in progress) makes it give up after its lock timeout, leaving the
    chunk to the backlog sweep; once the lock is gone it assigns."""
    await init_connection(conn)
    org, log = new_org(), Log()
    turn = ingest(org, "s", "a locked turn")
    await apply_batch(conn, log.append(turn))
    recorded = recorded_event(org, "model-x", [(sha256_hex(b"a locked turn"), np.ones(384, dtype=np.float32))])
    await apply_batch(conn, log.append(recorded))
    pool = await create_pool(db_url, org_scoped=False, min_size=1, max_size=2)
    assigner = VectorAssigner(pool, lock_timeout_ms=50, attempts=2, retry_after_s=0.01)
    try:
        async with conn.transaction():
            await conn.execute("SELECT set_config('app.org_id', $1, true)", org)
            await conn.execute("SELECT 1 FROM chunks WHERE org_id = $1 FOR UPDATE", org)
            assert await asyncio.wait_for(assigner.assign(org, recorded.event_id), timeout=5) == 0
        # The note the projector left stays until the vectors are assigned: a worker starting
        # again resumes it.
        restarted = VectorAssigner(pool)
        assert await restarted.resume() == 1
        assert await restarted.assign(org, recorded.event_id) == 1
        assert await restarted.resume() == 0
        assert await restarted.assign(org, recorded.event_id) == 0  # already there: nothing rewritten
    finally:
        await pool.close()


async def test_vector_assignment_order_does_not_matter(conn: asyncpg.Connection) -> None:
    """With two models' vectors recorded for one content, a chunk ends with the latest recorded,
    whichever event the assigner takes first: what a chunk written afterwards takes and what a
    replay assigns."""
    await init_connection(conn)
    org, log = new_org(), Log()
    await apply_batch(conn, log.append(ingest(org, "s", "one content, two models")))
    content = sha256_hex(b"one content, two models")
    older = recorded_event(org, "model-a", [(content, np.full(384, 0.1, dtype=np.float32))])
    await asyncio.sleep(0.01)
    newer = recorded_event(org, "model-b", [(content, np.full(384, 0.2, dtype=np.float32))])
    await apply_batch(conn, log.append(older, newer))
    assert await in_org(conn, org, assign_vectors_recorded_by, newer.event_id) == 1
    assert await in_org(conn, org, assign_vectors_recorded_by, older.event_id) == 0  # not the latest
    await apply_batch(conn, log.append(ingest(org, "s2", "one content, two models")))
    async with conn.transaction():
        await conn.execute("SELECT set_config('app.org_id', $1, true)", org)
        assert [r["embedding_model"] for r in await conn.fetch(
            "SELECT embedding_model FROM chunks WHERE org_id = $1", org)] == ["model-b", "model-b"]


_RETRIEVAL_DUMP = {
    "chunks": "SELECT chunk_id, scope_path, source_event_id, source_kind, session_id, chunk_index, domain, content, "
              "content_hash, token_count, term_count, metadata, created_at, active, pii_status, searchable "
              "FROM chunks WHERE org_id = $1 ORDER BY chunk_id",
    "chunk_terms": "SELECT term, chunk_id, tf, doc_length, scope_path, domain, searchable, impact FROM chunk_terms "
                   "WHERE org_id = $1 ORDER BY chunk_id, term",
    "corpus_stats": "SELECT scope_path, domain, n_docs, total_length, token_total FROM corpus_stats "
                    "WHERE org_id = $1 ORDER BY 1, 2",
    "term_stats": "SELECT scope_path, domain, term, df FROM term_stats WHERE org_id = $1 ORDER BY 1, 2, 3",
}


async def _retrieval_rows(conn: asyncpg.Connection, org: str) -> dict[str, list[tuple[Any, ...]]]:
    return await in_org(conn, org, lambda c, o: _dump_retrieval(c, o))


async def _dump_retrieval(conn: asyncpg.Connection, org: str) -> dict[str, list[tuple[Any, ...]]]:
    return {t: [tuple(r.values()) for r in await conn.fetch(sql, org)] for t, sql in _RETRIEVAL_DUMP.items()}


def _scrubbed(pushed: Event, content: bytes, status: str = "clear") -> Event:
    return Event(events_module.MEMORY_SCRUBBED, pushed.scope, pushed.aggregate, "pii-scanner", {
        "memory_event_id": pushed.event_id, "content_b64": base64.b64encode(content).decode(), "status": status,
        "spans_by_class": {}, "detector_version": "test", "fallback_reason": ""})


async def test_a_long_content_is_indexed_after_the_commit_as_a_replay_indexes_it_in_place(
        conn: asyncpg.Connection, postgres_url: str) -> None:
    """Live, the projector only asks for the chunks of a content over INLINE_INDEX_BYTES and the
    indexer writes them after the commit, with the source's state at that moment (here: rolled
    back in between, and a memory scanned twice); a bulk replay writes them in place. Both end in
    the same chunks, postings and statistics."""
    from projections.projector import deferred_indexing
    from projections.projector.chunks import INLINE_INDEX_BYTES, BulkLoad, recount_statistics

    org, log = new_org(), Log()
    words = "harbour lamp keeper boats tide village rain morning water grey".split()
    rng = random.Random(5)

    def long_text(n: int) -> str:
        return " ".join(rng.choice(words) + (". " if rng.random() < 0.1 else "") for _ in range(n))

    short = ingest(org, "s", "a short turn stays in the projector's transaction")
    first = ingest(org, "s", long_text(20_000))
    kept = ingest(org, "s", long_text(15_000))
    later = ingest(org, "s", long_text(12_000))
    pushed = push(org, "s", "x", memory_type="semantic")
    assert all(len(base64.b64decode(e.payload["content_b64"])) > INLINE_INDEX_BYTES for e in (first, kept, later))
    applied = await apply_batch(conn, log.append(short, first, kept, later, pushed))
    jobs = {a.event_id: [kind for kind, _ in map(job_message, a.jobs)] for a in applied}
    assert jobs[short.event_id] == ["embedding"] and jobs[first.event_id] == ["indexing"]
    rows = await _retrieval_rows(conn, org)
    assert {r[2] for r in rows["chunks"]} == {uuid.UUID(short.event_id)}  # only the short one so far
    version_after_kept = await conn.fetchval(
        "SELECT version FROM session_items WHERE org_id = $1 AND event_id = $2", org, uuid.UUID(kept.event_id))
    scans = [_scrubbed(pushed, long_text(14_000).encode()), _scrubbed(pushed, long_text(16_000).encode())]
    await apply_batch(conn, log.append(rollback(org, "s", version_after_kept), scans[0]))
    await apply_batch(conn, log.append(scans[1]))  # a rescan replaces the first scan's request

    assert await deferred_indexing.pending_count(conn, [org]) == 4
    for source in (first, kept, later, pushed):
        await deferred_indexing.index_requested(conn, org, source.event_id)
        assert await deferred_indexing.index_requested(conn, org, source.event_id) == {}  # done once
    assert await deferred_indexing.pending_count(conn, [org]) == 0
    live = await _retrieval_rows(conn, org)
    # A turn's chunks carry its position, inline and deferred alike (Search's adjacent-turn lift).
    placed = await conn.fetch(
        "SELECT c.source_kind, c.seq AS chunk_seq, e.seq AS turn_seq FROM chunks c "
        "LEFT JOIN session_events e ON e.org_id = c.org_id AND e.event_id = c.source_event_id "
        "WHERE c.org_id = $1", org)
    assert {r["source_kind"] for r in placed} == {"event", "memory"}
    assert all(r["chunk_seq"] == r["turn_seq"] if r["source_kind"] == "event" else r["chunk_seq"] is None
               for r in placed)
    assert len({r["chunk_seq"] for r in placed if r["source_kind"] == "event"}) == 4
    by_source = {}
    for r in live["chunks"]:
        by_source.setdefault(str(r[2]), set()).add(r[13])  # active flags
    assert by_source[later.event_id] == {False} and by_source[first.event_id] == {True}

    async with fresh_database(postgres_url, "ce_bulk", migrated=True) as replay_url:
        fresh = await asyncpg.connect(replay_url)
        try:
            archived = [LogRecord(r["topic"], r["partition"], r["offset"], bytes(r["raw"])) for r in await conn.fetch(
                'SELECT topic, partition, "offset", raw FROM event_archive WHERE org_id = $1 '
                'ORDER BY archive_seq', org)]
            await apply_batch(fresh, archived, bulk=BulkLoad(copy=False))
            async with fresh.transaction():
                await fresh.execute("SELECT set_config('app.org_id', $1, true)", org)
                await recount_statistics(fresh, org)
            replayed = await _retrieval_rows(fresh, org)
            assert await deferred_indexing.pending_count(fresh) == 0
        finally:
            await fresh.close()
    assert {t: len(v) for t, v in replayed.items()} == {t: len(v) for t, v in live.items()}
    assert replayed == live


async def test_an_indexing_request_that_keeps_failing_is_given_up_with_its_error(conn: asyncpg.Connection) -> None:
    from projections.projector import deferred_indexing

    org, log = new_org(), Log()
    long = ingest(org, "s", "lamp " * 5_000)
    await apply_batch(conn, log.append(long))
    for n in range(1, deferred_indexing.MAX_ATTEMPTS + 1):
        assert await deferred_indexing.record_failure(conn, org, long.event_id, f"RuntimeError: try {n}") == n
    assert org not in await deferred_indexing.backlog(conn, older_than=dt.timedelta(0))
    assert await deferred_indexing.index_requested(conn, org, long.event_id) == {}
    row = await in_org(conn, org, lambda c, o: c.fetchrow(
        "SELECT attempts, last_error FROM indexing_requests WHERE org_id = $1", o))
    assert (row["attempts"], row["last_error"]) == (deferred_indexing.MAX_ATTEMPTS, "RuntimeError: try 5")


async def test_the_indexer_process_indexes_on_its_own_connection_and_reports_what_failed(
        conn: asyncpg.Connection, db_url: str) -> None:
    """The worker hands its background process a source's id and gets the new chunks' ids back;
    PostgreSQL out of reach comes back as an infrastructure failure, the request untouched."""
    from context_engine.concurrency import BackgroundProcess
    from projections.projector import deferred_indexing, indexer_process

    org, log = new_org(), Log()
    long = ingest(org, "s", "lamp post " * 2_000)
    await apply_batch(conn, log.append(long))
    process = BackgroundProcess(0)
    try:
        unembedded = await process.run(functools.partial(
            indexer_process.index_source, db_url, org, long.event_id, build_niceness=5))  # not SCHED_IDLE: a
        # busy machine would starve it (test_concurrency checks that class)
        chunk_ids = await in_org(conn, org, lambda c, o: c.fetch(
            "SELECT chunk_id FROM chunks WHERE org_id = $1 AND source_event_id = $2", o, uuid.UUID(long.event_id)))
        assert chunk_ids and sorted(unembedded[long.event_id]) == sorted(str(r["chunk_id"]) for r in chunk_ids)
        assert await process.run(indexer_process.index_source, db_url, org, long.event_id) == {}  # done once

        # Its connection killed while it waited (as by a PostgreSQL restart): the next source is
        # indexed on a new one, within the call.
        killed = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = $1 AND datname = current_database()", indexer_process.APPLICATION_NAME)
        assert killed == 1
        for _ in range(600):  # until its backend has gone (a bound for a loaded machine, not a verdict)
            if not await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                                       indexer_process.APPLICATION_NAME):
                break
            await asyncio.sleep(0.05)
        after_kill = ingest(org, "s", "quay lamp " * 2_000)
        await apply_batch(conn, log.append(after_kill))
        assert await process.run(indexer_process.index_source, db_url, org, after_kill.event_id)

        other = ingest(org, "s", "harbour lamp " * 2_000)
        await apply_batch(conn, log.append(other))
        unreachable = db_url.replace(db_url.split("@")[1].split("/")[0], "127.0.0.1:1")
        with pytest.raises(indexer_process.IndexingFailed) as failed:
            await process.run(indexer_process.index_source, unreachable, org, other.event_id)
        assert failed.value.infrastructure and "Error" in failed.value.description
        assert await deferred_indexing.pending_count(conn, [org]) == 1
        assert await process.run(indexer_process.index_source, db_url, org, other.event_id)  # connects again
    finally:
        process.shutdown()
