"""The int8 self-check of the local MiniLM: the texts it embeds with both weight products, the
bound their vectors must agree to, and the comparison (inference/minilm_embedder.py runs it)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["INT8_CHECK_TEXTS", "INT8_MIN_COSINE", "Int8Check", "compare_products"]


#: What the int8 self-check embeds when a MiniLMEmbedder starts with ``matmul="int8"``: a few short
#: texts like those the engine embeds (chat turns, a question, a keyword query, a status line with
#: numbers and identifiers, non-Latin script and emoji, a paragraph), 7 to 50 word pieces. Both
#: products of all of them take ~30 ms on 2 cores.
INT8_CHECK_TEXTS: tuple[str, ...] = (
    "Caroline: I went to a LGBTQ support group yesterday and it was so powerful.",
    "When did Melanie paint a sunrise?",
    "quarterly revenue report",
    "Deploy v2.14.3 failed: migration 0013 timed out after 30 s, rolled back to snapshot 42.",
    "Ünïcode, 日本語, and emoji 🎉 in one message.",
    "The assistant summarised the meeting: the team agreed to move the release to Friday, Priya "
    "will review the payment service changes, and the customer asked for the invoice in euros "
    "before the end of the quarter.",
)

#: The lowest cosine, on any of INT8_CHECK_TEXTS, between the vectors of the int8 and the float32
#: products that keeps the int8 products. Measured for the packaged model: on CPUs with VNNI,
#: 0.98-1.0 over 3,000 LoCoMo turns and questions (mean 0.994); on AVX2 without VNNI, where
#: onnxruntime adds pairs of u8 x s8 products in saturating int16, min 0.979 and mean 0.992 over 300
#: LoCoMo turns (issue #18; bench/int8_saturation.py reproduces that arithmetic on any CPU). 0.97 is
#: below every healthy measurement, so a CPU that computes the products as intended never falls back
#: over a handful of texts, while a product that is really wrong (saturation on weights that use
#: the full int8 range, a misplaced scale, a kernel bug) moves vectors much further.
INT8_MIN_COSINE = 0.97


@dataclass(frozen=True)
class Int8Check:
    """What the int8 self-check measured: per check text, the cosine between the vectors of the int8
    and of the float32 products, in [0, 1]; and the bound they were held to."""

    cosines: tuple[float, ...]
    bound: float = INT8_MIN_COSINE

    @property
    def min_cosine(self) -> float:
        return min(self.cosines)

    @property
    def agrees(self) -> bool:
        """Every text at or above the bound: the int8 products may be used."""
        return self.min_cosine >= self.bound


def compare_products(int8: np.ndarray, float32: np.ndarray, bound: float = INT8_MIN_COSINE) -> Int8Check:
    """Row i of ``int8`` against row i of ``float32`` (the same text through both products): the
    cosine of each pair, whatever the rows' lengths. A zero or non-finite row counts as 0, and so
    does a negative cosine (it fails any bound that matters), so each cosine is in [0, 1]."""
    a, b = np.asarray(int8, dtype=np.float64), np.asarray(float32, dtype=np.float64)
    if a.ndim != 2 or a.shape != b.shape or not a.shape[0]:
        raise ValueError(f"expected two non-empty (n, d) arrays of one shape, got {a.shape} and {b.shape}")
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        cosines = (a * b).sum(axis=1) / norms
    cosines = np.clip(np.nan_to_num(cosines, nan=0.0, posinf=0.0, neginf=0.0), 0.0, 1.0)
    return Int8Check(tuple(float(c) for c in cosines), bound)

