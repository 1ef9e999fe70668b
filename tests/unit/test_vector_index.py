"""The running embedder's HNSW index: made for another dimension than the schema's, never for it."""

from projections.store.vector_index import SCHEMA_DIMENSION, ensure_vector_index


class RecordingPool:
    def __init__(self) -> None:
        self.executed: list[tuple] = []

    async def execute(self, query: str, *args) -> str:
        self.executed.append((query, *args))
        return "SELECT 1"


async def test_another_dimension_gets_its_index():
    pool = RecordingPool()
    await ensure_vector_index(pool, 1536)
    assert pool.executed == [("SELECT ensure_vector_index($1)", 1536)]


async def test_the_schemas_dimension_and_no_dimension_ask_for_nothing():
    pool = RecordingPool()
    await ensure_vector_index(pool, SCHEMA_DIMENSION)
    await ensure_vector_index(pool, 0)
    await ensure_vector_index(pool, None)
    assert pool.executed == []
