"""PII scrubbing of pushed memory, before it can reach assembly or search.

Every string leaf of JSON content (the whole text otherwise) is scanned by two detectors:

- national identifiers by format + checksum, always run here (`inference.natid`),
  reported as class ``national_id`` with the natid kind in ``Span.source`` (``natid:ie_ppsn``);
- the ML detector (DetectPII: ``person``, ``dob``, ``address``), reached through the `detect`
  callable, normally `PiiClient.detect`.

Each found span is replaced by ``[REDACTED:<CLASS>]`` (upper case, e.g. ``[REDACTED:PERSON]``).

Fail closed: when `detect` raises anything at all (DetectorError for every gRPC failure, the
canary included, or any other exception), the candidate is scanned again with `regex_spans` on
every leaf and marked ``quarantined``. `regex_spans` is a best-effort fallback, not a detector
of record: simple patterns for national IDs (natid), e-mail addresses, phone numbers, dates near
birth words, street addresses and names after "my name is" / "I am" / "name:" and titles. It
misses PII a model would find and over-redacts some harmless text; quarantine is what keeps the
candidate out of assembly and search until it is reviewed.

Results
-------
``status``: ``clean`` (nothing found; ``content`` is the input, byte for byte), ``redacted``, or
``quarantined`` (the detector failed; ``fallback_reason`` holds its error message).

``detector_version``: ``natid-<natid VERSION, else v1>+<DetectPII model_version>`` for a healthy
scrub (``natid-v1+urchade/gliner_small-v2.1@<rev>``); just ``natid-v1`` when no leaf had text for
the model (no non-blank strings); ``regex-fallback-v1`` when quarantined.

``spans_by_class``: how many redactions of each class were made (merged groups, counted once per
occurrence of the leaf in the document).

Redaction rule
--------------
Spans that overlap or touch (one ends where the next starts) are merged into one and replaced by
one placeholder. Its class is that of the longest span in the group; among equally long spans,
the one starting first, then the one listed first.

JSON
----
Content that parses (orjson) as an object or array has its string leaves scrubbed; keys, numbers,
booleans and nulls are untouched, key order is kept, and the output is re-serialised with orjson
(compact) only when something was redacted. Keys are never scanned (known limit: a name used as
a key survives). Content orjson cannot round-trip without changing it (integers beyond 64 bits,
which it reads as floats; nesting deeper than it writes) is scrubbed as one text instead.
Otherwise the content is decoded as UTF-8 (invalid bytes become U+FFFD) and scrubbed as one text.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from inference import natid
from inference.pii_client import DetectorError, PiiDetection

__all__ = [
    "ADDRESS",
    "DOB",
    "EMAIL",
    "NATIONAL_ID",
    "PERSON",
    "PHONE",
    "REGEX_FALLBACK_VERSION",
    "Detect",
    "ScrubResult",
    "Span",
    "byte_to_char_offsets",
    "merge_spans",
    "ml_spans",
    "natid_spans",
    "redact",
    "regex_spans",
    "scrub_content",
]

NATIONAL_ID = "national_id"
PERSON = "person"
DOB = "dob"
ADDRESS = "address"
EMAIL = "email"
PHONE = "phone"

REGEX_FALLBACK_VERSION = "regex-fallback-v1"
NATID_VERSION = getattr(natid, "VERSION", "v1")  # natid.py carries no version constant yet

Status = Literal["clean", "redacted", "quarantined"]
# The ML half: PII spans of one text on UTF-8 byte offsets, plus the model version.
Detect = Callable[[str], Awaitable[PiiDetection]]


@dataclass(frozen=True, slots=True)
class Span:
    """PII in a Python str: ``text[start:end]`` (code-point offsets, half-open).

    ``source`` says what found it: ``natid:<kind>``, ``ml`` or ``regex:<rule>``.
    """

    cls: str
    start: int
    end: int
    source: str


@dataclass(frozen=True, slots=True)
class ScrubResult:
    content: bytes
    spans_by_class: dict[str, int]
    status: Status
    detector_version: str
    fallback_reason: str = ""


# --------------------------------------------------------------------------- offsets and spans

def byte_to_char_offsets(text: str, byte_offsets: Iterable[int]) -> list[int]:
    """Code-point offsets in `text` of UTF-8 byte offsets into ``text.encode("utf-8")``, in the
    order given. ValueError for an offset outside the text or inside a multi-byte character."""
    data = text.encode("utf-8")
    wanted = list(byte_offsets)
    chars_at: dict[int, int] = {}
    position, chars = 0, 0
    for offset in sorted(set(wanted)):
        if not 0 <= offset <= len(data):
            raise ValueError(f"byte offset {offset} lies outside the {len(data)}-byte text")
        if offset < len(data) and data[offset] & 0xC0 == 0x80:
            raise ValueError(f"byte offset {offset} splits a UTF-8 character")
        chars += len(data[position:offset].decode("utf-8"))
        position = offset
        chars_at[offset] = chars
    return [chars_at[offset] for offset in wanted]


def natid_spans(text: str) -> list[Span]:
    matches = natid.find_national_ids(text)
    chars = byte_to_char_offsets(text, [edge for m in matches for edge in (m.start, m.end)])
    return [Span(NATIONAL_ID, chars[2 * i], chars[2 * i + 1], f"natid:{m.kind}") for i, m in enumerate(matches)]


def ml_spans(text: str, detection: PiiDetection) -> list[Span]:
    """The detector's byte-offset spans as Spans on `text` (ValueError if they do not fit it)."""
    chars = byte_to_char_offsets(text, [edge for s in detection.spans for edge in (s.start, s.end)])
    return [Span(s.pattern_class, chars[2 * i], chars[2 * i + 1], "ml") for i, s in enumerate(detection.spans)]


def merge_spans(spans: Iterable[Span]) -> list[Span]:
    """The union of `spans`: one span per group of overlapping or touching spans, sorted, with
    the class and source of the group's longest span (ties: earliest start, then first given)."""
    ordered = sorted(((span.start, span.end, index, span) for index, span in enumerate(spans)
                      if span.end > span.start), key=lambda item: item[:3])
    groups: list[list[tuple[int, int, int, Span]]] = []
    group_end = -1
    for item in ordered:
        if groups and item[0] <= group_end:
            groups[-1].append(item)
            group_end = max(group_end, item[1])
        else:
            groups.append([item])
            group_end = item[1]
    merged = []
    for group in groups:
        # longest first, then earliest start, then first given
        leader = min(group, key=lambda item: (item[0] - item[1], item[0], item[2]))[3]
        merged.append(Span(leader.cls, group[0][0], max(item[1] for item in group), leader.source))
    return merged


def placeholder(cls: str) -> str:
    return f"[REDACTED:{cls.upper()}]"


def redact(text: str, spans: Iterable[Span]) -> str:
    """`text` with every merged group of `spans` (see `merge_spans`) replaced by its placeholder."""
    out: list[str] = []
    position = 0
    for span in merge_spans(spans):
        out.append(text[position:span.start])
        out.append(placeholder(span.cls))
        position = span.end
    out.append(text[position:])
    return "".join(out)


# --------------------------------------------------------------------------- regex fallback

def _letter_class(predicate: Callable[[str], bool]) -> str:
    """A regex character class of the Basic Multilingual Plane characters matching `predicate`."""
    ranges: list[tuple[int, int]] = []
    for cp in range(0x10000):
        if predicate(chr(cp)):
            if ranges and ranges[-1][1] == cp - 1:
                ranges[-1] = (ranges[-1][0], cp)
            else:
                ranges.append((cp, cp))
    parts = (re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges)
    return "[" + "".join(parts) + "]"


_UPPER = _letter_class(lambda c: c.isupper() or c.istitle())
_LETTERS = r"[^\W\d_]"
# A capitalised word, Unicode-aware: "Aoife", "Ní", "O'Brien", "Jean-Luc", "Champs-Élysées".
_CAPWORD = rf"{_UPPER}{_LETTERS}*+(?:['’-]{_LETTERS}++)*+"
_WORD = rf"{_LETTERS}++(?:['’-]{_LETTERS}++)*+"
# Lower-case name and street-name particles: "Rue de Rivoli", "Ludwig van Beethoven".
_PARTICLE = (r"(?:de|del|della|di|da|do|dos|das|du|des|la|le|les|van|von|der|den|ter|ten|of|the|"
             r"y|ní|nic|mac|ó|ua|bin|ibn|al|el|am|an|auf|im)")
_NAME = rf"{_CAPWORD}(?:[ \t]+(?:{_PARTICLE}[ \t]+)*{_CAPWORD}){{0,4}}"


def _words(*alternatives: str) -> str:
    return rf"(?<!\w)(?:{'|'.join(alternatives)})(?!\w)"


_EMAIL = re.compile(r"(?<![\w.+%-])[\w.+%-]+@[\w-]+(?:\.[\w-]+)+")

# Digit groups with single separators; possessive so a long digit run cannot backtrack.
_PHONE = re.compile(r"(?<![\w+(])\+?\(?\d++\)?(?:[ .\-]\(?\d++\)?){0,6}(?!\w)")
_PHONE_WORDS = re.compile(_words("phone", "telephone", "tel", "téléphone", "mobile", "mob", "cell", "fax",
                                 "whatsapp", "call", "ring", "text", "sms", "handy", "telefon", "teléfono",
                                 "telefono", "móvil", "movil", "cellulare", "portable", "gsm", "contact"),
                          re.IGNORECASE)
_PHONE_DIGITS = range(9, 16)  # E.164 allows at most 15; fewer than 9 reads as a date or count
_PHONE_WORD_DISTANCE = 30

_MONTHS = ("january|february|march|april|may|june|july|august|september|october|november|december|"
           "jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec|"
           "janvier|février|fevrier|mars|avril|mai|juin|juillet|août|aout|septembre|octobre|novembre|"
           "décembre|decembre|enero|febrero|marzo|abril|mayo|junio|julio|agosto|septiembre|setiembre|"
           "octubre|noviembre|diciembre|januar|februar|märz|maerz|juni|juli|oktober|dezember|"
           "gennaio|febbraio|aprile|maggio|giugno|luglio|settembre|ottobre|dicembre|"
           "januari|februari|maart|mei|augustus")
_DAY = r"\d{1,2}(?:st|nd|rd|th|er|º|\.)?"
_DATE = re.compile(
    rf"(?<![\w.])(?:"
    rf"{_DAY}\s+(?:of\s+|de\s+)?(?:{_MONTHS})\.?,?\s+(?:de\s+)?\d{{4}}"  # 4 March 1987, 4 de marzo de 1987
    rf"|(?:{_MONTHS})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}"  # March 4, 1987
    rf"|\d{{1,2}}[./-]\d{{1,2}}[./-](?:\d{{4}}|\d{{2}})"  # 04/03/1987, 4.3.87
    rf"|\d{{4}}-\d{{2}}-\d{{2}}"  # 1987-03-04
    rf")(?![\w])",
    re.IGNORECASE)
_BIRTH_WORDS = re.compile(
    _words("born", "birth", "birthday", "birthdate", "dob", r"d\.o\.b\.?", "né", "née", "nee", "naissance",
           "nacido", "nacida", "nacimiento", "nato", "nata", "nascita", "geboren", r"geb\.?", "geburtstag",
           "geburtsdatum", "geboortedatum"),
    re.IGNORECASE)
_BIRTH_WORD_BEFORE = 40
_BIRTH_WORD_AFTER = 20

_STREET = (r"street|st|road|rd|avenue|ave|av|lane|ln|drive|dr|boulevard|blvd|bd|way|place|pl|square|sq|"
           r"court|ct|terrace|crescent|close|row|parade|highway|hwy|rue|allée|allee|chemin|impasse|quai|"
           r"cours|calle|c/|avenida|avda|paseo|plaza|carrera|camino|via|viale|piazza|corso|largo|vicolo|"
           r"strasse|straße|str|weg|platz|gasse|straat|laan|plein|gracht|kade|steeg|rua|travessa|praça")
_STRONG_STREET = r"street|road|avenue|lane|boulevard|rue|calle|strasse|straße|straat"
_GLUED_STREET = r"straße|strasse|str\.|weg|gasse|platz|allee|straat|laan|gracht|plein|kade|steeg"
_STREET_WORD = rf"(?i:{_STREET})\.?(?!\w)"
_HOUSE_NUMBER = r"(?<![\w.,/-])\d{1,5}[a-zA-Z]?(?:[-/]\d{1,5}[a-zA-Z]?)?(?!\w)"
_STREET_PARTICLES = rf"(?:(?i:{_PARTICLE})[ \t]+|[lL]['’])*"  # "de ", "de la ", "l'"
_STREET_NAME = rf"{_STREET_PARTICLES}{_CAPWORD}(?:[ \t-]+{_STREET_PARTICLES}{_CAPWORD}){{0,3}}"
_LOCALITY = rf"(?:,[ \t]*(?:\d{{4,5}}[ \t]+)?{_CAPWORD}(?:[ \t-]+{_CAPWORD}){{0,2}}(?:[ \t]+\d{{1,2}}(?!\w))?)?"
_ADDRESSES = [re.compile(pattern + _LOCALITY) for pattern in (
    rf"{_HOUSE_NUMBER},?[ \t]+(?:{_CAPWORD}[ \t]+){{1,3}}?{_STREET_WORD}",  # 221B Baker Street
    # any words, but only before an unambiguous street word ("2 days in a row" is no address)
    rf"{_HOUSE_NUMBER},?[ \t]+(?:{_WORD}[ \t]+){{1,3}}?(?i:{_STRONG_STREET})(?!\w)",  # 12 abbey road
    rf"{_HOUSE_NUMBER},?[ \t]+{_STREET_WORD}[ \t]+{_STREET_NAME}",  # 78 Rue de Rivoli
    rf"(?<!\w)(?:{_CAPWORD}[ \t]+{_STREET_WORD}(?:[ \t]+{_STREET_NAME})?|{_STREET_WORD}[ \t]+{_STREET_NAME})"
    rf",?[ \t]+{_HOUSE_NUMBER}",  # Calle Mayor 5, Berliner Straße 12
    rf"(?<!\w){_LETTERS}{{2,}}(?i:{_GLUED_STREET})(?!\w),?[ \t]*{_HOUSE_NUMBER}",  # Hauptstraße 5
)]

_NAME_AFTER = re.compile(
    r"(?i:(?<!\w)(?:my[ \t]+name[ \t]+is|my[ \t]+name's|(?:full[ \t]+)?name[ \t]*[:=]|i[ \t]+am|i['’]m|"
    r"call[ \t]+me|je[ \t]+m['’]appelle|je[ \t]+suis|me[ \t]+llamo|mi[ \t]+nombre[ \t]+es|mi[ \t]+chiamo|"
    r"ich[ \t]+hei(?:ß|ss)e|mein[ \t]+name[ \t]+ist|mijn[ \t]+naam[ \t]+is|ik[ \t]+heet|is[ \t]+mise))"
    rf"[ \t]*({_NAME})")
_NAME_AFTER_TITLE = re.compile(
    r"(?<!\w)(?:Mr|Mrs|Ms|Miss|Mx|Dr|Prof|Sir|Dame|Mme|Mlle|Sr|Sra|Srta|Herr|Frau|Dhr|Mevr)\.?[ \t]+"
    rf"({_NAME})")


def _birth_word_near(text: str, start: int, end: int) -> bool:
    return bool(_BIRTH_WORDS.search(text, max(0, start - _BIRTH_WORD_BEFORE), start)
                or _BIRTH_WORDS.search(text, end, end + _BIRTH_WORD_AFTER))


def _is_phone(text: str, m: re.Match[str]) -> bool:
    candidate = m.group()
    if sum(c.isdigit() for c in candidate) not in _PHONE_DIGITS:
        return False
    if candidate.startswith(("+", "00", "(", "0")):
        return True
    return bool(_PHONE_WORDS.search(text, max(0, m.start() - _PHONE_WORD_DISTANCE), m.start()))


def regex_spans(text: str) -> list[Span]:
    """The fail-closed fallback's spans for `text` (best effort; see the module docstring)."""
    spans = natid_spans(text)
    spans += [Span(EMAIL, *m.span(), "regex:email") for m in _EMAIL.finditer(text)]
    spans += [Span(PHONE, *m.span(), "regex:phone") for m in _PHONE.finditer(text) if _is_phone(text, m)]
    spans += [Span(DOB, *m.span(), "regex:dob") for m in _DATE.finditer(text) if _birth_word_near(text, *m.span())]
    spans += [Span(ADDRESS, *m.span(), "regex:address") for pattern in _ADDRESSES for m in pattern.finditer(text)]
    spans += [Span(PERSON, *m.span(1), "regex:person")
              for pattern in (_NAME_AFTER, _NAME_AFTER_TITLE) for m in pattern.finditer(text)]
    return spans


# --------------------------------------------------------------------------- scrubbing

@dataclass
class _Leaf:
    """Where one string leaf sits, so its redacted text can be put back."""

    container: dict[str, Any] | list[Any]
    key: str | int
    text: str


async def scrub_content(content: bytes, detect: Detect) -> ScrubResult:
    """Scrub one memory candidate. Never raises because of the detector (see the module docstring)."""
    document = _json_document(content)
    if document is not None:
        leaves = _string_leaves(document)
        texts = [leaf.text for leaf in leaves]
    else:
        leaves, texts = [], [content.decode("utf-8", errors="replace")]
    distinct = list(dict.fromkeys(texts))

    found: dict[str, list[Span]] = {text: natid_spans(text) for text in distinct}
    try:
        model_version = await _add_ml_spans(found, detect)
    except Exception as exc:  # fail closed on anything the detector does
        found = {text: regex_spans(text) for text in distinct}
        status: Status = "quarantined"
        version, reason = REGEX_FALLBACK_VERSION, _reason(exc)
    else:
        status, reason = "clean", ""
        version = f"natid-{NATID_VERSION}" + (f"+{model_version}" if model_version else "")

    redacted: dict[str, str] = {}
    counts: Counter[str] = Counter()
    occurrences = Counter(texts)
    for text, spans in found.items():
        merged = merge_spans(spans)
        if merged:
            redacted[text] = redact(text, merged)
            for span in merged:
                counts[span.cls] += occurrences[text]

    if not redacted:
        return ScrubResult(content, {}, status, version, reason)
    if document is not None:
        for leaf in leaves:
            leaf.container[leaf.key] = redacted.get(leaf.text, leaf.text)  # type: ignore[index]
        output = orjson.dumps(document)
    else:
        output = redacted[texts[0]].encode("utf-8")
    return ScrubResult(output, dict(counts), "quarantined" if status == "quarantined" else "redacted",
                       version, reason)


async def _add_ml_spans(found: dict[str, list[Span]], detect: Detect) -> str:
    """Extend each text's spans with the detector's; returns the model version ("" if no call)."""
    ml: dict[str, list[Span]] = {}
    versions: set[str] = set()
    for text in found:
        if text.strip():  # blank text holds no PII; no call needed
            detection = await detect(text)
            ml[text] = ml_spans(text, detection)
            versions.add(detection.model_version)
    if len(versions) > 1:
        raise ValueError(f"the detector changed model version within one candidate: {sorted(versions)}")
    # only once every call has succeeded, so a failure leaves no half-detected text behind
    for text, spans in ml.items():
        found[text] += spans
    return versions.pop() if versions else ""


def _reason(exc: Exception) -> str:
    if isinstance(exc, DetectorError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"


_LOSSY_FLOAT = 2.0**63  # orjson reads integers beyond 64 bits as floats of at least this size
_MAX_JSON_DEPTH = 250  # orjson.dumps refuses deeper nesting


def _json_document(content: bytes) -> dict[str, Any] | list[Any] | None:
    """The parsed object or array, or None when the content is to be scrubbed as one text."""
    try:
        document = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(document, (dict, list)):
        return None
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > _MAX_JSON_DEPTH:
            return None
        children = value.values() if isinstance(value, dict) else value
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
            elif isinstance(child, float) and abs(child) >= _LOSSY_FLOAT and child.is_integer():
                return None
    return document


def _string_leaves(document: dict[str, Any] | list[Any]) -> list[_Leaf]:
    leaves: list[_Leaf] = []
    stack: list[dict[str, Any] | list[Any]] = [document]
    while stack:
        container = stack.pop()
        items = container.items() if isinstance(container, dict) else enumerate(container)
        for key, value in items:
            if isinstance(value, str):
                leaves.append(_Leaf(container, key, value))
            elif isinstance(value, (dict, list)):
                stack.append(value)
    return leaves
