"""National-identifier detection by format + checksum (the engine's ``natid`` class).

The ML detector (GLiNER) reports ``person | dob | address`` and never ``natid``; the
engine finds national identifiers itself, deterministically, here.  Precision comes
first: a false positive on an engineering string (UUID, hash, version, IP, phone,
timestamp, order number, card number ...) is a bug.  See ``docs/natid.md`` for the
long form; the rules below are the contract.

API
---
``find_national_ids(text) -> list[NatIdMatch]``
    Matches sorted by ``start``, never overlapping.  ``start``/``end`` are UTF-8 byte
    offsets, half-open, the same convention as ``upsquad.ml.v1.PIISpan``;
    ``NatIdMatch.char_span(text)`` converts them to code-point offsets.
``redact(text, matches, placeholder_for=...) -> str``
    Replaces byte spans (anything with ``kind``, ``start``, ``end``) by placeholders.

Identifiers
-----------
A *canonical* form matches on format + checksum alone.  A *keyword* form also needs
a context keyword of that identifier nearby (see "Context" below).  Letters are
canonical only in upper case; the all-lower-case spelling is a keyword form.

=================  ===================================  ==========================================  ====================
kind               canonical forms                      validity rule                               keyword-only forms
=================  ===================================  ==========================================  ====================
us_ssn             ``AAA-GG-SSSS``                      area not 000, 666 or 900-999; group not     ``AAA GG SSSS``,
                                                        00; serial not 0000 (no checksum exists)    ``AAAGGSSSS``
uk_nino            ``AB123456C``, ``AB 12 34 56 C``     1st letter not D F I Q U V; 2nd letter not  lower case
                                                        D F I O Q U V; prefix not BG GB KN NK NT
                                                        TN ZZ; suffix A-D (required; no checksum)
ie_ppsn            ``1234567T``, ``1234567TW``,         check letter = "WABC...V"[(sum(d_i*w_i)     lower case; glued
                   ``1234567FA``                        + 9*v2) mod 23], w = 8..2, v2 = 0 for W or  check letter B K M G
                                                        absent, A..I = 1..9                         (reads as a size)
fr_nir             ``1 85 05 78 006 084 36``            sex 1/2; month 01-12, 20-42 or 50-99;       sex 3, 4, 7, 8;
                   (overseas:                           department not 00 (2A/2B: Corsica);         ``185057800608436``,
                   ``2 87 06 971 05 017 xx``)           commune, order not 000; key = 97 - (N mod   ``1850578006084 36``
                                                        97) over the 13 digits, 2A->19, 2B->18
es_dni             ``12345678Z``, ``12345678-Z``,       letter = "TRWAGMYFPDXBNJZSQVHLCKE"[n mod    lower case; space
                   ``12.345.678-Z``                     23]                                         before letter; glued
                                                                                                    letter B K M G
es_nie             ``X1234567L``, ``X-1234567-L``       X/Y/Z -> 0/1/2 prefixed, then the DNI       lower case; spaces
                                                        letter rule
it_codice_fiscale  ``RSSMRA85T10A562S`` (omocodia       6 letters, yy, month letter ABCDEHLMPRST,   lower case
                   letters LMNPQRSTUV allowed in        day 01-31 / 41-71, place letter A-M or Z,
                   digit places)                        check letter from the odd/even tables
                                                        (sum mod 26)
nl_bsn             (none)                               9 digits, 11-proof: 9a+8b+...+2h-1i = 0     ``123456782``,
                                                        mod 11, not all zero                        ``1234.56.782``,
                                                                                                    ``123 456 782``
de_steuer_id       (none)                               11 digits, first not 0; in the first 10     ``86095742719``,
                                                        exactly one digit repeats, 2 or 3 times,    ``86 095 742 719``
                                                        a triple not all adjacent; ISO 7064 MOD
                                                        11,10 check digit
in_aadhaar         ``2345 6789 0124`` (single spaces)   12 digits, first 2-9, Verhoeff checksum;    ``234567890124``,
                                                        canonical form refused when all three       ``2345-6789-0124``
                                                        groups look like years 1900-2099
=================  ===================================  ==========================================  ====================

Boundaries (every form)
-----------------------
* The identifier must be a whole token: no letter, digit or ``_`` touching either end.
* Left: ``- . / \\ + @ & % ~ $ ^`` directly before rejects (``ORD-123456789``, IPs,
  paths, phone ``+``); ``: = #`` directly before is accepted only if a keyword of that
  identifier ends right there (``SSN:123-45-6789``, ``bsn=123456782``).
* Right: ``- / \\ + @ & % ~ $ ^ # =`` directly after rejects; ``. : ! ?`` directly
  after rejects when followed by a letter, digit or ``_`` (versions, IPs, ``host:port``,
  file names, decimals), and is fine as sentence punctuation.
* Digit-group runs: a space, NBSP or comma between the match and a further digit (or
  ``(020) ``-style digits) rejects, so a 4-4-4 slice of a card number, a phone number
  with country code, an IBAN or a thousands-grouped number never matches.
* Only ASCII digits count as digits.

Context
-------
* Keyword: a keyword of that identifier (case-insensitive, letter-bounded; list in
  ``_KEYWORDS``) ending at most 40 characters before the match, or starting at most 24
  characters after it, with no ASCII digit between keyword and match.  A keyword
  confirms only the nearest number: "BSN 123456782, 987654321" matches the first one.
* Veto: a canonical form without a keyword is refused when a contrary label (order,
  invoice, tracking, card, phone, port, build, version, sha, crc, serial, imei, iban,
  account ...; ``_VETO_WORDS``) sits nearby under the same distance / no-digit rule.  A
  keyword always beats a veto.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

__all__ = [
    "KINDS",
    "NatIdMatch",
    "find_national_ids",
    "redact",
]

KINDS: tuple[str, ...] = (
    "us_ssn",
    "uk_nino",
    "ie_ppsn",
    "fr_nir",
    "es_dni",
    "es_nie",
    "it_codice_fiscale",
    "nl_bsn",
    "de_steuer_id",
    "in_aadhaar",
)


@dataclass(frozen=True, slots=True)
class NatIdMatch:
    """One national identifier; ``start``/``end`` are UTF-8 byte offsets, half-open."""

    kind: str
    start: int
    end: int
    text: str

    def char_span(self, source: str) -> tuple[int, int]:
        """Code-point offsets of this match in ``source`` (the string it was found in)."""
        data = source.encode("utf-8")
        start = len(data[: self.start].decode("utf-8"))
        return start, start + len(self.text)


# --------------------------------------------------------------------------- checksums

_DNI_LETTERS = "TRWAGMYFPDXBNJZSQVHLCKE"
_PPSN_LETTERS = "WABCDEFGHIJKLMNOPQRSTUV"  # remainder 0 -> W, 1 -> A, ... 22 -> V


def _ssn_ok(area: str, group: str, serial: str) -> bool:
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


def _nino_ok(prefix: str) -> bool:
    first, second = prefix[0], prefix[1]
    return (
        first not in "DFIQUV"
        and second not in "DFIOQUV"
        and prefix not in ("BG", "GB", "KN", "NK", "NT", "TN", "ZZ")
    )


def _ppsn_check_letter(digits: str, second: str) -> str:
    total = sum(int(d) * w for d, w in zip(digits, range(8, 1, -1)))
    if second and second != "W":
        total += 9 * (ord(second) - ord("A") + 1)
    return _PPSN_LETTERS[total % 23]


def _dni_letter(number: int) -> str:
    return _DNI_LETTERS[number % 23]


def _nir_ok(nir: str) -> bool:
    """``nir`` is the 15-character form without separators."""
    month = int(nir[3:5])
    if not (1 <= month <= 12 or 20 <= month <= 42 or 50 <= month <= 99):
        return False
    dept = nir[5:7]
    if dept == "2A":
        body = nir[:5] + "19" + nir[7:13]
    elif dept == "2B":
        body = nir[:5] + "18" + nir[7:13]
    elif dept == "00":
        return False
    else:
        body = nir[:13]
    if nir[7:10] == "000" or nir[10:13] == "000":
        return False
    return int(nir[13:15]) == 97 - int(body) % 97


_CF_ODD = {
    **dict(zip("0123456789", (1, 0, 5, 7, 9, 13, 15, 17, 19, 21))),
    **dict(
        zip(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
            (1, 0, 5, 7, 9, 13, 15, 17, 19, 21, 2, 4, 18, 20, 11, 3, 6, 8, 12, 14, 16, 10, 22, 25, 24, 23),
        )
    ),
}
_CF_EVEN = {
    **{str(i): i for i in range(10)},
    **{chr(ord("A") + i): i for i in range(26)},
}
_CF_OMOCODE = dict(zip("LMNPQRSTUV", "0123456789"))
_CF_MONTHS = "ABCDEHLMPRST"


def _cf_ok(cf: str) -> bool:
    """``cf`` is upper case, 16 characters, already shaped by the regex."""
    if cf[8] not in _CF_MONTHS or cf[11] not in "ABCDEFGHIJKLMZ":
        return False
    day = int("".join(_CF_OMOCODE.get(c, c) for c in cf[9:11]))
    if not (1 <= day <= 31 or 41 <= day <= 71):
        return False
    total = sum(_CF_ODD[c] for c in cf[0:15:2]) + sum(_CF_EVEN[c] for c in cf[1:15:2])
    return cf[15] == chr(ord("A") + total % 26)


def _bsn_ok(digits: str) -> bool:
    if digits == "000000000":
        return False
    total = sum(int(d) * w for d, w in zip(digits[:8], range(9, 1, -1))) - int(digits[8])
    return total % 11 == 0


def _steuer_id_ok(digits: str) -> bool:
    if digits[0] == "0":
        return False
    head = digits[:10]
    repeated = [(d, n) for d, n in Counter(head).items() if n > 1]
    if len(repeated) != 1 or repeated[0][1] not in (2, 3):
        return False
    if repeated[0][1] == 3 and repeated[0][0] * 3 in head:
        return False
    product = 10
    for d in head:
        total = (int(d) + product) % 10
        if total == 0:
            total = 10
        product = (total * 2) % 11
    check = 11 - product
    if check == 10:
        check = 0
    return check == int(digits[10])


def _dihedral_d5() -> list[list[int]]:
    # Elements 0-4 are the rotations r^k, 5-9 the reflections s.r^k; Verhoeff's table
    # is the Cayley table of D5 in that numbering.
    def compose(a: int, b: int) -> int:
        if a < 5 and b < 5:
            return (a + b) % 5
        if a < 5:
            return 5 + (a + b - 5) % 5
        if b < 5:
            return 5 + (a - 5 - b) % 5
        return (a - b) % 5

    return [[compose(a, b) for b in range(10)] for a in range(10)]


_VERHOEFF_D = _dihedral_d5()
_VERHOEFF_P = [list(range(10))]
for _ in range(7):
    _VERHOEFF_P.append([_VERHOEFF_P[-1][j] for j in (1, 5, 7, 6, 2, 8, 3, 0, 9, 4)])


def _verhoeff_ok(digits: str) -> bool:
    check = 0
    for i, d in enumerate(reversed(digits)):
        check = _VERHOEFF_D[check][_VERHOEFF_P[i % 8][int(d)]]
    return check == 0


# --------------------------------------------------------------------------- context

def _words(*alternatives: str) -> re.Pattern[str]:
    return re.compile(r"(?<![A-Za-z])(?:" + "|".join(alternatives) + r")(?![A-Za-z])", re.IGNORECASE)


_GENERIC_KEYWORDS = (r"national[\s_-]*id(?:entity|entification)?(?:[\s_-]*(?:number|no|nr|card))?",)

_KEYWORDS: dict[str, re.Pattern[str]] = {
    "us_ssn": _words(
        r"ssns?",
        r"ss#",
        r"ss[\s_-]*no",
        r"social[\s_-]+security(?:[\s_-]+(?:number|no|#))?",
        r"soc\.?[\s_-]*sec",
        # no generic "national id": an SSN has no checksum to back a guess
    ),
    "uk_nino": _words(
        r"ninos?",
        r"ni[\s_-]*(?:number|no|nr)",
        r"national[\s_-]+insurance",
        *_GENERIC_KEYWORDS,
    ),
    "ie_ppsn": _words(
        r"ppsns?",
        r"pps[\s_-]*(?:number|no|nr)",
        r"personal[\s_-]+public[\s_-]+service",
        *_GENERIC_KEYWORDS,
    ),
    "fr_nir": _words(
        r"nir",
        r"nss",
        r"insee",
        r"s[ée]cu",
        r"s[ée]curit[ée][\s_-]+sociale",
        r"carte[\s_-]+vitale",
        r"immatriculation",
        r"social[\s_-]+security",
        *_GENERIC_KEYWORDS,
    ),
    "es_dni": _words(
        r"dni",
        r"nif",
        r"documento[\s_-]+nacional",
        *_GENERIC_KEYWORDS,
    ),
    "es_nie": _words(
        r"nie",
        r"nif",
        r"n[úu]mero[\s_-]+de[\s_-]+identi(?:dad|ficaci[óo]n)[\s_-]+de[\s_-]+extranjero",
        *_GENERIC_KEYWORDS,
    ),
    "it_codice_fiscale": _words(
        r"codice[\s_-]+fiscale",
        r"cod\.?[\s_-]*fisc",
        r"c\.[\s]?f\.",
        r"cf",
        *_GENERIC_KEYWORDS,
    ),
    "nl_bsn": _words(
        r"bsn",
        r"burger[\s_-]*service[\s_-]*nummer",
        r"sofi[\s_-]*nummer",
        r"citizen[\s_-]+service[\s_-]+number",
        *_GENERIC_KEYWORDS,
    ),
    "de_steuer_id": _words(
        r"steuer[\s_-]*id(?:[\s_-]*nr)?",
        r"steuer[\s_-]*identifikations[\s_-]*nummer",
        r"identifikations[\s_-]*nummer",
        r"id[\s_-]*nr",
        r"tax[\s_-]+id(?:entification[\s_-]+number)?",
        *_GENERIC_KEYWORDS,
    ),
    "in_aadhaar": _words(
        r"aadhaa?r",
        r"adhaa?r",
        r"uidai",
        r"आधार",  # Hindi "Aadhaar"
        *_GENERIC_KEYWORDS,
    ),
}

# Contrary labels, matched as whole ASCII letter runs (case-insensitive, plural "s"
# allowed); a number glued to the label ("crc32", "sha-256") belongs to the label.
_VETO_WORDS = frozenset(
    """
    order ord invoice inv po purchase receipt ticket case incident
    tracking track shipment parcel package fedex ups usps dhl awb waybill
    card visa mastercard amex credit debit iban bic swift account acct
    phone tel telephone mobile cell fax whatsapp
    port pid uid gid build version release commit sha md5 hash checksum crc
    serial sku isbn imei ean upc part model batch lot
    transaction txn trace span request req job run pod container image digest
    epoch timestamp ts bytes size
    """.split()
)
_LETTER_RUN = re.compile(r"[A-Za-z]+")
_LABEL_NUMBER = re.compile(r"[-_]?[0-9]+(?![A-Za-z])")


def _veto_spans(text: str) -> tuple[list[int], list[int]]:
    starts: list[int] = []
    ends: list[int] = []
    for m in _LETTER_RUN.finditer(text):
        word = m.group().lower()
        if word not in _VETO_WORDS and not (word.endswith("s") and word[:-1] in _VETO_WORDS):
            continue
        end = m.end()
        number = _LABEL_NUMBER.match(text, end)
        if number:
            end = number.end()
        starts.append(m.start())
        ends.append(end)
    return starts, ends


_KEYWORD_BEFORE = 40
_KEYWORD_AFTER = 24
_DIGIT = re.compile(r"[0-9]")

_LEFT_REJECT = frozenset("-./\\+@&%~$^")
_LEFT_IF_KEYWORD = frozenset(":=#")
_RIGHT_REJECT = frozenset("-/\\+@&%~$^#=")
_RIGHT_PUNCT = frozenset(".:!?")
_GROUP_SEPS = frozenset(" \u00a0\u202f,")


class _Context:
    """Keyword and veto spans of one text, computed on demand."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._keywords: dict[str, tuple[list[int], list[int]]] = {}
        self._veto: tuple[list[int], list[int]] | None = None

    @staticmethod
    def _spans(pattern: re.Pattern[str], text: str) -> tuple[list[int], list[int]]:
        starts: list[int] = []
        ends: list[int] = []
        for m in pattern.finditer(text):
            starts.append(m.start())
            ends.append(m.end())
        return starts, ends

    def _near(self, spans: tuple[list[int], list[int]], start: int, end: int) -> bool:
        starts, ends = spans
        text = self.text
        # Nearest span ending at or before `start`; ends are increasing with starts
        # because the spans come from one non-overlapping finditer pass.
        i = bisect.bisect_right(ends, start) - 1
        if i >= 0 and start - ends[i] <= _KEYWORD_BEFORE and not _DIGIT.search(text, ends[i], start):
            return True
        j = bisect.bisect_left(starts, end)
        if j < len(starts) and starts[j] - end <= _KEYWORD_AFTER and not _DIGIT.search(text, end, starts[j]):
            return True
        return False

    def keyword_near(self, kind: str, start: int, end: int) -> bool:
        spans = self._keywords.get(kind)
        if spans is None:
            spans = self._keywords[kind] = self._spans(_KEYWORDS[kind], self.text)
        return self._near(spans, start, end)

    def keyword_ends_at(self, kind: str, pos: int) -> bool:
        spans = self._keywords.get(kind)
        if spans is None:
            spans = self._keywords[kind] = self._spans(_KEYWORDS[kind], self.text)
        i = bisect.bisect_left(spans[1], pos)
        return i < len(spans[1]) and spans[1][i] == pos

    def vetoed(self, start: int, end: int) -> bool:
        if self._veto is None:
            self._veto = _veto_spans(self.text)
        return self._near(self._veto, start, end)


def _digitish_before(text: str, i: int) -> bool:
    """True if text[i] is a digit, or a ')' closing digits: '(020) 123...'."""
    if i < 0:
        return False
    c = text[i]
    if "0" <= c <= "9":
        return True
    return c == ")" and i >= 1 and "0" <= text[i - 1] <= "9"


def _left_ok(ctx: _Context, kind: str, start: int) -> bool:
    if start == 0:
        return True
    text = ctx.text
    c = text[start - 1]
    if c.isalnum() or c == "_" or c in _LEFT_REJECT:
        return False
    if c in _LEFT_IF_KEYWORD:
        return ctx.keyword_ends_at(kind, start - 1)
    if c in _GROUP_SEPS and _digitish_before(text, start - 2):
        return False
    return True


def _right_ok(text: str, end: int) -> bool:
    if end == len(text):
        return True
    c = text[end]
    if c.isalnum() or c == "_" or c in _RIGHT_REJECT:
        return False
    nxt = text[end + 1] if end + 1 < len(text) else ""
    if c in _RIGHT_PUNCT and (nxt.isalnum() or nxt == "_"):
        return False
    if c in _GROUP_SEPS and "0" <= nxt <= "9":
        return False
    return True


# --------------------------------------------------------------------------- forms

_CANONICAL = "canonical"
_KEYWORD = "keyword"

_SP = "[ \u00a0\u202f]"  # one space, NBSP or narrow NBSP between groups


@dataclass(frozen=True)
class _Form:
    kind: str
    pattern: re.Pattern[str]
    # None: invalid; _CANONICAL: valid on its own; _KEYWORD: valid with a keyword.
    classify: Callable[[re.Match[str]], str | None]
    priority: int


def _case(letters: str) -> str | None:
    if letters.isupper():
        return _CANONICAL
    if letters.islower():
        return _KEYWORD
    return None


def _ssn_hyphen(m: re.Match[str]) -> str | None:
    return _CANONICAL if _ssn_ok(*m.groups()) else None


def _ssn_keyword(m: re.Match[str]) -> str | None:
    return _KEYWORD if _ssn_ok(*m.groups()) else None


def _nino(m: re.Match[str]) -> str | None:
    prefix, suffix = m.group(1), m.group(5)
    case = _case(prefix + suffix)
    if case is None or not _nino_ok(prefix.upper()):
        return None
    return case


_SIZE_LETTERS = "BKMG"


def _ppsn(m: re.Match[str]) -> str | None:
    digits, check, second = m.groups()
    case = _case(check + second)
    if case is None:
        return None
    check, second = check.upper(), second.upper()
    if _ppsn_check_letter(digits, second) != check:
        return None
    if check in _SIZE_LETTERS:  # "1048576K", "2097152KB": a size, not a person
        return _KEYWORD
    return case


def _dni(m: re.Match[str]) -> str | None:
    number, sep, letter = m.groups()
    case = _case(letter)
    if case is None or _dni_letter(int(number.replace(".", ""))) != letter.upper():
        return None
    if sep in (" ", "\u00a0"):  # "12345678 Z"
        return _KEYWORD
    if not sep and "." not in number and letter.upper() in _SIZE_LETTERS:
        return _KEYWORD
    return case


def _nie(m: re.Match[str]) -> str | None:
    prefix, sep1, digits, sep2, letter = m.groups()
    case = _case(prefix + letter)
    if case is None:
        return None
    number = int(str("XYZ".index(prefix.upper())) + digits)
    if _dni_letter(number) != letter.upper():
        return None
    if any(s and s != "-" for s in (sep1, sep2)):
        return _KEYWORD
    return case


def _nir_spaced(m: re.Match[str]) -> str | None:
    nir = re.sub(_SP, "", m.group(0))
    if len(nir) != 15 or not _nir_ok(nir):
        return None
    return _CANONICAL if nir[0] in "12" else _KEYWORD


def _nir_compact(m: re.Match[str]) -> str | None:
    # 15 bare digits are a numeric id as often as a NIR (~1 in 100 such ids passes the
    # key), so the compact spellings need a keyword.
    nir = re.sub(_SP, "", m.group(0))
    return _KEYWORD if len(nir) == 15 and _nir_ok(nir) else None


def _cf(m: re.Match[str]) -> str | None:
    cf = m.group(0)
    case = _case(cf)
    if case is None or not _cf_ok(cf.upper()):
        return None
    return case


def _bsn(m: re.Match[str]) -> str | None:
    digits = re.sub(r"[^0-9]", "", m.group(0))
    return _KEYWORD if _bsn_ok(digits) else None


def _steuer_id(m: re.Match[str]) -> str | None:
    digits = re.sub(r"[^0-9]", "", m.group(0))
    return _KEYWORD if _steuer_id_ok(digits) else None


def _aadhaar_spaced(m: re.Match[str]) -> str | None:
    groups = m.groups()
    if not _verhoeff_ok("".join(groups)):
        return None
    if all(1900 <= int(g) <= 2099 for g in groups):  # "2019 2020 2021" is a list of years
        return _KEYWORD
    return _CANONICAL


def _aadhaar_keyword(m: re.Match[str]) -> str | None:
    return _KEYWORD if _verhoeff_ok(m.group(1) + m.group(3) + m.group(4)) else None


_OMO = "[0-9LMNPQRSTUVlmnpqrstuv]"

_FORMS: tuple[_Form, ...] = (
    _Form("us_ssn", re.compile(r"(?<!\w)([0-9]{3})-([0-9]{2})-([0-9]{4})(?!\w)"), _ssn_hyphen, 0),
    _Form("us_ssn", re.compile(rf"(?<!\w)([0-9]{{3}}){_SP}([0-9]{{2}}){_SP}([0-9]{{4}})(?!\w)"), _ssn_keyword, 0),
    _Form("us_ssn", re.compile(r"(?<!\w)([0-9]{3})([0-9]{2})([0-9]{4})(?!\w)"), _ssn_keyword, 0),
    _Form(
        "uk_nino",
        re.compile(
            rf"(?<!\w)([A-Za-z]{{2}}){_SP}?([0-9]{{2}}){_SP}?([0-9]{{2}}){_SP}?([0-9]{{2}}){_SP}?([A-Da-d])(?!\w)"
        ),
        _nino,
        1,
    ),
    _Form("ie_ppsn", re.compile(r"(?<!\w)([0-9]{7})([A-Wa-w])([A-IWa-iw]?)(?!\w)"), _ppsn, 2),
    _Form(
        "fr_nir",
        re.compile(
            rf"(?<!\w)[1-478]{_SP}[0-9]{{2}}{_SP}[0-9]{{2}}{_SP}"
            rf"(?:[0-9]{{2}}{_SP}[0-9]{{3}}|2[AB]{_SP}[0-9]{{3}}|9[78][0-9]{_SP}[0-9]{{2}})"
            rf"{_SP}[0-9]{{3}}{_SP}[0-9]{{2}}(?!\w)"
        ),
        _nir_spaced,
        3,
    ),
    _Form(
        "fr_nir",
        re.compile(rf"(?<!\w)[1-478][0-9]{{4}}(?:[0-9]{{2}}|2[AB])[0-9]{{6}}{_SP}?[0-9]{{2}}(?!\w)"),
        _nir_compact,
        3,
    ),
    _Form(
        "es_dni",
        re.compile(r"(?<!\w)([0-9]{8}|[0-9]{2}\.[0-9]{3}\.[0-9]{3})(-|[ \u00a0]|)([A-Za-z])(?!\w)"),
        _dni,
        4,
    ),
    _Form(
        "es_nie",
        re.compile(r"(?<!\w)([XYZxyz])(-|[ \u00a0]|)([0-9]{7})(-|[ \u00a0]|)([A-Za-z])(?!\w)"),
        _nie,
        5,
    ),
    _Form(
        "it_codice_fiscale",
        re.compile(
            rf"(?<!\w)[A-Za-z]{{6}}{_OMO}{{2}}[A-Za-z]{_OMO}{{2}}[A-Za-z]{_OMO}{{3}}[A-Za-z](?!\w)"
        ),
        _cf,
        6,
    ),
    _Form(
        "nl_bsn",
        re.compile(
            rf"(?<!\w)(?:[0-9]{{9}}|[0-9]{{4}}\.[0-9]{{2}}\.[0-9]{{3}}|[0-9]{{3}}{_SP}[0-9]{{3}}{_SP}[0-9]{{3}})(?!\w)"
        ),
        _bsn,
        7,
    ),
    _Form(
        "de_steuer_id",
        re.compile(rf"(?<!\w)(?:[1-9][0-9]{{10}}|[1-9][0-9]{_SP}[0-9]{{3}}{_SP}[0-9]{{3}}{_SP}[0-9]{{3}})(?!\w)"),
        _steuer_id,
        8,
    ),
    _Form(
        "in_aadhaar",
        re.compile(rf"(?<!\w)([2-9][0-9]{{3}}){_SP}([0-9]{{4}}){_SP}([0-9]{{4}})(?!\w)"),
        _aadhaar_spaced,
        9,
    ),
    _Form(
        "in_aadhaar",
        re.compile(r"(?<!\w)([2-9][0-9]{3})(-?)([0-9]{4})\2([0-9]{4})(?!\w)"),
        _aadhaar_keyword,
        9,
    ),
)


# --------------------------------------------------------------------------- API

def find_national_ids(text: str) -> list[NatIdMatch]:
    """National identifiers in ``text``, by start, non-overlapping, with UTF-8 byte offsets."""
    ctx = _Context(text)
    found: list[tuple[int, int, int, str]] = []
    for form in _FORMS:
        for m in form.pattern.finditer(text):
            verdict = form.classify(m)
            if verdict is None:
                continue
            start, end = m.span()
            if not (_left_ok(ctx, form.kind, start) and _right_ok(text, end)):
                continue
            if ctx.keyword_near(form.kind, start, end):
                pass
            elif verdict == _KEYWORD or ctx.vetoed(start, end):
                continue
            found.append((start, end, form.priority, form.kind))

    found.sort(key=lambda f: (f[0], -(f[1] - f[0]), f[2]))
    matches: list[NatIdMatch] = []
    last_end = 0
    byte_pos = 0  # byte offset of char index `char_pos`
    char_pos = 0
    for start, end, _priority, kind in found:
        if start < last_end:
            continue
        byte_start = byte_pos + len(text[char_pos:start].encode("utf-8"))
        piece = text[start:end]
        byte_end = byte_start + len(piece.encode("utf-8"))
        matches.append(NatIdMatch(kind, byte_start, byte_end, piece))
        last_end, char_pos, byte_pos = end, end, byte_end
    return matches


class _Span(Protocol):
    kind: str
    start: int
    end: int


def _default_placeholder(kind: str) -> str:
    return "[NATID]"


def redact(
    text: str,
    matches: Iterable[_Span],
    placeholder_for: Callable[[str], str] = _default_placeholder,
) -> str:
    """Replace each byte span (``start``/``end`` UTF-8 offsets) with ``placeholder_for(kind)``.

    Spans must lie inside ``text``, on code-point boundaries, and not overlap.
    """
    data = text.encode("utf-8")
    out: list[bytes] = []
    pos = 0
    for m in sorted(matches, key=lambda s: (s.start, s.end)):
        if not (pos <= m.start <= m.end <= len(data)):
            raise ValueError(f"span {m.start}:{m.end} overlaps or lies outside the text")
        for edge in (m.start, m.end):
            if edge < len(data) and data[edge] & 0xC0 == 0x80:
                raise ValueError(f"byte offset {edge} splits a UTF-8 character")
        out.append(data[pos : m.start])
        out.append(placeholder_for(m.kind).encode("utf-8"))
        pos = m.end
    out.append(data[pos:])
    return b"".join(out).decode("utf-8")
