"""National-ID detection: format + checksum positives, checksum negatives, engineering negatives.

The check-digit helpers here are written independently of the module (hard-coded
Verhoeff tables, plain loops) so a shared mistake cannot make both sides agree.
"""

from __future__ import annotations

import itertools

import pytest

from inference.natid import NatIdMatch, find_national_ids, redact

# --------------------------------------------------------------------------- helpers


def ssn_ok(a: str, g: str, s: str) -> bool:
    return a not in {"000", "666"} and not a.startswith("9") and g != "00" and s != "0000"


def ppsn_letter(digits: str, second: str = "") -> str:
    weights = [8, 7, 6, 5, 4, 3, 2]
    total = sum(int(d) * w for d, w in zip(digits, weights))
    if second in "ABCDEFGHI" and second:
        total += 9 * ("ABCDEFGHI".index(second) + 1)
    r = total % 23
    return "W" if r == 0 else chr(ord("A") + r - 1)


def dni_letter(n: int) -> str:
    return "TRWAGMYFPDXBNJZSQVHLCKE"[n % 23]


def nie(prefix: str, digits: str) -> str:
    return prefix + digits + dni_letter(int({"X": "0", "Y": "1", "Z": "2"}[prefix] + digits))


def nir_key(first13: str) -> str:
    n = first13.replace("2A", "19").replace("2B", "18")
    return f"{97 - int(n) % 97:02d}"


def nir(first13: str) -> str:
    return first13 + nir_key(first13)


def nir_spaced(full15: str) -> str:
    parts = [full15[0], full15[1:3], full15[3:5], full15[5:7], full15[7:10], full15[10:13], full15[13:15]]
    return " ".join(parts)


CF_ODD = {
    "0": 1, "1": 0, "2": 5, "3": 7, "4": 9, "5": 13, "6": 15, "7": 17, "8": 19, "9": 21,
    "A": 1, "B": 0, "C": 5, "D": 7, "E": 9, "F": 13, "G": 15, "H": 17, "I": 19, "J": 21,
    "K": 2, "L": 4, "M": 18, "N": 20, "O": 11, "P": 3, "Q": 6, "R": 8, "S": 12, "T": 14,
    "U": 16, "V": 10, "W": 22, "X": 25, "Y": 24, "Z": 23,
}  # fmt: skip


def cf_check(first15: str) -> str:
    total = 0
    for i, c in enumerate(first15):
        if i % 2 == 0:  # 1st, 3rd, ... (odd in 1-based counting)
            total += CF_ODD[c]
        else:
            total += int(c) if c.isdigit() else ord(c) - ord("A")
    return chr(ord("A") + total % 26)


def cf(first15: str) -> str:
    return first15 + cf_check(first15)


def bsn_ok(d: str) -> bool:
    return sum(int(x) * w for x, w in zip(d, [9, 8, 7, 6, 5, 4, 3, 2, -1])) % 11 == 0


def bsn(first8: str) -> str:
    """Complete 8 digits to a valid BSN, or '' if no last digit works."""
    for last in "0123456789":
        if bsn_ok(first8 + last):
            return first8 + last
    return ""


def steuer_check(first10: str) -> str:
    product = 10
    for ch in first10:
        s = (int(ch) + product) % 10 or 10
        product = (2 * s) % 11
    c = 11 - product
    return "0" if c == 10 else str(c)


def steuer(first10: str) -> str:
    return first10 + steuer_check(first10)


VERHOEFF_D = [
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
    [1, 2, 3, 4, 0, 6, 7, 8, 9, 5],
    [2, 3, 4, 0, 1, 7, 8, 9, 5, 6],
    [3, 4, 0, 1, 2, 8, 9, 5, 6, 7],
    [4, 0, 1, 2, 3, 9, 5, 6, 7, 8],
    [5, 9, 8, 7, 6, 0, 4, 3, 2, 1],
    [6, 5, 9, 8, 7, 1, 0, 4, 3, 2],
    [7, 6, 5, 9, 8, 2, 1, 0, 4, 3],
    [8, 7, 6, 5, 9, 3, 2, 1, 0, 4],
    [9, 8, 7, 6, 5, 4, 3, 2, 1, 0],
]
VERHOEFF_P = [
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
    [1, 5, 7, 6, 2, 8, 3, 0, 9, 4],
    [5, 8, 0, 3, 7, 9, 6, 1, 4, 2],
    [8, 9, 1, 6, 0, 4, 3, 5, 2, 7],
    [9, 4, 5, 3, 1, 2, 6, 8, 7, 0],
    [4, 2, 8, 6, 5, 7, 3, 9, 0, 1],
    [2, 7, 9, 3, 8, 0, 6, 4, 1, 5],
    [7, 0, 4, 6, 9, 1, 3, 2, 5, 8],
]
VERHOEFF_INV = [0, 4, 3, 2, 1, 5, 6, 7, 8, 9]


def verhoeff_digit(body: str) -> str:
    c = 0
    for i, ch in enumerate(reversed(body)):
        c = VERHOEFF_D[c][VERHOEFF_P[(i + 1) % 8][int(ch)]]
    return str(VERHOEFF_INV[c])


def verhoeff_valid(num: str) -> bool:
    c = 0
    for i, ch in enumerate(reversed(num)):
        c = VERHOEFF_D[c][VERHOEFF_P[i % 8][int(ch)]]
    return c == 0


def aadhaar(first11: str) -> str:
    return first11 + verhoeff_digit(first11)


def spaced4(d: str) -> str:
    return " ".join(d[i : i + 4] for i in range(0, len(d), 4))


def wrong_digit(d: str) -> str:
    return d[:-1] + str((int(d[-1]) + 1) % 10)


def wrong_letter(c: str, alphabet: str = "ABCDEFGHJKLMNPQRSTVWXYZ") -> str:
    return alphabet[(alphabet.index(c) + 1) % len(alphabet)] if c in alphabet else "A"


def first_with(pred, candidates):
    for c in candidates:
        if pred(c):
            return c
    raise AssertionError("no candidate satisfied the predicate")


def kinds(text: str) -> list[tuple[str, str]]:
    return [(m.kind, m.text) for m in find_national_ids(text)]


# Sanity checks on the helpers themselves, against published examples.
def test_helpers_agree_with_published_examples() -> None:
    assert verhoeff_digit("236") == "3" and verhoeff_valid("2363")
    assert ppsn_letter("1234567") == "T" and ppsn_letter("1234567", "A") == "F"
    assert dni_letter(12345678) == "Z"
    assert nie("X", "1234567") == "X1234567L"
    assert cf("RSSMRA85T10A562") == "RSSMRA85T10A562S"
    assert bsn_ok("111222333") and bsn_ok("123456782")
    assert steuer("8609574271") == "86095742719"


# --------------------------------------------------------------------------- positives

_NIR_BODIES = ["1850578006084", "2940275123456", "1691099352108", "2010131055001", "1780492001333"]
_NIR_VALID = [nir(b) for b in _NIR_BODIES]
_NIR_CORSICA = [nir("18505" + "2A" + "004123"), nir("27212" + "2B" + "033071")]
_NIR_OVERSEAS = nir("2870697105017")  # department 971 (Guadeloupe), commune 05
# Overseas grouping: 3-digit department, 2-digit commune.
_NIR_OVERSEAS_TEXT = " ".join(
    [_NIR_OVERSEAS[0], _NIR_OVERSEAS[1:3], _NIR_OVERSEAS[3:5], _NIR_OVERSEAS[5:8],
     _NIR_OVERSEAS[8:10], _NIR_OVERSEAS[10:13], _NIR_OVERSEAS[13:]]
)

_CF_VALID = [
    "RSSMRA85T10A562S",
    cf("VRDGPP80A01H501"),  # male, 1 January
    cf("BNCLRA92E52F205"),  # female: day 12 + 40
    cf("RSSMRA85T10A56N"),  # omocodia: last digit 2 -> N
    cf("DLLMRC77M71Z404"),  # born abroad (Z...), female 31st
]

_BSN_VALID = ["111222333", "123456782", bsn("27834519"), bsn("60410127"), bsn("98765432")]
_STEUER_VALID = [steuer("8609574271"), steuer("4703689281"), steuer("6592997048"), steuer("1234567891")]
_AADHAAR_VALID = [aadhaar(b) for b in ("23456789012", "49183726504", "87654321098", "53901284765")]

POSITIVES: list[tuple[str, str, str]] = [
    # (text, kind, matched text)
    # us_ssn, hyphenated: canonical, no keyword needed
    ("123-45-6789", "us_ssn", "123-45-6789"),
    ("Applicant 078-05-1120 on file.", "us_ssn", "078-05-1120"),
    ("id: 001-01-0001", "us_ssn", "001-01-0001"),
    ("665-99-9999", "us_ssn", "665-99-9999"),
    ("(899-12-3456)", "us_ssn", "899-12-3456"),
    # us_ssn, keyword forms
    ("SSN: 123456789", "us_ssn", "123456789"),
    ("social security number 219 09 9999", "us_ssn", "219 09 9999"),
    ("user_ssn=457555462", "us_ssn", "457555462"),
    ("SSN#123-45-6789", "us_ssn", "123-45-6789"),
    ("212457890 is my ssn", "us_ssn", "212457890"),
    # uk_nino
    ("AB123456C", "uk_nino", "AB123456C"),
    ("NI: AB 12 34 56 C.", "uk_nino", "AB 12 34 56 C"),
    ("JG103759A", "uk_nino", "JG103759A"),
    ("Her number is CE987654D, she said", "uk_nino", "CE987654D"),
    ("OA000001B", "uk_nino", "OA000001B"),
    ("national insurance number: ab123456c", "uk_nino", "ab123456c"),
    # ie_ppsn
    ("1234567T", "ie_ppsn", "1234567T"),
    ("1234567FA", "ie_ppsn", "1234567FA"),
    ("1234567TW", "ie_ppsn", "1234567TW"),
    (f"PPS No. 7654321{ppsn_letter('7654321')}", "ie_ppsn", f"7654321{ppsn_letter('7654321')}"),
    (f"ppsn: 8765432{ppsn_letter('8765432').lower()}", "ie_ppsn", f"8765432{ppsn_letter('8765432').lower()}"),
    # fr_nir
    (f"NIR {_NIR_VALID[0]}", "fr_nir", _NIR_VALID[0]),
    (nir_spaced(_NIR_VALID[1]), "fr_nir", nir_spaced(_NIR_VALID[1])),
    (f"NIR {_NIR_VALID[2][:13]} {_NIR_VALID[2][13:]}", "fr_nir", f"{_NIR_VALID[2][:13]} {_NIR_VALID[2][13:]}"),
    (f"carte vitale: {_NIR_VALID[3]}", "fr_nir", _NIR_VALID[3]),
    (nir_spaced(_NIR_VALID[4]), "fr_nir", nir_spaced(_NIR_VALID[4])),
    (f"n° sécu {_NIR_CORSICA[0]}", "fr_nir", _NIR_CORSICA[0]),
    (nir_spaced(_NIR_CORSICA[1]), "fr_nir", nir_spaced(_NIR_CORSICA[1])),
    (_NIR_OVERSEAS_TEXT, "fr_nir", _NIR_OVERSEAS_TEXT),
    (f"sécurité sociale : {nir('7850578006084')}", "fr_nir", nir("7850578006084")),
    # es_dni
    ("12345678Z", "es_dni", "12345678Z"),
    ("12345678-Z", "es_dni", "12345678-Z"),
    ("12.345.678-Z", "es_dni", "12.345.678-Z"),
    (f"00000023{dni_letter(23)}", "es_dni", f"00000023{dni_letter(23)}"),
    (f"DNI 87654321 {dni_letter(87654321)}", "es_dni", f"87654321 {dni_letter(87654321)}"),
    # es_nie
    ("X1234567L", "es_nie", "X1234567L"),
    (nie("Y", "7654321"), "es_nie", nie("Y", "7654321")),
    (nie("Z", "0000001"), "es_nie", nie("Z", "0000001")),
    ("X-1234567-L", "es_nie", "X-1234567-L"),
    # it_codice_fiscale
    *[(c, "it_codice_fiscale", c) for c in _CF_VALID],
    (f"codice fiscale {_CF_VALID[1].lower()}", "it_codice_fiscale", _CF_VALID[1].lower()),
    # nl_bsn (always with a keyword)
    *[(f"BSN: {b}", "nl_bsn", b) for b in _BSN_VALID],
    (f"burgerservicenummer {_BSN_VALID[1][:4]}.{_BSN_VALID[1][4:6]}.{_BSN_VALID[1][6:]}", "nl_bsn", "1234.56.782"),
    ("123 456 782 (BSN)", "nl_bsn", "123 456 782"),
    ("bsn=123456782", "nl_bsn", "123456782"),
    # de_steuer_id (always with a keyword)
    *[(f"Steuer-ID: {s}", "de_steuer_id", s) for s in _STEUER_VALID],
    (f"IdNr. {_STEUER_VALID[0][:2]} {_STEUER_VALID[0][2:5]} {_STEUER_VALID[0][5:8]} {_STEUER_VALID[0][8:]}",
     "de_steuer_id", "86 095 742 719"),
    (f"Steueridentifikationsnummer {_STEUER_VALID[1]}", "de_steuer_id", _STEUER_VALID[1]),
    # in_aadhaar: 4-4-4 canonical; bare or hyphenated with a keyword
    *[(spaced4(a), "in_aadhaar", spaced4(a)) for a in _AADHAAR_VALID],
    (f"Aadhaar: {_AADHAAR_VALID[0]}", "in_aadhaar", _AADHAAR_VALID[0]),
    (f"aadhar no {_AADHAAR_VALID[1][:4]}-{_AADHAAR_VALID[1][4:8]}-{_AADHAAR_VALID[1][8:]}",
     "in_aadhaar", f"{_AADHAAR_VALID[1][:4]}-{_AADHAAR_VALID[1][4:8]}-{_AADHAAR_VALID[1][8:]}"),
]

@pytest.mark.parametrize(("text", "kind", "expected"), POSITIVES, ids=[p[0] for p in POSITIVES])
def test_positive(text: str, kind: str, expected: str) -> None:
    matches = find_national_ids(text)
    assert [(m.kind, m.text) for m in matches] == [(kind, expected)]
    m = matches[0]
    assert text.encode()[m.start : m.end].decode() == m.text


PROSE = [
    ("Ünïcödé 🙂 — my SSN is 123-45-6789, thanks", "us_ssn", "123-45-6789"),
    ("आधार संख्या: " + spaced4(_AADHAAR_VALID[2]) + " है", "in_aadhaar", spaced4(_AADHAAR_VALID[2])),
    (
        "N° de sécurité sociale\u00a0: " + nir_spaced(_NIR_VALID[0]).replace(" ", "\u00a0"),
        "fr_nir",
        nir_spaced(_NIR_VALID[0]).replace(" ", "\u00a0"),
    ),
    ("Größe egal — Steuer-ID: " + _STEUER_VALID[0] + ".", "de_steuer_id", _STEUER_VALID[0]),
    ("日本語のテキスト、DNI 12345678Z です", "es_dni", "12345678Z"),
    ("Il codice fiscale è «RSSMRA85T10A562S».", "it_codice_fiscale", "RSSMRA85T10A562S"),
    ("Μπορείτε να χρησιμοποιήσετε τον AB123456C", "uk_nino", "AB123456C"),
    ("€€€ ppsn 1234567FA", "ie_ppsn", "1234567FA"),
    ("Burgerservicenummer van de aanvrager (Zoë): 111222333", "nl_bsn", "111222333"),
    ("Ciudad: Málaga · NIE X1234567L", "es_nie", "X1234567L"),
]


@pytest.mark.parametrize(("text", "kind", "expected"), PROSE, ids=[f"prose-{i}" for i in range(len(PROSE))])
def test_positive_in_prose_byte_offsets(text: str, kind: str, expected: str) -> None:
    matches = find_national_ids(text)
    assert [(m.kind, m.text) for m in matches] == [(kind, expected)]
    m = matches[0]
    data = text.encode()
    assert data[m.start : m.end].decode() == m.text
    assert len(data) > len(text)  # multi-byte text really is in play
    cs, ce = m.char_span(text)
    assert text[cs:ce] == m.text


def test_several_ids_sorted_and_non_overlapping() -> None:
    text = (
        "Ünïcode ✓ SSN 123-45-6789; NINO AB123456C; DNI 12345678Z; "
        f"Aadhaar {spaced4(_AADHAAR_VALID[0])}; BSN {_BSN_VALID[0]}; CF RSSMRA85T10A562S."
    )
    matches = find_national_ids(text)
    assert [m.kind for m in matches] == [
        "us_ssn", "uk_nino", "es_dni", "in_aadhaar", "nl_bsn", "it_codice_fiscale",
    ]
    starts = [m.start for m in matches]
    assert starts == sorted(starts)
    for a, b in itertools.pairwise(matches):
        assert a.end <= b.start
    data = text.encode()
    for m in matches:
        assert data[m.start : m.end].decode() == m.text


# --------------------------------------------------------------------------- checksum negatives

CHECKSUM_NEGATIVES = [
    # us_ssn rules (no checksum exists)
    "000-12-3456", "666-12-3456", "900-12-3456", "987-65-4321", "123-00-4567", "123-45-0000",
    "SSN 000123456", "SSN 123004567",
    # uk_nino prefix and suffix rules
    "QQ123456C", "DA123456A", "FA123456A", "IA123456A", "UA123456A", "VA123456A", "AO123456A",
    "BG123456A", "GB123456A", "NK123456A", "KN123456A", "TN123456A", "NT123456A", "ZZ123456A",
    "AB123456E", "Ab123456C",
    # ie_ppsn wrong check letter / second letter
    "1234567A", "1234567FB", "1234567TA", "1234567TZ",
    # fr_nir wrong key, bad month / department / commune
    *["NIR " + v[:13] + f"{(int(v[13:]) % 97) + 1:02d}" for v in _NIR_VALID],
    nir_spaced(_NIR_VALID[1][:13] + f"{(int(_NIR_VALID[1][13:]) % 97) + 1:02d}"),
    "NIR " + nir("1851578006084"),  # month 15
    "NIR " + nir("1850500006084"),  # department 00
    "NIR " + nir("1850578000084"),  # commune 000
    "NIR " + _NIR_CORSICA[0][:13] + f"{(int(_NIR_CORSICA[0][13:]) % 97) + 1:02d}",
    # es_dni / es_nie wrong letter
    "12345678A", "12.345.678-A", "X1234567A", "Y7654321A",
    # it_codice_fiscale wrong check letter, bad month letter, bad day
    "RSSMRA85T10A562T",
    cf("RSSMRA85F10A562"),  # F is not a month letter
    cf("RSSMRA85T35A562"),  # day 35
    cf("RSSMRA85T10N562"),  # place code must start A-M or Z
    # nl_bsn / de_steuer_id / in_aadhaar wrong check digit even with a keyword
    *[f"BSN {wrong_digit(b)}" for b in _BSN_VALID],
    *[f"Steuer-ID {wrong_digit(s)}" for s in _STEUER_VALID],
    "Steuer-ID " + wrong_digit(steuer("1123456789")),
    "Steuer-ID " + steuer("1112345678"),  # digit 1 three times in a row
    "Steuer-ID " + steuer("1122345678"),  # two digits repeated
    "Steuer-ID " + steuer("0123456789"),  # leading zero
    *[spaced4(wrong_digit(a)) for a in _AADHAAR_VALID],
    *[f"Aadhaar {wrong_digit(a)}" for a in _AADHAAR_VALID],
    "Aadhaar " + spaced4(aadhaar("13456789012")),  # first digit 1
]


@pytest.mark.parametrize("text", CHECKSUM_NEGATIVES)
def test_checksum_negative(text: str) -> None:
    assert find_national_ids(text) == []


# --------------------------------------------------------------------------- engineering negatives

# Bare numbers that DO pass a checksum, to prove that the keyword rule and the boundary
# rules, not luck, keep them out.
_BARE_AADHAAR = first_with(lambda d: verhoeff_valid(d), (f"{n}" for n in range(273849561230, 273849561240)))
_HYPHEN_AADHAAR = _AADHAAR_VALID[3]
_YEARS = first_with(
    lambda t: verhoeff_valid(t.replace(" ", "")),
    (f"2019 2020 {y}" for y in range(2000, 2100)),
)
_CARD_PREFIX = spaced4(_AADHAAR_VALID[1]) + " 1234"  # 16-digit card whose first 12 pass Verhoeff
_FEDEX = spaced4(first_with(verhoeff_valid, (f"7749{n:08d}" for n in range(12345670, 12345700))))
_PPSN_K = first_with(lambda d: ppsn_letter(d) == "K", (f"{n}" for n in range(1048576, 1048700))) + "K"
_PPSN_KB = first_with(lambda d: ppsn_letter(d, "B") == "K", (f"{n}" for n in range(2097152, 2097300))) + "KB"
_PPSN_HEX = first_with(lambda d: ppsn_letter(d) in "ABCDEF", (f"{n}" for n in range(4821937, 4822000)))
_PPSN_HEX = _PPSN_HEX + ppsn_letter(_PPSN_HEX)
_DNI_K = first_with(lambda n: dni_letter(n) == "K", range(16303412, 16303500))
_NIR_IN_ID = nir("1000412345678")  # a 15-digit numeric id that happens to be NIR-valid
_STEUER_BARE = _STEUER_VALID[2]

ENGINEERING_NEGATIVES = [
    # UUIDs
    "123e4567-e89b-12d3-a456-426614174000",
    "550e8400-e29b-41d4-a716-446655440000",
    "request_id=9f1c2b7e-3d4a-4c8e-9b2f-123456789012",
    "00000000-0000-0000-0000-" + _BARE_AADHAAR,
    # hashes
    "da39a3ee5e6b4b0d3255bfef95601890afd80709",
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "commit a1b2c3d",
    "git show 9fceb02",
    f"short hash {_PPSN_HEX.lower()}",
    f"CRC32 {_PPSN_HEX}",
    "0x" + _PPSN_HEX,
    "md5 5d41402abc4b2a76b9719d911017c592",
    # versions
    "1.12.3",
    "v10.4.1-rc.2",
    "release 2024.11.130",
    "version " + "1234.56.782",
    "pip install foo==123.456.782",
    # IPs and ports
    "192.168.100.123",
    "10.0.0.1:8080",
    "2001:0db8:85a3:0000:0000:8a2e:0370:7334",
    "fe80::1ff:fe23:4567:890a",
    "localhost:5432",
    "listening on 0.0.0.0:50051",
    # phone numbers
    "+1 415 555 0132",
    "(020) 7946 0958",
    "+33 1 23 45 67 89",
    "0871 234 5678",
    "+1 (415) 555-0132",
    "+44 20 7946 0958",
    "+91 98765 43210",
    "+91 " + spaced4(_AADHAAR_VALID[0]),
    "tel. +49 " + _STEUER_BARE,
    "(020) 123-45-6789",
    # timestamps and epochs
    "2024-11-30T12:34:56Z",
    "2024-11-30T12:34:56.789+05:30",
    "20241130T123456Z",
    "1732963200",
    "1732963200123",
    "ts=1732963200",
    # order / invoice / ticket numbers
    "ORD-2024-000123",
    "INV-558812",
    "PO#44721",
    "#123456789",
    "ORD-123456789",
    "Order 123-45-6789",
    "invoice 1234567T",
    "ticket #AB123456C",
    # card-like digits
    "4111 1111 1111 1111",
    "5500-0000-0000-0004",
    "378282246310005",
    "4111111111111111",
    _CARD_PREFIX,
    "card " + spaced4(_AADHAAR_VALID[2]),
    # tracking numbers
    "1Z999AA10123456784",
    "9400 1000 0000 0000 0000 00",
    f"FedEx tracking {_FEDEX}",
    # Kubernetes, docker, base64, cloud ids
    "payments-api-7c9d8f6b5-x7k2q",
    "pod/web-123456789-abcde",
    "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "nginx@sha256:0d17b565c37bcbd895e9d92315a05c1c3c9a29f762b011a10c54a66cd53c9b31",
    "dGhpcyBpcyBhIHRlc3Q=",
    "QUJDREVGR0hJSktMTU5PUA==",
    "123456789012",
    "arn:aws:iam::123456789012:role/admin",
    # bare numbers without a keyword, several passing a checksum on purpose
    "123456782",
    "111222333",
    _STEUER_BARE,
    _STEUER_VALID[3],
    _BARE_AADHAAR,
    f"{_HYPHEN_AADHAAR[:4]}-{_HYPHEN_AADHAAR[4:8]}-{_HYPHEN_AADHAAR[8:]}",
    "123 456 782",
    f"{_STEUER_BARE[:2]} {_STEUER_BARE[2:5]} {_STEUER_BARE[5:8]} {_STEUER_BARE[8:]}",
    "123 45 6789",
    "212457890",
    # sizes, decimals, grouped numbers
    f"RSS grew to {_PPSN_K}",
    f"heap {_PPSN_KB}",
    f"MemTotal: {_DNI_K}K",
    "123456782.5",
    "12,345,678,901",
    "1 234 567 890 123",
    f"user id {_NIR_IN_ID}",
    _NIR_VALID[0],  # a valid NIR written as 15 bare digits needs a keyword
    _YEARS,
    # identifiers inside URLs, paths, e-mails, files, key=value
    "https://example.com/users/123-45-6789/profile",
    "123-45-6789@example.com",
    "file_123456782.log",
    "/var/data/" + _STEUER_BARE + ".json",
    "id=123456782",
    "build-123-45-6789",
    # IBAN, ISBN, IMEI, snowflakes
    "GB29 NWBK 6016 1331 9268 19",
    "DE89 3704 0044 0532 0130 00",
    "ISBN 978-3-16-148410-0",
    "IMEI 352099001761481",
    "1234567890123456789",
]


@pytest.mark.parametrize("text", ENGINEERING_NEGATIVES)
def test_engineering_negative(text: str) -> None:
    assert find_national_ids(text) == []


def test_constructed_negatives_really_pass_their_checksums() -> None:
    """Guard against a negative that is only negative because its check digit is wrong."""
    assert verhoeff_valid(_BARE_AADHAAR) and verhoeff_valid(_HYPHEN_AADHAAR)
    assert verhoeff_valid(_FEDEX.replace(" ", "")) and verhoeff_valid(_YEARS.replace(" ", ""))
    assert verhoeff_valid(_CARD_PREFIX.replace(" ", "")[:12])
    assert bsn_ok("123456782") and bsn_ok("111222333")
    assert steuer(_STEUER_BARE[:10]) == _STEUER_BARE
    assert ppsn_letter(_PPSN_K[:7]) == "K" and ppsn_letter(_PPSN_KB[:7], "B") == "K"
    assert ppsn_letter(_PPSN_HEX[:7]) == _PPSN_HEX[7]
    assert dni_letter(_DNI_K) == "K"
    assert kinds(f"NIR {_NIR_IN_ID}") == [("fr_nir", _NIR_IN_ID)]
    assert nir(_NIR_IN_ID[:13]) == _NIR_IN_ID
    # ...and that the same strings match once the context says what they are.
    assert kinds("BSN 123456782") == [("nl_bsn", "123456782")]
    assert kinds(f"Steuer-ID {_STEUER_BARE}") == [("de_steuer_id", _STEUER_BARE)]
    assert kinds(f"Aadhaar {_BARE_AADHAAR}") == [("in_aadhaar", _BARE_AADHAAR)]
    assert kinds(f"PPSN {_PPSN_K}") == [("ie_ppsn", _PPSN_K)]
    assert kinds(f"DNI {_DNI_K}K") == [("es_dni", f"{_DNI_K}K")]
    assert kinds(f"Aadhaar {_FEDEX}") == [("in_aadhaar", _FEDEX)]


# --------------------------------------------------------------------------- context rules


@pytest.mark.parametrize(
    "text",
    [
        "BSN (9 digits): 123456782",  # a digit between keyword and number
        "BSN " + "x" * 40 + " 123456782",  # too far
        "ssn.123456789",  # '.' joins tokens
        "SSNs were migrated on 2024-01-01; row 123456789",  # digits between
        "obsnx 123456782",  # keyword must be a whole word
        "bsn123456782",  # glued to the keyword: one token
    ],
)
def test_keyword_rule_negatives(text: str) -> None:
    assert find_national_ids(text) == []


def test_keyword_confirms_nearest_only() -> None:
    assert kinds("BSN: 111222333, 123456782") == [("nl_bsn", "111222333")]


def test_keyword_beats_veto() -> None:
    assert kinds("Order form, SSN 123-45-6789") == [("us_ssn", "123-45-6789")]
    assert kinds("Order 123-45-6789") == []


def test_veto_needs_no_digits_between() -> None:
    assert kinds("Phone 415-555-0132 and 123-45-6789") == [("us_ssn", "123-45-6789")]


def test_colon_adjacent_needs_keyword() -> None:
    assert kinds("SSN:123-45-6789") == [("us_ssn", "123-45-6789")]
    assert kinds("ref:123-45-6789") == []


def test_sentence_punctuation_is_a_boundary() -> None:
    assert kinds("It is 123-45-6789. Next") == [("us_ssn", "123-45-6789")]
    assert kinds("It is 123-45-6789.5") == []


# --------------------------------------------------------------------------- API


def test_match_is_frozen_and_char_span() -> None:
    text = "🙂 AB123456C"
    (m,) = find_national_ids(text)
    assert isinstance(m, NatIdMatch)
    assert (m.start, m.end) == (5, 14)
    assert m.char_span(text) == (2, 11)
    with pytest.raises(AttributeError):
        m.start = 0  # type: ignore[misc]


def test_redact_default_and_custom_placeholder() -> None:
    text = "Ünï 🙂 SSN 123-45-6789 and CF RSSMRA85T10A562S end"
    matches = find_national_ids(text)
    assert redact(text, matches) == "Ünï 🙂 SSN [NATID] and CF [NATID] end"
    assert (
        redact(text, matches, placeholder_for=lambda k: f"<{k}>")
        == "Ünï 🙂 SSN <us_ssn> and CF <it_codice_fiscale> end"
    )
    assert redact(text, []) == text


def test_redact_rejects_bad_spans() -> None:
    text = "é 123-45-6789"
    with pytest.raises(ValueError):
        redact(text, [NatIdMatch("us_ssn", 1, 5, "x")])  # splits 'é'
    with pytest.raises(ValueError):
        redact(text, [NatIdMatch("us_ssn", 3, 8, "x"), NatIdMatch("us_ssn", 5, 9, "y")])
    with pytest.raises(ValueError):
        redact(text, [NatIdMatch("us_ssn", 3, 99, "x")])


def test_empty_and_plain_text() -> None:
    assert find_national_ids("") == []
    assert find_national_ids("nothing to see here, just words and 42") == []
