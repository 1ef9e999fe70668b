"""Every identifier validator (context_engine/validation.py) over the same table of awkward
values, and Scope.parse, which uses the identifier rule for each of its four ids."""

from __future__ import annotations

import pytest

from context_engine import validation
from context_engine.errors import InvalidArgument
from context_engine.scope import ID_PATTERN, Scope

UUID = "3f2b8c1e-9a4d-4e6f-8b2a-1c5d7e9f0a3b"
SHA = "a" * 64

# Values every check must refuse, whatever else it accepts (empty only where a value is required).
HOSTILE = {
    "trailing LF": "\n",
    "trailing CR": "\r",
    "trailing CRLF": "\r\n",
    "NUL": "\x00",
    "tab": "\t",
    "DEL": "\x7f",
    "NEL U+0085": "\u0085",
    "C1 U+009B": "\u009b",
    "LINE SEPARATOR U+2028": "\u2028",
    "PARAGRAPH SEPARATOR U+2029": "\u2029",
}


def refused(check, value: str, field: str) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as err:
        check(value, field)
    assert err.value.field == field
    assert err.value.metadata["field"] == field
    assert err.value.message.startswith(f"{field}: ")
    return err.value


# -- identifiers: scope ids, session_id, agent_id -----------------------------------------------

ID_CHECKS = {
    "identifier": validation.identifier,
    "session_id": validation.session_id,
    "agent_id": validation.agent_id,
}

ID_CASES = [
    ("a", True),
    ("A9", True),
    ("s-1.2_3:x@y", True),
    ("a" * 128, True),
    ("a" * 129, False),
    ("", False),
    ("-leading-dash", False),
    ("_platform", False),
    (".dot", False),
    ("has space", False),
    ("slash/inside", False),
    ("café", False),          # non-ASCII letters: ids are ASCII
    ("ｓｅｓｓｉｏｎ", False),   # fullwidth letters
    ("Ꮪ", False),
    ("\u212a", False),   # KELVIN SIGN: [A-Za-z] must not match it
    ("١٢٣", False),           # Arabic-Indic digits
]


@pytest.mark.parametrize("check", ID_CHECKS.values(), ids=ID_CHECKS.keys())
@pytest.mark.parametrize("value, ok", ID_CASES)
def test_identifier_table(check, value, ok):
    if ok:
        assert check(value, "f") == value
        assert validation.is_identifier(value)
    else:
        refused(check, value, "f")
        assert not validation.is_identifier(value)


@pytest.mark.parametrize("check", ID_CHECKS.values(), ids=ID_CHECKS.keys())
@pytest.mark.parametrize("where", ["suffix", "prefix", "middle", "alone"])
@pytest.mark.parametrize("bad", HOSTILE.values(), ids=HOSTILE.keys())
def test_identifier_refuses_control_and_separator_characters(check, where, bad):
    value = {"suffix": "abc" + bad, "prefix": bad + "abc", "middle": "ab" + bad + "c", "alone": bad}[where]
    refused(check, value, "session_id")


def test_identifier_errors_say_the_rule_and_the_field():
    assert "is required" in refused(validation.session_id, "", "session_id").message
    assert "[A-Za-z0-9._:@-]" in refused(validation.session_id, "abc\n", "session_id").message
    assert validation.session_id.__defaults__ == ("session_id",)  # callers pass only the value
    with pytest.raises(InvalidArgument) as err:
        validation.session_id("abc\n")
    assert err.value.field == "session_id"


def test_id_pattern_is_safe_with_match_too():
    """`scope.ID_PATTERN` stays importable; `.match` on it can no longer accept "abc\\n"."""
    assert ID_PATTERN.match("abc")
    assert ID_PATTERN.match("abc\n") is None
    assert ID_PATTERN.fullmatch("abc\n") is None


# -- Scope.parse ----------------------------------------------------------------------------------

@pytest.mark.parametrize("level", ["org_id", "pillar_id", "team_id", "agent_id"])
@pytest.mark.parametrize("bad", [*HOSTILE.values(), "a" * 129, "café", "x y"],
                         ids=[*HOSTILE.keys(), "129 chars", "non-ASCII", "space"])
def test_scope_parse_refuses_each_level(level, bad):
    ids = {"org_id": "acme", "pillar_id": "sales", "team_id": "emea", "agent_id": "bot"}
    ids[level] = bad if len(bad) > 128 else "x" + bad
    with pytest.raises(InvalidArgument) as err:
        Scope.parse(**ids, field="token")
    assert err.value.field == f"token.{level}"


def test_scope_parse_accepts_the_longest_ids():
    longest = "a" * 128
    assert Scope.parse(longest, longest, longest, longest).path == "/".join([longest] * 4)


# -- names: snapshot_name ---------------------------------------------------------------------------

NAME_CASES = [
    ("v1", True),
    ("before the refactor", True),        # spaces inside
    ("Ünïcödé naïve café", True),         # non-ASCII letters are fine in names
    ("日本語のスナップショット", True),
    ("نسخه\u200cی دوم", True),              # ZWNJ (Persian)
    ("👨\u200d👩\u200d👧", True),           # ZWJ emoji sequence
    ("\u00a0nbsp", True),                 # NO-BREAK SPACE is a space (Zs)
    ("n" * 128, True),
    ("€" * 128, True),                    # the limit counts characters, not bytes
    ("n" * 129, False),
    ("", False),
    ("a\u200bb", False),                  # ZERO WIDTH SPACE (Cf)
    ("abc\u202e", False),                 # RIGHT-TO-LEFT OVERRIDE (Cf)
    ("\ufeffbom", False),                 # BOM (Cf)
    ("soft\u00adhyphen", False),          # SOFT HYPHEN (Cf)
    ("\ud800", False),                    # a lone surrogate (Cs)
]


@pytest.mark.parametrize("value, ok", NAME_CASES)
def test_name_table(value, ok):
    if ok:
        assert validation.name(value, "snapshot_name") == value
    else:
        refused(validation.name, value, "snapshot_name")


@pytest.mark.parametrize("where", ["suffix", "prefix", "middle", "alone"])
@pytest.mark.parametrize("bad", HOSTILE.values(), ids=HOSTILE.keys())
def test_name_refuses_control_and_separator_characters(where, bad):
    value = {"suffix": "snap" + bad, "prefix": bad + "snap", "middle": "sn" + bad + "ap", "alone": bad}[where]
    err = refused(validation.name, value, "snapshot_name")
    assert f"U+{ord(bad[0]):04X}" in err.message  # the first refused character, by code point


# -- labels: optional free text (Search.domain, model_id) -------------------------------------------

@pytest.mark.parametrize("value, ok", [
    ("", True),
    ("billing", True),
    ("Fakturierung/Österreich", True),
    ("d" * 128, True),
    ("d" * 129, False),
    *[("x" + bad, False) for bad in HOSTILE.values()],
])
def test_label_table(value, ok):
    if ok:
        assert validation.label(value, "domain") == value
    else:
        refused(validation.label, value, "domain")


# -- version hashes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value, ok", [
    (SHA, True),
    ("0123456789abcdef" * 4, True),
    ("", False),
    ("a" * 63, False),
    ("a" * 65, False),
    ("A" * 64, False),                    # lowercase only
    ("g" * 64, False),
    (SHA + "\n", False),                  # `$` would have let this through
    (SHA + "\r", False),
    (SHA + "\x00", False),
    (SHA + "\u2028", False),
    ("\n" + SHA, False),
    (" " + SHA, False),
    ("٠" * 64, False),                    # Arabic-Indic zero: not hex
])
def test_version_hash_table(value, ok):
    if ok:
        assert validation.version_hash(value, "target_version_hash") == value
    else:
        refused(validation.version_hash, value, "target_version_hash")


# -- UUIDs: chunk ids, event ids in hints ---------------------------------------------------------

@pytest.mark.parametrize("value, ok", [
    (UUID, True),
    (UUID.upper(), True),
    ("", False),
    (UUID + "\n", False),
    (UUID[:-1] + "\n", False),            # uuid.UUID would take this one (int() strips whitespace)
    (UUID + "\u2028", False),
    (UUID + "\x00", False),
    ("{" + UUID + "}", False),
    ("urn:uuid:" + UUID, False),
    (UUID.replace("-", ""), False),
    (" " + UUID, False),
    (UUID + "0", False),
    ("not-a-uuid", False),
])
def test_uuid_text_table(value, ok):
    if ok:
        assert validation.uuid_text(value, "hints.pinned_chunk_ids", "chunk id") == value
    else:
        err = refused(lambda v, f: validation.uuid_text(v, f, "chunk id"), value, "hints.pinned_chunk_ids")
        assert "chunk id" in err.message


# -- the idempotency-key header ------------------------------------------------------------------

@pytest.mark.parametrize("value, ok", [
    ("", True),                           # no key
    ("k", True),
    ("3f2b8c1e-9a4d-4e6f-8b2a-1c5d7e9f0a3b", True),
    ("base64+/=~!", True),
    ("k" * 128, True),
    ("k" * 129, False),
    ("has space", False),
    ("café", False),
    *[("k" + bad, False) for bad in HOSTILE.values()],
])
def test_idempotency_key_table(value, ok):
    if ok:
        assert validation.idempotency_key(value) == value
    else:
        refused(validation.idempotency_key, value, "idempotency-key")


def test_too_long_idempotency_key_says_the_limit():
    assert "128" in refused(validation.idempotency_key, "k" * 129, "idempotency-key").message
