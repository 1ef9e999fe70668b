"""What the worker's agents share, made once per process (`WorkerResources`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import faust
from faust.types import EventT, TopicT

from context_engine.concurrency import BackgroundProcess, background_thread
from context_engine.config import Settings
from context_engine.events import Event
from inference.embedder import Embedder
from inference.embedder_choice import embedder_from_settings
from inference.pii_client import PiiClient
from inference.summarizers.configured import summarizer_from_settings
from projections.store.pool import create_pool, transaction_state_only
from projections.store.vector_index import ensure_vector_index
from streams.agents.refusals import RefusalLog
from streams.compaction_worker import CompactionWorker
from streams.embedding_pipeline import EmbeddingPipeline
from streams.jobs import JobMessage
from streams.pii_scanner import PiiScanner
from streams.record_auth import Keyring, RecordSigner, RecordVerifier
from streams.topics import LogTopics
from streams.vector_assigner import VectorAssigner

# The job streams the worker consumes or publishes, each one faust topic shared by both.
JOB_KINDS = ("embedding", "reindex", "pii", "indexing", "compaction", "metrics:baseline", "audit:access")


class WorkerResources:
    """The settings; the log's topics; signing what the worker writes and checking what it reads;
    one database pool; the embedder, loaded at start on its background thread, and the indexer's
    process; and the embedding pipeline, the PII scanner, the compaction worker and the vector
    assigner, each made when an
    agent first asks for it and then shared."""

    def __init__(self, app: faust.App, settings: Settings, *,
                 load_embedder: Callable[..., Embedder] = embedder_from_settings,
                 connect: Callable[..., Awaitable[asyncpg.Pool]] = create_pool) -> None:
        """`load_embedder(settings, executor=)` and `connect(url, **pool_settings)`: the embedder's
        and the database's adapters (a test gives fakes)."""
        self.settings = settings
        self._connect = connect
        self.topics = LogTopics.from_settings(settings)
        keyring = Keyring.from_settings(settings)
        self._signer = RecordSigner(keyring)
        self._verifier = RecordVerifier(keyring, self.topics.partitions)
        self._refused = RefusalLog(self.topics)
        self.events_topic = _raw_topic(app, self.topics.events)
        self.job_topics = {kind: _raw_topic(app, self.topics.jobs[kind]) for kind in JOB_KINDS}
        self._pool: asyncio.Future[asyncpg.Pool] | None = None
        self._pipeline: EmbeddingPipeline | None = None
        self._scanner: PiiScanner | None = None
        self._assigner: VectorAssigner | None = None
        self._compactor: CompactionWorker | None = None
        # Loaded now, before the consumer starts: loading the model blocks for a second or more, and a
        # blocked event loop misses the consumer's heartbeats (a 2 s session) under CPU load. Loaded on
        # the thread it runs on, below the projectors' priority, so that onnxruntime's threads inherit
        # that priority too (docs/operations.md, "Background embedding").
        self.embedding_thread = background_thread("embedder", settings.embedding_niceness,
                                                  idle=settings.embedding_idle_priority)
        self.embedder = self.embedding_thread.submit(load_embedder, settings,
                                                     executor=self.embedding_thread).result()
        # Long contents are cut into chunks (below the projectors' priority too) and written in a
        # process of their own with a connection of its own: in this one, that pure Python would
        # hold the GIL the projector's event loop needs. The process itself runs at this one's
        # priority, as its writes hold locks the projector waits for; only its cutting thread is
        # lowered (projections/projector/indexer_process.py).
        self.indexing_process = BackgroundProcess(0, name="ce-indexer")

    def authentic(self, events: Sequence[EventT]) -> list[EventT]:
        """The events a trusted writer signed; the others are dropped here, before anything reads
        them (their offsets move on with the batch's)."""
        self._verifier.refresh()
        kept = []
        for event in events:
            m = event.message
            refusal = self._verifier.check(m.topic, m.partition, m.key, m.value, m.headers)
            if refusal is None:
                kept.append(event)
            else:
                self._refused(m.topic, m.partition, m.offset, refusal)
        return kept

    def signed(self, topic: str, key: bytes, value: bytes) -> dict[str, Any]:
        return {"key": key, "value": value, "headers": self._signer.headers(topic, key, value)}

    async def send_job(self, kind: str, job: JobMessage) -> None:
        """Publish a job, signed (not waiting for the broker's acknowledgement)."""
        await self.job_topics[kind].send(**self.signed(self.topics.jobs[kind], job.key, job.value))

    async def send_event(self, event: Event) -> None:
        """Append a domain event, signed, and wait until the broker has it."""
        delivered = await self.events_topic.send(**self.signed(self.topics.events, event.aggregate.encode(),
                                                               event.to_bytes()))
        await delivered

    async def pool(self) -> asyncpg.Pool:
        task = self._pool
        if task is None or (task.done() and task.exception() is not None):
            # A task, so that agents starting together share one pool; again if it failed.
            task = self._pool = asyncio.ensure_future(self._connect(
                self.settings.database_url, org_scoped=False, min_size=1, max_size=5,
                reset=transaction_state_only))
        return await task

    async def pipeline(self) -> EmbeddingPipeline:
        if self._pipeline is None:
            db = await self.pool()
            await ensure_vector_index(db, self.embedder.dimension)
            self._pipeline = EmbeddingPipeline(db, self.embedder, self.send_event,
                                               batch_size=self.settings.embedding_batch_size)
        return self._pipeline

    async def scanner(self) -> PiiScanner:
        if self._scanner is None:
            client = PiiClient.from_settings(self.settings, timeout_seconds=self.settings.pii_detector_timeout_seconds)
            self._scanner = PiiScanner(await self.pool(), client, self.send_event)
        return self._scanner

    async def compactor(self) -> CompactionWorker:
        db = await self.pool()
        if self._compactor is None:
            s = self.settings
            self._compactor = CompactionWorker(db, summarizer_from_settings(s), self.send_event,
                                               enabled=s.compaction_on_threshold,
                                               keep_recent=s.compaction_keep_recent_turns,
                                               max_content_bytes=s.max_content_bytes,
                                               verdict_timeout_s=max(30.0, s.ack_timeout_seconds),
                                               min_savings=s.compaction_min_savings,
                                               request_expiry_s=s.compaction_request_expiry_seconds)
        return self._compactor

    async def vector_assigner(self) -> VectorAssigner:
        db = await self.pool()  # before the check: the agent and the task must share one queue
        if self._assigner is None:
            self._assigner = VectorAssigner(db)
        return self._assigner


def _raw_topic(app: faust.App, name: str) -> TopicT:
    return app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
