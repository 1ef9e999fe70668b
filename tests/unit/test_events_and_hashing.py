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


# RFC 6962's reference tree: the leaves and the tree heads of its first 0..8 leaves, as every
# Certificate Transparency implementation tests them (also in docs/assembly.md).
RFC6962_LEAVES = ["", "00", "10", "2021", "3031", "40414243", "5051525354555657",
                  "606162636465666768696a6b6c6d6e6f"]
RFC6962_ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]


@pytest.mark.parametrize("size", range(len(RFC6962_ROOTS)))
def test_merkle_root_is_rfc6962s_tree_hash(size):
    assert hashing.merkle_root(RFC6962_LEAVES[:size]) == RFC6962_ROOTS[size]


@pytest.mark.parametrize("n", range(1, 18))
def test_no_two_leaf_lists_share_a_root_by_repeating_the_last(n):
    """CVE-2012-2459: with odd nodes paired with themselves, [a, b, c] and [a, b, c, c] collide."""
    leaves = [hashing.sha256_hex(f"block {i}".encode()) for i in range(n)]
    assert hashing.merkle_root(leaves) != hashing.merkle_root(leaves + leaves[-1:])
    assert hashing.merkle_root(leaves + leaves) != hashing.merkle_root(leaves)


@pytest.mark.parametrize("value, ok", [("a" * 64, True), ("A" * 64, False), ("a" * 63, False), ("g" * 64, False),
                                       ("a" * 64 + "\n", False), ("a" * 64 + "\r\n", False)])
def test_sha256_hex_shape(value, ok):
    assert hashing.is_sha256_hex(value) is ok
