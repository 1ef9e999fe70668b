"""The retrieval recipe (projections/retrieval/recipe.py) is where the retrieval's numbers come
from: the fusion recipe, BM25, the first and broadened pools and assembly's depth read them."""

from __future__ import annotations

import math

import pytest

from projections.retrieval import bm25, recipe
from projections.retrieval.confidence_gate import Pool, broaden
from projections.retrieval.fusion import HYBRID, RRF
from projections.retrieval.recipes import retrieval_depth


def test_the_default_fusion_is_the_recipes_weights_and_half_life():
    assert (HYBRID.w_vector, HYBRID.w_bm25, HYBRID.w_recency) == (recipe.W_VECTOR, recipe.W_LEXICAL, recipe.W_RECENCY)
    assert HYBRID.recency_half_life_seconds == recipe.RECENCY_HALF_LIFE_SECONDS
    assert HYBRID.neighbour_lift == recipe.NEIGHBOUR_LIFT
    assert RRF.k == recipe.RRF_K
    assert math.isclose(recipe.W_VECTOR + recipe.W_LEXICAL + recipe.W_RECENCY, 1.0)


def test_bm25_scores_with_the_recipes_k1_and_b():
    assert (bm25.K1, bm25.B) == (recipe.BM25_K1, recipe.BM25_B)
    stats = bm25.CorpusStats.from_documents([["a", "b"], ["a"], ["c", "c", "c"]])
    plain = bm25.bm25_score(["a"], ["a", "b"], stats)
    assert plain == bm25.bm25_score(["a"], ["a", "b"], stats, k1=recipe.BM25_K1, b=recipe.BM25_B)


def test_the_first_pool_and_its_one_broadening_follow_the_recipe():
    first = Pool()
    assert (first.vector_k, first.bm25_k, first.ef_search) == (recipe.MIN_POOL, recipe.MIN_POOL, recipe.FIRST_EF_SEARCH)
    assert first.bm25_min_match_fraction == recipe.BM25_MIN_MATCH_FRACTION
    wide = broaden(first)
    assert wide.vector_k == recipe.MIN_POOL * recipe.BROADEN_FACTOR
    assert wide.ef_search == recipe.FIRST_EF_SEARCH * recipe.BROADEN_FACTOR
    assert wide.bm25_min_match_fraction == recipe.BROADEN_MIN_MATCH_FRACTION


def test_assembly_depth_uses_the_recipes_overshoot_divisor_and_bounds():
    assert retrieval_depth(2_000, 0, 0) == 2_000 // recipe.TOKENS_PER_RETRIEVED_CHUNK
    assert retrieval_depth(1_000, 31_000, 1_000) == math.ceil(1_000 * recipe.RETRIEVAL_OVERSHOOT / 31)
    assert retrieval_depth(1, 0, 0) == recipe.MIN_RETRIEVAL_DEPTH


def test_search_and_assembly_differ_by_their_named_recipes_only():
    from projections.retrieval.recipes import SEARCH, BudgetDepth, RequestDepth, assembly

    a = assembly(2_000)
    assert (SEARCH.permission, SEARCH.depth, SEARCH.generic_plans) == ("read", RequestDepth(), True)
    assert (a.permission, a.depth, a.generic_plans) == ("use_in_assembly", BudgetDepth(2_000), False)
    assert a.depth.of(31_000, 1_000) == retrieval_depth(2_000, 31_000, 1_000)
    with pytest.raises(AttributeError):
        SEARCH.permission = "use_in_assembly"  # type: ignore[misc]  # frozen: copy, never mutate
