"""Job messages on the log: stream.proto payloads inside a StreamEnvelope.

A logical stream such as `embedding:org-1` lives on the topic of its kind (streams/topics.py),
keyed by org_id; the envelope keeps the logical name, a message_id consumers are idempotent on,
and the originating ScopePath.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from aiokafka import AIOKafkaProducer
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from context_engine.scope import Scope
from projections.projector.audit_rows import AuditRow
from projections.projector.job_requests import CompactSession, EmbedChunks, IndexSource, JobRequest, ScanMemory
from projections.projector.savings import Sample
from streams.record_auth import RecordSigner
from upsquad.context.v1 import context_pb2, stream_pb2

if TYPE_CHECKING:
    from streams.access_attempts import AccessAttempt


def scope_path(scope: Scope) -> context_pb2.ScopePath:
    return context_pb2.ScopePath(org_id=scope.org_id, pillar_id=scope.pillar_id,
                                 team_id=scope.team_id, agent_id=scope.agent_id)


def scope_of(path: context_pb2.ScopePath) -> Scope:
    return Scope(path.org_id, path.pillar_id, path.team_id, path.agent_id)


def now_timestamp() -> Timestamp:
    return timestamp(dt.datetime.now(dt.UTC))


def timestamp(at: dt.datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(at)
    return ts


@dataclass(frozen=True)
class JobMessage:
    key: bytes
    value: bytes
    message_id: str


# Logical streams that are one stream for every org (the others are `<kind>:<org_id>`).
SHARED_STREAMS = frozenset({"metrics:baseline", "audit:access"})


def envelope(kind: str, scope: Scope, payload: Message | bytes) -> JobMessage:
    """Wrap `payload` (a stream.proto message, or bytes already serialised) for the logical stream
    `<kind>:<org_id>` (or the shared stream `kind`), keyed by org_id."""
    message_id = str(uuid.uuid4())
    stream = kind if kind in SHARED_STREAMS else f"{kind}:{scope.org_id}"
    env = stream_pb2.StreamEnvelope(message_id=message_id, stream=stream,
                                    scope=scope_path(scope), created_at=now_timestamp(),
                                    payload=payload if isinstance(payload, bytes) else payload.SerializeToString())
    return JobMessage(scope.org_id.encode(), env.SerializeToString(), message_id)


def open_envelope(raw: bytes, payload_type: type[Message]) -> tuple[stream_pb2.StreamEnvelope, Message]:
    env = stream_pb2.StreamEnvelope.FromString(raw)
    return env, payload_type.FromString(env.payload)


def embedding_job(scope: Scope, event_id: str, chunk_ids: list[str]) -> JobMessage:
    return envelope("embedding", scope, stream_pb2.EmbeddingJob(
        event_id=event_id, chunk_ids=chunk_ids, scope=scope_path(scope), queued_at=now_timestamp()))


def compaction_job(scope: Scope, session_id: str, token_count: int, token_budget: int) -> JobMessage:
    return envelope("compaction", scope, stream_pb2.CompactionJob(
        session_id=session_id, scope=scope_path(scope), current_token_count=token_count,
        token_budget=token_budget, strategy="sliding_window", triggered_at=now_timestamp()))


def reindex_job(scope: Scope, old_model_version: str, new_model_version: str, initiated_by: str) -> JobMessage:
    return envelope("reindex", scope, stream_pb2.ReindexJob(
        scope=scope_path(scope), old_model_version=old_model_version,
        new_model_version=new_model_version, initiated_by=initiated_by, initiated_at=now_timestamp()))


# stream.proto has no message for the PII scan: its envelope carries JSON {"memory_event_id"}.
def pii_scan_job(scope: Scope, memory_event_id: str) -> JobMessage:
    return envelope("pii", scope, orjson.dumps({"memory_event_id": memory_event_id}))


def open_pii_scan_job(raw: bytes) -> tuple[stream_pb2.StreamEnvelope, str]:
    env = stream_pb2.StreamEnvelope.FromString(raw)
    return env, str(orjson.loads(env.payload)["memory_event_id"])


# Neither has the indexing of a long content (projections/projector/deferred_indexing.py): JSON {"source_event_id"}.
def indexing_job(scope: Scope, source_event_id: str) -> JobMessage:
    return envelope("indexing", scope, orjson.dumps({"source_event_id": source_event_id}))


def open_indexing_job(raw: bytes) -> tuple[stream_pb2.StreamEnvelope, str]:
    env = stream_pb2.StreamEnvelope.FromString(raw)
    return env, str(orjson.loads(env.payload)["source_event_id"])


def job_message(request: JobRequest) -> tuple[str, JobMessage]:
    """The stream kind and the envelope of a job the projector asked for."""
    match request:
        case EmbedChunks(scope, event_id, chunk_ids):
            return "embedding", embedding_job(scope, event_id, list(chunk_ids))
        case ScanMemory(scope, memory_event_id):
            return "pii", pii_scan_job(scope, memory_event_id)
        case CompactSession(scope, session_id, token_count, token_budget):
            return "compaction", compaction_job(scope, session_id, token_count, token_budget)
        case IndexSource(scope, source_event_id):
            return "indexing", indexing_job(scope, source_event_id)
    raise TypeError(f"not a job request: {request!r}")


def baseline_metric(scope: Scope, *, prompt_id: str, session_id: str, assembled_tokens: int,
                    naive_tokens: int, model_id: str) -> JobMessage:
    return envelope("metrics:baseline", scope, stream_pb2.BaselineMetricEvent(
        prompt_id=prompt_id, scope=scope_path(scope), session_id=session_id,
        assembled_tokens=assembled_tokens, naive_tokens=naive_tokens, model_id=model_id,
        sampled_at=now_timestamp()))


def baseline_sample(raw: bytes) -> Sample:
    """A metrics:baseline message as the baseline calculator stores it."""
    env, event = open_envelope(raw, stream_pb2.BaselineMetricEvent)
    return Sample(env.message_id, env.scope.org_id, event.prompt_id, event.session_id, event.model_id,
                  event.assembled_tokens, event.naive_tokens, event.sampled_at.ToDatetime(tzinfo=dt.UTC))


def audit_access(attempt: AccessAttempt) -> JobMessage:
    """An AuditAccessEvent for the audit:access stream, keyed by the actor's org."""
    return envelope("audit:access", attempt.actor, stream_pb2.AuditAccessEvent(
        actor_scope=scope_path(attempt.actor), target_resource_id=attempt.resource_id,
        target_resource_type=attempt.resource_type, operation=attempt.operation, share_id=attempt.share_id,
        outcome="allowed" if attempt.allowed else "denied", denial_reason=attempt.denial_reason,
        occurred_at=timestamp(attempt.occurred_at)))


def audit_row(raw: bytes) -> AuditRow:
    """An audit:access message as the audit writer stores it; ValueError (or protobuf's
    DecodeError) for one no publisher writes."""
    env, event = open_envelope(raw, stream_pb2.AuditAccessEvent)
    actor = event.actor_scope
    if actor.org_id != env.scope.org_id:
        raise ValueError("audit event of another org than its envelope")
    return AuditRow(env.message_id, actor.org_id, actor.pillar_id, actor.team_id, actor.agent_id,
                    event.target_resource_type, event.target_resource_id, event.operation, event.share_id,
                    event.outcome, event.denial_reason, event.occurred_at.ToDatetime(tzinfo=dt.UTC))


async def publish(bootstrap: str, topic: str, jobs: Iterable[JobMessage], *, signer: RecordSigner,
                  security: Mapping[str, Any] | None = None) -> None:
    """Send jobs from a one-off command (reindex, pii rescan), each signed (streams/record_auth.py)
    and acknowledged by the broker."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", **(security or {}))
    await producer.start()
    try:
        for job in jobs:
            await producer.send_and_wait(topic, job.value, key=job.key,
                                         headers=signer.headers(topic, job.key, job.value))
    finally:
        await producer.stop()
