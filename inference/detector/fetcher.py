"""`context-engine models fetch`: download the files a detector model is imported from, check
them, then install them the way `models import` does.

Files come from the Hugging Face Hub (`HF_ENDPOINT` names another server speaking its file API)
through `huggingface_hub`, into a downloads directory beside the models directory, never into it:
`<downloads>/<owner>--<name>@<commit>/`. An interrupted download resumes there from its
`.incomplete` file (huggingface_hub's Range requests). Every file of a pinned model is checked
against the manifest's SHA-256 before the import reads it; a file that differs is deleted. The
import stages and validates (canary, onnxruntime against torch) and swaps the model in with a
rename, so a failure at any step leaves the models directory as it was.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
from collections.abc import Callable
from dataclasses import dataclass

from inference.detector.importer import sha256_file
from inference.detector.model_manifest import COMMIT, ModelSource

Progress = Callable[[str], None]


class FetchFailed(Exception):
    """The fetch stopped; the message says why and what to do. Nothing was installed."""


@dataclass(frozen=True)
class Fetched:
    source: ModelSource
    directory: pathlib.Path  # the downloaded files
    commit: str
    sha256: dict[str, str]  # file -> its SHA-256 as downloaded
    size: dict[str, int]

    def pins(self) -> dict[str, object]:
        """The manifest entry that pins what was downloaded (`models fetch --print-pins`)."""
        return {"repo": self.source.repo, "revision": self.commit, "gated": self.source.gated,
                "licence": self.source.licence,
                "files": {n: {"sha256": self.sha256[n], "size": self.size[n]} for n in self.sha256},
                **({"backbone": self.source.backbone} if self.source.backbone else {})}


def endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _explain(source: ModelSource, filename: str, exc: BaseException, token_given: bool) -> FetchFailed:
    """One clear message per way a download fails."""
    from huggingface_hub import errors

    where = f"{source.repo} ({filename}) from {endpoint()}"
    status = exc.response.status_code if isinstance(exc, errors.HfHubHTTPError) and exc.response is not None else None
    if source.gated and (isinstance(exc, errors.GatedRepoError) or status in (401, 403)):
        how = ("the token given was refused: check that it has read access and that its account accepted"
               if token_given or _stored_token() else "then give a token: set HF_TOKEN, or --token-file FILE")
        return FetchFailed(f"{source.repo} is gated ({source.licence}): accept the licence at {source.page} "
                           f"with your Hugging Face account, {how}")
    if isinstance(exc, (errors.RevisionNotFoundError, errors.RepositoryNotFoundError)) or status in (401, 403, 404):
        return FetchFailed(f"{where}: the repository or revision {source.revision or 'main'} is not there ({exc})")
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return FetchFailed(f"the disk is full while downloading {where}; free space and run the same command "
                           "again (it resumes)")
    if isinstance(exc, (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled)) or _is_network(exc):
        return FetchFailed(f"cannot download {where}: {type(exc).__name__}: {exc}. Check the network (or "
                           "HF_ENDPOINT, HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE); an offline copy installs with "
                           "`models import ... --from DIR`")
    if isinstance(exc, errors.EntryNotFoundError):
        return FetchFailed(f"{where}: the file is not in revision {source.revision or 'main'}")
    return FetchFailed(f"downloading {where} failed: {type(exc).__name__}: {exc}")


def _stored_token() -> bool:
    """Whether huggingface_hub sends a token of its own (HF_TOKEN, or one saved by `hf auth login`)."""
    from huggingface_hub import get_token

    return get_token() is not None


def _is_network(exc: BaseException) -> bool:
    import httpx

    return isinstance(exc, (httpx.TransportError, ConnectionError, TimeoutError))


def _commit(source: ModelSource, token: str | None) -> str:
    """The commit the files come from: the pinned one, or the one `main` points at now."""
    if source.revision is not None:
        return source.revision
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    first = source.files[0].name
    try:
        commit = get_hf_file_metadata(hf_hub_url(source.repo, first, revision="main"), token=token).commit_hash
    except Exception as exc:  # noqa: BLE001 - every failure becomes one explained FetchFailed
        raise _explain(source, first, exc, token is not None) from exc
    if not commit or not COMMIT.fullmatch(commit):
        raise FetchFailed(f"{endpoint()} did not name the commit {source.repo}@main is (X-Repo-Commit "
                          f"{str(commit)[:60]!r} is not a 40-hex commit id)")
    return commit


def download(source: ModelSource, downloads: pathlib.Path, *, token: str | None, unpinned: bool,
             progress: Progress) -> Fetched:
    """Every file of `source` in `<downloads>/<owner>--<name>@<commit>/`, checked against its pins."""
    if not source.pinned and not unpinned:
        raise FetchFailed(f"this build pins no revision and checksums for {source.repo} (it could not reach the "
                          f"Hub when it was made): pass --unpinned to take its main branch and record what "
                          f"was downloaded, or --manifest FILE with your own pins, or install an offline copy "
                          f"with `models import ... --from DIR`")
    from huggingface_hub import hf_hub_download

    commit = _commit(source, token)
    directory = downloads / f"{source.repo.replace('/', '--')}@{commit}"
    directory.mkdir(parents=True, exist_ok=True)
    sha256, size = {}, {}
    for pinned in source.files:
        progress(f"{source.repo}@{commit[:12]}: {pinned.name}")
        try:
            path = pathlib.Path(hf_hub_download(source.repo, pinned.name, revision=commit, local_dir=directory,
                                                token=token))
        except Exception as exc:  # noqa: BLE001 - every failure becomes one explained FetchFailed
            raise _explain(source, pinned.name, exc, token is not None) from exc
        got = sha256_file(path)
        if pinned.sha256 is not None and got != pinned.sha256:
            path.unlink(missing_ok=True)
            raise FetchFailed(f"{source.repo}@{commit[:12]} {pinned.name}: SHA-256 {got} is not the manifest's "
                              f"{pinned.sha256}; the file was deleted and nothing was installed")
        sha256[pinned.name], size[pinned.name] = got, path.stat().st_size
    return Fetched(source, directory, commit, sha256, size)


def read_token(token_file: pathlib.Path | None) -> str | None:
    """The token from `--token-file`, else None (huggingface_hub then reads HF_TOKEN itself)."""
    if token_file is None:
        return None
    try:
        token = token_file.read_text().strip()
    except OSError as exc:
        raise FetchFailed(f"cannot read --token-file {token_file}: {exc}") from exc
    if not token or any(c.isspace() for c in token):
        raise FetchFailed(f"--token-file {token_file} holds no token (one line, no spaces)")
    return token


def require_detector_extra(key: str) -> None:
    """The import needs torch and transformers (and gliner for GLiNER); refuse before downloading."""
    modules = ("torch", "transformers") + (("gliner",) if key == "gliner" else ())
    missing = [m for m in modules if not _importable(m)]
    if missing:
        raise FetchFailed(f"installing {key} needs the detector extra ({', '.join(missing)} missing): run "
                          "`make install-detector` in a checkout, or pip install 'context-engine[detector]'")


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def record_download(installed: pathlib.Path, fetched: list[Fetched]) -> None:
    """What the fetch downloaded, beside the model's own manifest: per repository (the model's and
    its backbone's), the commit and each file's SHA-256, and whether the manifest pinned them."""
    (installed / "fetched.json").write_text(json.dumps(
        {"endpoint": endpoint(), **{f.source.key: {"pinned": f.source.pinned, **f.pins()} for f in fetched}},
        indent=2, sort_keys=True) + "\n")


def default_downloads(models_dir: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(os.path.abspath(models_dir)).parent / "model-downloads"


def installed_dir(key: str, models_dir: pathlib.Path) -> pathlib.Path:
    """Where `key` ("prompt-guard" or "gliner") is installed under `models_dir`."""
    from inference.detector.settings import GLINER_NAME, PROMPT_GUARD_NAME

    return models_dir / (PROMPT_GUARD_NAME if key == "prompt-guard" else GLINER_NAME)


def fetch_model(key: str, sources: dict[str, ModelSource], models_dir: pathlib.Path, *,
                downloads: pathlib.Path | None = None, token: str | None = None, unpinned: bool = False,
                force: bool = False, export_onnx: bool = False,
                progress: Progress = lambda message: None) -> tuple[pathlib.Path, list[Fetched]]:
    """Download `key` ("prompt-guard" or "gliner", with its backbone) and install it as `models import`
    does; returns the installed directory and what was downloaded."""
    from inference.detector import importer

    dest = installed_dir(key, models_dir)
    if dest.exists() and not force:
        raise FetchFailed(f"{dest} already exists; pass --force to replace it")
    require_detector_extra(key)
    downloads = downloads or default_downloads(models_dir)
    source = sources[key]
    fetched = [download(source, downloads, token=token, unpinned=unpinned, progress=progress)]
    try:
        if key == "prompt-guard":
            installed = importer.import_prompt_guard(fetched[0].directory, models_dir, revision=fetched[0].commit,
                                                     source_name=source.repo, force=force, progress=progress)
        else:
            backbone = None
            if source.backbone is not None:
                fetched.append(download(sources[source.backbone], downloads, token=token, unpinned=unpinned,
                                        progress=progress))
                backbone = fetched[-1].directory
            installed = importer.import_gliner(fetched[0].directory, models_dir, revision=fetched[0].commit,
                                               source_name=source.repo, backbone=backbone, export_onnx=export_onnx,
                                               force=force, progress=progress)
    except importer.ImportFailed as exc:
        raise FetchFailed(f"the downloaded {source.repo} does not install: {exc}") from exc
    record_download(installed, fetched)
    return installed, fetched
