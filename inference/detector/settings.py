"""Settings of the ML detector sidecar, read from the environment (prefix CONTEXT_ENGINE_DETECTOR_).

Every field is documented in docs/detector.md; keep the two in step. Nested values
(`tenant_thresholds`, `pii_canary_expect`) are JSON in the environment.
"""

from __future__ import annotations

import math
import pathlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "CONTEXT_ENGINE_DETECTOR_"

# Directory names under models_dir. They are also the gRPC health names and the model_hint values.
PROMPT_GUARD_NAME = "prompt-guard-86m"
GLINER_NAME = "gliner-small-v2.1"

# The anti-collapse canary. A plain English sentence with one unambiguous instance of each class the
# model owns; the expectation is the exact substring the model must find for each class.
DEFAULT_CANARY_TEXT = (
    "My name is John Smith, I was born on 12 March 1985 and I live at "
    "221B Baker Street, London."
)
DEFAULT_CANARY_EXPECT = {
    "person": "John Smith",
    "dob": "12 March 1985",
    "address": "221B Baker Street, London",
}


def default_models_dir() -> pathlib.Path:
    """`<home>/models`, where `home` is the engine's data directory (CONTEXT_ENGINE_HOME)."""
    from context_engine.config import Settings

    return Settings().home_dir / "models"


def _probability(name: str, value: float) -> float:
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be within [0, 1], got {value}")
    return value


class Thresholds(BaseModel):
    """Classify thresholds on the verdict score: >= block is "block", >= warn is "warn"."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    warn: float = 0.5
    block: float = 0.9

    @model_validator(mode="after")
    def _ordered(self) -> Thresholds:
        _probability("warn", self.warn)
        _probability("block", self.block)
        if self.warn > self.block:
            raise ValueError(f"warn ({self.warn}) must not exceed block ({self.block})")
        return self


class DetectorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    # --- where the weights are -------------------------------------------------------------
    models_dir: pathlib.Path = Field(default_factory=default_models_dir)
    prompt_guard_dir: pathlib.Path | None = None  # default <models_dir>/prompt-guard-86m
    gliner_dir: pathlib.Path | None = None  # default <models_dir>/gliner-small-v2.1

    # --- Classify verdict ------------------------------------------------------------------
    warn_threshold: float = 0.5
    block_threshold: float = 0.9
    # Which score the thresholds apply to: "jailbreak" = P(JAILBREAK) only (Prompt Guard's own
    # guidance for direct user input, and the spec reserves the INJECTION score for later tuning);
    # "max" = max(P(JAILBREAK), P(INJECTION)).
    verdict_score: Literal["jailbreak", "max"] = "jailbreak"
    # tenant_id -> {"warn": x, "block": y}; used when the request carries no threshold.
    tenant_thresholds: dict[str, Thresholds] = Field(default_factory=dict)

    # --- Classify windows ------------------------------------------------------------------
    classify_max_tokens: int = Field(default=512, ge=8)  # window incl. special tokens; capped by the manifest
    classify_stride_tokens: int = Field(default=256, ge=1)  # distance between window starts
    classify_batch_windows: int = Field(default=8, ge=1)  # windows per onnxruntime run

    # --- DetectPII -------------------------------------------------------------------------
    pii_threshold: float = 0.5
    pii_chunk_words: int = Field(default=192, ge=16)
    pii_chunk_overlap_words: int = Field(default=48, ge=0)
    pii_batch_size: int = Field(default=8, ge=1)
    pii_runtime: Literal["torch", "onnx"] = "torch"
    pii_canary_text: str = DEFAULT_CANARY_TEXT
    pii_canary_expect: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_CANARY_EXPECT))
    pii_canary_min_overlap: float = 0.5  # intersection-over-union of a found span with the expected one

    # --- size limits (bytes of UTF-8) ------------------------------------------------------
    soft_limit_bytes: int = Field(default=32 * 1024, ge=1)
    hard_limit_bytes: int = Field(default=64 * 1024, ge=1)
    classify_truncate_oversized: bool = True

    # --- threads ---------------------------------------------------------------------------
    ort_intra_op_threads: int = Field(default=0, ge=0)  # 0 = onnxruntime's default (all cores)
    torch_threads: int = Field(default=0, ge=0)  # 0 = leave torch's default
    classify_workers: int = Field(default=1, ge=1)  # threads running Classify inference
    pii_workers: int = Field(default=1, ge=1)  # threads running DetectPII inference

    @field_validator("warn_threshold", "block_threshold", "pii_threshold", "pii_canary_min_overlap")
    @classmethod
    def _in_unit_interval(cls, value: float, info) -> float:
        return _probability(info.field_name, value)

    @field_validator("pii_canary_expect")
    @classmethod
    def _canary_classes(cls, value: dict[str, str]) -> dict[str, str]:
        from inference.detector.gliner_pii import PATTERN_CLASSES

        unknown = set(value) - set(PATTERN_CLASSES)
        if unknown or not value:
            raise ValueError(f"pii_canary_expect keys must be a non-empty subset of {PATTERN_CLASSES}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> DetectorSettings:
        Thresholds(warn=self.warn_threshold, block=self.block_threshold)
        if self.soft_limit_bytes > self.hard_limit_bytes:
            raise ValueError("soft_limit_bytes must not exceed hard_limit_bytes")
        if self.pii_chunk_overlap_words >= self.pii_chunk_words:
            raise ValueError("pii_chunk_overlap_words must be smaller than pii_chunk_words")
        for cls_name, needle in self.pii_canary_expect.items():
            if needle not in self.pii_canary_text:
                raise ValueError(f"pii_canary_expect[{cls_name!r}] = {needle!r} is not in pii_canary_text")
        return self

    @property
    def default_thresholds(self) -> Thresholds:
        return Thresholds(warn=self.warn_threshold, block=self.block_threshold)

    @property
    def models_root(self) -> pathlib.Path:
        return self.models_dir.expanduser().resolve()

    @property
    def prompt_guard_path(self) -> pathlib.Path:
        if self.prompt_guard_dir is not None:
            return self.prompt_guard_dir.expanduser().resolve()
        return self.models_root / PROMPT_GUARD_NAME

    @property
    def gliner_path(self) -> pathlib.Path:
        if self.gliner_dir is not None:
            return self.gliner_dir.expanduser().resolve()
        return self.models_root / GLINER_NAME

    @property
    def model_paths(self) -> list[tuple[str, pathlib.Path]]:
        """(name, directory) of every model the service loads."""
        return [(PROMPT_GUARD_NAME, self.prompt_guard_path), (GLINER_NAME, self.gliner_path)]

    def thresholds_for(self, tenant_id: str) -> Thresholds:
        return self.tenant_thresholds.get(tenant_id, self.default_thresholds)
