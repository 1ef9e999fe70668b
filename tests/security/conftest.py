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
