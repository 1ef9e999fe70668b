"""The facts of a text, what its clauses state about them, and how faithfully a summary keeps
them: compaction's fact_retention_score and its gate (docs/compaction.md "fact_retention_score").

Facts. A fact is a (kind, canonical value) pair of one of these kinds, found by rules, not by a
model, so the judgement does not depend on the summarizer that wrote the text it judges:

- ``url``      http(s):// or www. addresses, scheme and host case-folded, trailing punctuation off;
- ``email``    addresses, case-folded;
- ``id``       tokens mixing letters and digits (``INV-2041``, ``A7``, a UUID) and dotted versions
               (``v2.1``, ``1.2.3``), case-folded;
- ``date``     ISO dates, ``7 May 2023``, ``May 7th, 2023``, ``May 2023``, ``7 May`` ->
               ``2023-05-07``, ``2023-05``, ``--05-07``;
- ``time``     ``3:30 pm``, ``3.30 pm``, ``15:30`` -> ``15:30``;
- ``number``   its value, whatever the spelling: digits with separators and decimals
               (``1,200.50`` -> ``1200.5``, ``.5`` -> ``0.5``), signs, ordinals (``2nd`` -> ``2``),
               scales (``30k``, ``2.5 million`` -> ``30000``, ``2500000``), and the number words zero
               to ninety-nine with hundred/thousand/million/billion (``twenty-one`` -> ``21``; a
               lone "one" only before a unit);
- ``quantity`` a number and its unit: the unit after it (``5 km``, ``3.5 hours``, ``12 %``) or a
               currency before it (``$30.50``, ``€4.99``, ``USD 30.50``): ``30.5 usd``;
- ``quoted``   a string in quotes, 2 to 200 characters, case-folded, spaces collapsed;
- ``name``     a run of capitalised words (people, places, organisations) that is not a
               sentence's ordinary first word, a month or a weekday, case-folded.

A text's spans are claimed in that order: the digits of a date are not also a number.

Statements (`statements`). A text is cut into sentences (`sentence_spans`: after . ! ? …
followed by a space or the end, but not after the dot of an abbreviation such as "Dr." or
"e.g."; at line breaks), and each sentence into clauses: at , ; : and at the words of
CLAUSE_WORDS (and, but, or, while, whereas, then), none of them inside a fact's own span ("1,200",
"May 7, 2023", "15:30"). In a clause

- each occurrence of a fact has a polarity: negated when a negation cue (NEGATION_CUES; n't, and
  its spellings without the apostrophe: dont, isnt, cant) comes before it in the clause;
- each name is bound to each number, quantity, date, time and id: a binding, reported as
  ``Fact("binding", "lyon=40")`` (the name, "=", the value's canonical form). A clause of more
  than MAX_CLAUSE_PAIRS (name, value) pairs binds each value to its nearest name only.

A line's leading "Speaker: " says who speaks (a summary's "user: ", "[3] Caroline: "): its name
is a fact of the text, but nothing in it is a statement (no polarity, no binding, never introduced).

The gate (`retention`, `Originals.retention`; the originals in conversation order):

- recall: `Retention.score` is the share of the originals' distinct facts the summary holds, as a
  fact or (names, quoted strings, ids, urls, emails) as a run of its words; bindings and
  polarities are not counted: they judge what the summary says, not how much of it. (A summary's
  sentence-initial word the originals have in lower case is not a name of the summary.)
- `Retention.introduced`: the summary's facts and (fact, polarity) pairs the originals do not
  support (`Originals.supporters`), and its bindings of a name the originals bound to another
  value of that kind (a swap, a changed number; a name and a value they said apart may be
  joined); a polarity is reported as ``Fact("negated", "date 2024-06-10")`` / ``Fact("affirmed", ...)``;
- `Retention.superseded`: where a later original changed a name's bindings or a fact's polarity,
  the latest statement, when the summary states that name or fact but lacks the statement or
  states an earlier one after it;
- `Retention.passes`: score >= RETENTION_FLOOR, nothing introduced, nothing superseded.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import TypeVar

RETENTION_FLOOR = 0.98  # the spec: compaction is rejected below this score
VALUE_KINDS = frozenset({"number", "quantity", "date", "time", "id"})  # what a name is bound to
WORD_KINDS = frozenset({"name", "quoted", "id", "url", "email"})  # kept as a run of words
NEGATION_CUES = frozenset("not no never cannot without neither nor none nobody nothing nowhere".split())
CLAUSE_WORDS = frozenset("and but or while whereas then".split())
MAX_CLAUSE_PAIRS = 64  # a clause with more (name, value) pairs binds each value to its nearest name only
ABBREVIATIONS = frozenset("""
mr mrs ms dr prof sr jr st mt vs cf al approx dept inc ltd co corp fig vol ave blvd rd gen col lt sgt capt
gov sen rep rev hon jan feb mar apr jun jul aug sep sept oct nov dec
""".split())  # a dot after these (or after single letters: "J.", "e.g.", "U.S.") does not end a sentence


@dataclass(frozen=True, order=True, slots=True)
class Fact:
    kind: str
    value: str


@dataclass(frozen=True, slots=True)
class Retention:
    """How many of the originals' distinct facts the summary holds and which it lost (recall), what
    it states that they do not (introduced), and the corrections it misses (superseded)."""

    total: int
    kept: int
    missing: tuple[Fact, ...]
    introduced: tuple[Fact, ...] = ()
    superseded: tuple[Fact, ...] = ()

    @property
    def score(self) -> float:
        """In [0, 1]; 1 when the originals hold no fact (nothing could be lost)."""
        return 1.0 if self.total == 0 else self.kept / self.total

    @property
    def passes(self) -> bool:
        """The gate: the score at the floor or above, nothing introduced, nothing superseded."""
        return self.score >= RETENTION_FLOOR and not self.introduced and not self.superseded


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One place a text states a fact: its span (offsets into the text) and its polarity."""

    fact: Fact
    start: int
    end: int
    negated: bool


@dataclass(frozen=True, slots=True)
class Binding:
    """A name and a value (number, quantity, date, time or id) in one clause; start and end are
    the value's."""

    name: str
    value: Fact
    start: int
    end: int

    @property
    def fact(self) -> Fact:
        return Fact("binding", f"{self.name}={self.value.value}")


@dataclass(frozen=True, slots=True)
class Statements:
    """What a text states. Offsets are into the text as given."""

    facts: frozenset[Fact]  # its distinct facts (what `extract` returns)
    occurrences: tuple[Occurrence, ...]  # in text order; not the "Speaker: " of a line
    bindings: tuple[Binding, ...]
    sentences: tuple[tuple[int, int], ...]


def polar(fact: Fact, negated: bool) -> Fact:
    """A fact with its polarity, as `Retention` reports it: Fact("negated", "date 2024-06-10")."""
    return Fact("negated" if negated else "affirmed", f"{fact.kind} {fact.value}")


MONTHS = {m: i for i, m in enumerate(
    ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
     "november", "december"), start=1)}
MONTHS |= {m[:3]: i for m, i in list(MONTHS.items())} | {"sept": 9}
WEEKDAYS = {"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"}

_ONES = {w: i for i, w in enumerate(
    ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
     "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"))}
_TENS = {w: 10 * i for i, w in enumerate(
    ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"), start=2)}
_SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
# "30k", "$5m": "m" is a million only after a currency ("5m" is metres)
_SUFFIX_SCALES = {"k": 1_000, "m": 1_000_000, "mn": 1_000_000, "bn": 1_000_000_000}

# Units a quantity may carry, by their spellings (the canonical one first).
_UNITS = {alias: unit for unit, *aliases in (
    ("km", "kilometer", "kilometers", "kilometre", "kilometres"), ("m", "meter", "meters", "metre", "metres"),
    ("mi", "mile", "miles"), ("kg", "kilogram", "kilograms", "kilo", "kilos"), ("lb", "lbs", "pound", "pounds"),
    ("g", "gram", "grams"), ("l", "liter", "liters", "litre", "litres"), ("%", "percent", "per cent"),
    ("second", "seconds", "sec", "secs"), ("minute", "minutes", "min", "mins"), ("hour", "hours", "hr", "hrs"),
    ("day", "days"), ("week", "weeks"), ("month", "months"), ("year", "years", "yr", "yrs"),
    ("usd", "dollar", "dollars", "$"), ("eur", "euro", "euros", "€"), ("gbp", "£"),
) for alias in (unit, *aliases)}

# Capitalised words that start sentences without naming anything.
ORDINARY_WORDS = frozenset("""
a about after again all also an and another any are as at back be because been before being both but by
can could did do does doing done each even every few for from had has have having he her here hers him his
how i if in into is it its just let like made make many maybe me might more most much must my no nor not
now of off oh ok okay on once one only or other our ours out over please really same she should since so
some still such sure than thank thanks that the their them then there these they this those though to
too under until up us very was we well were what when where which while who whom why will with would yeah
yes yet you your yours hi hello hey wow great good nice cool awesome amazing yesterday today tomorrow
tonight last next sounds totally absolutely definitely honestly anyway btw lol haha gonna wanna gotta
yep yup nope omg aww ooh ah hmm glad congrats congratulations love wish hope guess think
never nothing nobody none nowhere without cannot neither whereas
""".split())

_URL = re.compile(r"(?:https?://|www\.)[^\s<>\"'`]+", re.IGNORECASE)
# Starts only where a run of address characters starts: at every boundary inside "a-a-a-..." the
# scan for an "@" went to the end of the run (quadratic).
_EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
_ISO_DATE = re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b")
_MONTH = r"(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|" \
         r"oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(\d{4})"
_DAY_MONTH_YEAR = re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}(?:,?\s+{_YEAR})?\b", re.IGNORECASE)
_MONTH_DAY_YEAR = re.compile(rf"\b{_MONTH}\s+{_DAY}\b(?:,?\s+{_YEAR}\b)?", re.IGNORECASE)
_MONTH_YEAR = re.compile(rf"\b{_MONTH}\s+{_YEAR}\b", re.IGNORECASE)
_HALF = r"(am|pm|a\.m\.|p\.m\.)"
_TIME = re.compile(rf"\b(\d{{1,2}})(?::(\d{{2}})|\.(\d{{2}})(?=\s*{_HALF}))\s*{_HALF}?(?![\d:])"
                   rf"|\b(\d{{1,2}})\s*{_HALF}(?!\w)", re.IGNORECASE)
_CURRENCY_SCALE = r"(?:\s?(thousand|million|billion)\b|(k|m|mn|bn)\b)?"
_CURRENCY = re.compile(r"(?:([$€£])\s?|\b(usd|eur|gbp)\s?)(\d[\d,]*(?:\.\d+)?|\.\d+)(?![\d.]\d)" + _CURRENCY_SCALE,
                       re.IGNORECASE)
# A token of letters and digits, maybe joined by - or _ or a dot before a digit ("v2.1"); an id
# when it has both, or two dots (checked after the match: lookaheads at every boundary of
# "a-a-a-..." made the scan quadratic).
_TOKEN = re.compile(r"\b[a-z0-9]+(?:[-_][a-z0-9]+|\.\d[a-z0-9]*)*\b", re.IGNORECASE)
_LETTER, _DIGIT = re.compile(r"[a-z]", re.IGNORECASE), re.compile(r"\d")
_NUMBER_SUFFIXED = re.compile(r"(\d+(?:\.\d+)?)(st|nd|rd|th|k|bn|" + "|".join(
    re.escape(u) for u in sorted(_UNITS, key=len, reverse=True) if u.isalpha() or u == "%") + ")", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.])[-+]?\d+(?:\.\d+)?(?![\w])"
                     r"|(?<![\w.])[-+]?\.\d+(?![\w])")
_WORD_NUMBER = re.compile(
    r"\b(?:(?:" + "|".join(sorted(_ONES | _TENS | _SCALES, key=len, reverse=True)) + r")(?:[\s-]+(?:and[\s-]+)?)?)+\b",
    re.IGNORECASE)
_SCALE_AFTER = re.compile(r"\s?(hundred|thousand|million|billion)\b", re.IGNORECASE)
_UNIT_AFTER = re.compile(r"\s?(" + "|".join(re.escape(u) for u in sorted(_UNITS, key=len, reverse=True))
                         + r")(?!\w)", re.IGNORECASE)
_QUOTED = re.compile(r"\"([^\"\n]{2,200})\"|“([^”\n]{2,200})”|‘([^’\n]{2,200})’")
_WORD = re.compile(r"[^\W\d_][\w'’.-]*", re.UNICODE)
# End marks and the closing quotes/brackets after them; a sentence ends there when a space or the
# end follows. Starts only where a run starts: "....x" would otherwise be rescanned from each dot.
_END_MARKS = re.compile(r"(?<![.!?…])[.!?…]+[\"'’”)\]]*|\n")
# "Dr.", "e.g.", "U.S.", "J.": their last dot does not end a sentence.
_ABBREVIATION = re.compile(r"(?<![\w.])(?:(?:[^\W\d_]\.)+|(?:" + "|".join(sorted(ABBREVIATIONS)) + r")\.)",
                           re.IGNORECASE)
_SPEAKER = re.compile(r"^[ \t]*(?:\[\d{1,6}\][ \t]*)?[^\W\d_](?:[^\W\d_]|[ .'’-]){0,39}:(?=[ \t])", re.MULTILINE)
_CLAUSE_BREAK = re.compile(r"[,;:]|\b(?:" + "|".join(sorted(CLAUSE_WORDS)) + r")\b", re.IGNORECASE)
_NEGATION = re.compile(r"\b(?:" + "|".join(sorted(NEGATION_CUES)) + r")\b|n['’]t\b"
                       r"|\b(?:do|does|did|is|are|was|were|has|have|had|ca|could|would|should|wo|ai)nt\b",
                       re.IGNORECASE)
_SPACES = re.compile(r"[ \t]{2,}|\t")
_NEGATED_VERB = re.compile(r"n['’]t\b", re.IGNORECASE)
_APOSTROPHE = re.compile(r"['’]")

_Span = tuple[int, int, Fact]
_Origin = tuple[list[int], list[int]]  # per character of a normalised text: where it starts and ends in the raw one
_K = TypeVar("_K")
_V = TypeVar("_V")


def extract(text: str) -> set[Fact]:
    """The distinct facts of `text`."""
    return set(statements(text).facts)


def statements(text: str) -> Statements:
    """What `text` states: its facts, each occurrence with its polarity, its bindings, its sentences."""
    return _read(text, frozenset())


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """The (start, end) of each sentence of `text`, surrounding spaces off (see the module doc)."""
    plain, origin = _normalized(text)
    return [_to_raw(origin, s, e) for s, e in _sentence_spans(plain)]


def retention(originals: Iterable[str], summary: str) -> Retention:
    """The gate's reading of `summary` against the `originals` it replaces (conversation order)."""
    return Originals(originals).retention(summary)


class Originals:
    """The texts a summary replaces, in conversation order, read once: `retention` judges any
    number of summaries of them (the extractive summarizer drafts, judges and repairs)."""

    def __init__(self, texts: Iterable[str]) -> None:
        texts = list(texts)
        self.statements = tuple(statements(t) for t in texts)
        self.facts = frozenset(f for s in self.statements for f in s.facts)
        self._stated = {(o.fact, o.negated) for s in self.statements for o in s.occurrences}
        self._stated_facts = {fact for fact, _ in self._stated}
        self._texts = texts
        self._word_runs: _WordRuns | None = None  # built when a summary's fact needs it
        self._lower = frozenset(w for t in texts for w in re.findall(r"[^\W\d_]+", t) if w.islower())
        self._names_by_word: dict[str, set[str]] = defaultdict(set)
        self._facts_by_part: dict[str, set[Fact]] = defaultdict(set)  # a date's year, month-day...
        for fact in self._stated_facts:
            for part in _parts(fact):
                self._facts_by_part[part].add(fact)
            if fact.kind == "name":
                for word in fact.value.split():
                    self._names_by_word[word].add(fact.value)
        self._bound: dict[Fact, set[str]] = defaultdict(set)  # value -> the names bound to it
        self._bound_kinds: dict[str, set[str]] = defaultdict(set)  # name -> the kinds of the values bound to it
        for s in self.statements:
            for b in s.bindings:
                self._bound[b.value].add(b.name)
                self._bound_kinds[b.name].add(b.value.kind)
        self._latest_bindings, self._latest_polarities = _corrections(self.statements)
        self._supporters: dict[Fact, tuple[Fact, ...] | None] = {}

    def retention(self, summary: str) -> Retention:
        said = _read(summary, self._lower)
        missing = self._missing(summary, said)
        return Retention(len(self.facts), len(self.facts) - len(missing), missing, self._introduced(said),
                         self._superseded(said))

    def supporters(self, fact: Fact) -> tuple[Fact, ...] | None:
        """The originals' stated facts that support `fact`: the same fact; for a partial date, a
        fuller date it agrees with; for a number, also a date of that year or an id, url or email
        that has it as a word ("inv 2041" for INV-2041); for a name, a name that has its words.
        () when only the originals' words support it (a name, quoted string, id, url or email
        whose words occur as a run of theirs), None when nothing does."""
        if fact not in self._supporters:
            self._supporters[fact] = self._find_supporters(fact)
        return self._supporters[fact]

    def _find_supporters(self, fact: Fact) -> tuple[Fact, ...] | None:
        found = {fact} & self._stated_facts
        if fact.kind == "date":
            found |= {d for d in self._facts_by_part.get(_partial_date_key(fact.value), ()) if d.kind == "date"}
        elif fact.kind == "number":
            found |= self._facts_by_part.get(f"year {fact.value}", set())
            found |= self._facts_by_part.get(f"word {fact.value}", set())
        elif fact.kind == "name":
            found |= {Fact("name", n) for n in self._names_holding(fact.value)}
        if found:
            return tuple(sorted(found))
        if fact in self.facts or (fact.kind in WORD_KINDS and self._has_words(fact.value)):
            return ()
        return None

    def _has_words(self, text: str) -> bool:
        if self._word_runs is None:
            self._word_runs = _WordRuns(self._texts)
        return self._word_runs.has_run(text)

    def _names_holding(self, name: str) -> set[str]:
        """The originals' names that have `name`'s words as a run ("caroline" -> "caroline smith")."""
        words = name.split()
        if not words:
            return set()
        rarest = min(words, key=lambda w: len(self._names_by_word.get(w, ())))
        return {n for n in self._names_by_word.get(rarest, ()) if f" {name} " in f" {n} "}

    def _missing(self, summary: str, said: Statements) -> tuple[Fact, ...]:
        words = f" {' '.join(_plain_words(summary))} "
        return tuple(sorted(f for f in self.facts if f not in said.facts and not (
            f.kind in WORD_KINDS and f" {' '.join(_plain_words(f.value))} " in words)))

    def _introduced(self, said: Statements) -> tuple[Fact, ...]:
        introduced: set[Fact] = set()
        for o in said.occurrences:
            supporters = self.supporters(o.fact)
            if supporters is None:
                introduced.add(o.fact)
            elif supporters and not any((s, o.negated) in self._stated for s in supporters):
                introduced.add(polar(o.fact, o.negated))
        introduced |= {b.fact for b in said.bindings if not self._binding_supported(b)}
        return tuple(sorted(introduced))

    def _binding_supported(self, binding: Binding) -> bool:
        """Some name of the originals that has the binding's name is bound to its value (or a value
        that supports it), or none is bound to a value of its kind at all: a summary may join a
        name and a value the turns said apart ("went with Mel on 7 May 2023" when "Hey Mel!" was
        a turn of its own), but not give a name another value than the turns gave it (a swap, a
        changed number). A name the originals do not have is judged as a name, not bound."""
        holders = self._names_holding(binding.name)
        if not holders:
            return True
        values = {binding.value, *(self.supporters(binding.value) or ())}
        if any(holders & self._bound.get(v, set()) for v in values):
            return True
        return not any(binding.value.kind in self._bound_kinds.get(name, ()) for name in holders)

    def _superseded(self, said: Statements) -> tuple[Fact, ...]:
        names_said = {o.fact.value for o in said.occurrences if o.fact.kind == "name"}
        bound: dict[str, list[tuple[int, Fact]]] = defaultdict(list)
        for b in said.bindings:
            bound[b.name].append((b.start, b.value))
        polarities: dict[Fact, list[tuple[int, bool]]] = defaultdict(list)
        for o in said.occurrences:
            polarities[o.fact].append((o.start, o.negated))
        superseded = {Fact("binding", f"{name}={v.value}") for name, latest in self._latest_bindings.items()
                      if name in names_said for v in _unsaid(latest, bound.get(name, []))}
        superseded |= {polar(fact, negated) for fact, latest in self._latest_polarities.items()
                       if fact in polarities for negated in _unsaid(latest, polarities[fact])}
        return tuple(sorted(superseded))


class _WordRuns:
    """The originals' words, case-folded: is a run of words theirs (within one original)?"""

    def __init__(self, texts: list[str]) -> None:
        self._short: set[str] = set()  # every run of 1 to 3 words
        runs = []
        for text in texts:
            words = _plain_words(text)
            for n in (1, 2, 3):
                self._short.update(" ".join(words[i:i + n]) for i in range(len(words) - n + 1))
            runs.append(f" {' '.join(words)} ")
        self._all = "\n".join(runs)

    def has_run(self, text: str) -> bool:
        words = _plain_words(text)
        if len(words) <= 3:
            return bool(words) and " ".join(words) in self._short
        return f" {' '.join(words)} " in self._all


def _corrections(read: tuple[Statements, ...]) -> tuple[dict[str, frozenset[Fact]], dict[Fact, frozenset[bool]]]:
    """The latest statements that correct earlier ones: per name, the values the last original
    that binds it binds it to, when an earlier original bound it to others; per fact, the
    polarities of its last original, when an earlier one stated it otherwise."""
    bindings: dict[str, list[frozenset[Fact]]] = defaultdict(list)
    polarities: dict[Fact, list[frozenset[bool]]] = defaultdict(list)
    for s in read:
        for name, values in _grouped((b.name, b.value) for b in s.bindings).items():
            bindings[name].append(frozenset(values))
        for fact, negated in _grouped((o.fact, o.negated) for o in s.occurrences).items():
            polarities[fact].append(frozenset(negated))
    return _changed(bindings), _changed(polarities)


def _grouped(pairs: Iterable[tuple[_K, _V]]) -> dict[_K, set[_V]]:
    groups: dict[_K, set[_V]] = defaultdict(set)
    for key, value in pairs:
        groups[key].add(value)
    return groups


def _changed(history: dict[_K, list[frozenset[_V]]]) -> dict[_K, frozenset[_V]]:
    return {key: said[-1] for key, said in history.items() if any(s != said[-1] for s in said[:-1])}


def _unsaid(latest: frozenset[_K], said: list[tuple[int, _K]]) -> frozenset[_K]:
    """Of the `latest` statements, those `said` (position, statement) lacks; all of them when it
    states something else after the last of them ("12 to Lyon ... 40 to Lyon" when 12 is the latest)."""
    last: dict[_K, int] = {}
    for at, statement in said:
        last[statement] = max(at, last.get(statement, at))
    lacking = frozenset(s for s in latest if s not in last)
    if lacking:
        return lacking
    settled = min(last[s] for s in latest)
    return latest if any(at > settled and s not in latest for at, s in said) else frozenset()


def _parts(fact: Fact) -> list[str]:
    """The keys under which a fact supports a shorter one: a date's year (a number), its
    year-month and month-day (partial dates); an id's, url's or email's words (numbers)."""
    if fact.kind == "date":
        year, month, day = _date_fields(fact.value)
        return [f for f in (year and f"year {year}", year and month and f"date {year}-{month}",
                            day and f"date --{month}-{day}") if f]
    if fact.kind in ("id", "url", "email"):
        return [f"word {_decimal(w)}" for w in _plain_words(fact.value) if w.isdigit()]
    return []


def _date_fields(value: str) -> tuple[str, str, str]:
    """("2023", "05", "07") of 2023-05-07, ("", "05", "07") of --05-07, ("2023", "05", "") of 2023-05."""
    if value.startswith("--"):
        return "", value[2:4], value[5:7]
    return value[:4], value[5:7], value[8:10]


def _partial_date_key(value: str) -> str:
    year, month, day = _date_fields(value)
    if not year:
        return f"date --{month}-{day}"
    return f"date {year}-{month}" if not day else ""


# -- reading a text ---------------------------------------------------------------------------

def _read(raw: str, lower_elsewhere: frozenset[str]) -> Statements:
    """What `raw` states; `lower_elsewhere`: words known in lower case besides the text's own
    (the originals', when a summary is read: its sentences' first words were theirs)."""
    text, origin = _normalized(raw)
    found, claimed = _found_facts(text)
    sentences = _sentence_spans(text)
    speakers = [(m.start(), m.end()) for m in _SPEAKER.finditer(text)]
    starts = {0} | {s for s, _ in sentences} | {_skip_spaces(text, end) for _, end in speakers}
    names = _names(text, claimed, starts, lower_elsewhere)
    facts = frozenset(f for *_, f in found) | {f for *_, f in names}
    speaker_ends = [end for _, end in speakers]
    stated = sorted(s for s in found + names if not _in_speaker(s, speakers, speaker_ends))
    clause_of = _clauses(text, claimed, sentences)
    first_cue = _first_cues(text, claimed, clause_of)
    occurrences = [(start, end, fact, first_cue.get(clause_of(start), len(text)) < start)
                   for start, end, fact in stated]
    bindings = _bindings(occurrences, clause_of)
    return Statements(
        facts,
        tuple(Occurrence(f, *_to_raw(origin, s, e), n) for s, e, f, n in occurrences),
        tuple(Binding(name, value, *_to_raw(origin, s, e)) for name, value, s, e in bindings),
        tuple(_to_raw(origin, s, e) for s, e in sentences))


def _normalized(raw: str) -> tuple[str, _Origin | None]:
    """`raw` in NFKC with runs of spaces and tabs as one space, and where each of its characters
    came from in `raw` (None: from where it is)."""
    if unicodedata.is_normalized("NFKC", raw) and not _SPACES.search(raw):
        return raw, None
    parts: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    unit_start = 0
    for i in range(1, len(raw) + 1):  # a character and the combining marks after it, normalised together
        if i < len(raw) and unicodedata.combining(raw[i]):
            continue
        unit = unicodedata.normalize("NFKC", raw[unit_start:i])
        if unit in (" ", "\t"):
            unit = "" if parts and parts[-1] == " " else " "
        if unit:
            parts.append(unit)
            starts.extend([unit_start] * len(unit))
            ends.extend([i] * len(unit))
        unit_start = i
    return "".join(parts), (starts, ends)


def _to_raw(origin: _Origin | None, start: int, end: int) -> tuple[int, int]:
    """A (non-empty) span of the normalised text in the raw one."""
    if origin is None:
        return start, end
    starts, ends = origin
    return starts[start], ends[end - 1]


def _found_facts(text: str) -> tuple[list[_Span], bytearray]:
    """Every fact of `text` but names, with its span, and the characters they claimed."""
    found: list[_Span] = []
    claimed = bytearray(len(text))  # 1 where an earlier kind took the character

    def take(start: int, end: int) -> bool:
        if any(claimed[start:end]):
            return False
        claimed[start:end] = b"\x01" * (end - start)
        return True

    def add(start: int, end: int, kind: str, value: str) -> None:
        found.append((start, end, Fact(kind, value)))

    def number(start: int, end: int, value: str, unit: str | None = None, unit_end: int = 0) -> None:
        add(start, end, "number", value)
        if unit:
            add(start, max(end, unit_end), "quantity", f"{value} {_UNITS[unit.casefold()]}")

    for m in _URL.finditer(text):
        if take(*m.span()):
            add(*m.span(), "url", _url(m.group(0)))
    for m in _EMAIL.finditer(text):
        if take(*m.span()):
            add(*m.span(), "email", m.group(0).lstrip(".+-").casefold())
    for pattern, canonical in ((_ISO_DATE, _iso), (_DAY_MONTH_YEAR, _day_month), (_MONTH_DAY_YEAR, _month_day),
                               (_MONTH_YEAR, _month_year)):
        for m in pattern.finditer(text):
            if (value := canonical(m)) and take(*m.span()):
                add(*m.span(), "date", value)
    for m in _TIME.finditer(text):
        if (value := _time(m)) and take(*m.span()):
            add(*m.span(), "time", value)
    for m in _CURRENCY.finditer(text):
        if take(*m.span()):
            value = _scaled(_decimal(m.group(3)), _scale_of(m.group(4) or m.group(5)))
            number(*m.span(), value, m.group(1) or m.group(2), m.end())
    for m in _TOKEN.finditer(text):
        token = m.group(0)
        if _LETTER.search(token) and _DIGIT.search(token) and take(*m.span()):
            if suffixed := _NUMBER_SUFFIXED.fullmatch(token):  # "5km", "2nd", "30k": not an id
                suffix = suffixed.group(2).casefold()
                value = _scaled(_decimal(suffixed.group(1)), _SUFFIX_SCALES[suffix] if suffix in ("k", "bn") else 1)
                number(*m.span(), value, suffix if suffix in _UNITS else None, m.end())
            else:
                add(*m.span(), "id", token.casefold())
        elif token.count(".") >= 2 and take(*m.span()):  # a version or an address: 1.2.3, 10.0.0.1
            add(*m.span(), "id", token.casefold())
    for m in _NUMBER.finditer(text):
        if not take(*m.span()):
            continue
        end, scale = m.end(), 1
        if (scaled := _SCALE_AFTER.match(text, end)) and take(*scaled.span()):  # "2.5 million"
            end, scale = scaled.end(), _scale_of(scaled.group(1))
        unit = _UNIT_AFTER.match(text, end)
        number(m.start(), end, _scaled(_decimal(m.group(0)), scale),
               *((unit.group(1), unit.end()) if unit and take(*unit.span()) else ()))
    for m in _WORD_NUMBER.finditer(text):
        written = m.group(0).strip(" -")
        value = _words_value(written)
        unit = _UNIT_AFTER.match(text, m.end())
        if value is None or (written.casefold() == "one" and not unit) or not take(*m.span()):
            continue  # a lone "one" is a pronoun as often as a number ("one of them")
        number(*m.span(), value, *((unit.group(1), unit.end()) if unit and take(*unit.span()) else ()))
    for m in _QUOTED.finditer(text):
        inner = next(g for g in m.groups() if g is not None)
        add(*m.span(), "quoted", " ".join(inner.casefold().split()))
    return found, claimed


def _in_speaker(span: _Span, speakers: list[tuple[int, int]], speaker_ends: list[int]) -> bool:
    """In a line's leading "Speaker: " (or "[3] Speaker: ")."""
    i = bisect_right(speaker_ends, span[0])
    return i < len(speakers) and speakers[i][0] <= span[0]


def _skip_spaces(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t":
        at += 1
    return at


def _sentence_spans(text: str) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    start = 0
    abbreviated = {m.end() - 1 for m in _ABBREVIATION.finditer(text)}  # their dots
    for m in _END_MARKS.finditer(text):
        if m.group(0) == "\n":
            _add_stripped(spans, text, start, m.start())
        elif (m.end() < len(text) and not text[m.end()].isspace()) or (
                m.start() in abbreviated and text[m.start() + 1:m.start() + 2] != "."):
            continue
        else:
            _add_stripped(spans, text, start, m.end())
        start = m.end()
    _add_stripped(spans, text, start, len(text))
    return spans


def _add_stripped(spans: list[tuple[int, int]], text: str, start: int, end: int) -> None:
    piece = text[start:end]
    stripped = piece.strip()
    if stripped:
        first = start + len(piece) - len(piece.lstrip())
        spans.append((first, first + len(stripped)))


def _clauses(text: str, claimed: bytearray, sentences: list[tuple[int, int]]) -> Callable[[int], int]:
    """The clause of a position (see the module doc), as a number that grows along the text."""
    breaks = sorted({s for s, _ in sentences} | {m.end() for m in _CLAUSE_BREAK.finditer(text)
                                                 if not claimed[m.start()]})
    return lambda at: bisect_right(breaks, at)


def _first_cues(text: str, claimed: bytearray, clause_of: Callable[[int], int]) -> dict[int, int]:
    """Per clause, where its first negation cue starts: what starts after it there is negated."""
    starts: dict[int, int] = {}
    for m in _NEGATION.finditer(text):
        if not claimed[m.start()]:
            starts.setdefault(clause_of(m.start()), m.start())
    return starts


def _bindings(occurrences: list[tuple[int, int, Fact, bool]],
              clause_of: Callable[[int], int]) -> list[tuple[str, Fact, int, int]]:
    """(name, value, value's span) for each name and value of a clause."""
    names: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    values: dict[int, list[tuple[int, int, Fact]]] = defaultdict(list)
    for start, end, fact, _ in occurrences:
        if fact.kind == "name":
            names[clause_of(start)].append((start, end, fact.value))
        elif fact.kind in VALUE_KINDS:
            values[clause_of(start)].append((start, end, fact))
    bindings: list[tuple[str, Fact, int, int]] = []
    for clause, clause_values in values.items():
        clause_names = names.get(clause, [])
        crowded = len(clause_names) * len(clause_values) > MAX_CLAUSE_PAIRS
        every_name = list(dict.fromkeys(name for *_, name in clause_names))
        for start, end, value in clause_values:
            bound = [_nearest(clause_names, start, end)] if crowded else every_name
            bindings.extend((name, value, start, end) for name in bound)
    return bindings


def _nearest(names: list[tuple[int, int, str]], start: int, end: int) -> str:
    """The name closest to the value at start:end, the one before it on a tie."""
    i = bisect_right(names, (start,))
    gaps = [(start - n[1], 0, n[2]) for n in names[max(0, i - 1):i]] + [(n[0] - end, 1, n[2]) for n in names[i:i + 1]]
    return min(gaps)[2]


def _plain_words(text: str) -> list[str]:
    return re.findall(r"\w+", unicodedata.normalize("NFKC", text).casefold())


def _url(url: str) -> str:
    url = url.rstrip(".,;:!?)]}'\"")
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "http", url
    host, slash, path = rest.partition("/")
    return f"{scheme.casefold()}://{host.casefold()}{slash}{path}"


def _date(year: str | None, month: int, day: str | None) -> str | None:
    d = int(day) if day else None
    if not 1 <= month <= 12 or (d is not None and not 1 <= d <= 31):
        return None
    if d is None:
        return f"{int(year):04d}-{month:02d}" if year else None
    return f"{int(year):04d}-{month:02d}-{d:02d}" if year else f"--{month:02d}-{d:02d}"


def _iso(m: re.Match[str]) -> str | None:
    return _date(m.group(1), int(m.group(2)), m.group(3))


def _day_month(m: re.Match[str]) -> str | None:
    return _date(m.group(3), MONTHS[m.group(2).casefold()], m.group(1))


def _month_day(m: re.Match[str]) -> str | None:
    if m.group(1) == "may" and not m.group(3):
        return None  # "you may 2 ..." : a lower-case "may" without a year is the verb
    return _date(m.group(3), MONTHS[m.group(1).casefold()], m.group(2))


def _month_year(m: re.Match[str]) -> str | None:
    return _date(m.group(2), MONTHS[m.group(1).casefold()], None)


def _time(m: re.Match[str]) -> str | None:
    if m.group(1) is not None:
        hour, minute, half = int(m.group(1)), int(m.group(2) or m.group(3)), m.group(5) or m.group(4)
    else:
        hour, minute, half = int(m.group(6)), 0, m.group(7)
    if half:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if half.casefold().startswith("p") else 0)
    if hour > 23 or minute > 59:
        return None
    return f"{hour:02d}:{minute:02d}"


def _decimal(text: str) -> str:
    sign = "-" if text.startswith("-") else ""
    digits = text.lstrip("+-").replace(",", "")
    whole, _, frac = digits.partition(".")
    whole = whole.lstrip("0") or "0"
    frac = frac.rstrip("0")
    return sign + whole + (f".{frac}" if frac else "") if whole + frac != "0" else "0"


def _scale_of(word: str | None) -> int:
    if not word:
        return 1
    word = word.casefold()
    return _SCALES.get(word) or _SUFFIX_SCALES[word]


def _scaled(value: str, scale: int) -> str:
    """`value` (canonical) times `scale`, canonical: ("2.5", 1000000) -> "2500000"."""
    return value if scale == 1 else _decimal(format(Decimal(value) * scale, "f"))


def _words_value(text: str) -> str | None:
    """The value of a run of number words ("two hundred and five" -> "205"), None for a run
    that is not a number ("and")."""
    total = current = 0
    seen = False
    for word in re.split(r"[\s-]+", text.casefold()):
        if word == "and" or not word:
            continue
        if word in _ONES:
            current += _ONES[word]
        elif word in _TENS:
            current += _TENS[word]
        elif word in _SCALES:
            scale = _SCALES[word]
            if scale == 100:
                current = (current or 1) * 100
            else:
                total += (current or 1) * scale
                current = 0
        else:
            return None
        seen = True
    return str(total + current) if seen else None


def _before_openers(text: str, at: int) -> int:
    """Where the quotes, brackets and spaces just before `at` begin."""
    while at > 0 and text[at - 1] in " \t\"'“‘([":
        at -= 1
    return at


def _names(text: str, claimed: bytearray, starts: set[int], lower_elsewhere: frozenset[str]) -> list[_Span]:
    """Runs of capitalised words outside claimed spans, case-folded, with their spans. Not a
    name: an ordinary word (ORDINARY_WORDS), a month or weekday, a single letter, and a
    sentence's first word when the text (or `lower_elsewhere`) has it in lower case ("Painting
    is fun. I like painting")."""
    lower = {w for w in re.findall(r"[^\W\d_]+", text) if w.islower()}
    names: list[_Span] = []
    run: list[str] = []
    run_start = run_end = -1
    for m in _WORD.finditer(text):
        word = _APOSTROPHE.split(m.group(0).rstrip(".-"), maxsplit=1)[0]  # "I'm" -> "I", "Mel's" -> "Mel"
        folded = word.casefold()
        is_name = (len(word) > 1 and word[0].isupper() and not any(claimed[m.start():m.end()])
                   and folded not in ORDINARY_WORDS and folded not in MONTHS and folded not in WEEKDAYS
                   and not _NEGATED_VERB.search(m.group(0))  # "Don't" -> "Don" is no name
                   and not ((folded in lower or folded in lower_elsewhere)
                            and (m.start() in starts or _before_openers(text, m.start()) in starts)))
        if run and (not is_name or text[run_end:m.start()].strip()):
            names.append((run_start, run_end, Fact("name", " ".join(run))))
            run = []
        if is_name:
            if not run:
                run_start = m.start()
            run.append(folded)
            run_end = m.start() + len(word)
    if run:
        names.append((run_start, run_end, Fact("name", " ".join(run))))
    return names
