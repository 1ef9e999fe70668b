"""The adversarial suite (docs/security.md): every refusal is checked to have written nothing."""

import pytest

from tests.security.deployment import quiet_deployment
from tests.security.row_counts import unchanged


@pytest.fixture
def unchanged_rows(engine):
    """`async with unchanged_rows(): <attack>` fails when any table's row count moved. Only on a
    deployment where nothing else writes meanwhile: modules override `engine` with `quiet_engine`."""
    return lambda admin_url=None: unchanged(admin_url or engine.settings.database_url)


@pytest.fixture(scope="session")
async def quiet_engine(postgres_url, kafka_bootstrap, tmp_path_factory):
    """The suite's shared quiet deployment (`quiet_deployment`), for tests that change no setting."""
    async with quiet_deployment(postgres_url, kafka_bootstrap, tmp_path_factory.mktemp("security-home")) as (engine, _):
        yield engine
