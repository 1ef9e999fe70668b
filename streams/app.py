"""The Faust application that runs the stream workers.

Agents:
- `session-projector` — the archiver and the session read models in one transaction per batch:
  every domain event is stored verbatim with its topic/partition/offset, then applied to the
  read models, then the batch is announced with NOTIFY so the API can acknowledge the commands
  that wrote it. Writes are idempotent on event_id, so redelivery (a crash before the offset
  commit, a broker that lost its committed offsets) changes nothing.

Timeouts follow what measured well on the bundled broker (shared/ENVIRONMENT.md): a short
session timeout and heartbeat make a worker ready in ~3 s after a start or a crash. The bundled
broker holds every fetch for the consumer's full fetch wait even when data is waiting, and
Faust hard-codes that wait at 1.5 s, so the transport below makes it configurable (default
5 ms; measured p50 projection latency 400 ms → 2.4 ms). Topics are created by the engine with
their partition counts before the worker starts, never implicitly by Faust.
"""

from __future__ import annotations

import asyncio

import asyncpg
import faust
import structlog
from faust.transport.drivers import aiokafka as faust_aiokafka

from context_engine.config import Settings
from context_engine.projections.database import create_pool
from context_engine.projections.records import LogRecord
from context_engine.projections.session_projector import apply_batch
from context_engine.streams.log import ARCHIVED_CHANNEL, archived_payloads
from context_engine.streams.topics import LogTopics, ensure_topics

log = structlog.get_logger("context_engine.worker")

APP_ID = "context-engine-workers"
BATCH_MAX = 500
BATCH_WITHIN_S = 0.002


def _low_latency_transport(fetch_max_wait_ms: int) -> type[faust_aiokafka.Transport]:
    class ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
        def _create_worker_consumer(self, transport):
            consumer = super()._create_worker_consumer(transport)
            consumer._fetch_max_wait_ms = fetch_max_wait_ms  # read by AIOKafkaConsumer.start()
            return consumer

    class Consumer(faust_aiokafka.Consumer):
        def _new_consumer_thread(self):
            return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    class Transport(faust_aiokafka.Transport):
        pass

    Transport.Consumer = Consumer
    return Transport


class WorkerApp(faust.App):
    fetch_max_wait_ms = 5

    def _new_transport(self):
        return _low_latency_transport(self.fetch_max_wait_ms)(self.conf.broker_consumer, self)


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
    )
    app.fetch_max_wait_ms = settings.consumer_fetch_max_wait_ms
    topics = LogTopics.from_settings(settings)
    events_topic = app.topic(topics.events, key_type=bytes, value_type=bytes,
                             key_serializer="raw", value_serializer="raw")
    pool_holder: dict[str, asyncpg.Pool] = {}

    async def pool() -> asyncpg.Pool:
        if "pool" not in pool_holder:
            pool_holder["pool"] = await create_pool(settings.database_url, org_scoped=False,
                                                    min_size=1, max_size=2)
        return pool_holder["pool"]

    @app.agent(events_topic, name="session-projector")
    async def session_projector(stream):
        db = await pool()
        async for batch in stream.take_events(BATCH_MAX, within=BATCH_WITHIN_S):
            records = [LogRecord(e.message.topic, e.message.partition, e.message.offset, e.value)
                       for e in batch]
            await project_batch(db, records)

    return app


async def project_batch(pool: asyncpg.Pool, records: list[LogRecord]) -> None:
    """Apply one batch and announce its events, atomically: NOTIFY is delivered at commit."""
    async with pool.acquire() as conn, conn.transaction():
        applied = await apply_batch(conn, records)
        for payload in archived_payloads([(a.event_id, a.outcome) for a in applied]):
            await conn.execute("SELECT pg_notify($1, $2)", ARCHIVED_CHANNEL, payload)


def run_worker(settings: Settings, bootstrap: str) -> None:
    """Run the worker until SIGTERM/SIGINT (Faust's Worker owns signal handling)."""
    asyncio.run(ensure_topics(bootstrap, LogTopics.from_settings(settings).partitions))
    app = create_app(settings, bootstrap)
    worker = faust.Worker(app, loglevel=settings.log_level.lower(), quiet=True)
    worker.execute_from_commandline()
