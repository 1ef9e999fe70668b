"""The manifest `models fetch` reads (inference/detector/model_manifest.py) and the refusals that
come before any download."""

from __future__ import annotations

import copy
import errno
import pathlib

import pytest

from inference.detector import fetcher, model_manifest
from inference.detector.model_manifest import MANIFEST, ManifestInvalid, parse

SHA = "0" * 64
COMMIT = "a" * 40


def test_this_builds_manifest_parses_and_pins_all_or_nothing_per_model() -> None:
    sources = parse(MANIFEST)
    assert set(model_manifest.MODEL_NAMES) <= set(sources)
    assert sources["gliner"].backbone == "gliner-backbone"
    for source in sources.values():
        pins = [f.sha256 for f in source.files]
        assert source.pinned == (source.revision is not None and all(pins))
        assert source.page == f"https://huggingface.co/{source.repo}"
    assert sources["prompt-guard"].gated and not sources["gliner"].gated


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m["gliner"].update(revision="main"), "gliner: revision must be a 40-hex commit id"),
    (lambda m: m["gliner"].update(files={"a.bin": {"sha256": "not-hex"}}), "gliner: file 'a.bin' needs a lowercase"),
    (lambda m: m["gliner"].update(files={"a.bin": {"sha256": SHA, "size": -1}}), "size that is not a non-negative"),
    (lambda m: m["gliner"].update(files={}), "gliner: needs the files"),
    (lambda m: m["gliner"].update(backbone="nowhere"), "its backbone 'nowhere' has no entry"),
    (lambda m: m["gliner"].update(repo="no-owner"), "gliner: needs a repo"),
    (lambda m: m.pop("prompt-guard"), "no entry 'prompt-guard'"),
])
def test_a_manifest_that_cannot_be_fetched_as_written_is_refused_by_name(change, message) -> None:
    raw = copy.deepcopy(MANIFEST)
    change(raw)
    with pytest.raises(ManifestInvalid, match=message):
        parse(raw)


def test_a_pinned_entry_is_pinned() -> None:
    raw = copy.deepcopy(MANIFEST)
    raw["gliner"].update(revision=COMMIT, files={"a.bin": {"sha256": SHA, "size": 3}})
    assert parse(raw)["gliner"].pinned


def test_a_manifest_file_that_is_not_json_names_itself(tmp_path: pathlib.Path) -> None:
    (tmp_path / "m.json").write_text("{not json")
    with pytest.raises(ManifestInvalid, match="cannot read the manifest .*m.json"):
        model_manifest.load(tmp_path / "m.json")


def test_without_the_detector_extra_nothing_is_downloaded_or_written(tmp_path: pathlib.Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetcher, "_importable", lambda module: module != "gliner")
    with pytest.raises(fetcher.FetchFailed, match=r"detector extra \(gliner missing\).*make install-detector"):
        fetcher.fetch_model("gliner", parse(MANIFEST), tmp_path / "models", unpinned=True)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("content", ["", "\n", "two words\n"])
def test_a_token_file_without_one_token_is_refused(tmp_path: pathlib.Path, content: str) -> None:
    (tmp_path / "token").write_text(content)
    with pytest.raises(fetcher.FetchFailed, match="holds no token"):
        fetcher.read_token(tmp_path / "token")
    assert fetcher.read_token(None) is None


def test_a_full_disk_is_named_and_the_command_resumes() -> None:
    source = parse(MANIFEST)["gliner"]
    failed = fetcher._explain(source, "pytorch_model.bin", OSError(errno.ENOSPC, "No space left on device"), False)
    assert "the disk is full while downloading urchade/gliner_small-v2.1 (pytorch_model.bin)" in str(failed)
    assert "run the same command again (it resumes)" in str(failed)
