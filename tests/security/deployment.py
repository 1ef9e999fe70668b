"""A deployment of a security test module's own: nothing in it writes a row unprompted."""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import AsyncIterator

from entrypoints.embedded.process import free_port
from tests.fixtures.detector_stub import StubDetector
from tests.fixtures.engine import Engine, running_engine


@contextlib.asynccontextmanager
async def quiet_deployment(postgres_url: str, kafka_bootstrap: str,
                           home: pathlib.Path) -> AsyncIterator[tuple[Engine, StubDetector]]:
    """A deployment of a test module's own, with the detector sidecar as the shared one has it
    (its token is the home's, as `up`'s), the worker's metrics served, and no savings sampled: once
    its background work has settled (tests.fixtures.settling.settled), nothing but a request or a
    job writes a row, so a refusal's row counts prove it wrote nothing."""
    detector = StubDetector(free_port(), home / "detector-models", {})
    await detector.start()
    try:
        async with running_engine(postgres_url, kafka_bootstrap, home, extra_env={
                "CONTEXT_ENGINE_DETECTOR_PORT": str(detector.port),
                "CONTEXT_ENGINE_WORKER_METRICS_PORT": str(free_port()),
                "CONTEXT_ENGINE_SAVINGS_SAMPLE_RATE": "0"}) as running:
            yield running, detector
    finally:
        await detector.stop()
