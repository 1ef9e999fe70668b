"""The chunking rule: what text becomes which chunk.

1. **Text extraction.** Content is bytes: content that is not valid UTF-8 (binary) yields no
   chunk; it is stored and returned verbatim but is not retrievable. C0/C1 control characters
   other than tab, newline and carriage return (NUL among them) become spaces. Plain text is
   then used as is. JSON content (a ``dict``/``list`` value, or a
   string declared ``application/json``) becomes one line per scalar leaf,
   ``dotted.key.path: value``, keys sorted, list indices omitted from the path, ``null`` leaves
   skipped, booleans as ``true``/``false``. Keys are kept because they carry meaning for both
   BM25 and the embedder (``"address.city: Paris"``); sorting makes the text independent of
   the producer's key order, so equal JSON gives equal text and an equal content hash.
2. **Short stays whole.** A text of at most ``max_tokens`` tokens (cl100k_base, via
   :mod:`inference.tokens`; default 256) is ONE chunk: a conversation turn stays
   one chunk unless it is long. Leading/trailing whitespace is stripped; an empty or
   whitespace-only text yields no chunk.
3. **Long texts split on boundaries.** Paragraphs (blank lines), then sentences (after
   ``. ! ?`` and their CJK forms, before whitespace), then — only for a single sentence longer
   than ``max_tokens`` — token-boundary cuts (never inside a UTF-8 character). The pieces are
   packed greedily, in order, into windows of at most ``max_tokens`` tokens; each window's
   content is the ORIGINAL text from its first piece's start to its last piece's end, so
   formatting inside a window is preserved.
4. **Overlap.** Each window after the first starts with the trailing pieces of the previous
   window that fit in ``overlap_tokens`` (default 32): whole sentences only, so the overlap is
   "the last sentence or so", never a cut word. A hard-cut piece is too long to be carried.
5. **A summary line is one chunk.** A compaction summary is one session_events row per line
   (docs/compaction.md), and each is ONE chunk whatever its length (:func:`summary_line_chunk`):
   it is shown in a prompt, never retrieved (the turns it stands for are), so it is neither cut
   for the embedder nor indexed.
6. **Identity.** ``id = UUIDv5(CHUNK_NAMESPACE, f"{source_event_id}#{index}")``: replaying an
   event reproduces its chunk ids. ``content_hash = SHA-256(content as UTF-8)`` in lowercase
   hex: identical content gives an identical hash, whatever event it came from, so embeddings
   are computed once per content hash. ``token_count`` is the cl100k count of ``content``.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from inference import tokens

__all__ = [
    "CHUNK_NAMESPACE",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_OVERLAP_TOKENS",
    "ENCODING",
    "Chunk",
    "chunk_content",
    "summary_line_chunk",
    "chunk_id",
    "chunk_text",
    "content_hash",
    "json_text",
]

CHUNK_NAMESPACE = uuid.UUID("6f1c1b8e-3d2a-5c47-9e0b-7a4d2c9f8e31")
DEFAULT_MAX_TOKENS = 256
DEFAULT_OVERLAP_TOKENS = 32
ENCODING_MODEL = "gpt-4"  # any cl100k model id; tokens.count_tokens maps it to cl100k_base
ENCODING = tokens.CL100K_BASE


@dataclass(frozen=True)
class Chunk:
    id: uuid.UUID
    source_event_id: str
    index: int
    content: str
    content_hash: str
    token_count: int


def chunk_id(source_event_id: str, index: int) -> uuid.UUID:
    return uuid.uuid5(CHUNK_NAMESPACE, f"{source_event_id}#{index}")


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _count(text: str) -> int:
    return tokens.count_tokens(text, ENCODING_MODEL)


# ------------------------------------------------------------------------------------------
# JSON
# ------------------------------------------------------------------------------------------


def _leaves(value: Any, path: str, out: list[str]) -> None:
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            _leaves(value[key], f"{path}.{key}" if path else str(key), out)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _leaves(item, path, out)
    elif value is None:
        return
    else:
        if isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = str(value)
        if text.strip():
            out.append(f"{path}: {text}" if path else text)


def json_text(value: Any) -> str:
    """Text of a parsed JSON value: ``key.path: value`` per scalar leaf (module docstring)."""
    out: list[str] = []
    _leaves(value, "", out)
    return "\n".join(out)


# ------------------------------------------------------------------------------------------
# Splitting
# ------------------------------------------------------------------------------------------

_PARAGRAPH = re.compile(r"\S(?:.*?\S)?(?=\s*\n[ \t]*\n|\s*\Z)", re.S)
_SENTENCE = re.compile(r"\S.*?(?:[.!?](?=\s)|[。！？]|\Z)", re.S)


def _spans(text: str, pattern: re.Pattern[str], start: int, end: int) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in pattern.finditer(text, start, end)]


class _Counter:
    """Token counts of spans of one text, from ONE tokenization of the whole: a count is two
    binary searches, so splitting is linear in the text's size (counting every candidate window
    afresh was quadratic: 100 KB without a space took 1.4 s, a megabyte minutes). A span's own
    tokenization can differ from its slice of the whole's at its edges; `chunk_text` re-counts
    every chunk it keeps, and splits again, exactly, the rare one that came out over budget."""

    def __init__(self, text: str) -> None:
        enc = tokens.get_encoding(ENCODING)
        ids = enc.encode_ordinary(text)
        raw = text.encode("utf-8")
        # char_at[b]: characters wholly before byte b (a token may end inside a character)
        starts = np.frombuffer(raw, dtype=np.uint8) & 0xC0 != 0x80
        char_at = np.concatenate(([0], np.cumsum(starts)))
        byte_ends = np.cumsum([len(enc.decode_single_token_bytes(t)) for t in ids], dtype=np.int64)
        self.ends = char_at[byte_ends] if len(ids) else np.zeros(0, dtype=np.int64)  # char end of each token

    def __call__(self, start: int, end: int) -> int:
        return int(np.searchsorted(self.ends, end, "right") - np.searchsorted(self.ends, start, "right"))

    def cut(self, start: int, max_tokens: int) -> int:
        """Where `max_tokens` tokens from `start` end (a character offset after `start`)."""
        first = int(np.searchsorted(self.ends, start, "right"))
        last = min(first + max_tokens, len(self.ends)) - 1
        return max(int(self.ends[last]) if last >= first else start + 1, start + 1)


def _exact(text: str):
    return lambda start, end: _count(text[start:end])


def _hard_cut(text: str, start: int, end: int, max_tokens: int, count) -> list[tuple[int, int]]:
    out = []
    pos = start
    while pos < end:
        cut = min(count.cut(pos, max_tokens), end) if isinstance(count, _Counter) else \
            pos + len(tokens.truncate_to_tokens(text[pos:end], max_tokens, ENCODING_MODEL) or text[pos])
        out.append((pos, cut))
        pos = cut
        while pos < end and text[pos].isspace():
            pos += 1
    return out


def _units(text: str, max_tokens: int, count) -> list[tuple[int, int, bool]]:
    """(start, end, splittable) pieces, each at most ``max_tokens``; ``splittable`` False for a
    hard cut (not eligible as overlap)."""
    units: list[tuple[int, int, bool]] = []
    for ps, pe in _spans(text, _PARAGRAPH, 0, len(text)):
        if count(ps, pe) <= max_tokens:
            units.append((ps, pe, True))
            continue
        for ss, se in _spans(text, _SENTENCE, ps, pe):
            if count(ss, se) <= max_tokens:
                units.append((ss, se, True))
            else:
                units.extend((a, b, False) for a, b in _hard_cut(text, ss, se, max_tokens, count))
    return units


def _windows(text: str, max_tokens: int, overlap_tokens: int, count) -> list[tuple[int, int]]:
    units = _units(text, max_tokens, count)
    windows: list[tuple[int, int]] = []
    current: list[tuple[int, int, bool]] = []
    fresh = 0  # units in `current` not carried over from the previous window

    for unit in units:
        if current and count(current[0][0], unit[1]) > max_tokens:
            windows.append((current[0][0], current[-1][1]))
            carry: list[tuple[int, int, bool]] = []
            for u in reversed(current):
                if not u[2] or count(u[0], (carry or [u])[-1][1]) > overlap_tokens:
                    break
                carry.insert(0, u)
            # the carry must leave room for the new unit
            while carry and count(carry[0][0], unit[1]) > max_tokens:
                carry.pop(0)
            current, fresh = carry, 0
        current.append(unit)
        fresh += 1
    if current and fresh:
        windows.append((current[0][0], current[-1][1]))
    return windows


def _pieces(text: str, max_tokens: int, overlap_tokens: int) -> list[tuple[str, int]]:
    """Each window's content and exact count. A window the whole text's tokenization put within
    budget but whose own count is over is split again with exact counts."""
    out = []
    for a, b in _windows(text, max_tokens, overlap_tokens, _Counter(text)):
        piece = text[a:b]
        n = _count(piece)
        if n <= max_tokens:
            out.append((piece, n))
        else:
            out.extend((piece[x:y], _count(piece[x:y]))
                       for x, y in _windows(piece, max_tokens, overlap_tokens, _exact(piece)))
    return out


# C0 and C1 controls other than tab, newline and carriage return, and DEL: PostgreSQL text cannot
# hold NUL, and none of them means anything to BM25, the embedder or a prompt.
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def retrieval_text(text: str) -> str:
    """The text that is chunked: controls other than tab and line breaks become spaces."""
    return _CONTROLS.sub(" ", text)


def chunk_text(source_event_id: str, text: str, *, max_tokens: int = DEFAULT_MAX_TOKENS,
               overlap_tokens: int = DEFAULT_OVERLAP_TOKENS) -> list[Chunk]:
    """Chunks of a text (module docstring, rules 2-4 and 6)."""
    if max_tokens < 8:
        raise ValueError("max_tokens must be >= 8")
    if not 0 <= overlap_tokens < max_tokens:
        raise ValueError("overlap_tokens must be in [0, max_tokens)")
    text = retrieval_text(text).strip()
    if not text:
        return []
    # The common case (a turn) is counted once. A token covers at most a few dozen characters,
    # so a text this long is over budget without being counted here: `_pieces` counts it.
    whole = _count(text) if len(text) <= 64 * max_tokens else max_tokens + 1
    if whole <= max_tokens:
        return [Chunk(chunk_id(source_event_id, 0), source_event_id, 0, text, content_hash(text), whole)]
    return [
        Chunk(chunk_id(source_event_id, i), source_event_id, i, p, content_hash(p), n)
        for i, (p, n) in enumerate(_pieces(text, max_tokens, overlap_tokens))
    ]


def summary_line_chunk(source_event_id: str, text: str, token_count: int) -> Chunk:
    """The chunk of a compaction summary's line (rule 5): the line whole, `token_count` its
    stored cl100k count."""
    return Chunk(chunk_id(source_event_id, 0), source_event_id, 0, text, content_hash(text), token_count)


def chunk_content(source_event_id: str, content: Any, *, content_type: str = "text/plain",
                  max_tokens: int = DEFAULT_MAX_TOKENS,
                  overlap_tokens: int = DEFAULT_OVERLAP_TOKENS) -> list[Chunk]:
    """Chunks of an event's content: JSON values (or JSON text) via :func:`json_text`,
    bytes as UTF-8, anything else as text."""
    if isinstance(content, (bytes, bytearray)):
        try:
            content = bytes(content).decode("utf-8")
        except UnicodeDecodeError:
            return []  # binary content is stored and returned as it is, never retrieved as text
    raw_text = content if isinstance(content, str) else None
    if isinstance(content, str) and content_type.split(";")[0].strip().lower().endswith("json"):
        try:
            content = json.loads(content)
        except (ValueError, RecursionError):
            pass  # not actually JSON (or nested deeper than the parser goes): index the text as it is
    try:
        text = content if isinstance(content, str) else json_text(content)
    except RecursionError:  # JSON nested deeper than its leaves can be walked: index the text as it is
        if raw_text is None:
            raise
        text = raw_text
    return chunk_text(source_event_id, text, max_tokens=max_tokens, overlap_tokens=overlap_tokens)
