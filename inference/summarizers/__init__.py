"""Compaction's summarizers: one interface, two backends (docs/compaction.md).

- `extractive.ExtractiveSummarizer` (the default): offline, no model; keeps the fact-bearing
  sentences of the older turns (inference/facts.py), drops chit-chat and repetition;
- `chat_completions.ChatCompletionsSummarizer`: any OpenAI-compatible ``/chat/completions`` API
  (the spec's Gemini 2.5 Flash-Lite is reachable that way), configured by URL, model and key.
The one a deployment runs: `configured.summarizer_from_settings`.

What a summary is worth is not the summarizer's to say: compaction scores every summary with
`inference.facts.retention` against the turns it replaces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Turn:
    """One item of the session being replaced: who said it, and what."""

    role: str
    content: str


@dataclass(frozen=True, slots=True)
class SummaryLine:
    """One line of a summary and the turn it stands for (an index into the turns summarised):
    in a prompt the line carries that turn's time, and stands in its place."""

    turn: int
    text: str  # one line: "speaker: what was kept"


@dataclass(frozen=True, slots=True)
class Summary:
    lines: tuple[SummaryLine, ...]

    @property
    def text(self) -> str:
        """The summary as the session.compacted event carries it: its lines, one per line."""
        return "\n".join(line.text for line in self.lines)


def one_line(text: str) -> str:
    """`text` as a summary line: its line breaks and surrounding space gone."""
    return " ".join(text.split())


class SummarizerError(Exception):
    """The summarizer could not produce a summary (the backend's answer or its absence)."""


class Summarizer(Protocol):
    name: str  # recorded on the session.compacted event

    async def summarize(self, turns: Sequence[Turn]) -> Summary: ...
