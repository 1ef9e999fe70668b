"""The summarizer a deployment runs, from its settings (docs/compaction.md)."""

from __future__ import annotations

from typing import Any

from inference.openai_http import RetryPolicy
from inference.summarizers import Summarizer
from inference.summarizers.chat_completions import ChatCompletionsSummarizer
from inference.summarizers.extractive import ExtractiveSummarizer


def summarizer_from_settings(settings: Any) -> Summarizer:
    """The configured summarizer (context_engine.config.Settings: compaction_summarizer,
    compaction_llm_*)."""
    if settings.compaction_summarizer == "chat_completions":
        key = settings.compaction_llm_api_key.get_secret_value() if settings.compaction_llm_api_key else None
        return ChatCompletionsSummarizer(base_url=settings.compaction_llm_url, model=settings.compaction_llm_model,
                                         api_key=key, timeout_s=settings.compaction_llm_timeout_seconds,
                                         retry=RetryPolicy(max_attempts=settings.compaction_llm_max_attempts))
    return ExtractiveSummarizer()
