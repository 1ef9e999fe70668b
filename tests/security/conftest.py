"""The adversarial suite (docs/security.md): every refusal is checked to have written nothing."""

import pytest

from tests.security.row_counts import changed, row_counts


@pytest.fixture
def unchanged_rows(engine):
    """Use as `async with unchanged_rows(): <attack>`: fails when any table's row count moved.
    Only for attacks on the shared engine that no other test writes to meanwhile (tests run in one
    process, one at a time; the worker's own sweeps write nothing when nothing is pending)."""
    import contextlib

    @contextlib.asynccontextmanager
    async def guard(admin_url: str | None = None):
        url = admin_url or engine.settings.database_url
        before = await row_counts(url)
        yield
        assert changed(before, await row_counts(url)) == {}

    return guard


@pytest.fixture(scope="session")
async def quiet_engine(postgres_url, kafka_bootstrap, tmp_path_factory):
    """A deployment of the suite's own, with the detector sidecar as the shared one has it, that
    samples no savings: once its background work has settled (tests.security.world.settled),
    nothing but a request writes a row, so a refusal's row counts prove it wrote nothing."""
    from context_engine.embedded.process import free_port
    from tests.fixtures.detector_stub import StubDetector
    from tests.fixtures.engine import running_engine

    home = tmp_path_factory.mktemp("security-home")
    detector = StubDetector(free_port(), home / "detector-models", {})
    await detector.start()
    try:
        async with running_engine(postgres_url, kafka_bootstrap, home, extra_env={
                "CONTEXT_ENGINE_DETECTOR_PORT": str(detector.port),
                "CONTEXT_ENGINE_SAVINGS_SAMPLE_RATE": "0"}) as running:
            yield running
    finally:
        await detector.stop()
