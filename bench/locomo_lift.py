"""The adjacent-turn lift fitted offline on LoCoMo: Search's fusion recomputed in numpy over every
turn of a conversation, for each lift variant, fit (conv-26..44) and held out (conv-47..50) apart.

The signals are the stack's own: `inference.text_analysis.analyze`, `projections.retrieval.bm25`
with the conversation's statistics, the int8 MiniLM, `HYBRID`'s weights; every turn is a candidate
(Search's pools at `top_k` 256 hold a whole conversation). Through the API (bench/locomo_search.py,
conversations ingested in dialogue order) hybrid-v1, v2 and v3 give the same figures to the third
digit. Prints any@5, R@5, R@10, R@2k tok per variant: the lifts, query expansion from the first
pass, a turn's session as a unit, and the turns of a speaker the question names.

    .venv/bin/python bench/locomo_lift.py            # ~1 min: embeds the 5,882 turns and 1,536 questions
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from dataclasses import dataclass

import numpy as np
from locomo import FIT, LOCOMO_DIR, load_locomo

from inference.minilm_embedder import MiniLMEmbedder
from inference.text_analysis import analyze
from inference.tokens import count_tokens
from projections.retrieval import bm25
from projections.retrieval.fusion import HYBRID

COLUMNS = ("any@5", "R@5", "R@10", "R@2k tok")


@dataclass
class Signals:
    """One conversation: per question, every turn's vector and lexical leg; the turns' tokens."""
    name: str
    ids: list[str]
    tokens: np.ndarray
    vector: np.ndarray  # questions x turns, max(0, cosine)
    lexical: np.ndarray  # questions x turns, min(1, bm25 / idf mass)
    evidence: list[tuple[set[int], int]]  # the turns found, and how many ids the question names
    turns: np.ndarray  # the turns' vectors
    asked: np.ndarray  # the questions' vectors
    speakers: np.ndarray  # each turn's speaker, casefolded
    named: list[set[str]]  # per question, the speakers its analyzed terms name


def signals(locomo_dir) -> list[Signals]:
    embedder = MiniLMEmbedder()
    out = []
    for c in load_locomo(locomo_dir):
        ids = [d for d, _ in c.turns]
        docs = [bm25.term_frequencies(t) for _, t in c.turns]
        stats = bm25.CorpusStats.from_documents(docs)
        questions = [q for q in c.questions if q.category in (1, 2, 3, 4) and q.evidence]
        turns = np.asarray(embedder.embed_sync([t for _, t in c.turns]))
        asked = np.asarray(embedder.embed_sync([q.text for q in questions]))
        lexical = []
        for q in questions:
            terms = analyze(q.text)
            mass = bm25.query_idf_mass(terms, stats)
            raw = np.asarray(bm25.bm25_scores(terms, docs, stats))
            lexical.append(np.minimum(1.0, raw / mass) if mass > 0 else np.zeros(len(docs)))
        index = {d: i for i, d in enumerate(ids)}
        speakers = np.array([t.split(":", 1)[0].casefold() for _, t in c.turns])
        out.append(Signals(c.name, ids, np.array([count_tokens(t, "gpt-4") for _, t in c.turns]),
                           np.maximum(0.0, asked @ turns.T), np.array(lexical),
                           [({index[e] for e in q.evidence if e in index}, len(set(q.evidence)))
                            for q in questions], turns, asked,
                           speakers, [set(speakers) & set(analyze(q.text)) for q in questions]))
        print(f"conv-{c.name}: {len(ids)} turns, {len(questions)} questions", file=sys.stderr)
    return out


def lifted(fused: np.ndarray, lift: float, reach: int, second: float = 1.0) -> np.ndarray:
    """`fused` raised toward the best score within `reach` turns (the k-th weighted second**(k-1))."""
    near = np.zeros_like(fused)
    for k in range(1, reach + 1):
        weight = second ** (k - 1)
        near = np.maximum(near, np.pad(fused[:-k], (k, 0)) * weight)
        near = np.maximum(near, np.pad(fused[k:], (0, k)) * weight)
    return fused + lift * np.maximum(0.0, near - fused)


def row(ranking: np.ndarray, evidence: set[int], named: int, tokens: np.ndarray) -> list[float]:
    """any@5, R@5, R@10, R@2k tok as bench/locomo_search.py counts them (an id of no turn is a miss)."""
    within = ranking[: int(np.searchsorted(np.cumsum(tokens[ranking]), 2000, side="right"))]
    return [float(bool(evidence & set(ranking[:5]))), len(evidence & set(ranking[:5])) / named,
            len(evidence & set(ranking[:10])) / named, len(evidence & set(within)) / named]


def session_scores(fused: np.ndarray, sessions: np.ndarray, best: int) -> np.ndarray:
    """Each turn's session scored by the mean of its `best` turns' fused scores."""
    out = np.zeros_like(fused)
    for session in np.unique(sessions):
        members = sessions == session
        out[members] = np.sort(fused[members])[::-1][:best].mean()
    return out


def evaluate(data: list[Signals], lift: float, reach: int, second: float = 1.0, *,
             expand: tuple[int, float] | None = None,
             session: tuple[int, float] | None = None, speaker: float = 0.0) -> dict[str, np.ndarray]:
    """The variant's figures; `expand` = (m, β): query expansion from the first pass, the question's
    vector moved toward the mean of its top m results by β, normalised, and the vector leg recomputed;
    `session` = (n, γ): a turn's LoCoMo session as a unit, γ times the mean of its best n turns added;
    `speaker` = δ: added to the fused score of the turns spoken by the one speaker a question names."""
    rows: dict[str, list[list[float]]] = {"fit": [], "held out": []}
    for s in data:
        sessions = np.array([int(d.split(":")[0].lstrip("D")) for d in s.ids])  # D3:5 -> session 3
        for i, (evidence, named) in enumerate(s.evidence):
            fused = HYBRID.w_vector * s.vector[i] + HYBRID.w_bm25 * s.lexical[i]
            if speaker and len(s.named[i]) == 1:
                fused = fused + speaker * (s.speakers == next(iter(s.named[i])))
            score = lifted(fused, lift, reach, second) if reach else fused
            if session is not None:
                best, gamma = session
                score = score + gamma * session_scores(fused, sessions, best)
            if expand is not None:
                m, beta = expand
                moved = s.asked[i] + beta * s.turns[np.argsort(-score)[:m]].mean(axis=0)
                vector = np.maximum(0.0, s.turns @ (moved / np.linalg.norm(moved)))
                score = lifted(HYBRID.w_vector * vector + HYBRID.w_bm25 * s.lexical[i], lift, reach, second)
            ranking = np.lexsort((np.arange(len(score)), -score))
            rows["fit" if s.name in FIT else "held out"].append(row(ranking, evidence, named, s.tokens))
    return {split: np.mean(r, axis=0) for split, r in rows.items()}


# (name, λ, reach, weight of the second turn)
VARIANTS: tuple[tuple[str, float, int, float], ...] = (
    ("none (hybrid-v1)", 0.0, 0, 1.0),
    *((f"λ {lift}, {reach} turn{'s' if reach > 1 else ''}"
       + {(0.5, 1): " (hybrid-v2)", (0.5, 2): " (hybrid-v3)"}.get((lift, reach), ""), lift, reach, 1.0)
      for lift in (0.5, 0.6, 0.7, 1.0) for reach in (1, 2, 3)),
    ("λ 0.5, 2 turns, the second weighted 0.7", 0.5, 2, 0.7))


EXPANSIONS = ((1, 0.3), (3, 0.3), (3, 0.6), (5, 0.3), (5, 1.0))
SESSION_UNITS = ((1, 0.05), (1, 0.1), (1, 0.2), (3, 0.1), (3, 0.2), (3, 0.3))  # (best n turns, γ)
SPEAKER_BOOSTS = (0.02, 0.05, 0.1, 0.2)  # δ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locomo-dir", type=pathlib.Path, default=LOCOMO_DIR)
    data = signals(parser.parse_args().locomo_dir)
    print(f"{'variant':<42}{'fit: ' + ' / '.join(COLUMNS):<40}held out")
    runs = [(name, evaluate(data, lift, reach, second)) for name, lift, reach, second in VARIANTS]
    runs += [(f"hybrid-v2 + expansion, top {m}, β {beta}", evaluate(data, 0.5, 1, expand=(m, beta)))
             for m, beta in EXPANSIONS]
    runs += [(f"hybrid-v3 + session, best {n}, γ {gamma}", evaluate(data, 0.5, 2, session=(n, gamma)))
             for n, gamma in SESSION_UNITS]
    runs += [(f"hybrid-v3 + named speaker, δ {delta}", evaluate(data, 0.5, 2, speaker=delta))
             for delta in SPEAKER_BOOSTS]
    for name, result in runs:
        print(f"{name:<42}" + "".join(f"{' / '.join(f'{v:.3f}' for v in result[s]):<40}" for s in ("fit", "held out")))


if __name__ == "__main__":
    main()
