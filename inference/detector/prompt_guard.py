"""Prompt-Guard-86M under onnxruntime with a `tokenizers` tokenizer (no torch at serve time).

The model directory (`<models_dir>/prompt-guard-86m/`, written by `context-engine models import
prompt-guard`) holds:

    model.onnx       sequence classifier: inputs input_ids [+ attention_mask, token_type_ids],
                     output logits [batch, num_labels]
    tokenizer.json   the `tokenizers` serialisation of the model's tokenizer
    manifest.json    {"format", "name", "source", "revision", "id2label", "max_length", ...}

Label order comes from the manifest's `id2label` (copied from the model's config.json at import);
it is never assumed. Text longer than one window is scored in overlapping windows of
`max_length` tokens (special tokens included) whose starts are `stride` tokens apart, the last
window aligned to the end of the text, so every window has the same length (no padding, one
batched run) and every token is seen with at least `max_length - stride` tokens of context on one
side. Each class's probability is the maximum over the windows.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "context-engine/prompt-guard@1"
MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
REQUIRED_FILES = (MODEL_FILE, TOKENIZER_FILE, MANIFEST_NAME)
LABELS = ("BENIGN", "INJECTION", "JAILBREAK")


class ModelNotFound(Exception):
    """The model directory or one of its files is absent (the normal state before an import)."""


class ModelInvalid(Exception):
    """The model directory is present but unusable (bad manifest, labels, ONNX graph...)."""


class Scores(NamedTuple):
    benign: float
    injection: float
    jailbreak: float


@dataclass(frozen=True)
class Manifest:
    name: str
    source: str
    revision: str
    id2label: dict[int, str]
    max_length: int
    raw: dict[str, Any]

    @classmethod
    def read(cls, path: pathlib.Path) -> Manifest:
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ModelInvalid(f"cannot read {path}: {exc}") from exc
        if raw.get("format") != MANIFEST_FORMAT:
            raise ModelInvalid(f"{path}: format is {raw.get('format')!r}, expected {MANIFEST_FORMAT!r}")
        try:
            id2label = {int(k): str(v) for k, v in raw["id2label"].items()}
            return cls(name=str(raw.get("name", "")), source=str(raw.get("source", "")),
                       revision=str(raw["revision"]), id2label=id2label,
                       max_length=int(raw["max_length"]), raw=raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelInvalid(f"{path}: missing or malformed field: {exc}") from exc


def label_indices(id2label: dict[int, str]) -> dict[str, int]:
    """Map BENIGN / INJECTION / JAILBREAK to output columns, from the model's own label table."""
    by_name = {label.strip().upper(): index for index, label in id2label.items()}
    missing = [name for name in LABELS if name not in by_name]
    if missing:
        raise ModelInvalid(f"id2label {id2label} lacks {missing}; a Prompt-Guard-86M classifier has "
                           f"labels {list(LABELS)}")
    if sorted(id2label) != list(range(len(id2label))):
        raise ModelInvalid(f"id2label keys must be 0..{len(id2label) - 1}, got {sorted(id2label)}")
    return {name: by_name[name] for name in LABELS}


def window_starts(num_tokens: int, window: int, stride: int) -> list[int]:
    """Start offsets of the content windows over `num_tokens` content tokens.

    Windows are `window` tokens long, `stride` apart; the last one is aligned to the end, so the
    windows cover every token and all have the same length. One window when the text fits.
    """
    if window <= 0 or stride <= 0:
        raise ValueError("window and stride must be positive")
    if num_tokens <= window:
        return [0]
    last = num_tokens - window
    starts = list(range(0, last, stride))
    starts.append(last)
    return starts


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


class PromptGuard:
    """A loaded classifier. Thread-safe: onnxruntime sessions may be run concurrently."""

    def __init__(self, directory: pathlib.Path, *, max_tokens: int = 512, stride: int = 256,
                 batch_windows: int = 8, intra_op_threads: int = 0) -> None:
        self.directory = directory
        missing = [name for name in REQUIRED_FILES if not (directory / name).is_file()]
        if not directory.is_dir():
            raise ModelNotFound(f"{directory} does not exist")
        if missing:
            raise ModelNotFound(f"{directory} lacks {', '.join(missing)}")
        self.manifest = Manifest.read(directory / MANIFEST_NAME)
        self._columns = label_indices(self.manifest.id2label)

        from tokenizers import Tokenizer

        try:
            self._tokenizer = Tokenizer.from_file(str(directory / TOKENIZER_FILE))
        except Exception as exc:  # the tokenizers error type is not public
            raise ModelInvalid(f"cannot load {directory / TOKENIZER_FILE}: {exc}") from exc
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self._prefix, self._suffix = self._special_template()

        self.max_length = min(max_tokens, self.manifest.max_length)
        self.window = self.max_length - len(self._prefix) - len(self._suffix)
        if self.window < 1:
            raise ModelInvalid(f"max_length {self.max_length} leaves no room for text")
        self.stride = min(stride, self.window)
        self.batch_windows = batch_windows

        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if intra_op_threads:
            options.intra_op_num_threads = intra_op_threads
        try:
            self._session = ort.InferenceSession(str(directory / MODEL_FILE), sess_options=options,
                                                 providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise ModelInvalid(f"cannot load {directory / MODEL_FILE}: {exc}") from exc
        self._inputs = {i.name for i in self._session.get_inputs()}
        if "input_ids" not in self._inputs:
            raise ModelInvalid(f"{directory / MODEL_FILE} has no input_ids input (has {sorted(self._inputs)})")
        self._output = self._session.get_outputs()[0].name
        # Proves the graph and the label table agree before the model reports SERVING.
        probe = self._run([self._prefix + self._suffix])
        if probe.shape != (1, len(self.manifest.id2label)):
            raise ModelInvalid(f"model output shape {probe.shape} does not match "
                               f"{len(self.manifest.id2label)} labels in the manifest")

    @property
    def revision(self) -> str:
        return self.manifest.revision

    def _special_template(self) -> tuple[list[int], list[int]]:
        """The special tokens the tokenizer's post-processor puts around one sequence."""
        encoding = self._tokenizer.encode("a", add_special_tokens=True)
        mask = encoding.special_tokens_mask
        ordinary = [i for i, special in enumerate(mask) if not special]
        if not ordinary:
            raise ModelInvalid("tokenizer produced only special tokens for 'a'")
        return list(encoding.ids[: ordinary[0]]), list(encoding.ids[ordinary[-1] + 1:])

    def windows(self, text: str) -> list[list[int]]:
        """Token ids of every window (special tokens included) the text is scored in."""
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        return [self._prefix + ids[s: s + self.window] + self._suffix
                for s in window_starts(len(ids), self.window, self.stride)]

    def _run(self, batch: Sequence[list[int]]) -> np.ndarray:
        input_ids = np.asarray(batch, dtype=np.int64)
        feed = {"input_ids": input_ids}
        if "attention_mask" in self._inputs:
            feed["attention_mask"] = np.ones_like(input_ids)
        if "token_type_ids" in self._inputs:
            feed["token_type_ids"] = np.zeros_like(input_ids)
        return self._session.run([self._output], feed)[0]

    def window_probabilities(self, text: str) -> np.ndarray:
        """[windows, 3] probabilities in the order BENIGN, INJECTION, JAILBREAK."""
        windows = self.windows(text)
        logits = np.concatenate([self._run(windows[i: i + self.batch_windows])
                                 for i in range(0, len(windows), self.batch_windows)])
        probs = softmax(logits)
        return probs[:, [self._columns[name] for name in LABELS]]

    def classify(self, text: str) -> Scores:
        """(P(BENIGN), P(INJECTION), P(JAILBREAK)), each the maximum over the windows."""
        top = self.window_probabilities(text).max(axis=0)
        return Scores(float(top[0]), float(top[1]), float(top[2]))
