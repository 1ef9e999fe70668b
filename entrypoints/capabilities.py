"""What a stack cannot do yet, and the command that fixes each: `up`'s banner and
`context-engine status` say it in one line each (docs/operations.md)."""

from __future__ import annotations

import os

from context_engine.config import ENV_PREFIX, Settings


def degraded_capabilities(settings: Settings, command: str) -> list[str]:
    """One line per capability that is off, from what is installed in the data directory.
    `command`: how to run `context-engine` from a shell (supervisor.command_line)."""
    from inference.detector.importer import model_status
    from inference.detector.settings import GLINER_NAME, PROMPT_GUARD_NAME, DetectorSettings

    # The detector reads its models from <home>/models unless a setting says otherwise.
    detector = (DetectorSettings() if f"{ENV_PREFIX}DETECTOR_MODELS_DIR" in os.environ
                else DetectorSettings(models_dir=settings.home_dir / "models"))
    installed = {row["model"]: row["installed"] for row in model_status(detector.model_paths)}
    lines = []
    extra = "" if detector_extra_installed() else "make install-detector, then "
    if not installed[GLINER_NAME]:
        lines.append(f"memory pushes are quarantined (kept, never searched or assembled): no PII model in "
                     f"{detector.gliner_path} — {extra}{command} models fetch gliner --unpinned, restart, then "
                     f"{command} pii rescan (or models import gliner --from DIR; docs/pii.md)")
    if not installed[PROMPT_GUARD_NAME]:
        lines.append(f"MLDetectorService.Classify answers UNAVAILABLE: no Prompt-Guard model in "
                     f"{detector.prompt_guard_path} — {extra}{command} models fetch prompt-guard --unpinned (gated: "
                     f"HF_TOKEN), then restart (or models import prompt-guard --from DIR; docs/detector.md)")
    if (loose := loose_mode(settings.home_dir)) is not None:
        lines.append(f"the data directory {settings.home_dir} is open to other users (mode {loose:o}): its logs "
                     f"name every caller's org and subject — chmod 700 {settings.home_dir} (docs/security.md)")
    return lines


def detector_extra_installed() -> bool:
    """Whether the detector extra (torch, transformers, gliner) that installs models is importable."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "gliner"))


def loose_mode(home: os.PathLike[str]) -> int | None:
    """The data directory's mode when group or others may list or write it, else None (passing
    through, o+x, is what the embedded PostgreSQL's own user needs when `up` runs as root)."""
    try:
        mode = os.stat(home).st_mode & 0o777
    except OSError:
        return None
    return mode if mode & 0o066 else None
