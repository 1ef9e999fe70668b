"""Every event type the engine knows has exactly one applier in the session projector."""

from context_engine import events
from projections.projector.appliers import APPLIERS, SESSION_TYPES


def test_every_event_type_has_an_applier():
    assert set(APPLIERS) == set(events.BODY_TYPES)


def test_the_session_owned_types_are_the_ones_that_write_a_session():
    assert SESSION_TYPES == {events.EVENT_INGESTED, events.MEMORY_PUSHED, events.SNAPSHOT_CREATED,
                             events.SESSION_ROLLED_BACK, events.SESSION_COMPACTED}
