"""The offline summarizer: the older turns' fact-bearing sentences, in order, each once.

A sentence is kept when it holds a fact (inference/facts.py) no sentence kept before it holds;
a sentence without a fact (greetings, thanks, reactions) or whose facts are all kept already (a
repetition) is dropped. Each turn's kept sentences stay under its speaker ("user: ..."), so the
summary reads as the dialogue it replaces. Facts the sentence split cuts apart (a name found
only in the context of its whole turn) are caught by scoring the draft against the turns and
keeping, for each fact still missing, the first sentence that has it, else its whole turn.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from inference.facts import Fact, extract, retention
from inference.summarizers import Turn

_SENTENCE = re.compile(r"[^.!?…\n]+(?:[.!?…]+[\"')\]]*|$)")


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.findall(text) if s.strip()]


class ExtractiveSummarizer:
    name = "extractive"

    async def summarize(self, turns: Sequence[Turn]) -> str:
        return summarize(turns)


def summarize(turns: Sequence[Turn]) -> str:
    """The summary text: one line per turn that keeps a sentence, ``role: sentences``."""
    split = [sentences(t.content) for t in turns]
    keep = [[False] * len(s) for s in split]
    covered: set[Fact] = set()
    for i, turn_sentences in enumerate(split):
        for j, sentence in enumerate(turn_sentences):
            facts = extract(sentence)
            if facts - covered:
                keep[i][j] = True
                covered |= facts
    draft = _render(turns, split, keep)
    for fact in retention([t.content for t in turns], draft).missing:
        _keep_first_holding(fact, turns, split, keep)
    return _render(turns, split, keep)


def _keep_first_holding(fact: Fact, turns: Sequence[Turn], split: list[list[str]], keep: list[list[bool]]) -> None:
    for i, turn_sentences in enumerate(split):
        if fact in extract(turns[i].content):
            holding = [j for j, s in enumerate(turn_sentences) if fact in extract(s)]
            for j in holding or range(len(turn_sentences)):
                keep[i][j] = True
            return


def _render(turns: Sequence[Turn], split: list[list[str]], keep: list[list[bool]]) -> str:
    lines = []
    for turn, turn_sentences, kept in zip(turns, split, keep):
        text = " ".join(s for s, k in zip(turn_sentences, kept) if k)
        if text:
            lines.append(f"{turn.role}: {text}" if turn.role else text)
    return "\n".join(lines)
