"""`context-engine models ...`: install and inspect the detector's model weights.

`models_app` is a typer sub-app; the main CLI mounts it as `models`.
"""

from __future__ import annotations

import enum
import json
import pathlib
from typing import Annotated, Optional

import typer

models_app = typer.Typer(no_args_is_help=True, add_completion=False,
                         help="Detector model weights: fetch from the Hugging Face Hub, import from local "
                              "directories, show what is installed.")
import_app = typer.Typer(no_args_is_help=True,
                         help="Import model weights from a local directory (nothing is downloaded).")
models_app.add_typer(import_app, name="import")

ModelsDir = Annotated[Optional[pathlib.Path], typer.Option(
    "--models-dir", help="Where models are installed [env CONTEXT_ENGINE_DETECTOR_MODELS_DIR; "
                         "default <data dir>/models]")]
Revision = Annotated[Optional[str], typer.Option(
    help="Revision recorded in model_version [default: sha256 of the source weights]")]
Force = Annotated[bool, typer.Option("--force", help="Replace an installed model")]


def _models_dir(option: pathlib.Path | None) -> pathlib.Path:
    if option is not None:
        return option
    from inference.detector.settings import DetectorSettings

    return DetectorSettings().models_root


def _progress(message: str) -> None:
    typer.echo(message, err=True)


def _fail(exc: Exception) -> typer.Exit:
    typer.secho(f"import failed: {exc}", err=True, fg=typer.colors.RED)
    return typer.Exit(1)


@import_app.command("prompt-guard")
def import_prompt_guard(
    source: Annotated[pathlib.Path, typer.Option(
        "--from", help="A Hugging Face Prompt-Guard-86M directory (config.json, weights, tokenizer.json) "
                       "or a directory holding its ONNX export (model.onnx or onnx/model.onnx)")],
    revision: Revision = None,
    name: Annotated[str, typer.Option(help="Artifact name recorded in the manifest")] = "meta-llama/Prompt-Guard-86M",
    max_length: Annotated[int, typer.Option(help="Tokens per window, special tokens included")] = 512,
    models_dir: ModelsDir = None,
    force: Force = False,
) -> None:
    """Install Prompt-Guard-86M as <models-dir>/prompt-guard-86m (ONNX + tokenizer.json + manifest)."""
    from inference.detector.importer import ImportFailed
    from inference.detector.importer import import_prompt_guard as run

    try:
        dest = run(source, _models_dir(models_dir), revision=revision, source_name=name, max_length=max_length,
                   force=force, progress=_progress)
    except ImportFailed as exc:
        raise _fail(exc) from None
    typer.echo(str(dest))


@import_app.command("gliner")
def import_gliner(
    source: Annotated[pathlib.Path, typer.Option(
        "--from", help="A GLiNER model directory (gliner_config.json + weights), e.g. urchade/gliner_small-v2.1")],
    revision: Revision = None,
    name: Annotated[str, typer.Option(help="Artifact name recorded in model_version")] = "urchade/gliner_small-v2.1",
    backbone: Annotated[Optional[pathlib.Path], typer.Option(
        help="Local encoder directory (config + tokenizer) for saves that only name their backbone, "
             "e.g. microsoft/deberta-v3-small")] = None,
    onnx: Annotated[bool, typer.Option("--onnx", help="Also export to ONNX (serve it with "
                                                       "CONTEXT_ENGINE_DETECTOR_PII_RUNTIME=onnx)")] = False,
    models_dir: ModelsDir = None,
    force: Force = False,
) -> None:
    """Install a GLiNER model as <models-dir>/gliner-small-v2.1 (self-contained copy + manifest)."""
    from inference.detector.importer import ImportFailed
    from inference.detector.importer import import_gliner as run

    try:
        dest = run(source, _models_dir(models_dir), revision=revision, source_name=name, backbone=backbone,
                   export_onnx=onnx, force=force, progress=_progress)
    except ImportFailed as exc:
        raise _fail(exc) from None
    typer.echo(str(dest))


class Which(str, enum.Enum):
    prompt_guard = "prompt-guard"
    gliner = "gliner"
    all = "all"


@models_app.command("fetch")
def fetch(
    which: Annotated[Which, typer.Argument(help="prompt-guard, gliner (with its backbone's tokenizer) or all")],
    token_file: Annotated[Optional[pathlib.Path], typer.Option(
        help="A file holding a Hugging Face token (Prompt-Guard is gated) [default: env HF_TOKEN]")] = None,
    unpinned: Annotated[bool, typer.Option(
        "--unpinned", help="Fetch a model the manifest pins no revision for: the Hub's main, recorded")] = False,
    manifest: Annotated[Optional[pathlib.Path], typer.Option(
        help="A JSON manifest of pinned revisions and SHA-256s to use instead of this build's")] = None,
    print_pins: Annotated[bool, typer.Option(
        "--print-pins", help="Print the manifest entries that pin what was downloaded (JSON)")] = False,
    downloads_dir: Annotated[Optional[pathlib.Path], typer.Option(
        help="Where downloads are kept and resumed [default: <models-dir>/../model-downloads]")] = None,
    onnx: Annotated[bool, typer.Option("--onnx", help="GLiNER: also export to ONNX")] = False,
    models_dir: ModelsDir = None,
    force: Force = False,
) -> None:
    """Download the detector's models from the Hugging Face Hub (HF_ENDPOINT) and install them.

    Each file is checked against the manifest's SHA-256 before it is imported; downloads resume
    where they stopped; a failure installs nothing. Then `context-engine pii rescan` clears the
    memory pushes quarantined while no PII model was installed."""
    import os

    # huggingface_hub's Xet transfers bypass the resumable, checked path below: plain HTTP only.
    os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
    from inference.detector import fetcher, model_manifest

    keys = ["prompt-guard", "gliner"] if which is Which.all else [which.value]
    root = _models_dir(models_dir)
    pins: dict[str, object] = {}
    try:
        sources = model_manifest.load(manifest)
        token = fetcher.read_token(token_file)
        for key in keys:
            if which is Which.all and (dest := fetcher.installed_dir(key, root)).exists() and not force:
                _progress(f"{dest} is installed; skipped (--force replaces it)")
                continue
            installed, fetched = fetcher.fetch_model(
                key, sources, root, downloads=downloads_dir, token=token, unpinned=unpinned, force=force,
                export_onnx=onnx, progress=_progress)
            pins.update({f.source.key: f.pins() for f in fetched})
            typer.echo(str(installed))
    except (fetcher.FetchFailed, model_manifest.ManifestInvalid) as exc:
        typer.secho(f"fetch failed: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(1) from None
    if print_pins:  # a whole manifest: this one's entries with what was downloaded pinned
        typer.echo(json.dumps({**model_manifest.raw(manifest), **pins}, indent=2, sort_keys=True))
    if "gliner" in keys:
        _progress("memory pushed while no PII model was installed is quarantined: `context-engine pii rescan` "
                  "clears it (docs/pii.md)")


@models_app.command("status")
def status(models_dir: ModelsDir = None) -> None:
    """Show, as JSON lines, which detector models are installed and where the service looks."""
    from inference.detector.importer import model_status
    from inference.detector.settings import DetectorSettings

    settings = DetectorSettings(models_dir=models_dir) if models_dir else DetectorSettings()
    for row in model_status(settings.model_paths):
        typer.echo(json.dumps(row))
