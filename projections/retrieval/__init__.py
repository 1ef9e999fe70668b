"""The pure retrieval core (issue 4): analyzer + BM25, fusion, the outcome classification,
the confidence gate and the chunking rule. No database, no gRPC, no broker; see
docs/retrieval.md for the formulas and the rules."""

from __future__ import annotations

from .bm25 import CorpusStats, DocumentTerms, analyze, bm25_scores, term_frequencies
from .confidence_gate import Pool, broaden, needs_expansion
from .fusion import HYBRID, RRF, Candidate, RRFFusion, ScoredCandidate, WeightedFusion
from .outcome import RetrievalOutcome, RetrievalResult, classify, outcome_name, resolve_min_score, resolve_top_k

__all__ = [
    "HYBRID", "RRF", "Candidate", "CorpusStats", "DocumentTerms", "RetrievalOutcome", "Pool",
    "RRFFusion", "RetrievalResult", "ScoredCandidate", "WeightedFusion", "analyze",
    "bm25_scores", "broaden", "classify", "needs_expansion", "outcome_name",
    "resolve_min_score", "resolve_top_k", "term_frequencies",
]
