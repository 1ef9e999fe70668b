"""The Faust application that runs the stream workers.

Agents:
- `session-projector` — the archiver and the read models (sessions, memory, chunks) in one
  transaction per batch: every domain event is stored verbatim with its topic/partition/offset,
  then applied to the read models, then the batch is announced with NOTIFY so the API can
  acknowledge the commands that wrote it. Writes are idempotent on event_id, so redelivery (a
  crash before the offset commit, a broker that lost its committed offsets) changes nothing.
  Chunks the batch added without a known vector are published as EmbeddingJobs. A record it
  cannot apply is set aside (rejected_events) and the rest of the batch commits; a failure that
  is not an event's own retries the whole batch.
- `chunk-indexer` — the chunks of contents over 8 KiB, after the projector's commit
  (projections/deferred_indexing.py).
- `embedding-pipeline` — EmbeddingJobs -> `embedding.recorded` events (streams/embedding_pipeline.py).
- `reindex-worker` — ReindexJobs: re-embed a scope with the running model.
- `baseline-calculator` — BaselineMetricEvents -> savings per org and model
  (projections/savings_projection.py).
- `pii-scanner` — PII scans of pushed memory -> `memory.scrubbed` events (streams/pii_scanner.py).
- every agent first drops the records no trusted writer signed (streams/record_auth.py): unread,
  nothing written anywhere, counted (`context_engine_log_records_refused_total`) and logged by
  position only; and every record the worker writes (events, jobs) is signed.
- a timer sweeps work asked for and not done (indexing still requested, chunks without a vector,
  memory whose PII scan is still pending: a job lost in a crash): everything at start, then
  every `SWEEP_INTERVAL_S` what is older than `SWEEP_MIN_AGE_S`.

Timeouts follow what measured well on the bundled broker (shared/ENVIRONMENT.md): a short
session timeout and heartbeat make a worker ready in ~3 s after a start or a crash. The bundled
broker holds every fetch for the consumer's full fetch wait even when data is waiting, and
Faust hard-codes that wait at 1.5 s, so the transport below makes it configurable (default
5 ms; measured p50 projection latency 400 ms → 2.4 ms), and lengthens it while the log is idle
(streams/fetch_wait.py). Topics are created by the engine with their partition counts before the
worker starts, never implicitly by Faust.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time

import asyncpg
import faust
import structlog
from faust.transport.drivers import aiokafka as faust_aiokafka
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt, wait_exponential

from context_engine.concurrency import background_thread
from context_engine.config import Settings
from context_engine.events import EMBEDDING_RECORDED, Event
from context_engine.guardrails.trust import load_trust
from context_engine.metrics import LOG_RECORDS_REFUSED, PROJECTOR_BATCH_EVENTS, PROJECTOR_BATCH_SECONDS, serve_metrics
from context_engine.scope import Scope
from inference.embedder import embedder_from_settings
from inference.pii_client import PiiClient
from projections import deferred_indexing
from projections.database import create_pool, transaction_state_only
from projections.projector.batch import apply_batch
from projections.projector.outcome import Applied, Outcome
from projections.projector.rejections import is_infrastructure_failure
from projections.records import LogRecord
from projections.savings_projection import apply_samples
from streams import readiness
from streams.acknowledgement import announcement
from streams.embedding_pipeline import EmbeddingPipeline
from streams.fetch_wait import AdaptiveFetchWait
from streams.jobs import (
    baseline_sample,
    embedding_job,
    job_message,
    open_envelope,
    open_indexing_job,
    open_pii_scan_job,
    scope_of,
)
from streams.kafka_security import client_security, faust_credentials
from streams.pii_scanner import PiiScanner
from streams.record_auth import Keyring, RecordSigner, RecordVerifier, Refusal
from streams.topics import LogTopics, ensure_topics
from streams.vector_assigner import VectorAssigner
from streams.windowed_stream import WindowedStream
from upsquad.context.v1 import stream_pb2

log = structlog.get_logger("context_engine.worker")

APP_ID = "context-engine-workers"
BATCH_MAX = 500
BATCH_WITHIN_S = 0.002
JOB_BATCH_MAX = 64
JOB_BATCH_WITHIN_S = 0.02
SWEEP_INTERVAL_S = 30.0
SWEEP_MIN_AGE_S = 600.0
IDLE_AFTER_EMPTY_FETCHES = 200  # ~1 s without records at the 5 ms wait
# Refused records logged per minute at most: a process flooding the broker must not flood this log too.
REFUSALS_LOGGED_PER_MINUTE = 60


def _low_latency_transport(settings: Settings) -> type[faust_aiokafka.Transport]:
    class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
        def _create_worker_consumer(self, transport):
            consumer = super()._create_worker_consumer(transport)
            consumer._fetch_max_wait_ms = settings.consumer_fetch_max_wait_ms  # read by AIOKafkaConsumer.start()
            start = consumer.start

            async def start_with_adaptive_wait() -> None:
                await start()  # creates the fetcher
                background = LogTopics.from_settings(settings).telemetry
                AdaptiveFetchWait(settings.consumer_fetch_max_wait_ms, settings.consumer_idle_fetch_max_wait_ms,
                                  IDLE_AFTER_EMPTY_FETCHES, background).install(consumer._fetcher)

            consumer.start = start_with_adaptive_wait
            return consumer

    class Consumer(faust_aiokafka.Consumer):
        def _new_consumer_thread(self):
            return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    class Transport(faust_aiokafka.Transport):
        pass

    Transport.Consumer = Consumer
    return Transport


class WorkerApp(faust.App):
    engine_settings: Settings

    def _new_transport(self):
        return _low_latency_transport(self.engine_settings)(self.conf.broker_consumer, self)


def create_app(settings: Settings, bootstrap: str) -> faust.App:
    app = WorkerApp(
        APP_ID,
        broker=f"kafka://{bootstrap}",
        store="memory://",
        web_enabled=False,
        topic_allow_declare=False,
        topic_disable_leader=True,
        broker_session_timeout=2.0,
        broker_heartbeat_interval=0.2,
        stream_wait_empty=False,
        consumer_auto_offset_reset="earliest",
        autodiscover=False,
        Stream=WindowedStream,  # batches that do not poll while idle
        datadir=str(settings.home_dir / "worker"),  # not the current directory
        broker_credentials=faust_credentials(settings),  # an external Kafka's SASL / TLS
    )
    app.engine_settings = settings
    topics = LogTopics.from_settings(settings)
    keyring = Keyring.from_settings(settings)
    signer, verifier = RecordSigner(keyring), RecordVerifier(keyring, topics.partitions)
    refused = RefusalLog(topics)

    def authentic(events: list) -> list:
        """The events a trusted writer signed; the others are dropped here, before anything reads
        them (their offsets move on with the batch's)."""
        verifier.refresh()
        kept = []
        for event in events:
            m = event.message
            refusal = verifier.check(m.topic, m.partition, m.key, m.value, m.headers)
            if refusal is None:
                kept.append(event)
            else:
                refused(m.topic, m.partition, m.offset, refusal)
        return kept

    def signed(topic: str, key: bytes, value: bytes) -> dict:
        return {"key": key, "value": value, "headers": signer.headers(topic, key, value)}

    def raw_topic(name: str):
        return app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")

    events_topic = raw_topic(topics.events)
    embedding_topic = raw_topic(topics.jobs["embedding"])
    reindex_topic = raw_topic(topics.jobs["reindex"])
    pii_topic = raw_topic(topics.jobs["pii"])
    indexing_topic = raw_topic(topics.jobs["indexing"])
    job_topics = {"embedding": embedding_topic, "pii": pii_topic, "indexing": indexing_topic,
                  "compaction": raw_topic(topics.jobs["compaction"])}
    holder: dict[str, object] = {}

    async def pool() -> asyncpg.Pool:
        task = holder.get("pool")
        if task is None or (task.done() and task.exception() is not None):  # type: ignore[attr-defined]
            # A task, so that agents starting together share one pool; again if it failed.
            task = holder["pool"] = asyncio.ensure_future(create_pool(
                settings.database_url, org_scoped=False, min_size=1, max_size=5, reset=transaction_state_only))
        return await task  # type: ignore[misc]

    async def send_event(event: Event) -> None:
        delivered = await events_topic.send(**signed(topics.events, event.aggregate.encode(), event.to_bytes()))
        await delivered

    # Loaded now, before the consumer starts: loading the model blocks for a second or more, and a
    # blocked event loop misses the consumer's heartbeats (a 2 s session) under CPU load. Loaded on
    # the thread it runs on, below the projectors' priority, so that onnxruntime's threads inherit
    # that priority too (docs/operations.md, "Background embedding").
    embedding_thread = background_thread("embedder", settings.embedding_niceness,
                                         idle=settings.embedding_idle_priority)
    embedder = embedding_thread.submit(embedder_from_settings, settings, executor=embedding_thread).result()
    # Long contents are cut into chunks below the projectors' priority too (projections/deferred_indexing.py).
    indexing_thread = background_thread("indexer", settings.embedding_niceness, idle=settings.embedding_idle_priority)

    async def pipeline() -> EmbeddingPipeline:
        if "pipeline" not in holder:
            db = await pool()
            if embedder.dimension and embedder.dimension != 384:
                await db.execute("SELECT ensure_vector_index($1)", embedder.dimension)
            holder["pipeline"] = EmbeddingPipeline(db, embedder, send_event,
                                                   batch_size=settings.embedding_batch_size)
        return holder["pipeline"]  # type: ignore[return-value]

    async def scanner() -> PiiScanner:
        if "scanner" not in holder:
            client = PiiClient.from_settings(settings, timeout_seconds=settings.pii_detector_timeout_seconds)
            holder["scanner"] = PiiScanner(await pool(), client, send_event)
        return holder["scanner"]  # type: ignore[return-value]

    async def vector_assigner() -> VectorAssigner:
        db = await pool()  # before the check: the agent and the task must share one queue
        if "assigner" not in holder:
            holder["assigner"] = VectorAssigner(db)
        return holder["assigner"]  # type: ignore[return-value]

    # mode's SignalHandlerT allows only (sender, *args, signal=...); faust sends (sender, assigned, signal=...)
    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def announce_projecting(sender, assigned, **_kwargs) -> None:
        partitions = sorted(tp.partition for tp in assigned if tp.topic == topics.events)
        if partitions:
            readiness.mark_ready(settings.home_dir, partitions)

    @app.agent(events_topic, name="session-projector")
    async def session_projector(stream):
        db = await pool()
        assigner = await vector_assigner()
        async for batch in stream.take_events(BATCH_MAX, within=BATCH_WITHIN_S):
            records = [LogRecord(e.message.topic, e.message.partition, e.message.offset, e.value)
                       for e in authentic(batch)]
            if not records:
                continue
            for applied in await project_batch(db, records):
                if applied.type == EMBEDDING_RECORDED and applied.outcome == Outcome.APPLIED:
                    assigner.put(applied.org_id, applied.event_id)
                for kind, job in map(job_message, applied.jobs):
                    await job_topics[kind].send(**signed(topics.jobs[kind], job.key, job.value))

    async def index(sources_by_org: dict[str, list[str]]) -> None:
        """Index long contents (projections/deferred_indexing.py) and ask for their embeddings. A
        source that fails stays requested: the sweep tries it again."""
        db = await pool()
        for org_id, sources in sources_by_org.items():
            for source in sources:
                try:
                    async for attempt in AsyncRetrying(retry=retry_if_exception_type(asyncpg.TransactionRollbackError),
                                                       stop=stop_after_attempt(3), reraise=True):
                        with attempt:  # a deadlock with the projector, which PostgreSQL broke: again
                            async with db.acquire() as conn:
                                unembedded = await deferred_indexing.index_requested(
                                    conn, org_id, source, executor=indexing_thread)
                except Exception as exc:
                    log.exception("indexing failed; left for the sweep", org_id=org_id, source_event_id=source)
                    if not is_infrastructure_failure(exc):
                        with contextlib.suppress(Exception):
                            async with db.acquire() as conn:
                                await deferred_indexing.record_failure(conn, org_id, source, exc)
                    continue
                for event_id, chunk_ids in unembedded.items():
                    job = embedding_job(Scope(org_id), event_id, chunk_ids)
                    await embedding_topic.send(**signed(topics.jobs["embedding"], job.key, job.value))

    @app.agent(indexing_topic, name="chunk-indexer")
    async def chunk_indexer(stream):
        async for batch in stream.take_events(JOB_BATCH_MAX, within=JOB_BATCH_WITHIN_S):
            by_org: dict[str, list[str]] = {}
            for event in authentic(batch):
                env, source = open_indexing_job(event.value)
                by_org.setdefault(env.scope.org_id, []).append(source)
            await index(by_org)

    @app.agent(embedding_topic, name="embedding-pipeline")
    async def embedding_agent(stream):
        p = await pipeline()
        async for batch in stream.take_events(JOB_BATCH_MAX, within=JOB_BATCH_WITHIN_S):
            by_org: dict[str, list[str]] = {}
            for event in authentic(batch):
                env, job = open_envelope(event.value, stream_pb2.EmbeddingJob)
                by_org.setdefault(env.scope.org_id, []).extend(job.chunk_ids)
            await _embed_orgs(p, by_org)

    @app.agent(reindex_topic, name="reindex-worker")
    async def reindex_agent(stream):
        p = await pipeline()
        async for event in stream.events():
            if not authentic([event]):
                continue
            _env, job = open_envelope(event.value, stream_pb2.ReindexJob)
            scope = scope_of(job.scope)
            if job.new_model_version and job.new_model_version != p.model_version:
                log.error("reindex refused: the running embedder is another model", scope=scope.path,
                          asked=job.new_model_version, running=p.model_version)
                continue
            try:
                n = await p.reindex(scope)
                log.info("reindexed", scope=scope.path, contents=n, model_version=p.model_version)
            except Exception:
                log.exception("reindex failed", scope=scope.path)

    @app.agent(raw_topic(topics.jobs["metrics:baseline"]), name="baseline-calculator")
    async def baseline_agent(stream):
        db = await pool()
        async for batch in stream.take_events(JOB_BATCH_MAX, within=JOB_BATCH_WITHIN_S):
            if samples := [baseline_sample(event.value) for event in authentic(batch)]:
                await apply_samples(db, samples)

    @app.agent(pii_topic, name="pii-scanner")
    async def pii_agent(stream):
        s = await scanner()
        async for event in stream.events():
            if not authentic([event]):
                continue
            env, memory_event_id = open_pii_scan_job(event.value)
            await _scan(s, {env.scope.org_id: [memory_event_id]})

    async def sweep(older_than: dt.timedelta) -> None:
        async with (await pool()).acquire() as conn:
            await index(await deferred_indexing.backlog(conn, older_than=older_than))
        p = await pipeline()
        after = None
        while True:  # the whole backlog, a page at a time (a restart can leave thousands)
            page, after = await p.backlog(older_than=older_than, after=after)
            await _embed_orgs(p, page)
            if after is None:
                break
        s = await scanner()
        await _scan(s, await s.backlog(older_than=older_than))

    @app.timer(SWEEP_INTERVAL_S)
    async def sweep_backlog():
        # Only work older than any queued job should be: a sweep of younger chunks would embed
        # again what the agents are about to (measured: it doubled the work under a backlog).
        await sweep(dt.timedelta(seconds=SWEEP_MIN_AGE_S))

    @app.task
    async def assign_vectors():
        assigner = await vector_assigner()
        if left := await assigner.resume():
            log.info("resuming vector assignments", events=left)
        await assigner.run()

    @app.task
    async def sweep_at_start():
        await sweep(dt.timedelta(0))

    return app


class RefusalLog:
    """What the worker says of a record it refused: always counted (by stream and reason), logged
    by position and key id only, never its content (it may be anything a forger chose), at most
    REFUSALS_LOGGED_PER_MINUTE a minute, then once how many more were not logged."""

    def __init__(self, topics: LogTopics) -> None:
        self._topics = topics
        self._window_started = -60.0
        self._logged = self._unlogged = 0

    def __call__(self, topic: str, partition: int, offset: int, refusal: Refusal) -> None:
        LOG_RECORDS_REFUSED.labels(self._topics.stream_of(topic), refusal.reason).inc()
        now = time.monotonic()
        if now - self._window_started >= 60.0:
            if self._unlogged:
                log.warning("log records refused and not logged", count=self._unlogged, seconds=60)
            self._window_started, self._logged, self._unlogged = now, 0, 0
        if self._logged >= REFUSALS_LOGGED_PER_MINUTE:
            self._unlogged += 1
            return
        self._logged += 1
        log.warning("log record refused: not from a trusted writer", topic=topic, partition=partition,
                    offset=offset, key_id=refusal.key_id, reason=refusal.reason)


async def _scan(s: PiiScanner, memory_ids_by_org: dict[str, list[str]]) -> None:
    """A scan that cannot even fall back (the database or the log is down) stays pending; the
    sweep retries it."""
    for org_id, ids in memory_ids_by_org.items():
        for memory_event_id in ids:
            try:
                await s.scan(org_id, memory_event_id)
            except Exception:
                log.exception("pii scan failed; left for the sweep", org_id=org_id, memory_event_id=memory_event_id)


async def _embed_orgs(p: EmbeddingPipeline, chunk_ids_by_org: dict[str, list[str]]) -> None:
    """Never crash the agent on an embedder failure: the chunks stay in the backlog and the
    sweep retries them."""
    for org_id, ids in chunk_ids_by_org.items():
        try:
            await p.embed_chunks(org_id, ids)
        except Exception:
            log.exception("embedding failed; left for the backlog sweep", org_id=org_id, chunks=len(ids))


async def project_batch(pool: asyncpg.Pool, records: list[LogRecord]) -> list[Applied]:
    """Apply one batch and announce its events, atomically: NOTIFY is delivered at commit.

    An event that cannot be applied is set aside inside `apply_batch`; what still fails here is
    not any event's doing (PostgreSQL restarting, a lost connection), so the same batch is tried
    again until it commits: the partition waits, and nothing in the batch is dropped. Replaying
    a batch is safe: the projector is idempotent on event ids."""
    PROJECTOR_BATCH_EVENTS.observe(len(records))
    async for attempt in AsyncRetrying(wait=wait_exponential(multiplier=0.05, max=2.0),
                                       before_sleep=_log_batch_retry, reraise=True):
        with attempt, PROJECTOR_BATCH_SECONDS.time():
            async with pool.acquire() as conn:
                return await apply_batch(conn, records, notify=announcement)
    raise AssertionError("unreachable: the retry loop returns or raises")


def _log_batch_retry(state: RetryCallState) -> None:
    log.warning("projector batch failed; retrying it", attempt=state.attempt_number,
                error=repr(state.outcome.exception()) if state.outcome else None)


def run_worker(settings: Settings, bootstrap: str) -> None:
    """Run the worker until SIGTERM/SIGINT (Faust's Worker owns signal handling)."""
    load_trust(settings)  # a trust entry that cannot be read stops the start, not a partition later
    if settings.worker_metrics_port >= 0:
        port = serve_metrics(settings.api_host, settings.worker_metrics_port)
        log.info("worker metrics", url=f"http://{settings.api_host}:{port}/metrics")
    asyncio.run(ensure_topics(bootstrap, LogTopics.from_settings(settings).partitions,
                              security=client_security(settings)))
    app = create_app(settings, bootstrap)
    worker = faust.Worker(app, loglevel=settings.log_level.lower(), quiet=True)
    # Faust's terminal spinner: at WARNING or above it sets the root logger to DEBUG so that every
    # record turns it, and then every debug call of aiokafka and Faust builds a LogRecord (5 % of
    # the worker's event loop under ingest load, py-spy). A supervised worker has no terminal.
    worker.spinner = None
    worker.execute_from_commandline()
