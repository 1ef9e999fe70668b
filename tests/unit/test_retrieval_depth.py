"""AssembleContext's retrieval depth: half again the chunks its budget holds at the visible corpus's
mean chunk size, within 10..256, budget / 20 without a corpus."""

from projections.retrieval.recipes import retrieval_depth


def test_half_again_the_chunks_the_budget_holds_at_the_mean_size():
    assert retrieval_depth(4000, corpus_tokens=41_000, corpus_chunks=1_000) == 147  # 4000 / 41 * 1.5
    assert retrieval_depth(2000, corpus_tokens=30_000, corpus_chunks=1_000) == 100  # LoCoMo-like turns


def test_bounded_both_ways():
    assert retrieval_depth(100_000, corpus_tokens=10_000, corpus_chunks=1_000) == 256
    assert retrieval_depth(200, corpus_tokens=500_000, corpus_chunks=1_000) == 10


def test_budget_over_20_without_a_corpus():
    assert retrieval_depth(4000, corpus_tokens=0, corpus_chunks=0) == 200
    assert retrieval_depth(4000, corpus_tokens=0, corpus_chunks=5) == 200  # chunks with no counted tokens
