"""BM25: analyzer, statistics, and scores equal to reference computations."""

from __future__ import annotations

import math
import random

import pytest

from inference.text_analysis import STOP_WORDS, analyze
from projections.retrieval import bm25
from projections.retrieval.bm25 import CorpusStats, DocumentTerms, bm25_score, bm25_scores, term_frequencies
from tests.fixtures.bm25_reference import rank_bm25_lucene_idf

TOY = ["the cat sat on the mat", "dogs chase the cat", "a bird sang"]


def test_analyzer_lowercases_tokenises_unicode_and_drops_stop_words():
    assert analyze("The CAT sat on the Mat.") == ["cat", "sat", "mat"]
    assert analyze("Straße café_bar naïve") == ["strasse", "café", "bar", "naïve"]
    assert analyze("Don't panic, it's GPT-4o!") == ["panic", "gpt", "4o"]
    assert analyze("ＦＵＬＬ width") == ["full", "width"]  # NFKC
    assert analyze("東京タワー") == ["東", "京", "タ", "ワ", "ー"]  # one ideograph per token
    assert analyze("") == [] and analyze("the a of") == []
    assert "not" in STOP_WORDS and "cat" not in STOP_WORDS


def test_hand_worked_example():
    # Analysed: d1 = [cat, sat, mat] (3), d2 = [dogs, chase, cat] (3), d3 = [bird, sang] (2)
    docs = [term_frequencies(t) for t in TOY]
    assert [d.length for d in docs] == [3, 3, 2]
    stats = CorpusStats.from_documents(docs)
    assert stats.n_docs == 3 and stats.avgdl == pytest.approx(8 / 3)
    assert stats.df["cat"] == 2 and stats.df["mat"] == 1
    # idf(cat) = ln(1 + (3 - 2 + 0.5) / (2 + 0.5)) = ln(1.6)   = 0.4700036292
    # idf(mat) = ln(1 + (3 - 1 + 0.5) / (1 + 0.5)) = ln(8/3)   = 0.9808292530
    assert stats.idf("cat") == pytest.approx(0.4700036292, abs=1e-9)
    assert stats.idf("mat") == pytest.approx(0.9808292530, abs=1e-9)
    # d1: |D| = 3, norm = 1 - 0.75 + 0.75 * 3 / (8/3) = 1.09375
    #     tf part = 1 * 2.2 / (1 + 1.2 * 1.09375) = 2.2 / 2.3125 = 0.9513513514
    #     score = (0.4700036292 + 0.9808292530) * 0.9513513514 = 1.3802518231
    # d2: only cat, same length: 0.4700036292 * 0.9513513514 = 0.4471385878
    # d3: no query term: 0
    scores = bm25_scores(analyze("cat on a mat"), docs, stats)
    assert scores == pytest.approx([1.3802518231, 0.4471385878, 0.0], abs=1e-9)


def test_constants_and_idf_formula():
    assert bm25.K1 == 1.2 and bm25.B == 0.75
    assert bm25.idf(10, 10) == pytest.approx(math.log(1 + 0.5 / 10.5))
    assert all(bm25.idf(10, df) > 0 for df in range(11))  # never negative, no epsilon floor


def _random_corpus(seed: int, n_docs: int = 40):
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(30)]
    weights = [1 / (i + 1) for i in range(30)]  # Zipf-ish: some terms in most documents
    return [rng.choices(vocab, weights, k=rng.randint(1, 25)) for _ in range(n_docs)], vocab, rng


@pytest.mark.parametrize("seed", range(5))
def test_matches_rank_bm25_configured_comparably(seed):
    LuceneIdf = rank_bm25_lucene_idf()
    corpus, vocab, rng = _random_corpus(seed)
    ref = LuceneIdf(corpus, k1=1.2, b=0.75)
    stats = CorpusStats.from_documents(corpus)
    for _ in range(10):
        query = rng.sample(vocab, rng.randint(1, 5)) + ["never-seen"]
        query += query[:1]  # a repeated query term counts twice in both
        expected = list(ref.get_scores(query))
        assert bm25_scores(query, corpus, stats) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_real_text_against_rank_bm25():
    LuceneIdf = rank_bm25_lucene_idf()
    texts = [
        "Caroline: I went to the LGBTQ support group yesterday and it was so powerful.",
        "Melanie: That's great! I painted a sunrise over the lake last week.",
        "Caroline: The support group made me think about adoption agencies.",
        "Melanie: My kids loved the camping trip; we roasted marshmallows.",
        "Caroline: Researching adoption agencies, it's a big step!",
    ]
    corpus = [analyze(t) for t in texts]
    ref = LuceneIdf(corpus, k1=1.2, b=0.75)
    stats = CorpusStats.from_documents(corpus)
    q = analyze("When did Caroline go to the support group about adoption?")
    ours = bm25_scores(q, [term_frequencies(t) for t in texts], stats)
    assert ours == pytest.approx(list(ref.get_scores(q)), rel=1e-9)
    assert max(range(5), key=ours.__getitem__) == 2


def test_stats_from_sql_totals_equal_exact_stats():
    docs = [term_frequencies(t) for t in TOY]
    exact = CorpusStats.from_documents(docs)
    q = analyze("cat mat zebra cat")
    assert bm25.stats_terms(q) == ("cat", "mat", "zebra")
    df = {t: exact.df.get(t, 0) for t in bm25.stats_terms(q)}
    sql = CorpusStats.from_totals(3, sum(d.length for d in docs), df)
    assert bm25_scores(q, docs, sql) == bm25_scores(q, docs, exact)


def test_empty_and_degenerate_inputs():
    assert CorpusStats.from_documents([]).avgdl == 0.0
    empty = CorpusStats.from_documents([[], []])
    assert bm25_score(["x"], [], empty) == 0.0
    with pytest.raises(ValueError):
        CorpusStats(n_docs=1, avgdl=1.0, df={"x": 2})
    with pytest.raises(TypeError):
        bm25_score(["x"], "raw text", empty)


def test_score_properties():
    stats = CorpusStats(n_docs=100, avgdl=10.0, df={"a": 5, "b": 50})
    short = DocumentTerms({"a": 1}, 5)
    long = DocumentTerms({"a": 1}, 20)
    assert bm25_score(["a"], short, stats) > bm25_score(["a"], long, stats)  # length norm
    tf = [bm25_score(["a"], DocumentTerms({"a": n}, 10), stats) for n in range(1, 30)]
    assert tf == sorted(tf) and tf[-1] < stats.idf("a") * 2.2  # saturates below idf*(k1+1)
    # the rarer term is worth more
    assert bm25_score(["a"], DocumentTerms({"a": 1}, 10), stats) > \
        bm25_score(["b"], DocumentTerms({"b": 1}, 10), stats)
    # query_idf_mass is the score of an average-length document holding each term once
    doc = DocumentTerms({"a": 1, "b": 1}, 10)
    assert bm25_score(["a", "b"], doc, stats) == pytest.approx(bm25.query_idf_mass(["a", "b"], stats))


def test_minimum_should_match():
    assert bm25.minimum_should_match(4, 0.5) == 2
    assert bm25.minimum_should_match(5, 0.5) == 3
    assert bm25.minimum_should_match(3, 0.0) == 1  # OR
    assert bm25.minimum_should_match(3, 1.0) == 3  # AND
    assert bm25.minimum_should_match(0, 0.5) == 0
    doc = DocumentTerms({"a": 2, "c": 1}, 3)
    assert bm25.matches_minimum(["a", "b", "c", "d"], doc, 2)
    assert not bm25.matches_minimum(["a", "b", "c", "d"], doc, 3)


