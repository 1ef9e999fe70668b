"""The Faust application that runs the stream workers.

`create_app` makes the app, the resources its agents share (streams/agents/resources.py: topics,
record signatures, the pool, the embedder loaded on its background thread) and registers, in this
order, one family of agents at a time (streams/agents/):
- `session-projector` — the archiver and the read models in one transaction per batch, then the
  jobs the batch asked for (streams/agents/projector.py);
- `chunk-indexer` — the chunks of contents over 8 KiB, after the projector's commit
  (streams/agents/indexing.py, projections/projector/deferred_indexing.py);
- `embedding-pipeline` — EmbeddingJobs -> `embedding.recorded` events, and `reindex-worker` —
  ReindexJobs: re-embed a scope with the running model (streams/agents/embedding.py);
- `baseline-calculator` — BaselineMetricEvents -> savings per org and model (streams/agents/savings.py);
- `audit-writer` — AuditAccessEvents -> the audit trail's rows (streams/agents/audit.py);
- `pii-scanner` — PII scans of pushed memory -> `memory.scrubbed` events (streams/agents/pii.py);
- a timer and a start task that sweep work asked for and not done (streams/agents/sweep.py), and
  the task giving written chunks the vectors the projector applied (`assign_vectors`).
Every agent first drops the records no trusted writer signed (streams/record_auth.py): unread,
nothing written anywhere, counted (`context_engine_log_records_refused_total`) and logged by
position only (streams/agents/refusals.py); and every record the worker writes (events, jobs) is
signed.

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
from collections.abc import Callable

import faust
import structlog
from faust.transport.drivers import aiokafka as faust_aiokafka

from context_engine.config import Settings
from context_engine.guardrails.trust import load_trust
from context_engine.logs import logging_config
from context_engine.metrics import serve_metrics
from inference.embedder import Embedder
from inference.embedder_choice import embedder_from_settings
from streams.agents.audit import register_audit_writer
from streams.agents.compaction import register_compaction_worker
from streams.agents.embedding import register_embedding_pipeline, register_reindex_worker
from streams.agents.indexing import register_chunk_indexer
from streams.agents.pii import register_pii_scanner
from streams.agents.projector import project_batch, register_session_projector, register_vector_assignment
from streams.agents.refusals import RefusalLog
from streams.agents.resources import WorkerResources
from streams.agents.savings import register_baseline_calculator
from streams.agents.sweep import register_sweep_at_start, register_sweep_timer
from streams.fetch_wait import AdaptiveFetchWait
from streams.kafka_security import faust_credentials
from streams.topics import LogTopics, ensure_log_topics
from streams.windowed_stream import WindowedStream

__all__ = ["RefusalLog", "WorkerApp", "consumer_group", "create_app", "project_batch", "run_worker"]

log = structlog.get_logger("context_engine.worker")

IDLE_AFTER_EMPTY_FETCHES = 200  # ~1 s without records at the 5 ms wait


def consumer_group(settings: Settings) -> str:
    """The Kafka consumer group of one deployment's workers (Faust's app id), named by its topic
    prefix: deployments that share a cluster then never rebalance, nor lead, each other's
    workers. The default prefix gives the name every deployment once shared, so a default one
    keeps its committed offsets."""
    return f"{settings.topic_prefix}-workers"


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


def create_app(settings: Settings, bootstrap: str, *,
               load_embedder: Callable[..., Embedder] = embedder_from_settings) -> faust.App:
    """The worker's app: its agents, timer and tasks, registered in this order (the tasks start in it)."""
    app = _worker_app(settings, bootstrap)
    # Loads the embedder: before the consumer starts.
    resources = WorkerResources(app, settings, load_embedder=load_embedder)
    register_session_projector(app, resources)
    register_chunk_indexer(app, resources)
    register_embedding_pipeline(app, resources)
    register_reindex_worker(app, resources)
    register_baseline_calculator(app, resources)
    register_audit_writer(app, resources)
    register_pii_scanner(app, resources)
    register_sweep_timer(app, resources)
    register_vector_assignment(app, resources)
    register_sweep_at_start(app, resources)
    register_compaction_worker(app, resources)
    return app


def _worker_app(settings: Settings, bootstrap: str) -> WorkerApp:
    app = WorkerApp(
        consumer_group(settings),
        broker=[f"kafka://{host.strip()}" for host in bootstrap.split(",") if host.strip()],  # a cluster's brokers
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
    return app


def run_worker(settings: Settings, bootstrap: str) -> None:
    """Run the worker until SIGTERM/SIGINT (Faust's Worker owns signal handling)."""
    load_trust(settings)  # a trust entry that cannot be read stops the start, not a partition later
    if settings.worker_metrics_port >= 0:
        port = serve_metrics(settings.api_host, settings.worker_metrics_port)
        log.info("worker metrics", url=f"http://{settings.api_host}:{port}/metrics")
    asyncio.run(ensure_log_topics(settings, bootstrap))
    app = create_app(settings, bootstrap)
    worker = faust.Worker(app, loglevel=settings.log_level.lower(), quiet=True,
                          logging_config=logging_config(settings.log_level, process="worker"))
    # Faust's terminal spinner: at WARNING or above it sets the root logger to DEBUG so that every
    # record turns it, and then every debug call of aiokafka and Faust builds a LogRecord (5 % of
    # the worker's event loop under ingest load, py-spy). A supervised worker has no terminal.
    worker.spinner = None
    worker.execute_from_commandline()
