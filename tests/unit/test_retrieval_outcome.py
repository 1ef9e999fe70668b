"""The one classification (outcome, floor, counts), floor/top_k resolution, the gate."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import pytest

from context_engine.errors import InvalidArgument
from projections.retrieval import confidence_gate as gate
from projections.retrieval import outcome as oc
from projections.retrieval.fusion import ScoredCandidate
from projections.retrieval.outcome import (
    RetrievalOutcome,
    RetrievalResult,
    classify,
    outcome_name,
    resolve_min_score,
    resolve_top_k,
)


@dataclass(frozen=True)
class Hit:
    chunk_id: str
    score: float


def hits(*scores):
    return [Hit(f"c{i:02d}", s) for i, s in enumerate(scores)]


# ---------------------------------------------------------------- classification


def test_no_results():
    r = classify([], 0.7, 10)
    assert r.outcome is RetrievalOutcome.NO_RESULTS
    assert r.results == () and r.results_below_threshold == 0
    assert r.effective_min_score == 0.7 and r.candidates_total == 0
    assert r.confidence_score == 0.0 and r.top_score is None


def test_below_threshold_every_candidate_under_the_floor():
    r = classify(hits(0.69, 0.2, 0.0), 0.7, 10)
    assert r.outcome is RetrievalOutcome.BELOW_THRESHOLD
    assert r.results == () and r.results_below_threshold == 3 and r.candidates_total == 3
    assert r.outcome_name == "below_threshold"


def test_ok_with_some_candidates_below_the_floor():
    r = classify(hits(0.9, 0.1, 0.75, 0.3), 0.7, 10)
    assert r.outcome is RetrievalOutcome.OK
    assert [h.score for h in r.results] == [0.9, 0.75]
    assert r.results_below_threshold == 2  # a partial answer, named as OK
    assert r.confidence_score == pytest.approx((0.9 + 0.75) / 2)


def test_floor_is_inclusive_and_nan_never_clears():
    r = classify(hits(0.7, float("nan")), 0.7, 10)
    assert [h.score for h in r.results] == [0.7] and r.results_below_threshold == 1


def test_below_threshold_count_excludes_top_k_cuts():
    cands = hits(0.95, 0.9, 0.85, 0.8, 0.75, 0.2, 0.1)
    r = classify(cands, 0.7, 2)
    assert [h.score for h in r.results] == [0.95, 0.9]
    assert r.results_below_threshold == 2  # only the floor's victims, not the 3 top_k cut
    assert r.candidates_total == 7
    only_cut = classify(hits(0.9, 0.8, 0.75), 0.5, 1)
    assert only_cut.outcome is RetrievalOutcome.OK and only_cut.results_below_threshold == 0


def test_sorted_by_score_desc_with_stable_chunk_id_tie_break():
    cands = [Hit("b", 0.8), Hit("c", 0.9), Hit("a", 0.8), Hit("d", 0.8)]
    r = classify(cands, 0.5, 3)
    assert [h.chunk_id for h in r.results] == ["c", "a", "b"]
    assert classify(list(reversed(cands)), 0.5, 3).results == r.results


def test_invariants_over_many_sets():
    import random
    rng = random.Random(3)
    for _ in range(500):
        n = rng.randint(0, 12)
        cands = [Hit(f"x{i}", rng.random()) for i in range(n)]
        floor = rng.uniform(0.01, 1.0)
        k = rng.randint(1, 15)
        r = classify(cands, floor, k)
        above = sum(1 for c in cands if c.score >= floor)
        assert r.results_below_threshold == n - above
        assert len(r.results) == min(k, above)
        assert all(h.score >= floor for h in r.results)
        assert r.effective_min_score > 0
        if r.outcome is RetrievalOutcome.NO_RESULTS:
            assert n == 0 and r.results_below_threshold == 0
        elif r.outcome is RetrievalOutcome.BELOW_THRESHOLD:
            assert n > 0 and above == 0 and r.results_below_threshold == n
        else:
            assert r.outcome is RetrievalOutcome.OK and r.results


def test_works_on_fused_candidates_and_validates_inputs():
    cands = [ScoredCandidate("a", 0.8, 0.8, 0.5, 1.0), ScoredCandidate("b", 0.4, 0.4, 0, 0)]
    r = classify(cands, 0.7, 10)
    assert r.outcome is RetrievalOutcome.OK and r.results[0].chunk_id == "a"
    with pytest.raises(ValueError):
        classify(cands, 0.0, 10)  # a floor is never 0
    with pytest.raises(ValueError):
        classify(cands, 0.7, 0)
    with pytest.raises(ValueError):
        classify(cands + cands[:1], 0.7, 10)


def test_not_run_is_unspecified():
    r = RetrievalResult.not_run(0.7)
    assert r.outcome is RetrievalOutcome.UNSPECIFIED and r.results == () and r.effective_min_score == 0.7
    assert r.outcome_name == "unspecified"


# ---------------------------------------------------------------- names


def test_outcome_members_match_the_proto():
    pb = pytest.importorskip("upsquad.context.v1.context_pb2")
    proto = dict(pb.RetrievalOutcome.items())
    assert {m.proto_name: int(m) for m in RetrievalOutcome} == proto


def test_name_is_derived_by_stripping_the_prefix():
    assert outcome_name(RetrievalOutcome.BELOW_THRESHOLD) == "below_threshold"
    assert outcome_name("RETRIEVAL_OUTCOME_NO_RESULTS") == "no_results"
    assert outcome_name(1) == "ok"
    assert oc.name(RetrievalOutcome.DOCUMENT_REF_UNRESOLVED) == "document_ref_unresolved"
    assert RetrievalOutcome.NO_RESULTS.label == "no_results"
    for m in RetrievalOutcome:
        assert outcome_name(m) == m.proto_name.removeprefix("RETRIEVAL_OUTCOME_").lower()
    with pytest.raises(ValueError):
        outcome_name("BELOW_THRESHOLD")
    assert RetrievalOutcome.UNSPECIFIED == 0  # the zero value is the safe-to-forget one


# ---------------------------------------------------------------- min_score / top_k


@pytest.mark.parametrize("requested", [None, 0, 0.0, -0.0])
def test_absent_or_zero_min_score_selects_the_tenant_default(requested):
    assert resolve_min_score(requested, 0.7) == 0.7


@pytest.mark.parametrize("requested", [0.05, 0.5, 0.7, 0.9, 1.0, 1])
def test_explicit_min_score_is_honoured_as_sent(requested):
    assert resolve_min_score(requested, 0.7) == requested  # lower than the default too


@pytest.mark.parametrize("requested", [-0.1, 1.0001, 2, float("nan"), float("inf"), "0.5", True])
def test_invalid_min_score_names_the_field(requested):
    with pytest.raises(InvalidArgument) as e:
        resolve_min_score(requested, 0.7)
    assert e.value.field == "min_score" and "min_score" in str(e.value)


def test_effective_min_score_is_never_zero():
    for requested in (None, 0, 0.0, 1e-9, 0.3, 1.0):
        floor = resolve_min_score(requested, 0.7)
        assert floor > 0
        assert classify(hits(0.5), floor, 10).effective_min_score > 0
    for bad_default in (0, 0.0, -1, 1.5, float("nan")):
        with pytest.raises(ValueError):
            resolve_min_score(None, bad_default)


@pytest.mark.parametrize(("requested", "expected"), [(None, 10), (0, 10), (1, 1), (25, 25),
                                                     (100, 100), (256, 256)])
def test_top_k(requested, expected):
    assert resolve_top_k(requested) == expected


@pytest.mark.parametrize("requested", [-1, 257, 10_000, 2.5, True])
def test_top_k_out_of_bounds_names_the_field(requested):
    with pytest.raises(InvalidArgument) as e:
        resolve_top_k(requested)
    assert e.value.field == "top_k"


# ---------------------------------------------------------------- confidence gate


def test_needs_expansion():
    assert gate.needs_expansion(None, 0.7)
    assert gate.needs_expansion(float("nan"), 0.7)
    assert gate.needs_expansion(0.69, 0.7)
    assert not gate.needs_expansion(0.7, 0.7)
    assert not gate.needs_expansion(0.95, 0.7)


def test_broaden_once():
    wide = gate.broaden(gate.DEFAULT_POOL)
    assert wide.expanded and not gate.DEFAULT_POOL.expanded
    assert wide.vector_k == 4 * gate.DEFAULT_POOL.vector_k
    assert wide.bm25_k == 4 * gate.DEFAULT_POOL.bm25_k
    assert wide.ef_search == 4 * gate.DEFAULT_POOL.ef_search
    assert gate.DEFAULT_POOL.bm25_min_match_fraction == 0.5 and wide.bm25_min_match_fraction == 0.0
    with pytest.raises(ValueError):
        gate.broaden(wide)


def test_retrieve_with_gate_runs_at_most_twice():
    calls = []

    def weak(pool):
        calls.append(pool)
        return hits(0.3) if not pool.expanded else hits(0.3, 0.8)

    res = gate.retrieve_with_gate(weak, 0.7)
    assert res.expansion_applied and len(calls) == 2 and calls[1].expanded
    assert classify(res.candidates, 0.7, 10).outcome is RetrievalOutcome.OK

    calls.clear()
    res = gate.retrieve_with_gate(lambda p: calls.append(p) or [], 0.7)  # still nothing
    assert res.expansion_applied and len(calls) == 2 and res.candidates == []
    assert classify(res.candidates, 0.7, 10).outcome is RetrievalOutcome.NO_RESULTS

    calls.clear()
    res = gate.retrieve_with_gate(lambda p: calls.append(p) or hits(0.9), 0.7)
    assert not res.expansion_applied and len(calls) == 1


def test_retrieve_with_gate_async():
    async def retrieve(pool):
        return hits(0.9) if pool.expanded else hits(0.1)

    res = asyncio.run(gate.retrieve_with_gate_async(retrieve, 0.5))
    assert res.expansion_applied and res.pool.expanded and res.candidates[0].score == 0.9
    assert not math.isnan(res.candidates[0].score)


def test_retrieve_with_gate_async_reads_a_pass_through_top_score():
    @dataclass(frozen=True)
    class Counted:  # what the fusion statement returns: the best few and the top score
        best: list
        top: float | None

    async def retrieve(pool):
        return Counted(hits(0.8), 0.8) if pool.expanded else Counted([], 0.2)

    res = asyncio.run(gate.retrieve_with_gate_async(retrieve, 0.5, top_score=lambda p: p.top))
    assert res.expansion_applied and res.candidates.top == 0.8
    res = asyncio.run(gate.retrieve_with_gate_async(retrieve, 0.1, top_score=lambda p: p.top))
    assert not res.expansion_applied and res.candidates.top == 0.2


# ------------------------------------------------- classification of a ranked, counted set


@pytest.mark.parametrize("scores", [(), (0.69, 0.2, 0.0), (0.9, 0.1, 0.75, 0.3), (0.9, 0.8, 0.75, 0.71, 0.1)])
def test_classify_ranked_agrees_with_classify(scores):
    """The fusion statement floors, ranks and counts in PostgreSQL: naming the outcome from its
    counts gives what classifying the whole set gives."""
    whole = classify(hits(*scores), 0.7, 2)
    above = sorted((h for h in hits(*scores) if h.score >= 0.7), key=lambda h: -h.score)
    ranked = oc.classify_ranked(above[:2], len(above), len(scores), 0.7, 2)
    assert ranked == whole


def test_classify_ranked_refuses_inconsistent_counts():
    with pytest.raises(ValueError, match="inconsistent"):
        oc.classify_ranked(hits(0.9), 2, 3, 0.7, 10)  # 2 cleared the floor, only 1 given
    with pytest.raises(ValueError, match="inconsistent"):
        oc.classify_ranked(hits(0.9), 1, 0, 0.7, 10)  # more above than in all
    with pytest.raises(ValueError, match="clear the floor"):
        oc.classify_ranked(hits(0.5), 1, 1, 0.7, 10)
    with pytest.raises(ValueError, match="top_k"):
        oc.classify_ranked([], 0, 0, 0.7, 0)
