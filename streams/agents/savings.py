"""`baseline-calculator`: BaselineMetricEvents -> savings per org and model
(projections/projector/savings.py)."""

from __future__ import annotations

import faust
from faust.types import StreamT

from projections.projector.savings import apply_samples
from streams.agents import JOB_BATCH_MAX, JOB_BATCH_WITHIN_S, windowed
from streams.agents.resources import WorkerResources
from streams.jobs import baseline_sample


def register_baseline_calculator(app: faust.App, resources: WorkerResources) -> None:
    @app.agent(resources.job_topics["metrics:baseline"], name="baseline-calculator")
    async def baseline_agent(stream: StreamT) -> None:
        db = await resources.pool()
        async for batch in windowed(stream).take_events(JOB_BATCH_MAX, within=JOB_BATCH_WITHIN_S):
            if samples := [baseline_sample(event.value) for event in resources.authentic(batch)]:
                await apply_samples(db, samples)
