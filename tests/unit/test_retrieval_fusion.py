"""Fusion: bounded, monotonic in every signal, recency decay, RRF, frozen recipes."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from datetime import datetime, timedelta, timezone

import pytest

from projections.retrieval import fusion
from projections.retrieval.fusion import HYBRID, RRF, Candidate, RRFFusion, WeightedFusion

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
MASS = 4.0


def score(cos=None, bm=None, age_days=None, recipe=HYBRID):
    ts = None if age_days is None else NOW - timedelta(days=age_days)
    return recipe.score_one(Candidate("c", cos, bm, ts), now=NOW, query_idf_mass=MASS).score


def test_default_recipe_is_documented_weights():
    assert (HYBRID.w_vector, HYBRID.w_bm25, HYBRID.w_recency) == (0.45, 0.45, 0.10)
    assert HYBRID.recency_half_life_seconds == 14 * 86_400
    assert score(1.0, 100.0, 0) == pytest.approx(1.0)
    assert score(-1.0, 0.0, None) == 0.0
    # cosine 0.6, half the query's idf mass, two weeks old
    assert score(0.6, 2.0, 14) == pytest.approx(0.45 * 0.6 + 0.45 * 0.5 + 0.10 * 0.5)


def test_scores_always_in_unit_interval():
    rng = random.Random(7)
    for _ in range(2000):
        s = score(rng.uniform(-1, 1), rng.choice([None, rng.uniform(0, 50)]),
                  rng.choice([None, rng.uniform(-5, 400)]))
        assert 0.0 <= s <= 1.0


def test_monotonic_in_each_signal():
    coss = [-1, -0.2, 0, 0.1, 0.4, 0.8, 1]
    bms = [0, 0.5, 1, 2, 4, 8]
    ages = [365, 60, 14, 1, 0]
    for b, a in itertools.product(bms, ages):
        vals = [score(c, b, a) for c in coss]
        assert vals == sorted(vals)
    for c, a in itertools.product(coss, ages):
        vals = [score(c, b, a) for b in bms]
        assert vals == sorted(vals)
    for c, b in itertools.product(coss, bms):
        vals = [score(c, b, a) for a in ages]
        assert vals == sorted(vals)
    # strictly, where the signal is inside its unsaturated range
    assert score(0.5, 1, 3) < score(0.6, 1, 3)
    assert score(0.5, 1, 3) < score(0.5, 2, 3)
    assert score(0.5, 1, 3) < score(0.5, 1, 2)


def test_normalisations():
    assert fusion.normalise_cosine(-0.3) == 0.0 and fusion.normalise_cosine(0.42) == 0.42
    assert fusion.normalise_cosine(None) == 0.0 and fusion.normalise_cosine(float("nan")) == 0.0
    assert fusion.normalise_bm25(2.0, 4.0) == 0.5
    assert fusion.normalise_bm25(9.0, 4.0) == 1.0
    assert fusion.normalise_bm25(2.0, 0.0) == 0.0 and fusion.normalise_bm25(None, 4.0) == 0.0


def test_bm25_normalisation_does_not_depend_on_other_candidates():
    alone = HYBRID.fuse([Candidate("a", 0.3, 1.0)], now=NOW, query_idf_mass=MASS)
    crowd = HYBRID.fuse([Candidate("a", 0.3, 1.0), Candidate("b", 0.9, 40.0)], now=NOW,
                        query_idf_mass=MASS)
    assert alone[0].score == crowd[0].score  # unlike min-max: comparable under a fixed floor


def test_recency_decay():
    hl = HYBRID.recency_half_life_seconds
    w = lambda days: fusion.recency_weight(NOW - timedelta(days=days), NOW, hl)  # noqa: E731
    assert w(0) == 1.0
    assert w(14) == pytest.approx(0.5)
    assert w(28) == pytest.approx(0.25)
    assert w(60) == pytest.approx(0.5 ** (60 / 14))
    assert w(-3) == 1.0  # future timestamps count as now
    assert fusion.recency_weight(None, NOW, hl) == 0.0
    naive = datetime(2025, 12, 18)  # naive timestamps are UTC
    assert fusion.recency_weight(naive, NOW, hl) == pytest.approx(0.5)


def test_fuse_keeps_order_payload_components_and_rejects_duplicates():
    cands = [Candidate("b", 0.2, 1.0, NOW, payload={"x": 1}), Candidate("a", 0.9, None, None)]
    out = HYBRID.fuse(cands, now=NOW, query_idf_mass=MASS)
    assert [o.chunk_id for o in out] == ["b", "a"]
    assert out[0].payload == {"x": 1} and out[0].lexical == 0.25 and out[0].recency == 1.0
    assert out[1].vector == 0.9 and out[1].lexical == 0.0
    with pytest.raises(ValueError):
        HYBRID.fuse([Candidate("a"), Candidate("a")], now=NOW, query_idf_mass=MASS)


def test_recipes_are_frozen_and_copied_with_replace():
    with pytest.raises(dataclasses.FrozenInstanceError):
        HYBRID.w_vector = 0.9  # type: ignore[misc]
    lexical = dataclasses.replace(HYBRID, name="lexical-heavy", w_vector=0.35, w_bm25=0.55)
    assert HYBRID.w_vector == 0.45 and lexical.w_bm25 == 0.55 and lexical.name == "lexical-heavy"
    with pytest.raises(ValueError):
        dataclasses.replace(HYBRID, w_vector=0.9)  # weights must sum to 1
    with pytest.raises(ValueError):
        WeightedFusion(w_vector=1.2, w_bm25=-0.2, w_recency=0.0)
    with pytest.raises(ValueError):
        dataclasses.replace(HYBRID, recency_half_life_seconds=0)
    for lift in (-0.1, 1.1, math.nan):
        with pytest.raises(ValueError):
            dataclasses.replace(HYBRID, neighbour_lift=lift)


def test_a_turn_rises_toward_its_better_neighbour_and_no_further():
    assert HYBRID.neighbour_lift == 0.5
    assert HYBRID.lift(0.2, 0.6) == pytest.approx(0.4)  # half way
    assert HYBRID.lift(0.6, 0.2) == 0.6  # a weaker neighbour takes nothing away
    assert HYBRID.lift(0.3, None) == HYBRID.lift(0.3, math.nan) == 0.3  # no neighbour
    rng = random.Random(11)
    for _ in range(2000):
        own, neighbour = rng.random(), rng.random()
        lifted = HYBRID.lift(own, neighbour)
        assert own <= lifted <= max(own, neighbour) <= 1.0


def test_rrf():
    assert RRF.k == 60 and RRF.name == "rrf-60"
    cands = [
        Candidate("a", 0.9, 1.0),   # vector rank 1, bm25 rank 3
        Candidate("b", 0.5, 5.0),   # vector rank 2, bm25 rank 1
        Candidate("c", 0.1, 3.0),   # vector rank 3, bm25 rank 2
        Candidate("d", None, None),  # in no ranking
    ]
    out = {o.chunk_id: o.score for o in RRF.fuse(cands, now=NOW)}
    top = 2 / 61
    assert out["a"] == pytest.approx((1 / 61 + 1 / 63) / top)
    assert out["b"] == pytest.approx((1 / 62 + 1 / 61) / top)
    assert out["c"] == pytest.approx((1 / 63 + 1 / 62) / top)
    assert out["d"] == 0.0
    assert out["b"] > out["a"] > out["c"]
    first_everywhere = RRF.fuse([Candidate("x", 0.1, 0.1)], now=NOW)[0]
    assert first_everywhere.score == pytest.approx(1.0)
    # ties in a leg are broken by chunk id, so the result is deterministic
    tie = {o.chunk_id: o.score for o in RRF.fuse([Candidate("q", 0.5), Candidate("p", 0.5)], now=NOW)}
    assert tie["p"] > tie["q"]
    with_recency = dataclasses.replace(RRF, w_recency=1.0)
    r = {o.chunk_id: o.score for o in with_recency.fuse(
        [Candidate("old", 0.5, 1.0, NOW - timedelta(days=30)),
         Candidate("new", 0.5, 1.0, NOW)], now=NOW)}
    assert r["new"] > r["old"]
    with pytest.raises(ValueError):
        RRFFusion(w_vector=0, w_bm25=0)
    assert all(0.0 <= o.score <= 1.0 for o in RRF.fuse(cands, now=NOW))
