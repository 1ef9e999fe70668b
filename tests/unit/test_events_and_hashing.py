import hashlib

import orjson
import pytest

from context_engine import events, hashing
from context_engine.scope import Scope


def make(payload=None, **kw):
    return events.Event(type=events.MEMORY_PUSHED, scope=Scope("acme", "sales"),
                        aggregate=events.session_aggregate("acme", "s1"), actor="dev:acme",
                        payload=payload or {"b": 1, "a": "x"}, **kw)


def test_content_hash_is_sha256_of_canonical_payload():
    event = make({"b": 1, "a": "é"})
    assert event.content_hash == hashlib.sha256('{"a":"é","b":1}'.encode()).hexdigest()
    assert make({"a": "é", "b": 1}).content_hash == event.content_hash


def test_round_trip_through_canonical_bytes():
    event = make()
    assert events.decode(event.to_bytes()) == event
    assert event.to_bytes() == events.decode(event.to_bytes()).to_bytes()


def test_v1_ingested_event_reads_as_current_shape():
    stored_v1 = {
        "event_id": "3e0f1b5c-9d1e-4a65-8a3c-2b7d9f0e1a22", "type": events.EVENT_INGESTED,
        "schema_version": 1, "scope": {"org_id": "acme"}, "aggregate": "session/acme/s1",
        "occurred_at": "2025-01-02T03:04:05.000006Z", "actor": "dev:acme",
        "payload": {"session_id": "s1", "kind": "message", "content_b64": "aGk="},
        "content_hash": hashlib.sha256(b"as written").hexdigest(),
    }
    event = events.decode(orjson.dumps(stored_v1))
    assert event.schema_version == events.CURRENT_VERSIONS[events.EVENT_INGESTED] == 2
    assert event.payload == {"session_id": "s1", "event_type": "message", "content_b64": "aGk=", "metadata": {}}
    # The hash the chain uses is the one written, not a hash of the upcast payload.
    assert event.content_hash == stored_v1["content_hash"]


@pytest.mark.parametrize("raw", [b"{", b"{}", b'{"type": "nope", "schema_version": 1, "payload": {}}'])
def test_malformed_events_are_refused(raw):
    with pytest.raises(events.EventDecodeError):
        events.decode(raw)


def test_chain_matches_definition():
    h1, h2 = hashing.sha256_hex(b"one"), hashing.sha256_hex(b"two")
    v0 = hashlib.sha256(hashing.GENESIS + b"acme/s1").hexdigest()
    v1 = hashlib.sha256(bytes.fromhex(v0) + bytes.fromhex(h1)).hexdigest()
    v2 = hashlib.sha256(bytes.fromhex(v1) + bytes.fromhex(h2)).hexdigest()
    assert hashing.chain("acme/s1", [h1, h2]) == [v0, v1, v2]
    assert hashing.chain("acme/s2", [h1])[1] != v1


def test_merkle_root_order_and_domain_separation():
    leaves = [hashing.sha256_hex(bytes([i])) for i in range(5)]
    assert hashing.merkle_root(leaves) == hashing.merkle_root(list(leaves))
    assert hashing.merkle_root(leaves) != hashing.merkle_root(leaves[::-1])
    assert hashing.merkle_root(leaves[:1]) != leaves[0]
    assert hashing.is_sha256_hex(hashing.merkle_root([]))


@pytest.mark.parametrize("value, ok", [("a" * 64, True), ("A" * 64, False), ("a" * 63, False), ("g" * 64, False)])
def test_sha256_hex_shape(value, ok):
    assert hashing.is_sha256_hex(value) is ok
