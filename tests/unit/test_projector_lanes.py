"""The projector's org lanes (streams/agents/projector_lanes.py): a large record and every later
record of its org are applied in a lane, in log order, while other orgs' records go on in the
batches; the lane's events are acknowledged only once it has applied them."""

from __future__ import annotations

import asyncio

import pytest

from projections.projector.outcome import Applied, ProjectionOutcome
from projections.projector.records import LogRecord
from streams.agents.projector_lanes import OrgLanes
from tests.fixtures.projector_log import Log, ingest

LANE_BYTES = 1_000


class Lane:
    """apply/publish/ack as the projector gives them, recording what happened, with a gate that
    holds the lanes' applies until the test opens it."""

    def __init__(self) -> None:
        self.applied: list[list[tuple[int, int]]] = []  # (partition, offset) per lane commit
        self.published: list[list[str]] = []
        self.acked: list[str] = []
        self.gate = asyncio.Event()
        self.fail = False

    async def apply(self, records: list[LogRecord]) -> list[Applied]:
        await self.gate.wait()
        if self.fail:
            raise RuntimeError("a bug in the projector")
        self.applied.append([(r.partition, r.offset) for r in records])
        return [Applied(str(i), "event.ingested", "org", r.topic, r.partition, r.offset, ProjectionOutcome.APPLIED)
                for i, r in enumerate(records)]

    async def publish(self, applied: list[Applied]) -> None:
        self.published.append([a.event_id for a in applied])

    async def ack(self, event: str) -> None:
        self.acked.append(event)


def record(log: Log, org: str, text: str) -> LogRecord:
    return log.append(ingest(org, "s", text))[0]


async def settle(lanes: OrgLanes, timeout: float = 10.0) -> None:
    """Until every lane is done (a bound for a loaded machine, not a verdict)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while lanes.busy():
        assert asyncio.get_running_loop().time() < deadline, lanes.busy()
        await asyncio.sleep(0.001)


async def test_a_large_record_and_its_orgs_later_ones_go_in_order_to_a_lane_and_others_go_on():
    lane, log, held = Lane(), Log(), []
    lanes = OrgLanes(lane.apply, lane.publish, lane.ack, record_bytes=LANE_BYTES)
    big_a = record(log, "org-a", "x" * 2 * LANE_BYTES + " big a")
    small_b, small_a = record(log, "org-b", "small b"), record(log, "org-a", "after big a")

    assert lanes.route([(big_a, "ev-big-a"), (small_b, "ev-b")], held.append) == [small_b]
    assert lanes.busy() == ["org-a"]
    # While the lane holds org A, its next record follows it there; org B's goes on.
    later_b = record(log, "org-b", "later b")
    assert lanes.route([(small_a, "ev-a"), (later_b, "ev-later-b")], held.append) == [later_b]
    assert held == ["ev-big-a", "ev-a"] and lane.acked == []  # held until the lane commits them

    lane.gate.set()
    await settle(lanes)
    assert [at for applied in lane.applied for at in applied] == [(big_a.partition, big_a.offset),
                                                                  (small_a.partition, small_a.offset)]
    assert lane.acked == ["ev-big-a", "ev-a"] and sum(map(len, lane.published)) == 2
    # The lane is gone once empty: org A's small records are batched again.
    assert lanes.route([(record(log, "org-a", "quiet again"), "ev-quiet")], held.append) != []


async def test_past_the_lanes_limit_a_large_record_waits_in_the_batch():
    lane, log = Lane(), Log()
    lanes = OrgLanes(lane.apply, lane.publish, lane.ack, record_bytes=LANE_BYTES, max_lanes=1)
    big_a, big_b = record(log, "org-a", "a" * 2 * LANE_BYTES), record(log, "org-b", "b" * 2 * LANE_BYTES)
    assert lanes.route([(big_a, "a"), (big_b, "b")], lambda e: None) == [big_b]
    assert lanes.busy() == ["org-a"]
    lane.gate.set()
    await settle(lanes)


async def test_a_record_that_does_not_decode_is_left_to_the_batch_which_sets_it_aside():
    lane, log = Lane(), Log()
    lanes = OrgLanes(lane.apply, lane.publish, lane.ack, record_bytes=LANE_BYTES)
    big = record(log, "org-a", "a" * 2 * LANE_BYTES)
    garbage = LogRecord(log.topic, 0, 99, b"\x00" * (2 * LANE_BYTES))
    assert lanes.route([(big, "a"), (garbage, "g")], lambda e: None) == [garbage]
    lane.gate.set()
    await settle(lanes)


async def test_a_failed_lane_fails_the_projector_with_its_events_unacknowledged():
    lane, log = Lane(), Log()
    lane.fail = True
    lanes = OrgLanes(lane.apply, lane.publish, lane.ack, record_bytes=LANE_BYTES)
    lanes.route([(record(log, "org-a", "a" * 2 * LANE_BYTES), "a")], lambda e: None)
    lane.gate.set()
    deadline = asyncio.get_running_loop().time() + 10
    while not all(t.done() for t in lanes._tasks.values()):
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.001)
    with pytest.raises(RuntimeError, match="projector lane of org 'org-a' failed"):
        lanes.route([(record(log, "org-b", "b"), "b")], lambda e: None)
    assert lane.acked == []
