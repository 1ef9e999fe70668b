"""`compaction-worker`: CompactionJobs -> session.compacted events (streams/compaction_worker.py),
and the requests a lost job left open: all of them once at start, then every `SWEEP_INTERVAL_S`
those older than `SWEEP_MIN_AGE_S` but the ones refused for what would refuse them again."""

from __future__ import annotations

import datetime as dt

import faust
import structlog
from faust.types import StreamT
from google.protobuf.message import DecodeError

from streams.agents.resources import WorkerResources
from streams.agents.sweep import SWEEP_INTERVAL_S, SWEEP_MIN_AGE_S
from streams.compaction_worker import CompactionWorker
from streams.jobs import open_envelope
from upsquad.context.v1 import stream_pb2

log = structlog.get_logger("context_engine.compaction")


def register_compaction_worker(app: faust.App, resources: WorkerResources) -> None:
    @app.agent(resources.job_topics["compaction"], name="compaction-worker")
    async def compaction_agent(stream: StreamT) -> None:
        worker = await resources.compactor()
        async for event in stream.events():
            if not resources.authentic([event]):
                continue
            try:
                env, job = open_envelope(event.value, stream_pb2.CompactionJob)
            except DecodeError as exc:  # signed, so a trusted writer's bug: skipped, never a stalled agent
                m = event.message
                log.warning("compaction record skipped: not a CompactionJob", topic=m.topic, partition=m.partition,
                            offset=m.offset, error=str(exc))
                continue
            await worker.job(env.message_id, env.scope.org_id, job.session_id, job.strategy)

    @app.task
    async def compact_open_requests_at_start() -> None:
        await compact_open_requests(await resources.compactor(), dt.timedelta(0), retry=True)

    @app.timer(SWEEP_INTERVAL_S)
    async def compact_lost_requests() -> None:
        await compact_open_requests(await resources.compactor(), dt.timedelta(seconds=SWEEP_MIN_AGE_S), retry=False)


async def compact_open_requests(worker: CompactionWorker, older_than: dt.timedelta, *, retry: bool) -> None:
    """Compact the sessions of open requests (`retry`: also those refused for good in this process)."""
    async for org_id, session_id, opened_by in worker.open_requests(older_than=older_than):
        if retry or opened_by not in worker.settled:
            await worker.compact(org_id, session_id)
