"""`session-projector`: the archiver and the read models (sessions, memory, chunks) in one
transaction per batch.

Every domain event is stored verbatim with its topic/partition/offset, then applied to the read
models, then the batch is announced with NOTIFY so the API can acknowledge the commands that
wrote it. Writes are idempotent on event_id, so redelivery (a crash before the offset commit, a
broker that lost its committed offsets) changes nothing. After the commit, the jobs the batch
asked for (chunks without a known vector, PII scans, indexing, compaction) are published, and
the applied `embedding.recorded` events are queued for the `assign_vectors` task. A record it
cannot apply is set aside (rejected_events) and the rest of the batch commits; a failure that is
not an event's own retries the whole batch (`project_batch`).
"""

from __future__ import annotations

import asyncpg
import faust
import structlog
from faust.types import StreamT
from tenacity import AsyncRetrying, RetryCallState, wait_exponential

from context_engine.events import EMBEDDING_RECORDED
from context_engine.metrics import PROJECTOR_BATCH_EVENTS, PROJECTOR_BATCH_SECONDS
from projections.projector.batch import apply_batch
from projections.projector.outcome import Applied, ProjectionOutcome
from projections.projector.records import LogRecord
from streams import readiness
from streams.acknowledgement import announcement
from streams.agents import windowed
from streams.agents.resources import WorkerResources
from streams.jobs import job_message
from streams.windowed_stream import WindowedStream

log = structlog.get_logger("context_engine.worker")

BATCH_MAX = 500
BATCH_WITHIN_S = 0.002


def register_session_projector(app: faust.App, resources: WorkerResources) -> None:
    """The `session-projector` agent, and the readiness mark once it has partitions."""
    events_topic = resources.topics.events

    # mode's SignalHandlerT allows only (sender, *args, signal=...); faust sends (sender, assigned, signal=...)
    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def announce_projecting(sender, assigned, **_kwargs) -> None:
        partitions = sorted(tp.partition for tp in assigned if tp.topic == events_topic)
        if partitions:
            readiness.mark_ready(resources.settings.home_dir, partitions)

    @app.agent(resources.events_topic, name="session-projector")
    async def session_projector(stream: StreamT) -> None:
        await _project(resources, windowed(stream))


async def _project(resources: WorkerResources, stream: WindowedStream) -> None:
    db = await resources.pool()
    assigner = await resources.vector_assigner()
    async for batch in stream.take_events(BATCH_MAX, within=BATCH_WITHIN_S):
        records = [LogRecord(e.message.topic, e.message.partition, e.message.offset, e.value)
                   for e in resources.authentic(batch)]
        if not records:
            continue
        for applied in await project_batch(db, records):
            if applied.type == EMBEDDING_RECORDED and applied.outcome == ProjectionOutcome.APPLIED:
                assigner.put(applied.org_id, applied.event_id)
            for kind, job in map(job_message, applied.jobs):
                await resources.send_job(kind, job)


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


def register_vector_assignment(app: faust.App, resources: WorkerResources) -> None:
    """The `assign_vectors` task: the chunks already written get the vectors of the
    `embedding.recorded` events the projector applied, after its commit (streams/vector_assigner.py),
    beginning with those a previous run left."""

    @app.task
    async def assign_vectors() -> None:
        assigner = await resources.vector_assigner()
        if left := await assigner.resume():
            log.info("resuming vector assignments", events=left)
        await assigner.run()
