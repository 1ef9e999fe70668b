"""Explicit topic creation: run at start-up before any client touches a topic.

A Metadata request that names a missing topic auto-creates it (tansu: always, 4 partitions;
Kafka: when auto.create.topics.enable), with the wrong partition count for good. So topics are
created here with their configured counts and checked only through all-topics Metadata, which
creates nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import for_code

from streams.kafka_security import client_security

_TOPIC_ALREADY_EXISTS = 36
# Every topic is created taking records this large (Kafka's default is 1 MB, smaller than an event
# with a 1 MiB content once base64-encoded): the events a configured MAX_CONTENT_BYTES allows
# (streams/log.py, record_bytes_limit) stay below it, which config.Settings checks at start.
TOPIC_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
TOPIC_DEFAULT_CONFIGS = {"max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES)}


class TopicSetupError(RuntimeError):
    """A topic could not be created, or exists with other partitions than asked."""


async def ensure_topics(
    bootstrap: str,
    partitions_by_topic: Mapping[str, int],
    *,
    replication_factor: int = 1,
    configs: Mapping[str, Mapping[str, str]] | None = None,
    timeout: float = 15.0,
    security: Mapping[str, Any] | None = None,
) -> None:
    """Create the missing topics with their partition counts; then wait until the cluster
    reports every topic with exactly that many partitions. An existing topic with another
    count is an error (repartitioning would move keys between partitions). `security`: the
    client's SASL/TLS arguments (streams/kafka_security.py)."""
    if not partitions_by_topic:
        return
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000),
                                **(security or {}))
    await admin.start()
    try:
        existing = await _partition_counts(admin)
        missing = [t for t in partitions_by_topic if t not in existing]
        if missing:
            response = await admin.create_topics(
                [NewTopic(t, partitions_by_topic[t], replication_factor,
                          topic_configs={**TOPIC_DEFAULT_CONFIGS, **(configs or {}).get(t, {})})
                 for t in missing],
                timeout_ms=int(timeout * 1000))
            # aiokafka returns per-topic errors instead of raising them.
            for err in response.to_object()["topic_errors"]:
                code = err["error_code"]
                if code not in (0, _TOPIC_ALREADY_EXISTS):
                    raise TopicSetupError(
                        f"creating topic {err['topic']!r} failed: {for_code(code).__name__} "
                        f"({code}) {err.get('error_message') or ''}".rstrip())
        await _await_partition_counts(admin, partitions_by_topic, time.monotonic() + timeout)
    finally:
        await admin.close()


async def ensure_log_topics(settings, bootstrap: str) -> None:
    """Every topic of the engine's log as `settings` configure it: partition counts, copies
    (topic_replication_factor) and the client's SASL/TLS. What each process that may be the first
    to reach the broker runs before any other client touches it."""
    await ensure_topics(bootstrap, LogTopics.from_settings(settings).partitions, security=client_security(settings),
                        replication_factor=settings.topic_replication_factor)


async def _partition_counts(admin: AIOKafkaAdminClient) -> dict[str, int]:
    """Partition count of every topic whose metadata is complete (all-topics request)."""
    return {t["topic"]: len(t["partitions"])
            for t in await admin.describe_topics(None) if t["error_code"] == 0}


async def _await_partition_counts(admin: AIOKafkaAdminClient, wanted: Mapping[str, int],
                                  deadline: float) -> None:
    # Real Kafka propagates new topics to every broker's metadata asynchronously.
    while True:
        counts = await _partition_counts(admin)
        wrong = {t: counts[t] for t, n in wanted.items() if t in counts and counts[t] != n}
        if wrong:
            raise TopicSetupError(
                "topics exist with other partition counts than configured "
                + ", ".join(f"{t}: has {n}, wants {wanted[t]}" for t, n in sorted(wrong.items()))
                + " (was a topic auto-created by a client before start-up created it?)")
        absent = sorted(t for t in wanted if t not in counts)
        if not absent:
            return
        if time.monotonic() > deadline:
            raise TopicSetupError(f"topics not visible after creation: {absent}")
        await asyncio.sleep(0.1)


# Job streams of stream.proto: logical name prefix -> topic suffix. A logical stream such as
# "compaction:org-123" lives on topic "<prefix>.compaction", keyed by org_id (no topic per tenant).
JOB_STREAMS = {
    "embedding": "embedding",
    "compaction": "compaction",
    "reindex": "reindex",
    "metrics:baseline": "metrics-baseline",
    "audit:access": "audit-access",
    "pii": "pii",  # the engine's own: PII scans of pushed memory (docs/pii.md); not in stream.proto
    "indexing": "indexing",  # the engine's own: chunking long contents after the commit (docs/retrieval.md)
}
# Streams no caller waits on: their records do not keep the consumers' fetch wait short.
TELEMETRY_STREAMS = ("metrics:baseline", "audit:access")


class LogTopics:
    """The topic names and partition counts of one deployment."""

    def __init__(self, prefix: str, events_partitions: int, job_partitions: int) -> None:
        self.events = f"{prefix}.events"
        self.jobs = {stream: f"{prefix}.{suffix}" for stream, suffix in JOB_STREAMS.items()}
        self._partitions = {self.events: events_partitions,
                            **{topic: job_partitions for topic in self.jobs.values()}}

    def stream_of(self, topic: str) -> str:
        """The role of one of these topics, as metrics name it: 'events' or a job topic's suffix."""
        return "events" if topic == self.events else topic.rsplit(".", 1)[-1]

    @property
    def telemetry(self) -> frozenset[str]:
        return frozenset(self.jobs[stream] for stream in TELEMETRY_STREAMS)

    @classmethod
    def from_settings(cls, settings) -> "LogTopics":
        return cls(settings.topic_prefix, settings.events_topic_partitions, settings.job_topic_partitions)

    def job_topic(self, stream: str) -> str:
        """Topic of a logical stream name, e.g. 'compaction:org-1' -> '<prefix>.compaction'."""
        kind = stream if stream in self.jobs else stream.split(":", 1)[0]
        return self.jobs[kind]

    @property
    def partitions(self) -> dict[str, int]:
        return dict(self._partitions)
