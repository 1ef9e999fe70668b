"""The ONE retrieval classification, shared by Search and AssembleContext.

:func:`classify` takes the fused candidate set (before the floor, before ``top_k``), the
effective floor and ``top_k`` (:func:`classify_ranked` the same set already floored, ranked and
counted, as the retrieval statement returns it), and returns everything both surfaces report:
``results``, ``effective_min_score``, ``results_below_threshold`` and ``outcome``. Because
``SearchResponse`` and ``QualityAttestation`` both take their values from one
:class:`RetrievalResult`, the two surfaces cannot disagree about one retrieval.

==================  =====================================  =============================
outcome             when                                   results_below_threshold
==================  =====================================  =============================
NO_RESULTS          no candidate at all                    0
BELOW_THRESHOLD     candidates, every one under the floor  number of candidates (>= 1)
OK                  at least one candidate >= the floor    candidates under the floor
                    (results capped at top_k)              (may be > 0: a partial answer)
UNSPECIFIED         retrieval did not run / failed         0 (see :meth:`RetrievalResult.not_run`)
==================  =====================================  =============================

A candidate clears the floor when ``score >= effective_min_score`` (the floor is the minimum
for inclusion). ``results_below_threshold`` counts only the rows the FLOOR removed; rows above
the floor that ``top_k`` left out are not counted anywhere. A NaN score never clears a floor.

Floor resolution (:func:`resolve_min_score`)
-------------------------------------------
* ``min_score`` absent or 0 (proto3 cannot tell them apart) -> the tenant default
  (``retrieval_min_score``), which is the STRICTEST floor the engine has (core#2618).
* An explicit value in (0, 1] is the caller's choice and is honoured AS SENT, including a value
  below the tenant default: the spec names "ask for a lower floor" as the way an agent acts on
  BELOW_THRESHOLD, and ``effective_min_score`` reports whatever ran, so nothing is hidden.
  The strictest-default rule is about what silence means, not a cap on explicit requests.
* Anything else (negative, > 1, NaN, infinite) is INVALID_ARGUMENT naming ``min_score``.
* The result is always strictly positive (a tenant default outside (0, 1] is a configuration
  error and raises ``ValueError``).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Protocol, Sequence, TypeVar

from context_engine.errors import InvalidArgument

__all__ = [
    "DEFAULT_TOP_K",
    "MAX_TOP_K",
    "OUTCOME_PREFIX",
    "RetrievalOutcome",
    "RetrievalResult",
    "Scored",
    "classify",
    "classify_ranked",
    "name",
    "outcome_name",
    "resolve_min_score",
    "resolve_top_k",
]

OUTCOME_PREFIX = "RETRIEVAL_OUTCOME_"
DEFAULT_TOP_K = 10
MAX_TOP_K = 256


class RetrievalOutcome(enum.IntEnum):
    """Mirror of ``upsquad.context.v1.RetrievalOutcome``: member = proto name minus prefix,
    value = proto number (so ``int(outcome)`` goes straight onto the wire)."""

    UNSPECIFIED = 0
    OK = 1
    NO_RESULTS = 2
    BELOW_THRESHOLD = 3
    ACCESS_REVOKED_UPSTREAM = 4
    SOURCE_UNAVAILABLE = 5
    DOCUMENT_NO_LONGER_EXISTS = 6
    DOCUMENT_REF_UNRESOLVED = 7

    @property
    def proto_name(self) -> str:
        return OUTCOME_PREFIX + self.name

    @property
    def label(self) -> str:
        """The US-9 vocabulary word, e.g. ``below_threshold`` (see :func:`outcome_name`)."""
        return outcome_name(self)


def outcome_name(outcome: "RetrievalOutcome | int | str") -> str:
    """Derive the lowercase name: strip ``RETRIEVAL_OUTCOME_`` and lowercase.

    Accepts an :class:`RetrievalOutcome`, a proto enum number, or the proto's full member name.
    There is no transcribed table: the string is derived from the enum member name.
    """
    if isinstance(outcome, str):
        if not outcome.startswith(OUTCOME_PREFIX):
            raise ValueError(f"{outcome!r} is not a RetrievalOutcome member name")
        full = outcome
    else:
        full = OUTCOME_PREFIX + RetrievalOutcome(int(outcome)).name
    return full[len(OUTCOME_PREFIX):].lower()


#: The spec's ``OutcomeName``; an alias so callers can write ``outcome.name(x)``.
name = outcome_name


class Scored(Protocol):
    @property
    def chunk_id(self) -> str: ...
    @property
    def score(self) -> float: ...


S = TypeVar("S", bound=Scored)


@dataclass(frozen=True)
class RetrievalResult:
    """What one retrieval reports, on Search and on AssembleContext alike."""

    results: tuple  # tuple[Scored, ...], score desc, chunk_id asc on ties, len <= top_k
    effective_min_score: float
    results_below_threshold: int
    outcome: RetrievalOutcome
    candidates_total: int = 0  # the denominator: fused candidates before floor and top_k

    @property
    def outcome_name(self) -> str:
        return outcome_name(self.outcome)

    @property
    def confidence_score(self) -> float:
        """QualityAttestation.confidence_score: mean score of the results returned, 0 if none."""
        if not self.results:
            return 0.0
        return sum(r.score for r in self.results) / len(self.results)

    @property
    def top_score(self) -> float | None:
        return self.results[0].score if self.results else None

    @classmethod
    def not_run(cls, effective_min_score: float) -> "RetrievalResult":
        """Retrieval did not run or did not complete (AssembleContext's fallback path):
        outcome UNSPECIFIED, nothing retrieved, the floor that would have applied."""
        _check_floor(effective_min_score)
        return cls((), effective_min_score, 0, RetrievalOutcome.UNSPECIFIED, 0)


def _check_floor(floor: float) -> None:
    if not (isinstance(floor, (int, float)) and 0.0 < floor <= 1.0):
        raise ValueError(f"effective_min_score must be in (0, 1], got {floor!r}")


def _check_top_k(top_k: int) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}")


def _clears(score: float, floor: float) -> bool:
    return not math.isnan(score) and score >= floor


def classify(candidates: Sequence[S], effective_min_score: float, top_k: int) -> RetrievalResult:
    """Apply the floor, sort, cap at ``top_k`` and name the outcome (table in the module doc).

    ``candidates`` is the full fused candidate set, unique by ``chunk_id``, in any order.
    """
    _check_floor(effective_min_score)
    _check_top_k(top_k)
    ids = [c.chunk_id for c in candidates]
    if len(set(ids)) != len(ids):
        raise ValueError("candidates must be unique by chunk_id")
    above = [c for c in candidates if _clears(c.score, effective_min_score)]
    above.sort(key=lambda c: (-c.score, str(c.chunk_id)))
    return classify_ranked(above[:top_k], len(above), len(candidates), effective_min_score, top_k)


def classify_ranked(best: Sequence[S], above: int, total: int, effective_min_score: float,
                    top_k: int) -> RetrievalResult:
    """:func:`classify` for a candidate set the floor was applied to elsewhere (the retrieval
    statement fuses and ranks in PostgreSQL): ``best`` = the first ``min(top_k, above)``
    candidates that clear the floor, best first; ``above`` of the ``total`` candidates cleared
    it. The outcome is named here and only here."""
    _check_floor(effective_min_score)
    _check_top_k(top_k)
    if not 0 <= above <= total or len(best) != min(top_k, above):
        raise ValueError(f"inconsistent counts: {len(best)} best of {above} above the floor of {total}")
    if any(not _clears(c.score, effective_min_score) for c in best):
        raise ValueError("every one of the best candidates must clear the floor")
    if total == 0:
        outcome = RetrievalOutcome.NO_RESULTS
    elif above == 0:
        outcome = RetrievalOutcome.BELOW_THRESHOLD
    else:
        outcome = RetrievalOutcome.OK
    return RetrievalResult(tuple(best), float(effective_min_score), total - above, outcome, total)


def resolve_min_score(requested: float | None, tenant_default: float) -> float:
    """The floor to apply (module docstring): absent/0 -> ``tenant_default``; an explicit value
    in (0, 1] as sent; otherwise INVALID_ARGUMENT naming ``min_score``. Always > 0."""
    _check_floor(tenant_default)  # config error, not the caller's
    if requested is None or requested == 0:  # also -0.0
        return float(tenant_default)
    if isinstance(requested, bool) or not isinstance(requested, (int, float)):
        raise InvalidArgument("min_score", f"must be a number, got {type(requested).__name__}")
    if math.isnan(requested) or math.isinf(requested):
        raise InvalidArgument("min_score", f"must be a finite number in (0, 1], got {requested}")
    if not 0.0 < requested <= 1.0:
        raise InvalidArgument("min_score",
                              f"must be in (0, 1] (0 or absent selects the server default), "
                              f"got {requested}")
    return float(requested)


def resolve_top_k(requested: int | None) -> int:
    """absent/0 -> 10; 1..256 as sent; anything else INVALID_ARGUMENT naming ``top_k``."""
    if requested is None or (not isinstance(requested, bool) and requested == 0):
        return DEFAULT_TOP_K
    if isinstance(requested, bool) or not isinstance(requested, int):
        raise InvalidArgument("top_k", f"must be an integer, got {type(requested).__name__}")
    if not 1 <= requested <= MAX_TOP_K:
        raise InvalidArgument("top_k", f"must be between 1 and {MAX_TOP_K} (0 or absent selects "
                                       f"{DEFAULT_TOP_K}), got {requested}")
    return requested
