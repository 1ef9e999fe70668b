"""The offline summarizer: the older turns' informative sentences, in order, each once.

A sentence is kept when it holds a fact (inference/facts.py) no sentence kept before it holds,
or at least NEW_TERMS search terms (projections/retrieval/bm25.py's analyzer, without the
chit-chat words of facts.ORDINARY_WORDS) that no kept sentence has: what happened ("I painted
that lake sunrise") has no fact of the extractor's kinds, and retrieval finds the summary by its
terms. A sentence with neither (greetings, thanks, reactions, a repetition) is dropped. Each
turn's kept sentences stay under its speaker ("user: ...", or the "Name: " a turn without a role
starts with), so the summary reads as the dialogue it replaces, one line per turn (and is
chunked by its lines). Facts the sentence split cuts apart (a quoted string spanning two
sentences) are caught by scoring the draft against the turns and keeping, for each fact still missing, the
sentences that hold it, else its whole turn.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

from inference.facts import ORDINARY_WORDS, Fact, extract, retention
from inference.summarizers import Turn
from projections.retrieval.bm25 import analyze

NEW_TERMS = 2

_SENTENCE = re.compile(r"[^.!?…\n]+(?:[.!?…]+[\"')\]]*|$)")
# A turn stored as "Caroline: text" (no role): its speaker, kept on its line whatever sentences go.
_SPEAKER = re.compile(r"([^\W\d_][\w .'-]{0,39}): ")


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.findall(text) if s.strip()]


class ExtractiveSummarizer:
    name = "extractive"

    async def summarize(self, turns: Sequence[Turn]) -> str:
        # Pure Python over every older turn (~0.3 s for 600): on a thread, so that the event loop
        # keeps serving other calls meanwhile.
        return await asyncio.to_thread(summarize, turns)


def summarize(turns: Sequence[Turn]) -> str:
    """The summary text: one line per turn that keeps a sentence, ``role: sentences``."""
    turns = [part for t in turns for part in _speaker_turns(t)]
    split = [sentences(t.content) for t in turns]
    keep = [[False] * len(s) for s in split]
    covered: set[Fact] = set()
    said: set[str] = set()  # the kept sentences' terms
    for i, turn_sentences in enumerate(split):
        for j, sentence in enumerate(turn_sentences):
            facts, terms = extract(sentence), _terms(sentence)
            if facts - covered or len(terms - said) >= NEW_TERMS:
                keep[i][j] = True
                covered |= facts
                said |= terms
    draft = _render(turns, split, keep)
    missing = retention([t.content for t in turns], draft).missing
    if missing:
        turn_facts = [extract(t.content) for t in turns]  # once, for every missing fact
        for fact in missing:
            _keep_first_holding(fact, turn_facts, split, keep)
    return _render(turns, split, keep)


def _speaker_turns(turn: Turn) -> list[Turn]:
    """A turn without a role whose lines start with "Name: " is those speakers' turns, one per
    such line and the lines after it (a summary being summarised again keeps its lines)."""
    if turn.role:
        return [turn]
    parts: list[Turn] = []
    for line in turn.content.splitlines():
        if m := _SPEAKER.match(line):
            parts.append(Turn(m.group(1), line[m.end():]))
        elif parts:
            parts[-1] = Turn(parts[-1].role, f"{parts[-1].content}\n{line}")
        else:
            parts.append(Turn("", line))
    return parts or [turn]


def _terms(sentence: str) -> set[str]:
    return {t for t in analyze(sentence) if len(t) > 2 and t not in ORDINARY_WORDS and not t.isdigit()}


def _keep_first_holding(fact: Fact, turn_facts: list[set[Fact]], split: list[list[str]],
                        keep: list[list[bool]]) -> None:
    """Keep, in the first turn that has `fact`, the sentences that hold it, else all its sentences."""
    for i, turn_sentences in enumerate(split):
        if fact in turn_facts[i]:
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
