"""Each event type's class writes exactly the payload the engine wrote before the classes existed:
the payload's canonical bytes are its content_hash, chained into the session's versions, so
replays of existing logs verify only while these dicts stay the same."""

from __future__ import annotations

import base64
import dataclasses

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from context_engine import events, hashing
from context_engine.events import (
    CompactionRefused,
    CompactionThreshold,
    EmbeddingRecorded,
    EventIngested,
    GuardrailPublished,
    MemoryPushed,
    MemoryScrubbed,
    SessionCompacted,
    SessionRef,
    SessionRolledBack,
    ShareCreated,
    ShareRevoked,
    SnapshotCreated,
)
from context_engine.guardrails.signing import sign_layer
from context_engine.scope import Scope

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
LAYER = sign_layer(KEY, level=2, scope_path="acme/sales", content="be kind", signed_at_ms=1_700_000_000_000)
B64 = base64.b64encode(b"hello").decode()
SHA = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"

# (typed instance, the dict the command or worker built by hand before)
PINNED = [
    (EventIngested(session_id="s1", event_type="message", content_b64=B64, metadata={"k": "v"},
                   content_sha256=SHA, token_count=2, idempotency_key=""),
     {"session_id": "s1", "event_type": "message", "content_b64": B64, "metadata": {"k": "v"},
      "content_sha256": SHA, "token_count": 2, "idempotency_key": ""}),
    (EventIngested("s1", "tool_output", B64, {}, SHA, 0, "key-1"),
     {"session_id": "s1", "event_type": "tool_output", "content_b64": B64, "metadata": {},
      "content_sha256": SHA, "token_count": 0, "idempotency_key": "key-1"}),
    (MemoryPushed(session_id="s1", agent_id="bot", memory_type="semantic", content_b64=B64,
                  metadata={}, content_sha256=SHA),
     {"session_id": "s1", "agent_id": "bot", "memory_type": "semantic", "content_b64": B64,
      "metadata": {}, "content_sha256": SHA}),
    (SnapshotCreated(session_id="s1", snapshot_id="3e0f1b5c-9d1e-4a65-8a3c-2b7d9f0e1a22", name="before"),
     {"session_id": "s1", "snapshot_id": "3e0f1b5c-9d1e-4a65-8a3c-2b7d9f0e1a22", "name": "before"}),
    (SessionRolledBack(session_id="s1", target_version=SHA),
     {"session_id": "s1", "target_version": SHA}),
    (CompactionThreshold(session_id="s1", crossed=True, token_count=900, token_budget=1000),
     {"session_id": "s1", "crossed": True, "token_count": 900, "token_budget": 1000}),
    (CompactionThreshold(session_id="s1", crossed=False, token_count=10, token_budget=1000),
     {"session_id": "s1", "crossed": False, "token_count": 10, "token_budget": 1000}),
    (MemoryScrubbed(memory_event_id="3e0f1b5c-9d1e-4a65-8a3c-2b7d9f0e1a22", content_b64=B64, status="clear",
                    spans_by_class={"EMAIL": 1}, detector_version="natid-v1+m1", fallback_reason=""),
     {"memory_event_id": "3e0f1b5c-9d1e-4a65-8a3c-2b7d9f0e1a22", "content_b64": B64, "status": "clear",
      "spans_by_class": {"EMAIL": 1}, "detector_version": "natid-v1+m1", "fallback_reason": ""}),
    (EmbeddingRecorded(model_version="m1", vectors=[{"content_hash": SHA, "vector": "AACAPw=="}]),
     {"model_version": "m1", "vectors": [{"content_hash": SHA, "vector": "AACAPw=="}]}),
    (GuardrailPublished(LAYER),
     {"level": 2, "scope_path": "acme/sales", "content": "be kind", "content_sha256": LAYER.content_sha256,
      "signed_at_ms": 1_700_000_000_000, "signature_b64": base64.b64encode(LAYER.signature).decode(),
      "public_key_b64": base64.b64encode(LAYER.public_key).decode(), "key_fingerprint": LAYER.key_fingerprint}),
    (ShareCreated("5b1f7c0e-2a4d-4c8e-9f3a-1d2e3f4a5b6c", "chunk", "0c9d8e7f-6a5b-4c3d-8e1f-2a3b4c5d6e7f", "team",
                  "acme/sales/apac", ("read", "use_in_assembly"), "handover"),
     {"share_id": "5b1f7c0e-2a4d-4c8e-9f3a-1d2e3f4a5b6c", "resource_type": "chunk",
      "resource_id": "0c9d8e7f-6a5b-4c3d-8e1f-2a3b4c5d6e7f", "grantee_scope": "team",
      "grantee_path": "acme/sales/apac", "permissions": ["read", "use_in_assembly"], "reason": "handover"}),
    (SessionCompacted("s1", SHA, ("3e0f1b5c-9d1e-4a65-8a3c-2b7d9f0e1a22",), B64, "sliding_window", "extractive",
                      1.0, 120, 30, "5b1f7c0e-2a4d-4c8e-9f3a-1d2e3f4a5b6c",
                      ("3e0f1b5c-9d1e-4a65-8a3c-2b7d9f0e1a22",), (30,)),
     {"session_id": "s1", "base_version": SHA, "replaced": ["3e0f1b5c-9d1e-4a65-8a3c-2b7d9f0e1a22"],
      "summary_b64": B64, "strategy": "sliding_window", "summarizer": "extractive", "fact_retention_score": 1.0,
      "original_tokens": 120, "compacted_tokens": 30, "compaction_id": "5b1f7c0e-2a4d-4c8e-9f3a-1d2e3f4a5b6c",
      "stands_for": ["3e0f1b5c-9d1e-4a65-8a3c-2b7d9f0e1a22"], "line_tokens": [30]}),
    (CompactionRefused("s1", "5b1f7c0e-2a4d-4c8e-9f3a-1d2e3f4a5b6c", SHA, "insufficient_savings", "saves 2 %"),
     {"session_id": "s1", "request": "5b1f7c0e-2a4d-4c8e-9f3a-1d2e3f4a5b6c", "at_version": SHA,
      "reason": "insufficient_savings", "detail": "saves 2 %"}),
    (ShareRevoked("5b1f7c0e-2a4d-4c8e-9f3a-1d2e3f4a5b6c", "done"),
     {"share_id": "5b1f7c0e-2a4d-4c8e-9f3a-1d2e3f4a5b6c", "reason": "done"}),
]


@pytest.mark.parametrize(("body", "written"), PINNED, ids=lambda x: type(x).__name__)
def test_a_typed_body_writes_the_payload_written_before(body, written):
    payload = body.to_payload()
    assert payload == written
    assert [type(v) for v in payload.values()] == [type(written[k]) for k in payload]
    assert events.canonical_bytes(payload) == events.canonical_bytes(written)


@pytest.mark.parametrize(("body", "written"), PINNED, ids=lambda x: type(x).__name__)
def test_a_payload_reads_back_as_the_body_that_wrote_it(body, written):
    assert type(body).from_payload(body.to_payload()) == body


def test_every_event_type_has_one_class():
    assert set(events.BODY_TYPES) == {type(b).TYPE for b, _ in PINNED} == set(events.CURRENT_VERSIONS)
    assert {t: c.SCHEMA_VERSION for t, c in events.BODY_TYPES.items()} == events.CURRENT_VERSIONS


def test_an_event_of_a_body_is_the_event_of_its_payload():
    body = SnapshotCreated("s1", "3e0f1b5c-9d1e-4a65-8a3c-2b7d9f0e1a22", "n")
    ref = SessionRef("acme", "s1")
    typed = events.Event.of(body, scope=Scope("acme"), aggregate=ref.aggregate, actor="u",
                            event_id="3e0f1b5c-9d1e-4a65-8a3c-2b7d9f0e1a23", occurred_at="2026-01-01T00:00:00.000000Z")
    by_hand = events.Event(events.SNAPSHOT_CREATED, Scope("acme"), "session/acme/s1", "u", body.to_payload(),
                           event_id=typed.event_id, occurred_at=typed.occurred_at)
    assert typed == by_hand
    assert events.decode(typed.to_bytes()).body == body


def test_an_old_ingested_payload_reads_with_the_projectors_defaults():
    body = EventIngested.from_payload({"session_id": "s", "kind": "message", "content_b64": B64} |
                                      {"event_type": "message"})
    assert (body.metadata, body.content_sha256, body.token_count, body.idempotency_key) == ({}, "", 0, "")
    with pytest.raises(KeyError):
        EventIngested.from_payload({"session_id": "s"})


def test_a_v1_compaction_reads_as_v2_with_its_hash_as_written():
    v1 = {"session_id": "s1", "base_version": SHA, "replaced": ["3e0f1b5c-9d1e-4a65-8a3c-2b7d9f0e1a22"],
          "summary_b64": B64, "strategy": "sliding_window", "summarizer": "extractive", "fact_retention_score": 1.0,
          "original_tokens": 120, "compacted_tokens": 30}
    stored = events.Event(events.SESSION_COMPACTED, Scope("acme"), "session/acme/s1", "u", v1, schema_version=1)
    read = events.decode(stored.to_bytes())
    assert read.schema_version == 2 and read.content_hash == stored.content_hash  # the chain's input is unchanged
    body = read.body
    assert isinstance(body, SessionCompacted)
    assert (body.compaction_id, body.stands_for, body.line_tokens) == ("", (), ())
    assert body.summary == b"hello"


def test_a_session_ref_spells_the_persisted_keys():
    ref = SessionRef("acme", "s1")
    assert (ref.key, ref.aggregate) == ("acme/s1", "session/acme/s1")
    assert events.session_aggregate("acme", "s1") == ref.aggregate
    assert ref.genesis == hashing.genesis_version("acme/s1")


CARRIERS = [b for b, _ in PINNED if hasattr(type(b), "content")]
CONTENTS = [b"", b"\x00", bytes(range(256)), "é ☃ \u2028".encode(), b"x" * 70_000]


@pytest.mark.parametrize("carrier", CARRIERS, ids=lambda b: type(b).TYPE)
@pytest.mark.parametrize("content", CONTENTS, ids=["empty", "nul", "every-byte", "utf8", "long"])
def test_a_carrier_gives_back_the_exact_bytes_it_carries(carrier, content):
    body = dataclasses.replace(carrier, content_b64=events.content_b64(content))
    assert body.content == content
    assert type(body).from_payload(body.to_payload()).content == content
    assert body.to_payload()["content_b64"] == base64.b64encode(content).decode()  # the form on the log


@pytest.mark.parametrize("carrier", CARRIERS, ids=lambda b: type(b).TYPE)
@pytest.mark.parametrize("encoded", ["@@@@", "aGVsbG8", "aGVs\nbG8=", "aGVsbG8=\x00"])
def test_content_that_is_not_base64_is_refused_when_read(carrier, encoded):
    body = dataclasses.replace(carrier, content_b64=encoded)
    with pytest.raises(ValueError):
        _ = body.content


def test_the_three_content_carriers_are_the_ingest_the_push_and_the_scan():
    assert {type(b) for b in CARRIERS} == {EventIngested, events.MemoryPushed, events.MemoryScrubbed}
