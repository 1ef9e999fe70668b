"""The fused score's SQL rendering (retrieval.fusion: cosine_sql, bm25_sql, recency_sql,
WeightedFusion.score_sql), evaluated by PostgreSQL, equals the Python formula (score_one) for
every signal of a grid: NULL and NaN signals, negative and past-1 cosines, non-positive BM25 and
idf mass, unknown, future and old timestamps, for the default recipe and another one."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import math

import asyncpg
import pytest

from projections.retrieval.fusion import HYBRID, Candidate, WeightedFusion, bm25_sql, cosine_sql, recency_sql

pytestmark = pytest.mark.integration

NOW = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)
COSINES = [None, math.nan, -1.0, -0.3, 0.0, 1e-9, 0.5, 0.999999, 1.0, 1.5]
BM25S = [None, math.nan, -1.0, 0.0, 1e-12, 0.7, 2.5, 3.0, 50.0]
MASSES = [-1.0, 0.0, 1e-6, 2.5, 10.0]
AGES = [None, -3600.0, 0.0, 1.0, 86_400.0, 14 * 86_400.0, 60 * 86_400.0, 3650 * 86_400.0]


def _statement(recipe: WeightedFusion) -> str:
    return f"""
SELECT i, vector, lexical, recency, {recipe.score_sql("vector", "lexical", "recency")} AS score
FROM (
    SELECT i,
           {cosine_sql("c")} AS vector,
           {bm25_sql("b", "m")} AS lexical,
           {recency_sql("t", "$5::timestamptz", recipe.recency_half_life_seconds)} AS recency
    FROM unnest($1::float8[], $2::float8[], $3::float8[], $4::timestamptz[]) WITH ORDINALITY AS g(c, b, m, t, i)
) AS components
ORDER BY i
"""


GRID = list(itertools.product(COSINES, BM25S, MASSES, AGES))
OTHER = dataclasses.replace(HYBRID, w_vector=0.2, w_bm25=0.3, w_recency=0.5, recency_half_life_seconds=3600.0)


@pytest.mark.parametrize("recipe", [HYBRID, OTHER], ids=["hybrid", "other-weights-and-half-life"])
async def test_the_sql_rendering_of_the_fused_score_equals_the_python_formula(postgres_url, recipe):
    created = [None if age is None else NOW - dt.timedelta(seconds=age) for *_, age in GRID]
    conn = await asyncpg.connect(postgres_url)
    try:
        rows = await conn.fetch(_statement(recipe), [c for c, *_ in GRID], [b for _, b, *_ in GRID],
                                [m for _, _, m, _ in GRID], created, NOW)
    finally:
        await conn.close()
    assert len(rows) == len(GRID)
    for (cosine, bm25, mass, age), when, row in zip(GRID, created, rows):
        expected = recipe.score_one(Candidate("c", cosine, bm25, when), now=NOW, query_idf_mass=mass)
        got = (row["vector"], row["lexical"], row["recency"], row["score"])
        want = (expected.vector, expected.lexical, expected.recency, expected.score)
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12), (cosine, bm25, mass, age)
        assert 0.0 <= row["score"] <= 1.0


def test_the_rendering_carries_the_recipes_numbers():
    sql = OTHER.score_sql("v", "l", "r") + recency_sql("t", "now()", OTHER.recency_half_life_seconds)
    for number in ("0.2::float8", "0.3::float8", "0.5::float8", "3600.0::float8"):
        assert number in sql
