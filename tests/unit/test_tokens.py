"""Token counting: model table, counts, truncation, and proof that nothing is downloaded."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import random
import subprocess
import sys
import textwrap

import pytest

from inference import tokens

SAMPLE = "hello world, this is a test"
CACHE_NAMES = {
    "cl100k_base": "9b5ad71b2ce5302211f9c61530b329a4922fc6a4",
    "o200k_base": "fb374d419588a4632f3f557e76b4b70aebbca790",
}
EXPECTED_SHA256 = {
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}


@pytest.mark.parametrize(
    ("model_id", "expected"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini", "o200k_base"),
        ("gpt-4o-2024-08-06", "o200k_base"),
        ("chatgpt-4o-latest", "o200k_base"),
        ("gpt-4.1", "o200k_base"),
        ("gpt-4.1-mini-2025-04-14", "o200k_base"),
        ("gpt-4.5-preview", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("gpt-5-mini", "o200k_base"),
        ("o1", "o200k_base"),
        ("o1-mini", "o200k_base"),
        ("o1-preview-2024-09-12", "o200k_base"),
        ("o3", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("o4-mini", "o200k_base"),
        ("o4-mini-2025-04-16", "o200k_base"),
        ("GPT-4O", "o200k_base"),
        ("openai/gpt-4o", "o200k_base"),
        ("ft:gpt-4o-mini:acme::abc123", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-0613", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-4-32k", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("gpt-3.5-turbo-0125", "cl100k_base"),
        ("gpt-35-turbo", "cl100k_base"),
        ("text-embedding-3-small", "cl100k_base"),
        ("text-embedding-3-large", "cl100k_base"),
        ("", "cl100k_base"),
        ("claude-3-5-sonnet", "cl100k_base"),
        ("llama-3-70b", "cl100k_base"),
        ("omni-model", "cl100k_base"),
    ],
)
def test_encoding_name_for_model(model_id: str, expected: str) -> None:
    assert tokens.encoding_name_for_model(model_id) == expected


@pytest.mark.parametrize("model_id", ["", "gpt-4", "gpt-4o", "o3-mini"])
def test_sample_is_seven_tokens_in_both_encodings(model_id: str) -> None:
    assert tokens.count_tokens(SAMPLE, model_id) == 7


def test_encodings_differ_where_expected() -> None:
    # Sanity check that the two models really use different vocabularies.
    assert tokens.get_encoding("cl100k_base").n_vocab == 100277
    assert tokens.get_encoding("o200k_base").n_vocab == 200019
    assert tokens.encode(SAMPLE, "gpt-4") != tokens.encode(SAMPLE, "gpt-4o")


def test_get_encoding_is_cached_and_validated() -> None:
    assert tokens.get_encoding("o200k_base") is tokens.get_encoding("o200k_base")
    with pytest.raises(ValueError):
        tokens.get_encoding("r50k_base")


def test_encode_decode_roundtrip() -> None:
    text = "Grüße, 世界! <|endoftext|> is plain text here."
    for model in ("gpt-4", "gpt-4o"):
        ids = tokens.encode(text, model)
        assert tokens.decode(ids, model) == text
        assert tokens.count_tokens(text, model) == len(ids)


def test_count_empty() -> None:
    assert tokens.count_tokens("") == 0
    assert tokens.count_tokens("", "gpt-4o") == 0


def test_in_process_cache_holds_both_files() -> None:
    cache_dir = tokens.ensure_offline_cache()
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(cache_dir)
    for name, key in CACHE_NAMES.items():
        data = (cache_dir / key).read_bytes()
        assert hashlib.sha256(data).hexdigest() == EXPECTED_SHA256[name]


class TestTruncate:
    MIXED = "héllo wörld 日本語のテキスト 🎉🎉🎉 naïve café — ünïcode " * 5

    @pytest.mark.parametrize("model_id", ["gpt-4", "gpt-4o"])
    def test_every_cut_is_valid_prefix_within_budget(self, model_id: str) -> None:
        total = tokens.count_tokens(self.MIXED, model_id)
        for n in range(0, total + 2):
            out = tokens.truncate_to_tokens(self.MIXED, n, model_id)
            assert self.MIXED.startswith(out)
            assert "\ufffd" not in out
            out.encode("utf-8")  # would raise on a lone surrogate
            assert tokens.count_tokens(out, model_id) <= n
        assert tokens.truncate_to_tokens(self.MIXED, total, model_id) == self.MIXED

    def test_cut_inside_emoji_drops_partial_character(self) -> None:
        # cl100k splits an emoji into byte-level tokens: a 1-token cut holds a partial char.
        emoji = "🎉"
        ids = tokens.encode(emoji, "gpt-4")
        assert len(ids) > 1
        assert tokens.truncate_to_tokens(emoji, 1, "gpt-4") == ""

    def test_short_text_unchanged_and_zero_budget(self) -> None:
        assert tokens.truncate_to_tokens(SAMPLE, 100) == SAMPLE
        assert tokens.truncate_to_tokens(SAMPLE, 0) == ""
        assert tokens.truncate_to_tokens(SAMPLE, -3) == ""
        assert tokens.truncate_to_tokens(SAMPLE, 2) == "hello world"


# ----------------------------------------------------------------------------------------------
# Offline proof: fresh interpreters in which any download attempt fails loudly.
# ----------------------------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import json, os, socket, sys

    def no_network(*args, **kwargs):
        raise AssertionError("network access attempted")

    socket.socket.connect = no_network
    socket.create_connection = no_network
    import tiktoken.load
    real_read_file = tiktoken.load.read_file

    def guarded_read_file(blobpath):
        if "://" in blobpath:
            raise AssertionError("tiktoken tried to fetch " + blobpath)
        return real_read_file(blobpath)

    tiktoken.load.read_file = guarded_read_file

    from inference import tokens
    counts = [tokens.count_tokens("hello world, this is a test", m) for m in ("gpt-4", "gpt-4o")]
    cache = os.environ["TIKTOKEN_CACHE_DIR"]
    print(json.dumps({"counts": counts, "cache": cache, "files": sorted(os.listdir(cache))}))
    """
)


def _run_child(env_overrides: dict[str, str | None]) -> dict:
    env = dict(os.environ)
    for key in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        env.pop(key, None)
    env.update({"HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"})
    for key, value in env_overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _assert_holds_files(directory: pathlib.Path) -> None:
    for name, key in CACHE_NAMES.items():
        data = (directory / key).read_bytes()
        assert hashlib.sha256(data).hexdigest() == EXPECTED_SHA256[name]


def test_fresh_process_fetches_nothing(tmp_path: pathlib.Path) -> None:
    xdg = tmp_path / "xdg"
    out = _run_child({"XDG_CACHE_HOME": str(xdg)})
    assert out["counts"] == [7, 7]
    cache = pathlib.Path(out["cache"])
    assert cache == xdg / "context-engine" / "tiktoken"
    assert not str(cache).startswith(sys.prefix)  # never into site-packages
    assert sorted(CACHE_NAMES.values()) == [f for f in out["files"] if not f.startswith(".")]
    _assert_holds_files(cache)


def test_unwritable_user_cache_falls_back_to_temp_dir(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")  # a file where the cache directory would go: mkdir fails
    out = _run_child({"XDG_CACHE_HOME": str(blocker)})
    assert out["counts"] == [7, 7]
    cache = pathlib.Path(out["cache"])
    assert cache.name.startswith("context-engine-tiktoken-")
    _assert_holds_files(cache)


def test_operator_cache_dir_holding_files_is_left_alone(tmp_path: pathlib.Path) -> None:
    operator = tmp_path / "operator-cache"
    operator.mkdir()
    source = tokens.ensure_offline_cache()
    for key in CACHE_NAMES.values():
        (operator / key).write_bytes((source / key).read_bytes())
    extra = operator / "some-other-encoding"
    extra.write_bytes(b"operator data")
    before = {p.name: p.stat().st_mtime_ns for p in operator.iterdir()}

    out = _run_child({"TIKTOKEN_CACHE_DIR": str(operator), "XDG_CACHE_HOME": str(tmp_path / "x")})
    assert out["counts"] == [7, 7]
    assert out["cache"] == str(operator)
    assert {p.name: p.stat().st_mtime_ns for p in operator.iterdir()} == before
    assert not (tmp_path / "x").exists()


def test_operator_cache_dir_without_files_is_filled(tmp_path: pathlib.Path) -> None:
    operator = tmp_path / "operator-empty"
    operator.mkdir()
    out = _run_child({"TIKTOKEN_CACHE_DIR": str(operator), "XDG_CACHE_HOME": str(tmp_path / "x")})
    assert out["counts"] == [7, 7]
    assert out["cache"] == str(operator)
    _assert_holds_files(operator)


def test_remembered_counts_equal_fresh_counts_and_are_remembered_per_encoding():
    remembered, count_tokens, cache = tokens.count_tokens_remembered, tokens.count_tokens, tokens._remembered_count
    text = "user: did Caroline go to the LGBTQ support group on 7 May 2023?"
    for model in ("gpt-4", "gpt-4o", ""):
        assert remembered(text, model) == count_tokens(text, model)
    hits = cache.cache_info().hits
    assert remembered(text, "gpt-4") == count_tokens(text, "gpt-4")
    assert cache.cache_info().hits == hits + 1
    # o200k and cl100k count this differently: the encoding is part of what is remembered
    emoji = "naïve 🙂 façade " * 5
    assert remembered(emoji, "gpt-4o") == count_tokens(emoji, "gpt-4o")
    assert remembered(emoji, "gpt-4") == count_tokens(emoji, "gpt-4")
    long_text = "word " * (tokens.REMEMBERED_MAX_CHARS // 5 + 1)  # longer texts are counted, not kept
    size = cache.cache_info().currsize
    assert remembered(long_text, "gpt-4") == count_tokens(long_text, "gpt-4")
    assert cache.cache_info().currsize == size
    assert remembered("", "gpt-4") == 0


# Characters around which the encodings' patterns behave differently: newlines and other
# whitespace (Unicode's too), "/" (o200k's punctuation piece takes it after newlines),
# apostrophes of contractions, punctuation, digits, letters of several scripts, an emoji.
TRICKY = list("abcXYZ019") + list(" \t\r\n\n\n/'#!.,:;-_()[]\"") + [
    "\u00a0", "\u2028", "\x1c", "\x85", "\u3000", "é", "中", "😀", "'s", "'ll"]


@pytest.mark.parametrize("model_id", ["gpt-4", "gpt-4o"])
def test_a_long_text_counted_by_paragraphs_counts_the_same(model_id: str) -> None:
    """Long texts (prompts) are counted as the sum of their paragraphs' remembered counts: the
    cut rule must give tiktoken's own count for any text. Random paragraphs over TRICKY joined by
    "\\n\\n" (a looser rule, cutting before whitespace or "/" too, fails this within a few hundred
    of these cases)."""
    rng = random.Random(7)
    for _ in range(4000):
        paragraphs = ["".join(rng.choice(TRICKY) for _ in range(rng.randint(0, 12)))
                      for _ in range(rng.randint(2, 6))]
        text = "\n\n".join(paragraphs)
        by_parts = sum(tokens.count_tokens(part, model_id) for part in tokens._PARAGRAPH_CUT.split(text))
        assert by_parts == tokens.count_tokens(text, model_id), repr(text)


def test_a_prompt_of_counted_blocks_is_counted_from_them() -> None:
    blocks = [f"speaker {i}: a line about hiking, the lake and {i} pictures." for i in range(200)]
    prompt = "\n\n".join(["## Retrieved context", *blocks])
    assert len(prompt) > tokens.REMEMBERED_MAX_CHARS
    assert tokens.count_tokens_remembered(prompt, "gpt-4") == tokens.count_tokens(prompt, "gpt-4")
    hits = tokens._remembered_count.cache_info().hits
    tokens.count_tokens_remembered(prompt, "gpt-4")
    assert tokens._remembered_count.cache_info().hits - hits == len(blocks) + 1
