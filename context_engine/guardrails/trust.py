"""Which keys may sign guardrail layers: the trust set (docs/guardrails.md, "Trusted keys").

`guardrail_trusted_keys` (CONTEXT_ENGINE_GUARDRAIL_TRUSTED_KEYS, a JSON list) names them. Each
entry is either

- a fingerprint: 64 hex digits, the SHA-256 of the raw public key (`guardrail key` prints it), or
- the path of a PEM file holding an Ed25519 public key (SubjectPublicKeyInfo) or private key
  (PKCS#8; only its public half is used).

Empty, the default: the home's operator key `<home>/keys/guardrail-ed25519.pem` (the one `up` and
`guardrail key` generate), and nothing else. A configured list replaces that default.

The set is what the projection accepts layers from (a layer signed by any other key is refused,
REJECTED_UNTRUSTED_KEY, and writes nothing) and what the queries serve layers of (a layer whose key
stops being trusted stops being served at once). Every process reads it from its own settings; a
named file is read again on every use (a small read; parsed again only when its bytes changed),
so a key file that appears, changes or goes away counts from the next use on. A file that cannot be read as an Ed25519 key trusts nothing and
is logged; a set that ends up empty is logged too: then no layer is accepted or served.
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Sequence

import structlog
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from context_engine.config import Settings
from context_engine.guardrails.signing import KEY_FILE_NAME, fingerprint

log = structlog.get_logger("context_engine.guardrails")

_FINGERPRINT = re.compile(r"[0-9a-fA-F]{64}")
_MAX_KEY_FILE_BYTES = 64 * 1024  # a PEM key is a few hundred bytes
Stamp = bytes | None  # a key file's contents (a few hundred bytes); None: unreadable

# (entries, home) -> (stamps of the files, the fingerprints they gave)
_cache: dict[tuple[tuple[str, ...], pathlib.Path], tuple[tuple[Stamp, ...], frozenset[str]]] = {}


def trust_entries(settings: Settings) -> tuple[str, ...]:
    """The configured entries, or the home's operator key when none are configured."""
    entries = tuple(e.strip() for e in settings.guardrail_trusted_keys if e.strip())
    return entries or (str(settings.home_dir / "keys" / KEY_FILE_NAME),)


def trusted_fingerprints(settings: Settings) -> frozenset[str]:
    """The fingerprints of the keys `settings` trusts (see the module docstring)."""
    return _resolve(settings)[0]


def configured_trusted_fingerprints() -> frozenset[str]:
    """The trust set of this process's settings (its environment): what the projector uses when
    it is given none. `context-engine` commands export their options to the environment, so the
    worker and replay read the same settings as the command that started them. Logged whenever it
    is read anew, so the worker's log says which keys it accepted layers from."""
    trusted, fresh = _resolve(Settings())
    if fresh and trusted:
        log.info("guardrail trust set", fingerprints=sorted(trusted))
    return trusted


def _resolve(settings: Settings) -> tuple[frozenset[str], bool]:
    """(the trust set, whether it was read anew rather than remembered)."""
    entries = trust_entries(settings)
    files = [pathlib.Path(e).expanduser() for e in entries if not _FINGERPRINT.fullmatch(e)]
    stamps = tuple(_stamp(p) for p in files)
    key = (entries, settings.home_dir)
    hit = _cache.get(key)
    if hit is not None and hit[0] == stamps:
        return hit[1], False
    trusted = _read(entries)
    _cache[key] = (stamps, trusted)
    if not trusted:
        log.warning("no trusted guardrail key: every layer is refused and none is served",
                    entries=list(entries),
                    hint="run `context-engine guardrail key` (or `up`), or set CONTEXT_ENGINE_GUARDRAIL_TRUSTED_KEYS")
    return trusted, True


def public_key_fingerprint(path: pathlib.Path) -> str:
    """The fingerprint of the Ed25519 key in a PEM file (public or private). ValueError."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from exc
    key: object
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path} is not a PEM Ed25519 public or unencrypted private key") from exc
    if not isinstance(key, (Ed25519PublicKey, Ed25519PrivateKey)):
        raise ValueError(f"{path} does not hold an Ed25519 key")
    return fingerprint(key)


def _read(entries: Sequence[str]) -> frozenset[str]:
    trusted = set()
    for entry in entries:
        if _FINGERPRINT.fullmatch(entry):
            trusted.add(entry.lower())
            continue
        path = pathlib.Path(entry).expanduser()
        try:
            trusted.add(public_key_fingerprint(path))
        except ValueError as exc:
            missing = not path.exists()
            (log.warning if missing else log.error)("guardrail trust entry gives no key", entry=entry,
                                                   problem="does not exist" if missing else str(exc))
    return frozenset(trusted)


def _stamp(path: pathlib.Path) -> Stamp:
    try:
        with open(path, "rb") as f:
            return f.read(_MAX_KEY_FILE_BYTES + 1)
    except OSError:
        return None
