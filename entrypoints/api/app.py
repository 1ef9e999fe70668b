"""The ContextEngine API process, and its composition root: the pool, the producer, the archive
watch and the audit trail's publisher live as long as the server, opened before it serves and
closed after it stops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import structlog

from commands import access_audit
from commands.deps import Deps
from commands.read_back import PostgresReadBack
from commands.refusal_budget import RefusalBudget
from commands.session_owners import SessionOwners
from commands.write_budget import WriteBudget
from context_engine.auth import TokenVerifier
from context_engine.config import Settings, required
from context_engine.metrics import serve_metrics
from entrypoints.api.context_servicer import ContextEngineServicer
from entrypoints.api.interceptors import Authentication
from entrypoints.serving.interceptors import ErrorsAndAccessLog
from entrypoints.serving.server import HostedServer, ServiceBinding, build_server, wait_for_termination_signal
from inference.coalescing_embedder import CoalescingEmbedder
from inference.embedder_choice import embedder_from_settings
from inference.query_vectors import QueryVectors
from inference.summarizers.configured import summarizer_from_settings
from projections.store.migrations import APP_ROLE, app_url
from projections.store.pool import create_pool
from streams import readiness
from streams.acknowledgement import ArchiveWatch
from streams.audit import AuditHealth, AuditPublisher, follow_health
from streams.freshness import SessionFreshness
from streams.kafka_security import client_security
from streams.log import EventLog, record_bytes_limit
from streams.record_auth import signer_from_settings
from streams.restore import restore_if_behind
from streams.topics import LogTopics, ensure_log_topics
from upsquad.context.v1 import context_pb2, context_pb2_grpc

log = structlog.get_logger("context_engine.api")

SERVICE_NAME = context_pb2.DESCRIPTOR.services_by_name["ContextEngine"].full_name
# The audit trail's own grpc.health.v1 name: NOT_SERVING while audit events are not published
# (streams/audit.py), while the API itself stays SERVING (docs/operations.md, "The audit trail").
AUDIT_HEALTH_SERVICE = "context_engine.audit"


def api_database_url(settings: Settings) -> str:
    """The API connects as the app role (no BYPASSRLS), never as the admin of database_url."""
    if settings.api_database_url:
        return settings.api_database_url
    path = settings.app_password_path  # written by `up` (supervisor), set by migrate
    return app_url(required(settings.database_url, "database_url"), APP_ROLE,
                   path.read_text().strip() if path.exists() else None)


async def _record_unrecorded_every_second(deps: Deps) -> None:
    """The refusals over their principals' budgets, summarised into the audit trail each second
    (commands/refusal_budget.py)."""
    while True:
        await asyncio.sleep(1.0)
        access_audit.record_unrecorded(deps)


@contextlib.asynccontextmanager
async def open_deps(settings: Settings) -> AsyncIterator[Deps]:
    if not settings.database_url or not settings.kafka_bootstrap:
        raise RuntimeError("the API needs CONTEXT_ENGINE_DATABASE_URL and CONTEXT_ENGINE_KAFKA_BOOTSTRAP "
                           "(`context-engine up` sets both)")
    bootstrap = settings.kafka_bootstrap
    topics = LogTopics.from_settings(settings)
    # Appends are held until the topics exist and the log holds the whole archive: a produce
    # that reaches a fresh broker before its topic exists is lost (shared/ENVIRONMENT.md).
    admin = await create_pool(settings.database_url, org_scoped=False, min_size=1, max_size=1)
    # Every record this process writes is signed (docs/security.md, "The log").
    security, signer = client_security(settings), signer_from_settings(settings)

    async def recover() -> None:
        await ensure_log_topics(settings, bootstrap)
        if settings.restore_log_from_archive:
            await restore_if_behind(bootstrap, topics.events, admin, signer=signer, security=security)

    url = api_database_url(settings)
    pool = await create_pool(url, min_size=2, max_size=16)
    event_log = EventLog(bootstrap, topics, recover, signer=signer, security=security,
                         hold_timeout=settings.ack_timeout_seconds,
                         max_record_bytes=record_bytes_limit(settings.max_content_bytes))
    watch = ArchiveWatch(url, pool)
    audit = AuditPublisher(event_log, topics.jobs["audit:access"])
    # Queries of concurrent calls share model runs (inference/coalescing_embedder.py).
    embedder = CoalescingEmbedder(embedder_from_settings(settings, threads=settings.query_embedder_threads))
    try:
        await event_log.start()
        await watch.start()
        audit.start()
        deps = Deps(settings, event_log, watch, SessionFreshness(settings.freshness_timeout_seconds), pool,
                    SessionOwners(pool), PostgresReadBack(pool), embedder,
                    QueryVectors(embedder, settings.query_vectors_remembered),
                    WriteBudget.from_settings(settings), audit=audit,
                    summarizer=summarizer_from_settings(settings), refusals=RefusalBudget.from_settings(settings))
        summaries = asyncio.create_task(_record_unrecorded_every_second(deps))
        try:
            yield deps
        finally:
            summaries.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await summaries
            access_audit.record_unrecorded(deps)
    finally:
        await audit.stop()  # before the log: what is pending is published first, for a few seconds at most
        await embedder.aclose()
        await watch.stop()
        await event_log.stop()
        await close_pool(pool)
        await close_pool(admin)


async def close_pool(pool, grace: float = 5.0) -> None:
    """Close gracefully, but never hang a shutdown on a connection a cancelled call still holds."""
    try:
        await asyncio.wait_for(pool.close(), grace)
    except (asyncio.TimeoutError, Exception):
        pool.terminate()


def build_api_server(settings: Settings, deps: Deps, address: str | None = None, *,
                     reuse_port: bool = False) -> HostedServer:
    servicer = ContextEngineServicer(deps)
    binding = ServiceBinding(
        SERVICE_NAME, lambda server: context_pb2_grpc.add_ContextEngineServicer_to_server(servicer, server))
    return build_server(
        address or settings.api_address, [binding],
        interceptors=[ErrorsAndAccessLog(settings.rpc_timeout_seconds),
                      Authentication(TokenVerifier(settings), deps.refusals)],
        max_message_bytes=settings.grpc_max_message_bytes, reuse_port=reuse_port,
    )


async def run_api(settings: Settings, process_index: int = 0) -> None:
    async with open_deps(settings) as deps:
        server = build_api_server(settings, deps, reuse_port=settings.api_processes > 1)
        metrics = None
        if settings.metrics_port >= 0:  # bound before serving: a taken port fails the start, not later
            metrics = serve_metrics(settings.api_host, settings.metrics_port and settings.metrics_port + process_index)
        follower = await start_serving(server, settings)
        audit_health = await report_audit_health(server, deps)
        log.info("serving", service=SERVICE_NAME, address=f"{settings.api_host}:{server.port}",
                 process=process_index, metrics=metrics and f"http://{settings.api_host}:{metrics}/metrics")
        signal_name = await wait_for_termination_signal()
        log.info("stopping", signal=signal_name, grace_s=settings.shutdown_grace_seconds)
        if follower is not None:
            follower.cancel()
        if audit_health is not None:
            audit_health.cancel()
        await server.stop(settings.shutdown_grace_seconds)
    log.info("stopped")


async def report_audit_health(server: HostedServer, deps: Deps) -> asyncio.Task | None:
    """The audit publisher's state on AUDIT_HEALTH_SERVICE, and in the log when it changes."""
    if not isinstance(deps.audit, AuditPublisher):
        return None
    await server.set_health(AUDIT_HEALTH_SERVICE, deps.audit.health().ok)

    async def changed(health: AuditHealth) -> None:
        await server.set_health(AUDIT_HEALTH_SERVICE, health.ok)

    return asyncio.create_task(follow_health(deps.audit, changed), name="audit-health")


async def start_serving(server: HostedServer, settings: Settings) -> asyncio.Task | None:
    """Start the server. Under `up` its health follows the worker (streams/readiness.py): an
    IngestEvent cannot be acknowledged while no worker projects, so the API says NOT_SERVING
    then (reads still answer), SERVING again once the restarted worker has its partitions.
    It also begins to listen only once a worker projects: with several API processes on one
    port, one that listened before would answer a health check NOT_SERVING for up to a poll
    after `up` said SERVING. Returns the task that follows the worker, or None when the API
    runs on its own."""
    if not readiness.health_follows_worker():
        await server.start()
        return None
    home = settings.home_dir
    if not readiness.is_ready(home):
        log.info("waiting for the worker to project before listening")
        await readiness.wait_ready(home)
    await server.start()

    async def worker_changed(now_ready: bool) -> None:
        if now_ready:
            log.info("the worker projects again: health SERVING")
        else:
            log.warning("no worker projects: health NOT_SERVING")
        await server.set_serving(now_ready)

    return asyncio.create_task(readiness.follow(home, worker_changed, ready=True), name="worker-readiness")
