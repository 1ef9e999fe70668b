"""The compaction worker in the real worker process (issue #22): a CompactionJob that
AssembleContext's crossing published compacts the session once; a redelivered or stale job, and
a job for a session rolled back since, is a no-op; a request whose job was lost is compacted at
the worker's next start; `context-engine stats compaction` and the worker's metric report it."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from context_engine.scope import Scope
from streams.jobs import compaction_job, publish
from streams.record_auth import Keyring, RecordSigner
from streams.topics import LogTopics
from tests.fixtures.calls import admin_fetch as fetch
from tests.fixtures.calls import wait_for
from tests.fixtures.engine import unique, wait_until_projecting
from tests.fixtures.sessions import OLDER, RECENT, active_turns, long_session
from upsquad.context.v1 import context_pb2 as pb

pytestmark = pytest.mark.integration



def job_outcomes(port: int) -> dict[str, float]:
    """context_engine_compactions_total{trigger="job"} of the worker, by outcome."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {s.labels["outcome"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "context_engine_compactions_total" and s.labels.get("trigger") == "job"}


async def compactions(engine, org, sid):
    return await fetch(engine, "SELECT actor, replaced_turns, original_tokens, compacted_tokens, fact_retention_score "
                               "FROM compactions WHERE org_id = $1 AND session_id = $2", org, sid)


async def requests(engine, org, sid):
    return await fetch(engine, "SELECT opened_by, closed_by, closed_reason, refusal FROM compaction_requests "
                               "WHERE org_id = $1 AND session_id = $2 ORDER BY opened_at", org, sid)


async def session_tokens(engine, org, sid) -> int:
    rows = await fetch(engine, "SELECT sum(token_count) AS n FROM session_events WHERE org_id = $1 "
                               "AND session_id = $2 AND active", org, sid)
    return int(rows[0]["n"])


async def cross_threshold(engine, lead, org, sid):
    """AssembleContext with a budget the session's history is above 80 % of: the crossing."""
    budget = await session_tokens(engine, org, sid)
    await lead("AssembleContext", pb.AssembleContextRequest(session_id=sid, task_description="orders",
                                                            token_budget=budget, model_id="gpt-4"))


async def send_jobs(engine, org, sid, *, copies: int = 1):
    """Publish one CompactionJob for the session, signed as the projector signs, `copies` times
    (the same message_id: a redelivery)."""
    settings = engine.settings
    job = compaction_job(Scope(org), sid, 1, 1)
    await publish(settings.kafka_bootstrap, LogTopics.from_settings(settings).jobs["compaction"], [job] * copies,
                  signer=RecordSigner(Keyring.from_settings(settings)))


async def handled(engine, before: dict[str, float], outcome: str, count: int) -> None:
    port = engine.settings.worker_metrics_port

    async def grown():
        now = await asyncio.to_thread(job_outcomes, port)
        return now.get(outcome, 0.0) - before.get(outcome, 0.0) >= count

    await wait_for(f"{count} job(s) handled as {outcome}", grown, engine)


async def test_a_job_published_by_assemble_context_compacts_the_session_once(engine):
    org, sid, lead = await long_session(engine)
    await cross_threshold(engine, lead, org, sid)
    [done] = await wait_for("the compaction", lambda: compactions(engine, org, sid), engine)
    assert done["actor"] == "compaction-worker" and done["replaced_turns"] == len(OLDER)
    assert done["fact_retention_score"] >= 0.98 and 0 < done["compacted_tokens"] < done["original_tokens"]
    turns = await active_turns(engine, org, sid)
    assert turns[-len(RECENT):] == RECENT and any(b"INV-2041" in line for line in turns[:-len(RECENT)])
    [request] = await requests(engine, org, sid)
    assert request["closed_reason"] == "compacted" and request["closed_by"] is not None
    # The same job again (a redelivery: its message_id is known) and a new job for the session
    # (its request is closed): neither compacts it again.
    before = await asyncio.to_thread(job_outcomes, engine.settings.worker_metrics_port)
    await send_jobs(engine, org, sid, copies=2)
    await handled(engine, before, "already_closed", 1)
    await handled(engine, before, "duplicate", 1)
    assert len(await compactions(engine, org, sid)) == 1
    assert await active_turns(engine, org, sid) == turns


async def test_a_refusal_and_a_rollback_close_the_request_and_a_job_for_it_is_a_no_op(engine):
    org, sid = unique("org"), unique("s")
    lead = engine.caller(org, "sales", "emea", clearance=3)
    for content in OLDER[:3]:
        await lead("IngestEvent", pb.IngestEventRequest(session_id=sid, event_type="message", content=content))
    version = (await fetch(engine, "SELECT version FROM sessions WHERE org_id = $1 AND session_id = $2",
                           org, sid))[0]["version"]
    await lead("IngestEvent", pb.IngestEventRequest(session_id=sid, event_type="message", content=OLDER[3]))
    crossing = await asyncio.to_thread(job_outcomes, engine.settings.worker_metrics_port)
    await cross_threshold(engine, lead, org, sid)
    await handled(engine, crossing, "nothing_to_compact", 1)  # too few turns: refused, and the request closes

    async def refused():
        rows = await requests(engine, org, sid)
        return rows if rows[0]["closed_reason"] == "refused" else None

    [request] = await wait_for("the refusal's close", refused, engine)
    assert request["refusal"] == "nothing_to_compact"
    # What a request the worker has not served yet is (its job lost): a rollback closes it.
    await fetch(engine, "INSERT INTO compaction_requests (org_id, session_id, opened_by, token_count, token_budget, "
                        "opened_at) VALUES ($1, $2, gen_random_uuid(), 1, 1, now()) RETURNING opened_by", org, sid)
    try:
        await lead("RollbackContext", pb.RollbackContextRequest(session_id=sid, target_version_hash=version))
        rows = await requests(engine, org, sid)
        assert [r["closed_reason"] for r in rows] == ["refused", "rolled_back"]
        before = await asyncio.to_thread(job_outcomes, engine.settings.worker_metrics_port)
        await send_jobs(engine, org, sid)
        await handled(engine, before, "already_closed", 1)
        assert await compactions(engine, org, sid) == []
        assert await active_turns(engine, org, sid) == OLDER[:3]
    finally:  # no event opened it: verify must not find it
        await fetch(engine, "DELETE FROM compaction_requests WHERE org_id = $1 AND session_id = $2 "
                            "AND closed_reason = 'rolled_back' RETURNING 1", org, sid)


async def test_a_request_whose_job_was_lost_is_compacted_at_the_next_start(engine):
    org, sid, lead = await long_session(engine)
    # What a job lost with the job stream (a broker restart) leaves: the request, and no job.
    await fetch(engine, "INSERT INTO compaction_requests (org_id, session_id, opened_by, token_count, token_budget, "
                        "opened_at) VALUES ($1, $2, gen_random_uuid(), 1, 1, now()) RETURNING opened_by", org, sid)
    try:
        engine.worker.stop()
        engine.worker.start()
        await wait_until_projecting(engine)
        [done] = await wait_for("the compaction at start", lambda: compactions(engine, org, sid), engine)
        assert done["actor"] == "compaction-worker" and done["replaced_turns"] == len(OLDER)
        assert (await active_turns(engine, org, sid))[-len(RECENT):] == RECENT
        [request] = await requests(engine, org, sid)
        assert request["closed_reason"] == "compacted"
    finally:  # no event opened it: verify must not find it
        await fetch(engine, "DELETE FROM compaction_requests WHERE org_id = $1 AND session_id = $2 RETURNING 1",
                    org, sid)


async def test_stats_compaction_reports_requests_and_compactions(engine):
    org, sid, lead = await long_session(engine)
    await cross_threshold(engine, lead, org, sid)
    [done] = await wait_for("the compaction", lambda: compactions(engine, org, sid), engine)
    code, out = await engine.cli("stats", "compaction", "--org", org)
    assert code == 0, out
    header, row = out.strip().splitlines()[-2:]
    assert "requests" in header and "reduction" in header
    fields = row.split()
    assert fields[0] == org
    # 1 request, closed by the 1 compaction (none rolled back, below the threshold or refused), the worker's
    assert fields[1:9] == ["1", "0", "1", "0", "0", "0", "1", "1"]
    assert fields[9:11] == [str(done["original_tokens"]), str(done["compacted_tokens"])]


async def test_only_the_owner_scopes_assembly_asks_for_a_compaction(engine):
    """A compaction rewrites what every reader of the session sees, so a crossing seen by a scope
    below the owner's (which reads the session whole) opens no request: no job, no rewrite."""
    org, sid, lead = await long_session(engine)
    below = engine.caller(org, "sales", "emea", "bot", clearance=4)
    await cross_threshold(engine, below, org, sid)
    assert await requests(engine, org, sid) == []
    await cross_threshold(engine, lead, org, sid)
    [request] = await requests(engine, org, sid)
    assert request["opened_by"] is not None
