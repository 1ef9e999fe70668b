"""The facts of a text, and the share of them a summary keeps: compaction's fact_retention_score.

A fact is a (kind, canonical value) pair of one of these kinds, found by rules, not by a model,
so the score does not depend on the summarizer that wrote the text it judges (docs/compaction.md):

- ``url``      http(s):// or www. addresses, scheme and host case-folded, trailing punctuation off;
- ``email``    addresses, case-folded;
- ``id``       tokens mixing letters and digits (``INV-2041``, ``A7``, a UUID), case-folded;
- ``date``     ISO dates, ``7 May 2023``, ``May 7th, 2023``, ``May 2023``, ``7 May`` ->
               ``2023-05-07``, ``2023-05``, ``--05-07``;
- ``time``     ``3:30 pm``, ``15:30`` -> ``15:30``;
- ``number``   digits (``1,200.50`` -> ``1200.5``), signs, ordinals (``2nd`` -> ``2``), and the
               number words zero to ninety-nine with hundred/thousand/million/billion
               (``twenty-one`` -> ``21``; a lone "one" only before a unit);
- ``quantity`` a number and the unit after it (``5 km``, ``3 hours``, ``$40`` -> ``40 usd``);
- ``quoted``   a string in quotes, 2 to 200 characters, case-folded, spaces collapsed;
- ``name``     a run of capitalised words (people, places, organisations) that is not a
               sentence's ordinary first word, a month or a weekday, case-folded.

A text's spans are claimed in that order: the digits of a date are not also a number.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass

RETENTION_FLOOR = 0.98  # the spec: compaction is rejected below this score


@dataclass(frozen=True, order=True, slots=True)
class Fact:
    kind: str
    value: str


@dataclass(frozen=True, slots=True)
class Retention:
    """How many of the originals' distinct facts the summary holds, and which it lost."""

    total: int
    kept: int
    missing: tuple[Fact, ...]

    @property
    def score(self) -> float:
        """In [0, 1]; 1 when the originals hold no fact (nothing could be lost)."""
        return 1.0 if self.total == 0 else self.kept / self.total


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
_TIME = re.compile(r"\b(\d{1,2}):(\d{2})\s*(am|pm|a\.m\.|p\.m\.)?(?![\d:])|\b(\d{1,2})\s*(am|pm|a\.m\.|p\.m\.)(?!\w)",
                   re.IGNORECASE)
# A token of letters and digits, maybe joined by - or _; an id when it has both (checked after the
# match: lookaheads at every boundary of "a-a-a-..." made the scan quadratic).
_TOKEN = re.compile(r"\b[a-z0-9]+(?:[-_][a-z0-9]+)*\b", re.IGNORECASE)
_LETTER, _DIGIT = re.compile(r"[a-z]", re.IGNORECASE), re.compile(r"\d")
_NUMBER_SUFFIXED = re.compile(r"(\d+(?:\.\d+)?)(st|nd|rd|th|k|" + "|".join(
    re.escape(u) for u in sorted(_UNITS, key=len, reverse=True) if u.isalpha() or u == "%") + ")", re.IGNORECASE)
_CURRENCY = re.compile(r"([$€£])\s?(\d[\d,]*(?:\.\d+)?)")
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.])[-+]?\d+(?:\.\d+)?(?![\w])")
_WORD_NUMBER = re.compile(
    r"\b(?:(?:" + "|".join(sorted(_ONES | _TENS | _SCALES, key=len, reverse=True)) + r")(?:[\s-]+(?:and[\s-]+)?)?)+\b",
    re.IGNORECASE)
_UNIT_AFTER = re.compile(r"\s?(" + "|".join(re.escape(u) for u in sorted(_UNITS, key=len, reverse=True))
                         + r")(?!\w)", re.IGNORECASE)
_QUOTED = re.compile(r"\"([^\"\n]{2,200})\"|“([^”\n]{2,200})”|‘([^’\n]{2,200})’")
_WORD = re.compile(r"[^\W\d_][\w'’.-]*", re.UNICODE)
_SENTENCE_END = re.compile(r"[.!?…]+[\"')\]]*\s+|\n+")


def extract(text: str) -> set[Fact]:
    """The distinct facts of `text`."""
    text = unicodedata.normalize("NFKC", text)
    facts: set[Fact] = set()
    claimed = bytearray(len(text))  # 1 where an earlier kind took the character

    def take(m: re.Match[str]) -> bool:
        if any(claimed[m.start():m.end()]):
            return False
        claimed[m.start():m.end()] = b"\x01" * (m.end() - m.start())
        return True

    def number(value: str, unit: str | None) -> None:
        facts.add(Fact("number", value))
        if unit:
            facts.add(Fact("quantity", f"{value} {_UNITS[unit.casefold()]}"))

    for m in _URL.finditer(text):
        if take(m):
            facts.add(Fact("url", _url(m.group(0))))
    for m in _EMAIL.finditer(text):
        if take(m):
            facts.add(Fact("email", m.group(0).lstrip(".+-").casefold()))
    for pattern, canonical in ((_ISO_DATE, _iso), (_DAY_MONTH_YEAR, _day_month), (_MONTH_DAY_YEAR, _month_day),
                               (_MONTH_YEAR, _month_year)):
        for m in pattern.finditer(text):
            if (value := canonical(m)) and take(m):
                facts.add(Fact("date", value))
    for m in _TIME.finditer(text):
        if (value := _time(m)) and take(m):
            facts.add(Fact("time", value))
    for m in _TOKEN.finditer(text):
        if _LETTER.search(m.group(0)) and _DIGIT.search(m.group(0)) and take(m):
            if suffixed := _NUMBER_SUFFIXED.fullmatch(m.group(0)):  # "5km", "2nd": not an id
                unit = suffixed.group(2).casefold()
                number(_decimal(suffixed.group(1)), unit if unit in _UNITS else None)
            else:
                facts.add(Fact("id", m.group(0).casefold()))
    for m in _CURRENCY.finditer(text):
        if take(m):
            number(_decimal(m.group(2)), m.group(1))
    number_forms: tuple[tuple[re.Pattern[str], Callable[[str], str | None]], ...] = (
        (_NUMBER, _decimal), (_WORD_NUMBER, _words_value))
    for pattern, value_of in number_forms:
        for m in pattern.finditer(text):
            written = m.group(0).strip() if pattern is _NUMBER else m.group(0).strip(" -")
            value = value_of(written)
            unit = _UNIT_AFTER.match(text, m.end())
            if value is None or (written.casefold() == "one" and not unit) or not take(m):
                continue  # a lone "one" is a pronoun as often as a number ("one of them")
            number(value, unit.group(1) if unit and take(unit) else None)
    for m in _QUOTED.finditer(text):
        inner = next(g for g in m.groups() if g is not None)
        facts.add(Fact("quoted", " ".join(inner.casefold().split())))
    facts |= {Fact("name", n) for n in _names(text, claimed)}
    return facts


def retention(originals: Iterable[str], summary: str) -> Retention:
    """The originals' distinct facts and how many of them the summary holds: as a fact of the
    summary, or (a name, quoted string, id, url or email) as a whole-word run of its text."""
    wanted = set().union(*(extract(t) for t in originals))
    held = extract(summary)
    words = f" {' '.join(_plain_words(summary))} "
    missing = tuple(sorted(f for f in wanted if f not in held and not (
        f.kind in ("name", "quoted", "id", "url", "email") and f" {' '.join(_plain_words(f.value))} " in words)))
    return Retention(len(wanted), len(wanted) - len(missing), missing)


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
        hour, minute, half = int(m.group(1)), int(m.group(2)), m.group(3)
    else:
        hour, minute, half = int(m.group(4)), 0, m.group(5)
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


def _names(text: str, claimed: bytearray) -> set[str]:
    """Runs of capitalised words outside claimed spans, case-folded. Not a name: an ordinary
    word (ORDINARY_WORDS), a month or weekday, a single letter, and a sentence's first word when
    the text also has it in lower case ("Painting is fun. I like painting")."""
    starts = {0} | {m.end() for m in _SENTENCE_END.finditer(text)}
    lower = {w for w in re.findall(r"[^\W\d_]+", text) if w.islower()}
    names: set[str] = set()
    run: list[str] = []
    run_end = -1
    for m in _WORD.finditer(text):
        word = re.split(r"['’]", m.group(0).rstrip(".-"), maxsplit=1)[0]  # "I'm" -> "I", "Mel's" -> "Mel"
        folded = word.casefold()
        at_start = m.start() in starts or _before_openers(text, m.start()) in starts
        is_name = (len(word) > 1 and word[0].isupper() and not any(claimed[m.start():m.end()])
                   and folded not in ORDINARY_WORDS and folded not in MONTHS and folded not in WEEKDAYS
                   and not (at_start and folded in lower))
        if run and (not is_name or text[run_end:m.start()].strip()):
            names.add(" ".join(run))
            run = []
        if is_name:
            run.append(folded)
            run_end = m.start() + len(word)
    if run:
        names.add(" ".join(run))
    return names
