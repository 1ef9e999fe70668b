"""Workers that share the log (issue #25): three `context-engine worker` processes in one consumer
group split the partitions during a four-writer ingest burst, and one is killed with SIGKILL in the
middle of it. Every acknowledged event is applied exactly once, none is skipped, each session's
chain (turns and pushed memory) is contiguous, every chunk gets its vector and every pushed
memory its PII scan, every audited cross-scope attempt its one audit row (jobs and audit
records the same group splits), and `verify` (a single-process replay of the
log, compared with the read models) finds no difference."""

from __future__ import annotations

import asyncio
import json
import re
import signal

import asyncpg
import grpc
import pytest

from tests.fixtures.engine import WorkerProcess, running_engine, unique
from tests.fixtures.infra import START_TIMEOUT_S
from tests.fixtures.settling import settled
from upsquad.context.v1 import context_pb2 as pb

pytestmark = pytest.mark.integration

WRITERS, TURNS_EACH = 4, 60
ASSIGNED = "Setting newly assigned partitions"
RETRIED = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
EXPECTED_WARNINGS = ("pii scan fell back", "guardrail")  # no detector, no guardrail key here


# Each step has a deadline of its own, which says where the run stalled and what the workers
# logged; together they stay under the test's.
@pytest.mark.timeout(600)
async def test_three_workers_one_killed_mid_burst_apply_every_acknowledged_event_once(
        postgres_url, kafka_bootstrap, tmp_path):
    async with running_engine(postgres_url, kafka_bootstrap, tmp_path) as engine:
        others = [WorkerProcess(engine.worker.env, tmp_path / f"worker-{i}.log") for i in (1, 2)]
        for w in others:
            w.start()
        workers = [engine.worker, *others]
        # The group has settled on three members, each with a share of the event topic's partitions.
        await _within(120, "the group settling on three members",
                      _until(lambda: all(_event_partitions(w, engine.settings.topic_prefix) for w in workers)),
                      lambda: _report(workers, engine.settings.topic_prefix, {}, []))
        org = unique("group")
        acknowledged: dict[str, list[str]] = {}  # session -> event ids, in the order acknowledged
        retries: list[str] = []
        refused: list[str] = []  # sessions another team asked to assemble, once per attempt
        intruder = engine.caller(org, "p1", "intruder", clearance=1)
        halfway = asyncio.Event()

        async def writer(n: int) -> None:
            caller = engine.caller(org, "p1", f"t{n}", clearance=1)
            session = f"s{n}"
            acknowledged[session] = []
            for turn in range(TURNS_EACH):
                request = pb.IngestEventRequest(session_id=session, event_type="message",
                                                content=f"user: writer {n} turn {turn}".encode())
                while True:  # a retry with the same idempotency key is safe (docs/operations.md)
                    try:
                        reply = await caller("IngestEvent", request, ("idempotency-key", f"{session}/{turn}"))
                        break
                    except grpc.aio.AioRpcError as err:
                        assert err.code() in RETRIED, err.details()
                        retries.append(err.code().name)
                        await asyncio.sleep(0.2)
                acknowledged[session].append(reply.event_id)
                if turn % 10 == 9:  # memory too: its PII scan is a job of the same group
                    await caller("PushContext", pb.PushContextRequest(
                        session_id=session, memory_type="semantic", content=f"note {turn} of {n}".encode()),
                                 ("idempotency-key", f"{session}/memory/{turn}"))
                    # a sibling team may not see the session: refused as absent, and audited
                    with pytest.raises(grpc.aio.AioRpcError) as denied:
                        await intruder("AssembleContext", pb.AssembleContextRequest(session_id=session,
                                                                                    token_budget=500))
                    assert denied.value.code() == grpc.StatusCode.NOT_FOUND, denied.value.details()
                    refused.append(session)
                if n == 0 and turn == TURNS_EACH // 3:
                    halfway.set()

        async def kill_one() -> None:
            await halfway.wait()
            others[0].proc.send_signal(signal.SIGKILL)

        victim = _event_partitions(others[0], engine.settings.topic_prefix)
        try:
            def report() -> str:
                return _report(workers, engine.settings.topic_prefix, acknowledged, retries)
            await _within(150, "the burst", asyncio.gather(*(writer(n) for n in range(WRITERS)), kill_one()),
                          report)
            # The embedding and PII agents' jobs were split and moved the same way: the two left do
            # all of it (no detector here: every push is scanned and quarantined).
            # A bound, not a measurement: beside two busy loops the survivors' niced embedders once
            # took longer than 90 s for the burst's 240 turns and 24 memories.
            await _within(START_TIMEOUT_S, "the background work settling", settled(engine.settings.database_url, org),
                          report)
            audited = await _within(45, "the audit rows", _audit_rows(engine.settings.database_url, org,
                                                                     len(refused)), report)
        finally:
            for w in others:
                w.stop()
        assert others[0].proc.returncode == -signal.SIGKILL
        print(f"\n{WRITERS} writers x {TURNS_EACH} turns, 3 workers, the one holding event partitions {victim} "
              f"killed at a third: {len(retries)} retried calls ({', '.join(sorted(set(retries))) or 'none'})")
        # Its partitions moved: the survivors' latest assignments cover every event partition.
        survivors = set().union(*(_event_partitions(w, engine.settings.topic_prefix) for w in (engine.worker,
                                                                                               others[1])))
        assert survivors == set(range(engine.settings.events_topic_partitions)), survivors

        conn = await asyncpg.connect(engine.settings.database_url)
        try:
            rows = await conn.fetch("SELECT session_id, event_id::text, seq FROM session_events "
                                    "WHERE org_id = $1 ORDER BY session_id, seq", org)
            memory_seqs = await conn.fetch("SELECT session_id, seq FROM memory_versions WHERE org_id = $1", org)
            statuses = await conn.fetch("SELECT pii_status, count(*) FROM memory_versions WHERE org_id = $1 "
                                        "GROUP BY 1", org)
        finally:
            await conn.close()
        assert sorted(audited) == sorted((s, "use_in_assembly", "denied", "not_visible") for s in refused)
        assert [tuple(r) for r in statuses] == [("quarantined", WRITERS * (TURNS_EACH // 10))]
        by_session: dict[str, list[str]] = {}
        for r in rows:
            by_session.setdefault(r["session_id"], []).append(r["event_id"])
        # exactly once and in the order acknowledged (one writer per session, one call at a time)
        assert by_session == acknowledged
        pushes = TURNS_EACH // 10
        for session in acknowledged:  # the chain's items (turns and memory) have no gap
            seqs = sorted([r["seq"] for r in rows if r["session_id"] == session]
                          + [r["seq"] for r in memory_seqs if r["session_id"] == session])
            assert seqs == list(range(seqs[0], seqs[0] + TURNS_EACH + pushes)), (session, seqs)

        code, out = await engine.cli("verify", timeout=90)
        assert code == 0 and "0 difference(s)" in out, out


async def _audit_rows(database_url: str, org: str, at_least: int) -> list[tuple]:
    """The org's audit rows once there are `at_least` of them (the audit-writer stores them)."""
    conn = await asyncpg.connect(database_url)
    try:
        while True:
            rows = await conn.fetch("SELECT resource_id, operation, outcome, denial_reason FROM audit_access "
                                    "WHERE org_id = $1", org)
            if len(rows) >= at_least:
                return [tuple(r) for r in rows]
            await asyncio.sleep(0.5)
    finally:
        await conn.close()


async def _within(seconds: float, step: str, awaitable, report):
    """`awaitable`'s result, or a failure naming the step that did not end in time and `report()`."""
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:
        pytest.fail(f"{step} did not end within {seconds:.0f}s\n{report()}", pytrace=False)


def _report(workers: list[WorkerProcess], prefix: str, acknowledged: dict[str, list[str]],
            retries: list[str]) -> str:
    """What each writer had acknowledged, and each worker's state and last warnings."""
    lines = [f"acknowledged per session: { {s: len(ids) for s, ids in acknowledged.items()} }, "
             f"{len(retries)} retried call(s)"]
    for i, w in enumerate(workers):
        state = "running" if w.proc is not None and w.proc.poll() is None else \
            f"exited {w.proc.returncode if w.proc else None}"
        notable = [line for line in w.log_path.read_text(errors="replace").splitlines()
                   if ('"level": "warning"' in line or '"level": "error"' in line or "group" in line)
                   and not any(expected in line for expected in EXPECTED_WARNINGS)]
        lines.append(f"worker {i} ({state}), event partitions {sorted(_event_partitions(w, prefix))}:")
        lines.extend(f"    {line[:300]}" for line in notable[-15:])
    return "\n".join(lines)


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.5)


def _event_partitions(worker: WorkerProcess, prefix: str) -> set[int]:
    """The event topic's partitions in the worker's latest assignment, from its JSON log."""
    latest = ""
    for line in worker.log_path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line).get("event", "")
        except ValueError:
            continue
        if isinstance(event, str) and event.startswith(ASSIGNED):
            latest = event
    return {int(p) for p in re.findall(rf"topic='{re.escape(prefix)}\.events', partition=(\d+)", latest)}
