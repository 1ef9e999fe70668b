"""The projector's version chain, in memory: genesis, items and rollbacks as context_engine.hashing defines them."""

from __future__ import annotations

from context_engine import hashing
from context_engine.events import Event, SessionRef, SessionRolledBack
from context_engine.scope import Scope
from projections.projector.version_chain import VersionChain
from projections.store.statement_batch import StatementBatch

OWNER = Scope("acme", "p", "t")


def event(n: int, at: Scope = OWNER) -> Event:
    return Event.of(SessionRolledBack("s", f"v{n}"), scope=at, aggregate=SessionRef("acme", "s").aggregate,
                    actor="u")


def test_a_new_session_starts_at_its_genesis_and_chains_each_item():
    chain = VersionChain(conn=None, org_id="acme")
    first, second = event(1), event(2)
    s = chain.session("s", first)
    assert s.version == s.genesis == hashing.genesis_version("acme/s") == SessionRef("acme", "s").genesis
    assert chain.append(s, first, "event") == (1, hashing.chain("acme/s", [first.content_hash])[1])
    seq, version = chain.append(s, second, "memory")
    assert (seq, version) == (2, hashing.chain("acme/s", [first.content_hash, second.content_hash])[2])
    assert (s.item_count, s.active_count, s.last_event_id) == (2, 2, second.event_id)


def test_the_first_event_of_a_session_makes_its_scope_the_owner():
    chain = VersionChain(conn=None, org_id="acme")
    s = chain.session("s", event(1, Scope("acme", "p", "t")))
    assert chain.session("s", event(2, Scope("acme", "p", "other"))) is s
    assert s.admits(Scope("acme", "p", "t", "bot")) and not s.admits(Scope("acme", "p", "other"))


def test_after_a_rollback_the_next_item_chains_from_the_target():
    chain = VersionChain(conn=None, org_id="acme")
    s = chain.session("s", event(1))
    _, v1 = chain.append(s, event(1), "event")
    chain.append(s, event(2), "event")
    chain.rolled_back(s, event(3), v1, 1, 1)
    later = event(4)
    assert chain.append(s, later, "event") == (3, hashing.next_version(v1, later.content_hash))


def test_items_versions_and_sessions_are_staged_once():
    chain = VersionChain(conn=None, org_id="acme")
    s = chain.session("s", event(1))
    chain.append(s, event(1), "event")
    batch = StatementBatch()
    chain.stage_items(batch)
    chain.stage_sessions(batch)
    again = StatementBatch()
    chain.stage_items(again)
    assert (len(batch._clauses), len(again._clauses)) == (3, 0)
