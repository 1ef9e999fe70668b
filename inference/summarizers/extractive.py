"""The offline summarizer: the older turns' informative sentences, in order, each once.

A sentence (inference.facts.sentence_spans: the dot of "30.5", "v2.1" or "Dr." does not end one)
is kept when it states something no sentence kept before it states: a fact, a fact with the
other polarity ("not on 2024-06-10"), or a name bound to a value ("12 boxes to Lyon"; see
inference/facts.py); or when it has at least NEW_TERMS search terms (projections/retrieval/bm25.py's
analyzer, without the chit-chat words of facts.ORDINARY_WORDS) that no kept sentence has: what
happened ("I painted that lake sunrise") has no fact of the extractor's kinds, and retrieval finds
the summary by its terms. A sentence with none of these (greetings, thanks, reactions, a
repetition) is dropped. Each turn's kept sentences stay under its speaker ("user: ...", or the
"Name: " a turn without a role starts with), so the summary reads as the dialogue it replaces,
one line per turn (and is chunked by its lines).

The draft is then judged as compaction judges it (facts.Originals.retention) and repaired, for
a few rounds at most: for each fact still missing (a quoted string spanning two sentences), the
sentences of the first turn that hold it, else that whole turn; for each superseded statement
(a correction the draft states before what it corrects, or not at all: "12 boxes to Lyon" said
again after "40 boxes to Lyon"), the sentences of the latest turn that state it, else that turn.
"""

from __future__ import annotations

import asyncio
import re
from bisect import bisect_right
from collections.abc import Hashable, Sequence

from inference.facts import ORDINARY_WORDS, Fact, Originals, Statements, polar, sentence_spans
from inference.summarizers import Summary, SummaryLine, Turn, one_line
from inference.text_analysis import analyze

NEW_TERMS = 2
REPAIR_ROUNDS = 3  # a repair keeps more sentences, which can move a name's last statement: judged again
_NO_END = 1 << 62  # sorts after every span that starts at the same place

# A turn stored as "Caroline: text" (no role): its speaker, kept on its line whatever sentences go.
_SPEAKER = re.compile(r"([^\W\d_][\w .'-]{0,39}): ")


def sentences(text: str) -> list[str]:
    return [text[start:end] for start, end in sentence_spans(text)]


class ExtractiveSummarizer:
    name = "extractive"

    async def summarize(self, turns: Sequence[Turn]) -> Summary:
        # Pure Python over every older turn (~0.3 s for 600): on a thread, so that the event loop
        # keeps serving other calls meanwhile.
        return Summary(tuple(await asyncio.to_thread(summary_lines, turns)))


def summarize(turns: Sequence[Turn]) -> str:
    """The summary text: one line per turn that keeps a sentence, ``role: sentences``."""
    return Summary(tuple(summary_lines(turns))).text


def summary_lines(turns: Sequence[Turn]) -> list[SummaryLine]:
    """One line per turn (per speaker of a turn without a role) that keeps a sentence, each
    standing for the turn it came from."""
    parts = [(i, part) for i, t in enumerate(turns) for part in _speaker_turns(t)]
    origin = [i for i, _ in parts]
    turns = [part for _, part in parts]
    originals = Originals(t.content for t in turns)
    read = originals.statements
    split = [[t.content[start:end] for start, end in r.sentences] for t, r in zip(turns, read)]
    keep = _informative(read, split)
    for _ in range(REPAIR_ROUNDS):
        judged = originals.retention(Summary(tuple(_render(turns, origin, split, keep))).text)
        repaired = [_keep_stating(fact, False, read, keep) for fact in judged.missing]
        repaired += [_keep_stating(fact, True, read, keep) for fact in judged.superseded]
        if not any(repaired):
            break
    return _render(turns, origin, split, keep)


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


def _informative(read: Sequence[Statements], split: list[list[str]]) -> list[list[bool]]:
    """Per turn and sentence: does it state something, or name NEW_TERMS terms, no sentence kept
    before it did."""
    keep = [[False] * len(s) for s in split]
    covered: set[Hashable] = set()
    said: set[str] = set()  # the kept sentences' terms
    for i, (statements, turn_sentences) in enumerate(zip(read, split)):
        stated = _stated_by_sentence(statements)
        for j, sentence in enumerate(turn_sentences):
            terms = _terms(sentence)
            if stated[j] - covered or len(terms - said) >= NEW_TERMS:
                keep[i][j] = True
                covered |= stated[j]
                said |= terms
    return keep


def _stated_by_sentence(statements: Statements) -> list[set[Hashable]]:
    """Per sentence, what it states: (fact, negated) pairs and bindings. A fact that runs over two
    sentences is neither's (the repair keeps its turn)."""
    stated: list[set[Hashable]] = [set() for _ in statements.sentences]
    for o in statements.occurrences:
        if (j := _sentence_holding(statements.sentences, o.start, o.end)) is not None:
            stated[j].add((o.fact, o.negated))
    for b in statements.bindings:
        if (j := _sentence_holding(statements.sentences, b.start, b.end)) is not None:
            stated[j].add(b.fact)
    return stated


def _sentence_holding(spans: Sequence[tuple[int, int]], start: int, end: int) -> int | None:
    j = bisect_right(spans, (start, _NO_END)) - 1
    return j if j >= 0 and spans[j][0] <= start and end <= spans[j][1] else None


def _terms(sentence: str) -> set[str]:
    return {t for t in analyze(sentence) if len(t) > 2 and t not in ORDINARY_WORDS and not t.isdigit()}


def _keep_stating(fact: Fact, latest: bool, read: Sequence[Statements], keep: list[list[bool]]) -> bool:
    """Keep, in the first turn that has `fact` (the latest that states it, when `latest`), the
    sentences that state it; all its sentences when none does alone, or those are kept already.
    Whether any sentence was not kept before."""
    for i in reversed(range(len(read))) if latest else range(len(read)):
        spans = _spans_stating(read[i], fact)
        if spans or (not latest and fact in read[i].facts):
            stating = {_sentence_holding(read[i].sentences, start, end) for start, end in spans}
            if None in stating or all(keep[i][j] for j in stating if j is not None):
                stating = set(range(len(read[i].sentences)))
            added = [j for j in stating if j is not None and not keep[i][j]]
            for j in added:
                keep[i][j] = True
            return bool(added)
    return False


def _spans_stating(statements: Statements, fact: Fact) -> list[tuple[int, int]]:
    """Where the text states `fact`: a fact, a fact with its polarity, or a binding."""
    spans = [(o.start, o.end) for o in statements.occurrences if fact in (o.fact, polar(o.fact, o.negated))]
    return spans + [(b.start, b.end) for b in statements.bindings if b.fact == fact]


def _render(turns: Sequence[Turn], origin: list[int], split: list[list[str]],
            keep: list[list[bool]]) -> list[SummaryLine]:
    lines = []
    for turn, i, turn_sentences, kept in zip(turns, origin, split, keep):
        text = one_line(_joined([s for s, k in zip(turn_sentences, kept) if k]))
        if text:
            lines.append(SummaryLine(i, f"{one_line(turn.role)}: {text}" if turn.role.strip() else text))
    return lines


def _joined(kept: list[str]) -> str:
    """Sentences on one line, each still a sentence there: one that ended at a line break gets a
    full stop, or it would run into the next (and bind its names to the next one's values)."""
    return " ".join(s if n == len(kept) - 1 or _ends_a_sentence(s) else f"{s}." for n, s in enumerate(kept))


def _ends_a_sentence(sentence: str) -> bool:
    return len(sentence_spans(f"{sentence} X")) > 1
