"""Input checks shared by every RPC: the one place identifiers are validated. Each failure is
`InvalidArgument` naming the field; handlers run every check before they read or write.

Every pattern matches the whole value (`re.fullmatch`, or `\\A...\\Z`): `^...$` with `re.match`
also accepts a value ending in "\\n", since `$` matches before a trailing newline.

Each check, the fields it guards, and its rule:
- `identifier`: scope ids (org_id, pillar_id, team_id, agent_id), session_id, PullContext.agent_id:
  1-128 ASCII characters of `[A-Za-z0-9._:@-]`, the first a letter or digit.
- `name`: snapshot_name:
  1-128 characters (code points), none of them a control, format or line/paragraph separator character (below).
- `version_hash`: target_version_hash:
  exactly 64 lowercase hex digits (SHA-256).
- `uuid_text`: hints.pinned_chunk_ids, the <id> of hints.must_include `event:<id>`:
  a UUID in its 36-character hyphenated form, hex in either case.
- `idempotency_key`: the `idempotency-key` header (IngestEvent):
  empty (no key), or 1-128 printable ASCII characters without space (U+0021-U+007E).
- `label`: optional free-text filters (Search.domain):
  at most 128 characters, none of them a control, format or separator character.

Characters refused in names and labels, by Unicode general category:
- Cc: C0 controls U+0000-U+001F (tab, "\\n", "\\r", NUL included), DEL U+007F, C1 controls
  U+0080-U+009F (NEL U+0085 included);
- Zl / Zp: LINE SEPARATOR U+2028, PARAGRAPH SEPARATOR U+2029;
- Cf: format characters (bidi overrides and isolates, zero-width space, word joiner, BOM, soft
  hyphen, tag characters), which make two names look alike or text display out of order;
  except ZERO WIDTH NON-JOINER / JOINER (U+200C / U+200D), which Persian and Indic scripts and
  emoji sequences need;
- Cs: surrogates (never valid UTF-8, so a decoded request cannot hold one; refused all the same).
Letters, marks, digits, punctuation, symbols (emoji) and spaces of any script are accepted;
unassigned (Cn) and private-use (Co) code points pass too, so what a name may hold does not
shrink or grow with the server's Unicode version. Names are not normalised (NFC and NFD
spellings are different names).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping

from context_engine.errors import InvalidArgument
from context_engine.hashing import is_sha256_hex

MAX_ID = 128
MAX_NAME = 128
MAX_LABEL = 128
MAX_IDEMPOTENCY_KEY = 128
MAX_METADATA_ENTRIES = 64
MAX_METADATA_KEY = 128
MAX_METADATA_VALUE = 4096
DOMAIN_KEY = "domain"  # metadata["domain"]: the chunks' retrieval domain (projections/projector/chunks.py)

# \A and \Z: safe with .match as well as .fullmatch (scope.ID_PATTERN re-exports it).
ID_PATTERN = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}\Z")
_ID_RULE = f"must be 1-{MAX_ID} characters of [A-Za-z0-9._:@-], starting with a letter or digit"
_UUID_TEXT = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,128}")
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
ALLOWED_FORMAT = frozenset({"\u200c", "\u200d"})  # ZWNJ, ZWJ


def is_identifier(value: str) -> bool:
    return isinstance(value, str) and ID_PATTERN.fullmatch(value) is not None


def identifier(value: str, field: str) -> str:
    """A required identifier (`is_identifier`); `field` names it in the error."""
    if not value:
        raise InvalidArgument(field, "is required")
    if not is_identifier(value):
        raise InvalidArgument(field, _ID_RULE)
    return value


def session_id(value: str, field: str = "session_id") -> str:
    return identifier(value, field)


def agent_id(value: str, field: str = "agent_id") -> str:
    return identifier(value, field)


def refused_character(value: str) -> str | None:
    """The first character names and labels may not hold, as U+XXXX, or None."""
    for ch in value:
        if unicodedata.category(ch) in REFUSED_CATEGORIES and ch not in ALLOWED_FORMAT:
            return f"U+{ord(ch):04X}"
    return None


def name(value: str, field: str) -> str:
    """A required human-readable name: 1-128 characters, none refused (module docstring)."""
    if not value:
        raise InvalidArgument(field, "is required")
    if len(value) > MAX_NAME:
        raise InvalidArgument(field, f"is {len(value)} characters; at most {MAX_NAME}")
    return _without_refused_characters(value, field)


def _without_refused_characters(value: str, field: str) -> str:
    if (bad := refused_character(value)) is not None:
        raise InvalidArgument(field, f"holds {bad}: control, format and line or paragraph separator "
                                     "characters are not allowed")
    return value


def label(value: str, field: str, limit: int = MAX_LABEL) -> str:
    """An optional free-text value: may be empty; at most `limit` characters, none refused."""
    if len(value) > limit:
        raise InvalidArgument(field, f"must be at most {limit} characters")
    return _without_refused_characters(value, field)


def version_hash(value: str, field: str) -> str:
    if not is_sha256_hex(value):
        raise InvalidArgument(field, "must be a lowercase hex SHA-256 (64 characters)")
    return value


def is_uuid_text(value: str) -> bool:
    return isinstance(value, str) and _UUID_TEXT.fullmatch(value) is not None


def is_canonical_uuid(value: str) -> bool:
    """A UUID exactly as `str(uuid.UUID(...))` writes it (hyphenated, lowercase): the form the
    engine gives event ids, so the only one it takes back from a client or from the log."""
    return is_uuid_text(value) and value == value.lower()


def uuid_text(value: str, field: str, what: str = "id") -> str:
    """A UUID in its hyphenated 36-character form. `uuid.UUID` alone is laxer: it accepts braces,
    a "urn:uuid:" prefix, no hyphens, and surrounding whitespace."""
    if not is_uuid_text(value):
        raise InvalidArgument(field, f"{value[:40]!r} is not a {what} (UUID, 8-4-4-4-12 hex digits)")
    return value


def idempotency_key(value: str, field: str = "idempotency-key") -> str:
    """Empty (no key) or 1-128 printable ASCII characters without space."""
    if value and _IDEMPOTENCY_KEY.fullmatch(value) is None:
        if len(value) > MAX_IDEMPOTENCY_KEY:
            raise InvalidArgument(field, f"is longer than {MAX_IDEMPOTENCY_KEY} characters")
        raise InvalidArgument(field, "must be printable ASCII without spaces (U+0021-U+007E)")
    return value


def one_of(value: str, allowed: tuple[str, ...], field: str) -> str:
    if value not in allowed:
        raise InvalidArgument(field, f"must be one of {', '.join(allowed)}; got {value[:40]!r}")
    return value


def content(value: bytes, limit: int, field: str = "content") -> bytes:
    if not value:
        raise InvalidArgument(field, "is empty")
    if len(value) > limit:
        raise InvalidArgument(field, f"is {len(value)} bytes; the limit is {limit}",
                              reason="CONTENT_TOO_LARGE")
    return value


def metadata(value: Mapping[str, str], field: str = "metadata") -> dict[str, str]:
    """At most 64 entries; a key is a name (1-128 characters, none refused); a value at most 4,096
    characters of anything but NUL, which PostgreSQL's text and JSON cannot hold (content, which
    is bytes, may hold NUL); `domain`'s value a label (at most 128 characters, none refused): it
    is a key of the retrieval statistics, which an index row bounds."""
    if len(value) > MAX_METADATA_ENTRIES:
        raise InvalidArgument(field, f"has {len(value)} entries; at most {MAX_METADATA_ENTRIES}")
    for key, item in value.items():
        if not key or len(key) > MAX_METADATA_KEY:
            raise InvalidArgument(field, f"keys must be 1-{MAX_METADATA_KEY} characters")
        if (bad := refused_character(key)) is not None:
            raise InvalidArgument(field, f"has a key holding {bad}: control, format and line or paragraph "
                                         "separator characters are not allowed in keys")
        if len(item) > MAX_METADATA_VALUE:
            raise InvalidArgument(f"{field}[{key}]", f"is longer than {MAX_METADATA_VALUE} characters")
        if "\x00" in item:
            raise InvalidArgument(f"{field}[{key}]", "holds U+0000 (NUL), which a metadata value may not")
    if DOMAIN_KEY in value:  # retrieval's domain filter: a label, as Search.domain is
        label(value[DOMAIN_KEY], f"{field}[{DOMAIN_KEY}]")
    return dict(value)
