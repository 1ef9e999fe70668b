"""The embedder a deployment runs: by name (`build_embedder`) or from its settings
(`embedder_from_settings`); what every embedder promises is inference/embedder.py."""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any

from inference.embedder import Embedder
from inference.minilm_embedder import MiniLMEmbedder
from inference.openai_embedder import OpenAIEmbedder


def build_embedder(kind: str = "minilm", **options: Any) -> Embedder:
    """``"minilm"`` (default; local, no network) or ``"openai"`` (any OpenAI-compatible API).

    ``options`` go to the constructor: see :class:`MiniLMEmbedder` / :class:`OpenAIEmbedder`.
    """
    key = (kind or "minilm").strip().lower()
    if key in {"minilm", "all-minilm-l6-v2", "local"}:
        return MiniLMEmbedder(**options)
    if key in {"openai", "openai-compatible"}:
        return OpenAIEmbedder(**options)
    raise ValueError(f"unknown embedder kind {kind!r}; expected 'minilm' or 'openai'")


def embedder_from_settings(settings: Any, *, threads: int | None = None,
                           executor: Executor | None = None) -> Embedder:
    """The configured embedder (context_engine.config.Settings: embedder, embedder_*);
    `threads`: the local model's intra-op threads (None: min(2, cpus)); `executor`: where the
    local model runs (see MiniLMEmbedder)."""
    if settings.embedder == "openai":
        key = settings.embedder_api_key.get_secret_value() if settings.embedder_api_key else None
        return OpenAIEmbedder(model=settings.embedder_model, base_url=settings.embedder_url,
                              api_key=key, dimensions=settings.embedder_dimensions)
    return MiniLMEmbedder(intra_op_threads=threads, executor=executor, matmul=settings.minilm_matmul)
