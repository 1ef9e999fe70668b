"""The confidence gate: a low top score triggers ONE broadened retrieval.

Rule
----
After the first retrieval, look at the top fused score (``results[0].score`` of the fused
candidate set, before the floor is applied). :func:`needs_expansion` is true when there is no
candidate at all or the top score is below ``threshold``. The recommended threshold is the
effective floor itself: expand exactly when the first pass would otherwise answer NO_RESULTS or
BELOW_THRESHOLD.

Broadening (:func:`broaden`) turns the initial :class:`Pool` into a wider one:

* vector candidates ``vector_k`` x4 and HNSW ``ef_search`` x4 (more of the graph is explored);
* BM25 candidates ``bm25_k`` x4;
* the BM25 candidate operator relaxes from AND-ish (a candidate must hold at least half of the
  query's distinct terms, :func:`bm25.minimum_should_match` with fraction 0.5) to OR (any one
  term).

The broadened pass REPLACES the first pass's candidates (its pools hold the first pass's; the
turns Search adds beside its leading candidates may differ) and is classified as usual.
Expansion happens at most once: broadening an expanded pool raises, and
:func:`retrieve_with_gate` calls the retriever at most twice.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence, TypeVar, overload

from projections.retrieval import recipe

__all__ = [
    "BROADEN_FACTOR",
    "DEFAULT_POOL",
    "GateResult",
    "Pool",
    "broaden",
    "needs_expansion",
    "retrieve_with_gate",
    "retrieve_with_gate_async",
]

BROADEN_FACTOR = recipe.BROADEN_FACTOR


@dataclass(frozen=True)
class Pool:
    """How wide one retrieval pass reaches."""

    vector_k: int = recipe.MIN_POOL
    bm25_k: int = recipe.MIN_POOL
    ef_search: int = recipe.FIRST_EF_SEARCH
    bm25_min_match_fraction: float = recipe.BM25_MIN_MATCH_FRACTION
    expanded: bool = False

    def __post_init__(self) -> None:
        if min(self.vector_k, self.bm25_k, self.ef_search) < 1:
            raise ValueError("pool sizes must be >= 1")
        if not 0.0 <= self.bm25_min_match_fraction <= 1.0:
            raise ValueError("bm25_min_match_fraction must be in [0, 1]")


DEFAULT_POOL = Pool()


def needs_expansion(top_score: float | None, threshold: float) -> bool:
    """True when there is no candidate (``None``) or the top score is below ``threshold``."""
    if top_score is None or math.isnan(top_score):
        return True
    return top_score < threshold


def broaden(pool: Pool) -> Pool:
    """The one broadened pool (x4 sizes, BM25 OR). Raises if ``pool`` is already expanded."""
    if pool.expanded:
        raise ValueError("retrieval is broadened at most once")
    return dataclasses.replace(
        pool,
        vector_k=pool.vector_k * BROADEN_FACTOR,
        bm25_k=pool.bm25_k * BROADEN_FACTOR,
        ef_search=pool.ef_search * BROADEN_FACTOR,
        bm25_min_match_fraction=recipe.BROADEN_MIN_MATCH_FRACTION,
        expanded=True,
    )


T = TypeVar("T")


@dataclass(frozen=True)
class GateResult:
    candidates: Any  # the pass that counts: its fused candidates, or what the retriever returns
    pool: Pool
    expansion_applied: bool


def _top(candidates: Sequence) -> float | None:
    return max((c.score for c in candidates), default=None)


def retrieve_with_gate(retrieve: Callable[[Pool], Sequence], threshold: float,
                       pool: Pool = DEFAULT_POOL) -> GateResult:
    """Run ``retrieve(pool)`` (returns fused candidates with ``.score``); if the gate fires, run
    it once more with the broadened pool and keep that pass."""
    first = retrieve(pool)
    if pool.expanded or not needs_expansion(_top(first), threshold):
        return GateResult(first, pool, False)
    wide = broaden(pool)
    return GateResult(retrieve(wide), wide, True)


@overload
async def retrieve_with_gate_async(retrieve: Callable[[Pool], Awaitable[Sequence[Any]]], threshold: float,
                                   pool: Pool = ...) -> GateResult: ...


@overload
async def retrieve_with_gate_async(retrieve: Callable[[Pool], Awaitable[T]], threshold: float,
                                   pool: Pool = ..., *, top_score: Callable[[T], float | None]) -> GateResult: ...


async def retrieve_with_gate_async(retrieve: Callable[[Pool], Awaitable[Any]], threshold: float,
                                   pool: Pool = DEFAULT_POOL, *,
                                   top_score: Callable[[Any], float | None] = _top) -> GateResult:
    """:func:`retrieve_with_gate` for an async retriever. A pass need not be the candidates
    themselves: ``top_score`` reads its top fused score (the candidates' highest by default)."""
    first = await retrieve(pool)
    if pool.expanded or not needs_expansion(top_score(first), threshold):
        return GateResult(first, pool, False)
    wide = broaden(pool)
    return GateResult(await retrieve(wide), wide, True)
