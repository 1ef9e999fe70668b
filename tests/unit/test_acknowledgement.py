"""The acknowledgement protocol's pure parts: the NOTIFY payloads both ways, the retry advice of
each command, and the waiter and append step against fakes (no broker, no database)."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import pytest

from commands import create_share, create_snapshot, revoke_share, rollback_context
from commands.idempotency import retry_with_key
from context_engine.errors import Unavailable
from context_engine.events import (
    EVENT_INGESTED,
    Event,
    SessionRef,
)
from context_engine.scope import Scope
from projections.projector.guardrail_layers import REJECTED_UNTRUSTED_KEY
from projections.projector.outcome import ProjectionOutcome
from streams.acknowledgement import (
    APPENDS_AGAIN,
    ARCHIVED_CHANNEL,
    IDS_PER_NOTIFICATION,
    ArchiveWatch,
    EventRejected,
    announcement,
    append_and_wait,
    archived_payloads,
    parse_payload,
)
from streams.freshness import SessionFreshness
from streams.log import LogPosition

NOTIFY_LIMIT_BYTES = 8000  # PostgreSQL's limit on one NOTIFY payload
LONGEST_OUTCOMES = (REJECTED_UNTRUSTED_KEY, ProjectionOutcome.IDEMPOTENCY_KEY_TAKEN)


def outcomes(n: int) -> list[tuple[str, str]]:
    return [(str(uuid.uuid4()), LONGEST_OUTCOMES[i % 2]) for i in range(n)]


SESSION = SessionRef("org", "s1")


def event(type_: str, payload: dict) -> Event:
    return Event(type_, Scope("org"), SESSION.aggregate, "test", payload)


@pytest.mark.parametrize("n", [1, IDS_PER_NOTIFICATION - 1, IDS_PER_NOTIFICATION, IDS_PER_NOTIFICATION + 1, 1000])
def test_parsing_the_payloads_of_a_batch_gives_back_each_event_with_its_outcome_in_order(n):
    announced = outcomes(n)
    heard = [item for payload in archived_payloads(announced) for item in parse_payload(payload)]
    assert heard == announced


def test_every_payload_fits_one_notify_and_names_whole_event_ids():
    announced = outcomes(5 * IDS_PER_NOTIFICATION + 7)
    payloads = archived_payloads(announced)
    assert len(payloads) == 6
    ids = {event_id for event_id, _ in announced}
    for payload in payloads:
        assert len(payload.encode()) < NOTIFY_LIMIT_BYTES
        assert all(event_id in ids for event_id, _ in parse_payload(payload))  # never a piece of one


def test_an_empty_batch_announces_nothing():
    assert archived_payloads([]) == []


def test_the_announcement_names_the_channel_and_skips_records_without_an_event_id():
    applied = [SimpleNamespace(event_id="e1", outcome=ProjectionOutcome.APPLIED),
               SimpleNamespace(event_id="", outcome=ProjectionOutcome.REJECTED),
               SimpleNamespace(event_id="e2", outcome=ProjectionOutcome.REJECTED)]
    assert announcement(applied) == (ARCHIVED_CHANNEL, ["e1:APPLIED,e2:REJECTED"])
    assert ARCHIVED_CHANNEL == "event_archived"


def test_a_retry_of_an_ingest_or_push_with_a_key_is_told_the_key():
    ingest = retry_with_key("k1", "event")
    assert ingest.text == ("retry with idempotency-key k1: a retry returns this event if it was applied, "
                           "and writes it once otherwise")
    assert ingest.metadata == {"idempotency_key": "k1"}
    push = retry_with_key("k2", "memory version")
    assert push.text == ("retry with idempotency-key k2: a retry returns this memory version if it was "
                         "applied, and writes it once otherwise")
    assert push.metadata == {"idempotency_key": "k2"}


def test_a_retry_of_a_snapshot_is_told_the_name_and_id():
    advice = create_snapshot.retry_advice("v1", "sid")
    assert advice.text == ("a retry with snapshot_name 'v1' creates the snapshot if this one was not applied, "
                           "and answers ALREADY_EXISTS (SNAPSHOT_NAME_TAKEN) if it was (or if another create "
                           "of that name won)")
    assert advice.metadata == {"snapshot_name": "v1", "snapshot_id": "sid"}


def test_a_retry_of_a_rollback_is_told_the_target():
    advice = rollback_context.retry_advice("abc")
    assert advice.text == ("a retry rolls the session back to abc again: if this rollback was applied and "
                           "nothing was written to the session since, the state stays the same (one more "
                           "rollback is recorded); anything written since is rolled back too")
    assert advice.metadata == {"target_version_hash": "abc"}


def test_a_retry_of_a_share_grant_or_revocation_is_told_the_share():
    created = create_share.retry_advice("sid")
    assert created.text == ("ListShares shows whether share sid was created; a retry creates a second grant "
                            "of the same resource")
    revoked = revoke_share.retry_advice("sid")
    assert revoked.text == ("a retry of the revocation of share sid answers with the first revocation's time "
                            "if this one was applied")
    assert created.metadata == revoked.metadata == {"share_id": "sid"}


def test_any_other_retry_appends_a_second_event():
    assert APPENDS_AGAIN.text == "a retry appends a second event"
    assert APPENDS_AGAIN.metadata == {}


POSITION = LogPosition("events", 0, 7)


async def test_a_notification_resolves_only_its_own_waiter():
    watch = ArchiveWatch("unused", pool=None)
    watch.expect("mine")
    watch._on_notify(None, 0, ARCHIVED_CHANNEL, "other:APPLIED")
    assert watch.waiting() == 1
    watch._on_notify(None, 0, ARCHIVED_CHANNEL, "x:DUPLICATE,mine:OUT_OF_SCOPE")
    assert await watch.wait("mine", "org", POSITION, timeout=5) == "OUT_OF_SCOPE"
    assert watch.waiting() == 0


async def test_no_word_in_time_is_not_durable_yet_with_the_retry_advice():
    watch = ArchiveWatch("unused", pool=None)
    advice = retry_with_key("k1", "event")
    with pytest.raises(Unavailable) as err:
        await watch.wait("e1", "org", POSITION, timeout=0, retry=advice)
    assert err.value.reason == "NOT_DURABLE_YET"
    assert err.value.message == ("event e1 was appended at events/0@7 but not archived within 0.0s: it is not "
                                 f"acknowledged, and it may still be applied; {advice.text}")
    assert err.value.metadata == {"event_id": "e1", "idempotency_key": "k1"}
    assert watch.waiting() == 0


class AnnouncingLog:
    """A log whose append is archived at once with `outcome`, announced as the worker does."""

    def __init__(self, watch: ArchiveWatch, freshness: SessionFreshness, outcome: str) -> None:
        self.watch, self.freshness, self.outcome = watch, freshness, outcome
        self.pending_reads = None

    async def append(self, ev: Event) -> LogPosition:
        reader = asyncio.ensure_future(self.freshness.wait(SESSION))
        await asyncio.sleep(0)
        self.pending_reads = not reader.done()  # a read of the session waits for this append
        reader.cancel()
        _, payloads = announcement([SimpleNamespace(event_id=ev.event_id, outcome=self.outcome)])
        for payload in payloads:
            self.watch._on_notify(None, 0, ARCHIVED_CHANNEL, payload)
        return POSITION


async def test_an_acknowledged_append_answers_the_projectors_outcome_and_holds_reads_until_then():
    watch, freshness = ArchiveWatch("unused", pool=None), SessionFreshness(5)
    log = AnnouncingLog(watch, freshness, ProjectionOutcome.APPLIED)
    answer = await append_and_wait(log, watch, freshness, event(EVENT_INGESTED, {}), SESSION, timeout=5)
    assert answer == ProjectionOutcome.APPLIED
    assert log.pending_reads is True
    await asyncio.wait_for(freshness.wait(SESSION), 1)  # answered: nothing in flight any more


async def test_an_append_the_projector_set_aside_is_event_rejected():
    watch, freshness = ArchiveWatch("unused", pool=None), SessionFreshness(5)
    ev = event(EVENT_INGESTED, {})
    with pytest.raises(EventRejected) as err:
        await append_and_wait(AnnouncingLog(watch, freshness, ProjectionOutcome.REJECTED), watch, freshness, ev,
                              SESSION,
                              timeout=5)
    assert err.value.reason == "EVENT_REJECTED"
    assert err.value.metadata == {"event_id": ev.event_id}


async def test_a_failed_produce_says_the_event_may_still_be_applied_and_forgets_the_waiter():
    class FailingLog:
        async def append(self, ev):
            raise Unavailable("the event log is unavailable: boom", reason="LOG_UNAVAILABLE")

    watch, freshness = ArchiveWatch("unused", pool=None), SessionFreshness(5)
    ev = event(EVENT_INGESTED, {})
    with pytest.raises(Unavailable) as err:
        await append_and_wait(FailingLog(), watch, freshness, ev, SESSION, timeout=5,
                              retry=retry_with_key("k1", "event"))
    assert err.value.reason == "LOG_UNAVAILABLE"
    assert err.value.message == (f"the event log is unavailable: boom; event {ev.event_id} may have been appended "
                                 "and may still be applied: retry with idempotency-key k1: a retry returns this "
                                 "event if it was applied, and writes it once otherwise")
    assert err.value.metadata == {"event_id": ev.event_id, "idempotency_key": "k1"}
    assert watch.waiting() == 0
