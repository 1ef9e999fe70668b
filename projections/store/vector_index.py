"""The chunks' HNSW index for the running embedder's dimension.

pgvector indexes one fixed dimension, so `chunks` has one partial HNSW index per dimension. The
default embedder's (384) comes with the schema (projections/store/sql/0003_retrieval.sql); another
dimension (a configured OpenAI-compatible model, e.g. 1536) gets its index when the worker
first embeds with it, through the SQL function `ensure_vector_index` (CREATE INDEX IF NOT EXISTS).
"""

from __future__ import annotations

import asyncpg

SCHEMA_DIMENSION = 384  # chunks_embedding_384, created by the migrations


async def ensure_vector_index(pool: asyncpg.Pool, dimension: int | None) -> None:
    """Create the index for `dimension` unless the schema has it (or the embedder names none)."""
    if dimension and dimension != SCHEMA_DIMENSION:
        await pool.execute("SELECT ensure_vector_index($1)", dimension)
