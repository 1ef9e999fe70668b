"""Where `context-engine models fetch` gets the detector's models: a Hugging Face repository per
model, the revision fetched and each file's SHA-256 and size.

A model is pinned when its revision is a commit id and every file has its SHA-256: then the fetch
takes exactly those bytes or nothing. This build could not reach the Hub to read the published
commits and checksums, so the entries below are unpinned: `models fetch` refuses them unless
`--unpinned` is given, and then takes the Hub's `main`, records the commit and the SHA-256 it saw in
the installed model's manifest and prints the entry to pin here (`--print-pins`). `--manifest FILE`
reads a manifest of the same shape from a JSON file instead (an offline mirror's own pins).
"""

from __future__ import annotations

import json
import pathlib
import re
from dataclasses import dataclass
from typing import Any

COMMIT = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")
MODEL_NAMES = ("prompt-guard", "gliner")

MANIFEST: dict[str, Any] = {
    "prompt-guard": {
        "repo": "meta-llama/Prompt-Guard-86M",
        "revision": None,
        "gated": True,
        "licence": "Llama 3.1 Community License",
        # The files the importer reads: the labels (config.json), the weights, the tokenizer.
        "files": {"config.json": None, "model.safetensors": None, "tokenizer.json": None,
                  "tokenizer_config.json": None, "special_tokens_map.json": None},
    },
    "gliner": {
        "repo": "urchade/gliner_small-v2.1",
        "revision": None,
        "gated": False,
        "licence": "Apache-2.0",
        "files": {"gliner_config.json": None, "pytorch_model.bin": None},
        "backbone": "gliner-backbone",
    },
    # The save names its encoder without embedding it: its config and tokenizer (not its weights).
    "gliner-backbone": {
        "repo": "microsoft/deberta-v3-small",
        "revision": None,
        "gated": False,
        "licence": "MIT",
        "files": {"config.json": None, "spm.model": None, "tokenizer_config.json": None},
    },
}


class ManifestInvalid(ValueError):
    """The manifest names something that cannot be fetched as written; the message says what."""


@dataclass(frozen=True)
class PinnedFile:
    name: str
    sha256: str | None  # None: unpinned
    size: int | None


@dataclass(frozen=True)
class ModelSource:
    key: str  # "prompt-guard", "gliner", "gliner-backbone"
    repo: str  # "owner/name" on the Hub
    revision: str | None  # a 40-hex commit id, or None (unpinned: the Hub's main)
    gated: bool
    licence: str
    files: tuple[PinnedFile, ...]
    backbone: str | None = None  # the key of the entry holding this model's encoder

    @property
    def pinned(self) -> bool:
        return self.revision is not None and all(f.sha256 for f in self.files)

    @property
    def page(self) -> str:
        return f"https://huggingface.co/{self.repo}"


def _file(key: str, name: str, raw: Any) -> PinnedFile:
    if raw is None:
        return PinnedFile(name, None, None)
    if not isinstance(raw, dict) or not SHA256.fullmatch(str(raw.get("sha256", ""))):
        raise ManifestInvalid(f"{key}: file {name!r} needs a lowercase hex sha256 (or null when unpinned)")
    size = raw.get("size")
    if size is not None and (not isinstance(size, int) or size < 0):
        raise ManifestInvalid(f"{key}: file {name!r} has a size that is not a non-negative integer")
    return PinnedFile(name, raw["sha256"], size)


def parse(raw: Any) -> dict[str, ModelSource]:
    """The manifest's entries, checked: a revision is a commit id or null, a file's pin a SHA-256."""
    if not isinstance(raw, dict):
        raise ManifestInvalid("the manifest is not a JSON object of model entries")
    sources = {}
    for key, entry in raw.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("repo"), str) or "/" not in entry["repo"]:
            raise ManifestInvalid(f"{key}: needs a repo 'owner/name'")
        revision = entry.get("revision")
        if revision is not None and not COMMIT.fullmatch(str(revision)):
            raise ManifestInvalid(f"{key}: revision must be a 40-hex commit id or null, not {revision!r}")
        files = entry.get("files")
        if not isinstance(files, dict) or not files:
            raise ManifestInvalid(f"{key}: needs the files to fetch")
        sources[key] = ModelSource(key, entry["repo"], revision, bool(entry.get("gated", False)),
                                   str(entry.get("licence", "")),
                                   tuple(_file(key, name, pin) for name, pin in files.items()),
                                   entry.get("backbone"))
    for source in sources.values():
        if source.backbone is not None and source.backbone not in sources:
            raise ManifestInvalid(f"{source.key}: its backbone {source.backbone!r} has no entry")
    for name in MODEL_NAMES:
        if name not in sources:
            raise ManifestInvalid(f"the manifest has no entry {name!r}")
    return sources


def raw(path: pathlib.Path | None = None) -> dict[str, Any]:
    """The manifest as written: this build's, or the JSON file at `path`."""
    if path is None:
        return MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ManifestInvalid(f"cannot read the manifest {path}: {exc}") from exc


def load(path: pathlib.Path | None = None) -> dict[str, ModelSource]:
    """This build's manifest, or the JSON file at `path`, checked."""
    return parse(raw(path))
