"""Okapi BM25 over real term statistics, and the analyzer that produces the terms.

Pure: no database. The statistics (N, average document length, document frequency per term)
describe the CALLER'S VISIBLE CORPUS and are passed in as data; the SQL that gathers them
lives with the Search wiring. What that SQL needs is spelled out by the pieces here:

* at ingest, :func:`term_frequencies` turns a chunk's text into ``DocumentTerms`` (term ->
  tf, plus the document length in analysed terms); store one row per (chunk, term, tf) and the
  length on the chunk;
* at query time, :func:`analyze` the query, ask :func:`stats_terms` which terms need a
  document frequency, and gather ``N`` (visible chunks), ``sum(length)`` (-> avgdl) and
  ``df`` for those terms only, all under the caller's visibility (RLS) and ``domain`` filter;
  build :class:`CorpusStats` and call :func:`bm25_scores`.

The analyzer (``analyze``: what a text's terms are) is inference/text_analysis.py.

Scoring
-------
For query terms ``q_1..q_n`` (analysed; a term repeated in the query contributes once per
occurrence, as in rank_bm25 and in a Lucene BooleanQuery) and a document ``D``::

    score(D) = sum_i idf(q_i) * tf(q_i, D) * (k1 + 1)
                               / (tf(q_i, D) + k1 * (1 - b + b * |D| / avgdl))

    idf(q)   = ln(1 + (N - df(q) + 0.5) / (df(q) + 0.5))        (Lucene / BM25+ style idf)

with ``k1 = 1.2``, ``b = 0.75``. This idf is always positive, so there is no epsilon floor
(rank_bm25's ``BM25Okapi`` uses ``ln((N - df + 0.5) / (df + 0.5))`` floored at
``epsilon * mean idf``; the two differ, and the tests compare against rank_bm25 with its idf
replaced by this one). The numerator keeps the classic ``(k1 + 1)`` factor (Lucene >= 8 drops
it; it only rescales). When ``avgdl`` is 0 (every visible document is empty) the length
normalisation is taken as 1.

In SQL
------
Search scores BM25 in PostgreSQL (projections/reads/search.py: the lexical leg and the fused
statement). The idf and one posting's term are rendered beside their Python (:func:`idf_sql`,
:func:`term_score_sql`), so k1 and b are written once; tests/integration/test_fusion_sql.py
evaluates the renderings in PostgreSQL over a grid of tf, df, N, document and average lengths
against :func:`idf` and :func:`bm25_scorer`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence, Union

from inference.text_analysis import analyze
from projections.retrieval import recipe

__all__ = [
    "B",
    "K1",
    "CorpusStats",
    "DocumentTerms",
    "bm25_score",
    "bm25_scorer",
    "bm25_scores",
    "idf",
    "idf_sql",
    "matches_minimum",
    "minimum_should_match",
    "query_idf_mass",
    "stats_terms",
    "term_frequencies",
    "term_score_sql",
]

K1 = recipe.BM25_K1
B = recipe.BM25_B
@dataclass(frozen=True)
class DocumentTerms:
    """What BM25 needs of one document: term -> tf, and its length in analysed terms."""

    tf: Mapping[str, int]
    length: int

    @classmethod
    def from_terms(cls, terms: Iterable[str]) -> "DocumentTerms":
        terms = list(terms)
        return cls(tf=dict(Counter(terms)), length=len(terms))


def term_frequencies(text: str) -> DocumentTerms:
    """Analyse ``text`` and count: the per-chunk rows stored at ingest."""
    return DocumentTerms.from_terms(analyze(text))


@dataclass(frozen=True)
class CorpusStats:
    """Statistics of the caller's visible corpus.

    ``df`` needs only the query's terms (:func:`stats_terms`); a term absent from it has
    df 0.
    """

    n_docs: int
    avgdl: float
    df: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.n_docs < 0:
            raise ValueError("n_docs must be >= 0")
        if self.avgdl < 0 or math.isnan(self.avgdl):
            raise ValueError("avgdl must be >= 0")
        for term, n in self.df.items():
            if n < 0 or n > self.n_docs:
                raise ValueError(f"df[{term!r}]={n} outside [0, n_docs={self.n_docs}]")

    @classmethod
    def from_totals(cls, n_docs: int, total_length: int, df: Mapping[str, int]) -> "CorpusStats":
        """From ``count(*)``, ``sum(length)`` and per-term ``count(*)`` as SQL returns them."""
        return cls(n_docs=n_docs, avgdl=(total_length / n_docs) if n_docs else 0.0, df=dict(df))

    @classmethod
    def from_documents(cls, docs: Sequence["DocumentTerms | Sequence[str]"]) -> "CorpusStats":
        """Exact statistics of an in-memory corpus (tests, benchmarks, small scopes)."""
        dts = [_as_doc(d) for d in docs]
        df: Counter[str] = Counter()
        for d in dts:
            df.update(t for t, n in d.tf.items() if n > 0)
        return cls.from_totals(len(dts), sum(d.length for d in dts), df)

    def idf(self, term: str) -> float:
        return idf(self.n_docs, self.df.get(term, 0))


def idf(n_docs: int, df: int) -> float:
    """``ln(1 + (N - df + 0.5) / (df + 0.5))``: positive for every 0 <= df <= N."""
    return math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))


def idf_sql(n_docs: str, df: str) -> str:
    """:func:`idf` of the SQL expressions ``n_docs`` and ``df``, in float8."""
    return f"ln(1.0::float8 + ({n_docs} - {df} + 0.5::float8) / ({df} + 0.5::float8))"


def stats_terms(query_terms: Iterable[str]) -> tuple[str, ...]:
    """The distinct terms whose df the SQL side must fetch for this query (sorted)."""
    return tuple(sorted(set(query_terms)))


def query_idf_mass(query_terms: Sequence[str], stats: CorpusStats) -> float:
    """``sum_i idf(q_i)`` over the query's term occurrences: the BM25 score of a document of
    average length holding every query term once. :mod:`fusion` normalises BM25 by it."""
    return sum(stats.idf(q) for q in query_terms)


DocLike = Union[DocumentTerms, Sequence[str]]


def _as_doc(doc: DocLike) -> DocumentTerms:
    if isinstance(doc, DocumentTerms):
        return doc
    if isinstance(doc, str):
        raise TypeError("pass analysed terms (list[str]) or DocumentTerms, not a raw string")
    return DocumentTerms.from_terms(doc)


def bm25_score(query_terms: Sequence[str], doc: DocLike, stats: CorpusStats,
               *, k1: float = K1, b: float = B) -> float:
    """BM25 of one document (see the module docstring for the formula)."""
    d = _as_doc(doc)
    return bm25_scorer(query_terms, stats, k1=k1, b=b)(d.tf, d.length)


def bm25_scorer(query_terms: Sequence[str], stats: CorpusStats, *, k1: float = K1,
                b: float = B) -> Callable[[Mapping[str, int], int], float]:
    """:func:`bm25_score` for many documents of one query: ``score(tf, length)``, with each
    term's idf computed once. The same arithmetic in the same order, so the same floats."""
    terms = list(query_terms)
    idfs = {q: stats.idf(q) for q in set(terms)}
    avgdl = stats.avgdl

    def score(tf: Mapping[str, int], length: int) -> float:
        norm = (1.0 - b + b * length / avgdl) if avgdl > 0 else 1.0
        total = 0.0
        for q in terms:
            n = tf.get(q, 0)
            if n > 0:
                total += idfs[q] * n * (k1 + 1.0) / (n + k1 * norm)
        return total

    return score


def term_score_sql(weight: str, tf: str, length: str, avgdl: str, *, avgdl_positive: str | None = None,
                   k1: float = K1, b: float = B) -> str:
    """One posting's term of :func:`bm25_scorer` in SQL, ``weight * tf * (k1 + 1) / (tf + k1 *
    norm)``, of the SQL expressions ``weight`` (the term's idf times its count in the query),
    ``tf``, ``length`` (the document's) and ``avgdl``. The length normalisation is 1 unless
    ``avgdl_positive`` (by default ``avgdl > 0``) holds: a caller deriving ``avgdl`` as a
    quotient tests its numerator, so a corpus of no documents divides nothing."""
    positive = avgdl_positive if avgdl_positive is not None else f"{avgdl} > 0"
    return (f"{weight} * {tf} * {k1 + 1.0!r}::float8 / ({tf} + {k1!r}::float8 * CASE WHEN {positive}\n"
            f"               THEN 1.0::float8 - {b!r}::float8 + {b!r}::float8 * {length} / {avgdl}\n"
            f"               ELSE 1.0::float8 END)")


def bm25_scores(query_terms: Sequence[str], docs_terms: Sequence[DocLike], stats: CorpusStats,
                *, k1: float = K1, b: float = B) -> list[float]:
    """BM25 of each document, in input order."""
    score = bm25_scorer(query_terms, stats, k1=k1, b=b)
    return [score(d.tf, d.length) for d in map(_as_doc, docs_terms)]


def minimum_should_match(n_distinct_terms: int, fraction: float) -> int:
    """How many distinct query terms a BM25 candidate must contain.

    ``fraction`` 0 is plain OR (at least one term); 1 is AND. The result is in
    ``[min(1, n), n]``: a query always needs at least one matching term.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError("fraction must be in [0, 1]")
    if n_distinct_terms <= 0:
        return 0
    return max(1, math.ceil(fraction * n_distinct_terms - 1e-9))


def matches_minimum(query_terms: Iterable[str], doc: DocLike, required: int) -> bool:
    """Whether ``doc`` holds at least ``required`` distinct query terms (the SQL
    ``HAVING count(DISTINCT term) >= required`` in Python)."""
    d = _as_doc(doc)
    return sum(1 for t in set(query_terms) if d.tf.get(t, 0) > 0) >= max(required, 1)
