"""The chunking rule: short turns whole, long texts on boundaries, ids and hashes."""

from __future__ import annotations

import hashlib
import json
import uuid

import pytest

from inference import tokens
from projections.retrieval import chunking
from projections.retrieval.chunking import chunk_content, chunk_text, json_text


def count(text):
    return tokens.count_tokens(text, "gpt-4")


def long_text(n=120):
    paras = []
    for p in range(n // 6):
        paras.append(" ".join(f"Paragraph {p} sentence {i} mentions the harbour and lighthouse."
                              for i in range(6)))
    return "\n\n".join(paras)


def test_short_turn_is_one_chunk():
    text = "Caroline: I went to the support group yesterday!"
    [c] = chunk_text("ev-1", text)
    assert c.content == text and c.index == 0
    assert c.token_count == count(text)
    assert c.content_hash == hashlib.sha256(text.encode()).hexdigest()
    assert c.id == uuid.uuid5(chunking.CHUNK_NAMESPACE, "ev-1#0") and c.id.version == 5


def test_turn_at_the_limit_stays_whole():
    text = " ".join(["word"] * 256)
    assert count(text) <= 256
    assert len(chunk_text("e", text, max_tokens=count(text))) == 1
    assert len(chunk_text("e", text, max_tokens=count(text) - 1, overlap_tokens=8)) > 1


def test_empty_text_yields_no_chunk():
    assert chunk_text("e", "") == [] and chunk_text("e", "  \n\n ") == []


def test_long_text_splits_on_sentence_boundaries_within_budget():
    text = long_text()
    chunks = chunk_text("ev-long", text, max_tokens=64, overlap_tokens=16)
    assert len(chunks) > 5
    for i, c in enumerate(chunks):
        assert c.index == i and c.token_count == count(c.content) <= 64
        assert c.content in text  # original text, formatting preserved
        assert c.content.startswith("Paragraph") and c.content.endswith(".")  # whole sentences
        assert c.id == chunking.chunk_id("ev-long", i)
    # together the chunks cover every sentence
    covered = " ".join(c.content for c in chunks)
    for p in range(20):
        for i in range(6):
            assert f"Paragraph {p} sentence {i} " in covered


def test_overlap_carries_the_previous_window_tail():
    chunks = chunk_text("e", long_text(), max_tokens=64, overlap_tokens=16)
    overlapping = 0
    for a, b in zip(chunks, chunks[1:]):
        first_sentence = b.content.split(". ")[0]
        if first_sentence in a.content:
            overlapping += 1
            assert count(first_sentence + ".") <= 16
    assert overlapping == len(chunks) - 1
    no_overlap = chunk_text("e", long_text(), max_tokens=64, overlap_tokens=0)
    assert sum(c.token_count for c in no_overlap) < sum(c.token_count for c in chunks)


def test_a_single_huge_sentence_is_cut_on_token_boundaries():
    text = "é" + "ü".join(["naïve"] * 800)  # no sentence or paragraph boundary at all
    chunks = chunk_text("e", text, max_tokens=50, overlap_tokens=10)
    assert len(chunks) > 3
    assert all(c.token_count <= 50 for c in chunks)
    assert "".join(c.content for c in chunks) == text  # nothing lost, no broken characters


def test_deterministic_and_content_hash_dedups():
    a = chunk_text("ev-a", long_text(), max_tokens=80)
    assert a == chunk_text("ev-a", long_text(), max_tokens=80)
    b = chunk_text("ev-b", long_text(), max_tokens=80)
    assert [c.content_hash for c in a] == [c.content_hash for c in b]  # same text, same hashes
    assert {c.id for c in a}.isdisjoint({c.id for c in b})  # ids belong to the source event
    hashes = [c.content_hash for c in a]
    assert len(set(hashes)) == len(hashes)


def test_json_text_keys_sorted_leaves_with_paths():
    value = {"user": {"name": "Ana", "address": {"city": "Paris"}}, "tags": ["x", "y"],
             "ok": True, "n": 3, "gone": None}
    assert json_text(value) == ("n: 3\nok: true\ntags: x\ntags: y\n"
                                "user.address.city: Paris\nuser.name: Ana")
    reordered = json.loads(json.dumps(value, sort_keys=True))
    assert json_text(reordered) == json_text(value)


def test_chunk_content_json_and_bytes():
    value = {"b": "second", "a": "first"}
    [c1] = chunk_content("e", value)
    [c2] = chunk_content("e", json.dumps(value), content_type="application/json")
    [c3] = chunk_content("e", json.dumps({"a": "first", "b": "second"}).encode(),
                         content_type="application/json; charset=utf-8")
    assert c1.content == "a: first\nb: second"
    assert c1.content_hash == c2.content_hash == c3.content_hash
    [t] = chunk_content("e", "{not json", content_type="application/json")
    assert t.content == "{not json"
    [p] = chunk_content("e", "plain text")
    assert p.content == "plain text"


def test_parameter_validation():
    with pytest.raises(ValueError):
        chunk_text("e", "x", max_tokens=4)
    with pytest.raises(ValueError):
        chunk_text("e", "x", max_tokens=64, overlap_tokens=64)


def _hostile_texts(size: int) -> dict[str, str]:
    words = "the harbour keeper lit a lamp while seven boats waited for the tide".split()
    sentence = " ".join(words) + ". "
    return {
        "no spaces": "".join(chr(ord("a") + (i * 7919) % 26) for i in range(size)),
        "ordinary text": (sentence * (size // len(sentence) + 1))[:size],
        "no punctuation": ((" ".join(words) + " ") * size)[:size],
        "multi-byte": ("漢字ÿ€😀" * size)[:size // 3],
        "NUL bytes": ("abc\x00def " * size)[:size],
    }


@pytest.mark.parametrize("kind", list(_hostile_texts(10)))
def test_splitting_tokenizes_each_character_a_bounded_number_of_times(kind, monkeypatch):
    """Linear in the content size: the characters handed to the tokenizer grow in proportion to
    the text (one pass over the whole, one per chunk kept, and the overlap), for a text twice as
    long exactly twice as much, give or take a chunk."""
    import tiktoken

    def encoded_chars(text: str) -> tuple[int, list]:
        seen = [0]
        original = tiktoken.Encoding.encode_ordinary

        def counting(self, s):
            seen[0] += len(s)
            return original(self, s)

        monkeypatch.setattr(tiktoken.Encoding, "encode_ordinary", counting)
        chunks = chunk_text("e", text)
        monkeypatch.setattr(tiktoken.Encoding, "encode_ordinary", original)
        return seen[0], chunks

    small, big = _hostile_texts(64 * 1024)[kind], _hostile_texts(256 * 1024)[kind]
    small_work, small_chunks = encoded_chars(small)
    big_work, big_chunks = encoded_chars(big)
    assert small_work <= 4 * len(small) and big_work <= 4 * len(big)
    assert big_work / small_work < 4 * 1.1  # 4x the text, 4x the work
    for c in big_chunks:
        assert c.token_count == count(c.content) <= chunking.DEFAULT_MAX_TOKENS
        assert "\x00" not in c.content


def test_controls_become_spaces_and_binary_content_yields_no_chunk():
    [c] = chunk_content("e", b"before\x00after\x07bell\ttab\nline")
    assert c.content == "before after bell\ttab\nline"
    assert chunk_content("e", bytes(range(256)) * 4) == []  # not UTF-8: stored, never chunked
    assert chunk_content("e", "naïve café".encode())[0].content == "naïve café"


def test_a_token_without_spaces_is_capped_in_the_index():
    from inference.text_analysis import MAX_TERM_CHARS, analyze

    [term] = analyze("x" * 10_000)
    assert term == "x" * MAX_TERM_CHARS
    assert analyze("ordinary words stay whole") == ["ordinary", "words", "stay", "whole"]


def test_a_summary_line_is_one_chunk_whatever_its_length():
    long_line = " ".join(f"Sentence {i} about the harbour and the lighthouse keeper." for i in range(60))
    chunk = chunking.summary_line_chunk("line-9", long_line, 777)
    assert (chunk.id, chunk.index, chunk.content, chunk.token_count) == (chunking.chunk_id("line-9", 0), 0,
                                                                        long_line, 777)
    assert chunk.content_hash == chunking.content_hash(long_line)
