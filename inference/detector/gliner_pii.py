"""DetectPII with GLiNER small v2.1 (the `gliner` package), the anti-collapse canary and the
mapping onto the closed platform enum.

Pieces, in the order a request meets them:

- `chunk_text` splits a fragment into overlapping word windows (GLiNER truncates anything past
  its `max_len` words silently, which would leave the tail of a long fragment unscanned).
- One `EntityModel.predict` call scores every chunk AND the canary sentence together, so the
  canary result is proof about the very call that produced the spans. The model sits behind that
  small seam (`EntityModel`): texts + labels + threshold in, codepoint spans out; tests stub it.
- `PROMPT_LABELS` is the zero-shot label prompt. Only labels mapped to a `PATTERN_CLASSES`
  member are emitted; everything else, the national-ID labels included, is dropped by
  construction (the class of an emitted span is looked up in the mapping, never copied from the
  model).
- Codepoint offsets are converted to UTF-8 byte offsets (half-open) and spans sorted by start.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import pathlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

# The closed enum of DetectPII's pattern_class. natid is deliberately absent (the caller derives
# it from format + checksum).
PATTERN_CLASSES = ("person", "dob", "address")

# The label prompt, in the order it is given to the model, and what each label becomes.
# None = asked for (keeping the measured zero-shot label interaction) but never emitted.
PROMPT_LABELS: tuple[tuple[str, str | None], ...] = (
    ("person", "person"),
    ("date of birth", "dob"),
    ("address", "address"),
    ("national id number", None),
    ("passport number", None),
    ("social security number", None),
)
LABEL_TO_CLASS: Mapping[str, str] = {label: cls for label, cls in PROMPT_LABELS if cls is not None}

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "context-engine/gliner@1"
CONFIG_FILE = "gliner_config.json"
DEFAULT_SOURCE = "urchade/gliner_small-v2.1"

# The same word notion GLiNER's default splitter uses, so chunk sizes count its words.
_WORD = re.compile(r"\w+(?:[-_]\w+)*|\S")


class ModelNotFound(Exception):
    """The model directory or one of its files is absent."""


class ModelInvalid(Exception):
    """The directory is present but cannot be loaded."""


class DependencyMissing(Exception):
    """gliner / torch are not installed (the `detector` extra)."""


class RawSpan(NamedTuple):
    """One model prediction: codepoint offsets into the text it was given, half-open."""

    start: int
    end: int
    label: str
    score: float


class PiiSpan(NamedTuple):
    """One emitted span: UTF-8 byte offsets, half-open."""

    pattern_class: str
    start: int
    end: int
    score: float


class EntityModel(Protocol):
    """The model seam: one batched zero-shot NER call."""

    def predict(self, texts: Sequence[str], labels: Sequence[str], threshold: float) -> list[list[RawSpan]]:
        ...


@dataclass(frozen=True)
class Canary:
    text: str
    expect: Mapping[str, str]  # pattern class -> the exact substring the model must find
    min_overlap: float = 0.5

    def expected_spans(self) -> dict[str, tuple[int, int]]:
        spans = {}
        for cls, needle in self.expect.items():
            start = self.text.find(needle)
            if start < 0:
                raise ValueError(f"canary expectation {needle!r} is not in the canary text")
            spans[cls] = (start, start + len(needle))
        return spans

    def missing(self, found: Sequence[RawSpan]) -> list[str]:
        """The expected classes the prediction did NOT find (empty = canary passes).

        A class is found when a prediction whose label maps to it overlaps the expected span with
        intersection-over-union >= min_overlap (so a span swallowing the sentence does not count).
        """
        missing = []
        for cls, (start, end) in self.expected_spans().items():
            ok = False
            for span in found:
                if LABEL_TO_CLASS.get(span.label) != cls:
                    continue
                inter = min(end, span.end) - max(start, span.start)
                union = max(end, span.end) - min(start, span.start)
                if inter > 0 and inter / union >= self.min_overlap:
                    ok = True
                    break
            if not ok:
                missing.append(cls)
        return missing


@dataclass(frozen=True)
class Detection:
    spans: list[PiiSpan]
    canary_missing: list[str]
    chunks: int

    @property
    def canary_healthy(self) -> bool:
        return not self.canary_missing


def chunk_text(text: str, words: int, overlap: int) -> list[tuple[int, str]]:
    """Overlapping windows of at most `words` words: (codepoint offset, chunk text) pairs.

    Consecutive chunks share `overlap` words, so an entity up to `overlap` words long lies whole
    in some chunk. A text that fits is one chunk (itself, offset 0).
    """
    if overlap >= words:
        raise ValueError("overlap must be smaller than words")
    bounds = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    if len(bounds) <= words:
        return [(0, text)]
    chunks = []
    step = words - overlap
    first = 0
    while True:
        last = min(first + words, len(bounds)) - 1
        start, end = bounds[first][0], bounds[last][1]
        chunks.append((start, text[start:end]))
        if last == len(bounds) - 1:
            return chunks
        first += step


def byte_offsets(text: str) -> list[int]:
    """offsets[i] = UTF-8 byte offset of codepoint i; offsets[len(text)] = total byte length."""
    sizes = (1 if c < "\x80" else 2 if c < "\u0800" else 3 if c < "\U00010000" else 4 for c in text)
    return list(itertools.accumulate(sizes, initial=0))


def _flat(spans: list[tuple[int, int, str, float]]) -> list[tuple[int, int, str, float]]:
    """Resolve overlaps (chunk overlaps yield duplicates): highest score first wins, like flat NER."""
    kept: list[tuple[int, int, str, float]] = []
    for span in sorted(spans, key=lambda s: (-s[3], s[0], s[1])):
        if all(span[1] <= k[0] or span[0] >= k[1] for k in kept):
            kept.append(span)
    return kept


PROMPT_LABEL_NAMES = tuple(label for label, _ in PROMPT_LABELS)


class PiiDetector:
    """Runs a request's chunks and the canary through one model call and maps the result."""

    def __init__(self, model: EntityModel, *, canary: Canary, threshold: float = 0.5,
                 chunk_words: int = 192, chunk_overlap: int = 48,
                 labels: Sequence[str] = PROMPT_LABEL_NAMES) -> None:
        self.model = model
        self.canary = canary
        self.threshold = threshold
        self.chunk_words = chunk_words
        self.chunk_overlap = chunk_overlap
        self.labels = list(labels)

    def detect(self, text: str) -> Detection:
        chunks = chunk_text(text, self.chunk_words, self.chunk_overlap)
        results = self.model.predict([c for _, c in chunks] + [self.canary.text], self.labels,
                                     self.threshold)
        if len(results) != len(chunks) + 1:
            raise RuntimeError(f"model returned {len(results)} results for {len(chunks) + 1} texts")
        canary_spans = [s for s in results[-1] if s.score >= self.threshold]
        missing = self.canary.missing(canary_spans)

        found: list[tuple[int, int, str, float]] = []
        for (offset, chunk), spans in zip(chunks, results[:-1], strict=True):
            for span in spans:
                cls = LABEL_TO_CLASS.get(span.label)
                if cls is None or span.score < self.threshold:
                    continue  # unmapped labels (national IDs, anything unexpected) end here
                start, end = offset + span.start, offset + span.end
                if not 0 <= start < end <= offset + len(chunk):
                    continue
                found.append((start, end, cls, float(span.score)))
        to_bytes = byte_offsets(text)
        pii = [PiiSpan(cls, to_bytes[start], to_bytes[end], min(max(score, 0.0), 1.0))
               for start, end, cls, score in _flat(found)]
        pii.sort(key=lambda s: (s.start, s.end))
        return Detection(spans=pii, canary_missing=missing, chunks=len(chunks))


# --- the GLiNER model behind the seam ------------------------------------------------------------


@dataclass(frozen=True)
class GlinerManifest:
    source: str
    revision: str
    runtime_files: dict[str, Any]

    @property
    def version(self) -> str:
        return f"{self.source}@{self.revision}"

    @classmethod
    def read(cls, directory: pathlib.Path) -> GlinerManifest:
        path = directory / MANIFEST_NAME
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ModelInvalid(f"cannot read {path}: {exc}") from exc
        if raw.get("format") != MANIFEST_FORMAT or not raw.get("revision"):
            raise ModelInvalid(f"{path}: not a {MANIFEST_FORMAT} manifest with a revision")
        return cls(source=str(raw.get("source") or DEFAULT_SOURCE), revision=str(raw["revision"]),
                   runtime_files=dict(raw.get("files", {})))


def check_gliner_dir(directory: pathlib.Path) -> GlinerManifest:
    if not directory.is_dir():
        raise ModelNotFound(f"{directory} does not exist")
    missing = [n for n in (CONFIG_FILE, MANIFEST_NAME) if not (directory / n).is_file()]
    if missing:
        raise ModelNotFound(f"{directory} lacks {', '.join(missing)}")
    return GlinerManifest.read(directory)


def import_gliner_package() -> Any:
    """The `gliner` module, with the Hugging Face hub forced offline (nothing is downloaded)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import gliner
        import torch  # noqa: F401  (gliner needs it; fail here with the install hint)
    except ImportError as exc:
        raise DependencyMissing(
            f"the PII model needs the `gliner` and `torch` packages ({exc}); install the detector "
            "extra: pip install 'context-engine[detector]'") from exc
    return gliner


class GlinerModel:
    """`EntityModel` over a local GLiNER directory (torch, or its ONNX export under onnxruntime)."""

    def __init__(self, directory: pathlib.Path, *, runtime: str = "torch", torch_threads: int = 0,
                 batch_size: int = 8) -> None:
        self.manifest = check_gliner_dir(directory)
        gliner = import_gliner_package()
        import torch

        if torch_threads:
            torch.set_num_threads(torch_threads)
        kwargs: dict[str, Any] = {"local_files_only": True}
        if runtime == "onnx":
            onnx_file = self.manifest.runtime_files.get("onnx")
            if not onnx_file or not (directory / onnx_file).is_file():
                raise ModelNotFound(f"{directory} has no ONNX export (import with --onnx)")
            kwargs.update(load_onnx_model=True, onnx_model_file=onnx_file)
        try:
            self.model = gliner.GLiNER.from_pretrained(str(directory), **kwargs)
        except Exception as exc:
            raise ModelInvalid(f"cannot load GLiNER from {directory}: {type(exc).__name__}: {exc}") from exc
        self.model.eval()
        self.batch_size = batch_size
        self.directory = directory

    @property
    def max_words(self) -> int:
        return int(getattr(self.model.config, "max_len", 384))

    def predict(self, texts: Sequence[str], labels: Sequence[str], threshold: float) -> list[list[RawSpan]]:
        import torch

        with torch.inference_mode():
            results = self.model.inference(list(texts), list(labels), flat_ner=True, threshold=threshold,
                                           multi_label=False, batch_size=self.batch_size)
        return [[RawSpan(int(e["start"]), int(e["end"]), str(e["label"]), float(e["score"])) for e in found]
                for found in results]


def content_revision(paths: Sequence[pathlib.Path]) -> str:
    """A revision for weights that came without one: the first 12 hex of SHA-256 over the files."""
    digest = hashlib.sha256()
    for path in sorted(paths, key=lambda p: p.name):
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return "sha256-" + digest.hexdigest()[:12]
