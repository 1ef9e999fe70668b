"""`compaction-worker`: CompactionJobs -> session.compacted events (streams/compaction_worker.py),
and the requests a lost job or a failure left open: all of them once at start, then every
`SWEEP_INTERVAL_S` those older than `SWEEP_MIN_AGE_S` (closed as expired once older than the
expiry)."""

from __future__ import annotations

import datetime as dt

import faust
import structlog
from faust.types import StreamT
from google.protobuf.message import DecodeError

from streams.agents.resources import WorkerResources
from streams.agents.sweep import SWEEP_INTERVAL_S, SWEEP_MIN_AGE_S
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
        await (await resources.compactor()).sweep(dt.timedelta(0))

    @app.timer(SWEEP_INTERVAL_S)
    async def compact_lost_requests() -> None:
        await (await resources.compactor()).sweep(dt.timedelta(seconds=SWEEP_MIN_AGE_S))
