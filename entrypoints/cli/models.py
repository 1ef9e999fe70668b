"""`models`: the detector's model commands, with the embedder's row added to `models status`."""

from __future__ import annotations

import contextlib
import copy
from typing import Annotated

import typer

from context_engine.config import Settings
from entrypoints.cli.settings import command_settings
from entrypoints.detector.cli import ModelsDir as _ModelsDir
from entrypoints.detector.cli import models_app as _models_app
from entrypoints.detector.cli import status as _detector_models_status


def _embedder_status(settings: Settings) -> dict[str, object]:
    """The configured embedder, for `models status`; the local MiniLM is loaded (one thread) so that
    its int8 self-check says which products this CPU computes with."""
    if settings.embedder == "openai":
        return {"model": settings.embedder_model, "embedder": "openai", "url": settings.embedder_url}
    from inference.minilm_embedder import MiniLMEmbedder

    row: dict[str, object] = {"model": "all-MiniLM-L6-v2", "embedder": "minilm"}
    try:
        embedder = MiniLMEmbedder(intra_op_threads=1, matmul=settings.minilm_matmul)
    except Exception as exc:  # noqa: BLE001 - reported, as a detector model that is not installed is
        return {**row, "installed": False, "problem": f"{type(exc).__name__}: {exc}"}
    return {**row, "installed": True, "model_version": embedder.model_version, **embedder.matmul_status()}


def _models_status(
    models_dir: _ModelsDir = None,
    embedder: Annotated[bool, typer.Option(
        "--embedder/--no-embedder", help="Also load the local embedder and show the products its int8 self-check "
                                          "chose on this CPU (~1 s)")] = True,
) -> None:
    """Show, as JSON lines, the detector models installed and the embedder's products on this CPU.

    A row per detector model (where the service looks, what is installed there), then the embedder's:
    its model_version and matmul, int8 or float32 when the int8 self-check disagreed on this CPU."""
    _detector_models_status(models_dir=models_dir)
    if embedder:
        import json
        import sys

        with contextlib.redirect_stdout(sys.stderr):  # the self-check's log line, not among the rows
            row = _embedder_status(command_settings())
        typer.echo(json.dumps(row))


def _models_with_embedder_status() -> typer.Typer:
    # `models status` is the detector's command with the embedder's row after its rows; a copy of the
    # detector's sub-app, so that models_app itself stays as the detector module defines it.
    models = copy.copy(_models_app)
    models.registered_commands = [copy.copy(c) for c in _models_app.registered_commands]
    (status,) = [c for c in models.registered_commands if c.name == "status"]
    status.callback = _models_status
    return models


models_app = _models_with_embedder_status()
