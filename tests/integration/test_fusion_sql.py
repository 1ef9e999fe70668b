"""The fused score's SQL rendering (retrieval.fusion: cosine_sql, bm25_sql, recency_sql,
WeightedFusion.score_sql), evaluated by PostgreSQL, equals the Python formula (score_one) for
every signal of a grid: NULL and NaN signals, negative and past-1 cosines, non-positive BM25 and
idf mass, unknown, future and old timestamps, for the default recipe and another one.

Likewise BM25's idf and posting term (retrieval.bm25: idf_sql, term_score_sql) against idf and
bm25_scorer, over a grid of tf, df, N, document length and average length (given, or derived
from the corpus's total length as the lexical leg does), empty corpora and documents included."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import math

import asyncpg
import pytest

from projections.retrieval.bm25 import CorpusStats, bm25_scorer, idf, idf_sql, term_score_sql
from projections.retrieval.fusion import HYBRID, Candidate, WeightedFusion, bm25_sql, cosine_sql, recency_sql

pytestmark = pytest.mark.integration

NOW = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)
COSINES = [None, math.nan, -1.0, -0.3, 0.0, 1e-9, 0.5, 0.999999, 1.0, 1.5]
BM25S = [None, math.nan, -1.0, 0.0, 1e-12, 0.7, 2.5, 3.0, 50.0]
MASSES = [-1.0, 0.0, 1e-6, 2.5, 10.0]
AGES = [None, -3600.0, 0.0, 1.0, 86_400.0, 14 * 86_400.0, 60 * 86_400.0, 3650 * 86_400.0]
# Around the smallest doubles, for both recipes' half-lives (below): 0.5 ** x is subnormal past
# 1022 half-lives, PostgreSQL's power() underflows past 1074, and a weight times it from 1072.
EDGE_HALF_LIVES = [1021.9, 1022.1, 1072.0, 1073.5, 1074.0, 1074.5, 1100.0]


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


OTHER = dataclasses.replace(HYBRID, w_vector=0.2, w_bm25=0.3, w_recency=0.5, recency_half_life_seconds=3600.0)
AGES += [k * recipe.recency_half_life_seconds for recipe in (HYBRID, OTHER) for k in EDGE_HALF_LIVES]
GRID = list(itertools.product(COSINES, BM25S, MASSES, AGES))


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


SCORES = [0.0, 1e-9, 0.2, 0.5, 0.999999, 1.0]
NEIGHBOURS = [None, math.nan, 0.0, 0.1, 0.2, 0.5, 0.8, 1.0]
LIFTS = dataclasses.replace(HYBRID, neighbour_lift=0.0), HYBRID, dataclasses.replace(HYBRID, neighbour_lift=1.0)


@pytest.mark.parametrize("recipe", LIFTS, ids=["no-lift", "hybrid", "full-lift"])
async def test_the_sql_rendering_of_the_adjacent_turn_lift_equals_the_python(postgres_url, recipe):
    grid = list(itertools.product(SCORES, NEIGHBOURS))
    rows = await _fetch(postgres_url, f"""
SELECT i, {recipe.lift_sql("s", "n")} AS lifted
FROM unnest($1::float8[], $2::float8[]) WITH ORDINALITY AS g(s, n, i) ORDER BY i
""", [score for score, _ in grid], [n for _, n in grid])
    assert len(rows) == len(grid)
    for (score, neighbour), row in zip(grid, rows):
        lifted = recipe.lift(score, neighbour)
        assert row["lifted"] == pytest.approx(lifted, rel=1e-12, abs=1e-12), (score, neighbour)
        # never lowers a score, never passes the neighbour's: [0, 1] and the floor keep their meaning
        assert score <= lifted <= max(score, 0.0 if neighbour is None or math.isnan(neighbour) else neighbour)


CORPORA = [(n, df) for n in (0, 1, 2, 10, 1000, 10**7) for df in (0, 1, 2, 9, 500, 10**7) if df <= n]
TFS = [0, 1, 2, 7, 300]
LENGTHS = [0, 1, 16, 250, 10**5]
TIMES = [1, 3]


async def _fetch(postgres_url: str, statement: str, *columns: list) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(postgres_url)
    try:
        return await conn.fetch(statement, *columns)
    finally:
        await conn.close()


def _python_term(tf: int, length: int, times: int, stats: CorpusStats) -> float:
    """bm25_scorer of a query holding the term `times` times, for a document holding it `tf` times."""
    return bm25_scorer(["q"] * times, stats)({"q": tf}, length)


async def test_the_sql_rendering_of_a_bm25_term_with_a_given_average_length_equals_the_python(postgres_url):
    avgdls = [0.0, 1e-9, 0.5, 1.0, 16.0, 12345.6]
    grid = [(n, df, tf, length, times, avgdl) for (n, df), tf, length, times, avgdl
            in itertools.product(CORPORA, TFS, LENGTHS, TIMES, avgdls)]
    statement = f"""
SELECT i, {idf_sql("n", "df")} AS idf,
       {term_score_sql(f"{idf_sql('n', 'df')} * times", "tf", "length", "avgdl")} AS term
FROM unnest($1::bigint[], $2::bigint[], $3::int[], $4::int[], $5::int[], $6::float8[])
     WITH ORDINALITY AS g(n, df, tf, length, times, avgdl, i)
ORDER BY i
"""
    rows = await _fetch(postgres_url, statement, *map(list, zip(*grid)))
    assert len(rows) == len(grid)
    for (n, df, tf, length, times, avgdl), row in zip(grid, rows):
        stats = CorpusStats(n_docs=n, avgdl=avgdl, df={"q": df})
        assert row["idf"] == pytest.approx(idf(n, df), rel=1e-12, abs=1e-12), (n, df)
        want = _python_term(tf, length, times, stats)
        assert row["term"] == pytest.approx(want, rel=1e-12, abs=1e-12), (n, df, tf, length, times, avgdl)


async def test_the_sql_rendering_of_a_bm25_term_with_the_average_of_the_corpus_totals_equals_the_python(
        postgres_url):
    """As the lexical leg writes it: avgdl = total / N, and no length normalisation when the
    corpus's total length is 0 (an empty corpus divides nothing)."""
    totals = [0, 1, 37, 10**5, 10**9]
    grid = [(n, df, tf, length, times, total) for (n, df), tf, length, times, total
            in itertools.product(CORPORA, TFS, LENGTHS, TIMES, totals) if n > 0 or total == 0]
    weight = f"{idf_sql('n', 'df')} * times"
    statement = f"""
SELECT i, {term_score_sql(weight, "tf", "length", "(total::float8 / n)", avgdl_positive="total > 0")} AS term
FROM unnest($1::bigint[], $2::bigint[], $3::int[], $4::int[], $5::int[], $6::bigint[])
     WITH ORDINALITY AS g(n, df, tf, length, times, total, i)
ORDER BY i
"""
    rows = await _fetch(postgres_url, statement, *map(list, zip(*grid)))
    assert len(rows) == len(grid)
    for (n, df, tf, length, times, total), row in zip(grid, rows):
        stats = CorpusStats.from_totals(n, total, {"q": df})
        want = _python_term(tf, length, times, stats)
        assert row["term"] == pytest.approx(want, rel=1e-12, abs=1e-12), (n, df, tf, length, times, total)


def test_the_bm25_rendering_carries_the_recipes_k1_and_b():
    sql = term_score_sql("w", "tf", "len", "avgdl", k1=1.7, b=0.4)
    for number in ("2.7::float8", "1.7::float8", "0.4::float8"):
        assert number in sql
