"""The retrieval recipe: every tuning constant of Search's and AssembleContext's retrieval, in one
place. The modules that use them (bm25.py, fusion.py, confidence_gate.py, projections/reads/search.py,
commands/assemble_context.py) read them from here; the formulas they feed are in docs/retrieval.md,
the measurements named below in docs/retrieval.md and docs/benchmarks.md.

Changing a value changes what every caller retrieves; the recall tables were measured with these.
"""

from __future__ import annotations

DAY = 86_400.0

# Fusion (fusion.WeightedFusion, the HYBRID recipe): score = W_VECTOR·v + W_LEXICAL·l + W_RECENCY·r.
#: Weight of the vector leg (cosine clamped to [0, 1]). Measured on LoCoMo (1,536 questions,
#: MiniLM-L6 int8): 0.45/0.45 gives R@5/10/25 .540/.623/.712, the middle of an optimum flat
#: between 0.35 and 0.45 (docs/retrieval.md, "Weights").
W_VECTOR = 0.45
#: Weight of the lexical leg (BM25 over the query's idf mass, clamped to 1); same measurement.
W_LEXICAL = 0.45
#: Weight of recency: a tie-breaker that can never on its own lift an unrelated chunk over a floor
#: above 0.10 (a choice, not a measurement).
W_RECENCY = 0.10
#: Recency's half-life: a chunk a fortnight old keeps half its recency credit (a choice).
RECENCY_HALF_LIFE_SECONDS = 14 * DAY
#: k of the alternative RRF recipe (fusion.RRF), the usual 60; measured worse than HYBRID on
#: LoCoMo (R@5/10/25 .457/.534/.658, docs/retrieval.md).
RRF_K = 60

#: The adjacent-turn lift: a conversation turn next to a better-scoring candidate of its session
#: rises toward it, score + NEIGHBOUR_LIFT · max(0, neighbour − score). An answer often shares
#: few words with the question the turn before it asked (fit on LoCoMo conversations 26–44,
#: docs/retrieval.md, "Adjacent turns").
NEIGHBOUR_LIFT = 0.5
#: How far the lift reaches: the candidates within this many turns before and after a turn (or
#: chunks of the same message) are its neighbours. 2 fitted on conversations 26–44 (1: any@5 .669,
#: R@2k tok .857; 2: .699, .877; 3: .684, .873; docs/retrieval.md, "Adjacent turns").
NEIGHBOUR_REACH = 2

# BM25 (bm25.py, and its SQL rendering in projections/reads/search.py and chunk_projection's impact).
#: Term-frequency saturation k1: the Robertson/Lucene default, 1.2.
BM25_K1 = 1.2
#: Length normalisation b: the Robertson/Lucene default, 0.75.
BM25_B = 0.75

# Candidate pools (confidence_gate.Pool, projections/reads/search.py).
#: The smallest pool of either leg: a pass reaches max(MIN_POOL, POOL_PER_RESULT · top_k).
MIN_POOL = 50
#: Candidates per leg for each result asked for (top_k).
POOL_PER_RESULT = 2
#: HNSW ef_search of the first pass; pgvector's iterative scan goes past it as filtering needs.
FIRST_EF_SEARCH = 64
#: A visible corpus of at most this many chunks is ranked exactly by the vector leg instead of
#: over the HNSW graph every org shares: the graph is filtered by org after the walk, and a small
#: org behind many nearer vectors of others lost candidates once the scan budget ran out.
EXACT_VECTOR_LEG_MAX_DOCS = 2_000
#: The share of the query's distinct terms a first-pass BM25 candidate must hold ("AND-ish").
BM25_MIN_MATCH_FRACTION = 0.5
#: Best postings read per query term by impact, at least 2 · bm25_k: bounds the lexical leg's
#: cost for common terms (docs/retrieval.md, step 3; the effect in docs/benchmarks.md).
POSTINGS_PER_TERM = 300

# The confidence gate's one broadened pass (confidence_gate.broaden).
#: vector_k, bm25_k and ef_search are multiplied by this when the top fused score is below the floor.
BROADEN_FACTOR = 4
#: The broadened pass reads this many times more postings per term.
BROADEN_POSTINGS = 4
#: The broadened pass's BM25 operator: 0, plain OR (a candidate holding any query term).
BROADEN_MIN_MATCH_FRACTION = 0.0

# AssembleContext's retrieval depth (projections/retrieval/recipes.retrieval_depth).
#: Chunks retrieved per chunk the budget holds at the visible corpus's mean chunk size: the floor
#: removes some, and recency should not fill what retrieval could (docs/assembly.md).
RETRIEVAL_OVERSHOOT = 1.5
#: The depth's divisor when the visible corpus is empty: budget / 20, on LoCoMo (~31 cl100k
#: tokens a turn) about the depth RETRIEVAL_OVERSHOOT gives (docs/assembly.md).
TOKENS_PER_RETRIEVED_CHUNK = 20
#: The shallowest retrieval assembly asks for (the deepest is outcome.MAX_TOP_K).
MIN_RETRIEVAL_DEPTH = 10
