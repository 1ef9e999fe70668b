"""Fusion: vector similarity + BM25 + recency -> one score in [0, 1].

A FIXED floor (``effective_min_score``) is applied to the fused score, so the fused score has
to mean the same thing for every query. Every normalisation below is therefore a function of
the candidate and the query only, never of the other candidates.

Default recipe :data:`HYBRID` (``WeightedFusion``)::

    score = 0.45 * v + 0.45 * l + 0.10 * r                      (weights sum to 1)

    v = max(0, cosine)                                           vector leg, in [0, 1]
    l = min(1, bm25 / sum_i idf(q_i))                            lexical leg, in [0, 1]
    r = 0.5 ** (max(0, age) / half_life),  half_life = 14 days   recency, in (0, 1]

    final = score + 0.5 * max(0, neighbour - score)              adjacent-turn lift (below)

Why these normalisations
------------------------
* **Vector.** Cosine is in [-1, 1]. For sentence-embedding models a negative cosine carries no
  more "irrelevance" than 0, and the affine map ``(1 + c) / 2`` would score every unrelated
  text about 0.5 — half way to any floor. Clamping at 0 keeps the absolute meaning of the
  similarity: cosine 0.6 contributes 0.6.
* **BM25.** Raw BM25 is unbounded and its scale grows with the number of query terms and their
  idf (a one-word query's best match scores ~2, a ten-word query's ~20), so a fixed
  saturation ``s / (s + k)`` is not comparable across queries; min-max over the candidate set
  gives the best candidate 1.0 even when it is junk, which would defeat the floor. Dividing by
  the query's own idf mass ``sum_i idf(q_i)`` (:func:`bm25.query_idf_mass`) — the score a
  document of average length gets when it holds every query term exactly once — gives the
  fraction of the query's information the document covers. It depends on the query and the
  corpus statistics, not on which other candidates were retrieved; it is clamped at 1
  (repeated terms or a short document can exceed full coverage).
* **Recency.** Exponential decay with a 14-day half-life: a chunk a fortnight old keeps half its
  recency credit, two months old about 5 %. A timestamp in the future counts as age 0; an
  unknown timestamp contributes 0.

Weights: the vector leg (paraphrase) and BM25 (exact names, numbers, rare words the embedder
blurs) share 0.90 equally; recency is a tie-breaker that can never on its own lift an
unrelated chunk over a floor above 0.10. Measured on LoCoMo (dialog turns, categories 1-4,
1,536 questions, MiniLM-L6 int8, this analyzer), evidence recall R@5/10/25 without recency:
0.45/0.45 -> .540/.623/.712; 0.55/0.35 -> .529/.606/.701; 0.35/0.55 -> .547/.623/.708; plain
BM25 .497/.568/.634, plain dense .372/.455/.588, RRF .457/.534/.658. The optimum is flat
between 0.35 and 0.45 on the vector side; equal weights sit in the middle of it.

Scale: on that data the top fused score (without recency) has median 0.46 and 10th percentile
0.32, and the best evidence turn a median of 0.35; a fresh chunk adds up to 0.10 of recency.
A floor of 0.7 therefore rejects most genuine answers: calibrate ``retrieval_min_score``
against this scale (the default is 0.25 for MiniLM, docs/retrieval.md), not against raw cosine habits.

A candidate missing a leg's signal (``None``) gets 0 from that leg. The wiring should compute
BOTH signals for the union of the two legs' candidates (the vector is stored with the chunk and
the term frequencies are stored per chunk), so ``None`` is a fallback, not the normal case.

Adjacent turns: ``neighbour`` is the best score of the candidates near this one in its session
(the turns up to two before and after it, ``recipe.NEIGHBOUR_REACH``, or its own message's
chunks as near), and the lift raises a turn half way toward it (``recipe.NEIGHBOUR_LIFT``). A question's answer often
shares few words or little meaning with the question, while the turn before it (the question
asked in the conversation) shares many. It is the one term that depends on other candidates,
and only on their absolute scores: a lifted score never passes its neighbour's, so the floor
still means "this close to the query, or next to a turn that is". Search states it per result
(``engine.score.neighbour``).

Alternative recipe :data:`RRF` (``RRFFusion``): Reciprocal Rank Fusion,
``sum_leg w_leg / (k + rank_leg)`` with ``k = 60`` and ranks 1-based within the candidate set,
divided by its maximum ``sum_leg w_leg / (k + 1)`` so a candidate ranked first by every leg
scores 1.0. RRF is rank-based: its score says where a candidate stood among THIS query's
candidates, not how relevant it is, so under RRF a floor is a rank-position floor. It is a
named alternative for ranking experiments, not the default.

Recipes are frozen dataclasses; derive a variant with ``dataclasses.replace(HYBRID, ...)``.
Their default values are the retrieval recipe's (:mod:`recipe`).

In SQL
------
Search fuses in PostgreSQL (projections/reads/search.py). Each normalisation above has its SQL
rendering beside it (``cosine_sql``, ``bm25_sql``, ``recency_sql``, ``WeightedFusion.score_sql``),
and the statement is built from them, so the weights and the half-life are the recipe's values
and nowhere else. tests/integration/test_fusion_sql.py evaluates the renderings in PostgreSQL over
a grid of signals (NULL, NaN, negative, past 1, future timestamps) against the Python functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Sequence, Union

from projections.retrieval import recipe

__all__ = [
    "HYBRID",
    "RRF",
    "Candidate",
    "FusionRecipe",
    "RRFFusion",
    "ScoredCandidate",
    "WeightedFusion",
    "normalise_bm25",
    "normalise_cosine",
    "recency_weight",
    "bm25_sql",
    "cosine_sql",
    "recency_sql",
]

DAY = recipe.DAY


@dataclass(frozen=True)
class Candidate:
    """One chunk from either leg, with the raw signals it has."""

    chunk_id: str
    cosine: float | None = None  # in [-1, 1]
    bm25: float | None = None  # raw BM25, >= 0
    created_at: datetime | None = None  # timezone-aware
    payload: Any = field(default=None, compare=False)  # carried through untouched


@dataclass(frozen=True)
class ScoredCandidate:
    """A candidate with its fused score and the normalised components that made it."""

    chunk_id: str
    score: float
    vector: float
    lexical: float
    recency: float
    payload: Any = field(default=None, compare=False)
    neighbour: float = 0.0  # the best nearby candidate's score before its lift (WeightedFusion.lift)


def normalise_cosine(cosine: float | None) -> float:
    """``max(0, cosine)`` clamped to [0, 1]; ``None``/NaN -> 0."""
    if cosine is None or math.isnan(cosine):
        return 0.0
    return min(1.0, max(0.0, cosine))


def cosine_sql(cosine: str) -> str:
    """:func:`normalise_cosine` of the float8 SQL expression ``cosine``. PostgreSQL orders NaN
    above every number, so NaN (like NULL) is spelled out as 0."""
    return (f"CASE WHEN {cosine} IS NULL OR {cosine} = 'NaN'::float8 THEN 0.0::float8\n"
            f"                ELSE least(1.0::float8, greatest(0.0::float8, {cosine})) END")


def normalise_bm25(score: float | None, query_idf_mass: float) -> float:
    """``min(1, score / query_idf_mass)``; 0 when either is missing or non-positive."""
    if score is None or math.isnan(score) or score <= 0 or query_idf_mass <= 0:
        return 0.0
    return min(1.0, score / query_idf_mass)


def bm25_sql(score: str, query_idf_mass: str) -> str:
    """:func:`normalise_bm25` of the float8 SQL expressions ``score`` and ``query_idf_mass``
    (NULL or NaN BM25 -> 0, as ``None`` and NaN in Python)."""
    return (f"CASE WHEN {query_idf_mass} > 0 AND {score} > 0 AND {score} <> 'NaN'::float8\n"
            f"                THEN least(1.0::float8, {score} / {query_idf_mass}) ELSE 0.0::float8 END")


def _age_seconds(created_at: datetime, now: datetime) -> float:
    if created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=timezone.utc)
    if now.tzinfo is None:
        now = now.replace(tzinfo=timezone.utc)
    return max(0.0, (now - created_at).total_seconds())


#: Half-lives past which recency counts as 0, in Python and in SQL alike. 0.5 ** 1022 is the
#: smallest normal double: further on, PostgreSQL's power() raises "value out of range:
#: underflow" (past 1074) and so does its multiplication by a weight when the product rounds to 0
#: (1072–1074), where Python computes a subnormal; so both answer 0, and stay equal.
NEGLIGIBLE_HALF_LIVES = 1022.0


def recency_weight(created_at: datetime | None, now: datetime, half_life_seconds: float) -> float:
    """``0.5 ** (age / half_life)`` in (0, 1]; unknown timestamp, or older than
    NEGLIGIBLE_HALF_LIVES half-lives -> 0."""
    if created_at is None:
        return 0.0
    half_lives = _age_seconds(created_at, now) / half_life_seconds
    return 0.0 if half_lives > NEGLIGIBLE_HALF_LIVES else 0.5 ** half_lives


def recency_sql(created_at: str, now: str, half_life_seconds: float) -> str:
    """:func:`recency_weight` of the timestamptz SQL expressions ``created_at`` and ``now``."""
    half_lives = (f"greatest(0.0::float8, extract(epoch FROM {now} - {created_at})::float8)\n"
                  f"                                        / {float(half_life_seconds)!r}::float8")
    return (f"CASE WHEN {created_at} IS NULL THEN 0.0::float8\n"
            f"                WHEN {half_lives} > {NEGLIGIBLE_HALF_LIVES!r}::float8 THEN 0.0::float8\n"
            f"                ELSE power(0.5::float8, {half_lives}) END")


def _check_unique(candidates: Sequence[Candidate]) -> None:
    ids = [c.chunk_id for c in candidates]
    if len(set(ids)) != len(ids):
        raise ValueError("candidates must be unique by chunk_id (merge the legs first)")


@dataclass(frozen=True)
class WeightedFusion:
    """Weighted sum of normalised signals (see the module docstring)."""

    name: str = "hybrid-v3"
    w_vector: float = recipe.W_VECTOR
    w_bm25: float = recipe.W_LEXICAL
    w_recency: float = recipe.W_RECENCY
    recency_half_life_seconds: float = recipe.RECENCY_HALF_LIFE_SECONDS
    neighbour_lift: float = recipe.NEIGHBOUR_LIFT

    def __post_init__(self) -> None:
        ws = (self.w_vector, self.w_bm25, self.w_recency)
        if any(w < 0 or math.isnan(w) for w in ws):
            raise ValueError("fusion weights must be >= 0")
        if not math.isclose(sum(ws), 1.0, abs_tol=1e-9):
            raise ValueError(f"fusion weights must sum to 1, got {sum(ws)}")
        if not self.recency_half_life_seconds > 0:
            raise ValueError("recency_half_life_seconds must be > 0")
        if not 0 <= self.neighbour_lift <= 1:
            raise ValueError("neighbour_lift must be in [0, 1]")

    def score_one(self, c: Candidate, *, now: datetime, query_idf_mass: float) -> ScoredCandidate:
        v = normalise_cosine(c.cosine)
        lex = normalise_bm25(c.bm25, query_idf_mass)
        r = recency_weight(c.created_at, now, self.recency_half_life_seconds)
        s = self.w_vector * v + self.w_bm25 * lex + self.w_recency * r
        return ScoredCandidate(c.chunk_id, min(1.0, max(0.0, s)), v, lex, r, c.payload)

    def score_sql(self, vector: str, lexical: str, recency: str) -> str:
        """The fused score of :meth:`score_one` in SQL, of the normalised components' SQL
        expressions (``cosine_sql``, ``bm25_sql``, ``recency_sql``): the weighted sum clamped
        to [0, 1]."""
        return (f"least(1.0::float8, greatest(0.0::float8, {float(self.w_vector)!r}::float8 * {vector}\n"
                f"                                          + {float(self.w_bm25)!r}::float8 * {lexical}"
                f" + {float(self.w_recency)!r}::float8 * {recency}))")

    def lift(self, score: float, neighbour: float | None) -> float:
        """``score`` raised toward its best adjacent candidate's ``neighbour`` score:
        ``score + neighbour_lift · max(0, neighbour − score)``. Never lowers a score and never
        passes the neighbour's, so it stays in [0, 1] and a floor keeps its meaning; no
        neighbour (``None``/NaN) -> ``score``."""
        if neighbour is None or math.isnan(neighbour):
            return score
        return score + self.neighbour_lift * max(0.0, neighbour - score)

    def lift_sql(self, score: str, neighbour: str) -> str:
        """:meth:`lift` of the float8 SQL expressions ``score`` and ``neighbour``."""
        return (f"CASE WHEN {neighbour} IS NULL OR {neighbour} = 'NaN'::float8 THEN {score}\n"
                f"                ELSE {score} + {float(self.neighbour_lift)!r}::float8"
                f" * greatest(0.0::float8, {neighbour} - {score}) END")

    def fuse(self, candidates: Sequence[Candidate], *, now: datetime,
             query_idf_mass: float) -> list[ScoredCandidate]:
        """Fused scores, in input order (ordering is :mod:`outcome`'s job)."""
        _check_unique(candidates)
        return [self.score_one(c, now=now, query_idf_mass=query_idf_mass) for c in candidates]


def _ranks(values: list[tuple[str, float | None]]) -> dict[str, int]:
    present = [(cid, v) for cid, v in values if v is not None and not math.isnan(v)]
    present.sort(key=lambda p: (-p[1], p[0]))
    return {cid: i + 1 for i, (cid, _) in enumerate(present)}


@dataclass(frozen=True)
class RRFFusion:
    """Reciprocal Rank Fusion over the vector, BM25 and (optionally) recency rankings."""

    name: str = "rrf-60"
    k: int = recipe.RRF_K
    w_vector: float = 1.0
    w_bm25: float = 1.0
    w_recency: float = 0.0
    recency_half_life_seconds: float = recipe.RECENCY_HALF_LIFE_SECONDS

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError("k must be >= 0")
        ws = (self.w_vector, self.w_bm25, self.w_recency)
        if any(w < 0 or math.isnan(w) for w in ws) or sum(ws) <= 0:
            raise ValueError("RRF weights must be >= 0 and not all 0")

    def fuse(self, candidates: Sequence[Candidate], *, now: datetime,
             query_idf_mass: float = 0.0) -> list[ScoredCandidate]:
        """RRF scores normalised to [0, 1], in input order. ``query_idf_mass`` is accepted for
        interface parity and only used to report the normalised lexical component."""
        _check_unique(candidates)
        rec = {c.chunk_id: recency_weight(c.created_at, now, self.recency_half_life_seconds)
               if c.created_at is not None else None for c in candidates}
        rv = _ranks([(c.chunk_id, c.cosine) for c in candidates])
        rb = _ranks([(c.chunk_id, c.bm25 if (c.bm25 or 0) > 0 else None) for c in candidates])
        rr = _ranks(list(rec.items())) if self.w_recency > 0 else {}
        top = (self.w_vector + self.w_bm25 + self.w_recency) / (self.k + 1)
        out = []
        for c in candidates:
            s = 0.0
            for w, ranks in ((self.w_vector, rv), (self.w_bm25, rb), (self.w_recency, rr)):
                if w > 0 and c.chunk_id in ranks:
                    s += w / (self.k + ranks[c.chunk_id])
            out.append(ScoredCandidate(
                c.chunk_id, min(1.0, s / top), normalise_cosine(c.cosine),
                normalise_bm25(c.bm25, query_idf_mass), rec[c.chunk_id] or 0.0, c.payload))
        return out


FusionRecipe = Union[WeightedFusion, RRFFusion]

#: The default recipe: Search and AssembleContext use it unless configured otherwise.
HYBRID = WeightedFusion()
#: Reciprocal Rank Fusion (k = 60), the named alternative.
RRF = RRFFusion()
