"""Which keys may sign guardrail layers: the trust set (docs/guardrails.md, "Trusted keys").

`guardrail_trusted_keys` (CONTEXT_ENGINE_GUARDRAIL_TRUSTED_KEYS, a JSON list) names them. Each
entry is either

- a fingerprint: 64 hex digits, the SHA-256 of the raw public key (`guardrail key` prints it), or
- the path of a PEM file holding an Ed25519 public key (SubjectPublicKeyInfo). A private key is
  refused: the processes that verify (the API, the worker) never read one.

Empty, the default: the public half of the home's operator key, `<home>/keys/guardrail-ed25519.pub`
(`up` and `guardrail key` write it beside the private `guardrail-ed25519.pem`), and nothing else.
For a home made before that file existed, the first process that needs it (`up`, the API at its
start, the worker at its first layer) derives it from the .pem once; after that only the .pub is
read. A configured list replaces the default.

The set is what the projection accepts layers from (a layer signed by any other key is refused,
REJECTED_UNTRUSTED_KEY, and writes nothing) and what the queries serve layers of (a layer whose key
stops being trusted stops being served). Every process reads it from its own settings and keeps,
per file, only the stat it read at and the fingerprint it gave: the files are stat'ed at most once
a second (`CHECK_INTERVAL_S`) and read again only when (device, inode, mtime_ns, size) changed, so
a key file that appears, changes or goes away counts within a second. A call between two checks
costs a clock read.

A file that is missing trusts nothing (logged). A file that cannot be read (EACCES, EMFILE...) or
parsed keeps the key it gave last, with a warning (at most one a minute per file); when it never
gave one, there is no trust set: `GuardrailTrustUnavailable`, which the API answers UNAVAILABLE
(GUARDRAIL_TRUST_UNAVAILABLE) rather than assemble a prompt without its layers, and which is an
infrastructure failure to the projector (the batch is tried again; no layer is refused for it).
"""

from __future__ import annotations

import math
import os
import pathlib
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from context_engine.config import Settings
from context_engine.errors import Unavailable
from context_engine.guardrails.signing import KEY_FILE_NAME, PUBLIC_KEY_FILE_NAME, derive_public_key, fingerprint

log = structlog.get_logger("context_engine.guardrails")

TRUST_UNAVAILABLE = "GUARDRAIL_TRUST_UNAVAILABLE"
CHECK_INTERVAL_S = 1.0   # the files are stat'ed at most this often
WARN_INTERVAL_S = 60.0   # a file that keeps failing is warned about at most this often
_FINGERPRINT = re.compile(r"[0-9a-fA-F]{64}")
_MAX_KEY_FILE_BYTES = 64 * 1024  # a PEM public key is about a hundred bytes
_ABSENT = "absent"
Stat = tuple[int, int, int, int]  # st_dev, st_ino, st_mtime_ns, st_size


class GuardrailTrustUnavailable(Unavailable, OSError):
    """There is no trust set: a key file it names could not be read or parsed, and never was.
    A DomainError (UNAVAILABLE, reason GUARDRAIL_TRUST_UNAVAILABLE) for a caller, and an OSError
    for the projector, whose `is_infrastructure_failure` then tries the batch again."""

    reason = TRUST_UNAVAILABLE

    def __init__(self, message: str, *, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = list(problems)  # for the operator's commands and the log, not for callers


@dataclass
class _File:
    path: pathlib.Path
    derive_from: pathlib.Path | None = None  # the private key to derive a missing .pub from, once
    seen: Stat | str | None = None           # the stat of the last conclusive look (_ABSENT); None: none yet
    fingerprint: str | None = None           # what that look gave (None: the file is absent)
    problem: str | None = None               # why the last look failed, if it did
    warned_at: float = -math.inf


class KeyFiles:
    """Key files as the trust set sees them: a stat (or _ABSENT), the key a public-key file
    holds, and a public half derived from a private key. A test gives one that counts or fails."""

    def stat(self, path: pathlib.Path) -> Stat | str:
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return _ABSENT
        return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size

    def fingerprint(self, path: pathlib.Path) -> str:
        return public_key_fingerprint(path)

    def derive(self, private: pathlib.Path) -> bool:
        return derive_public_key(private)


LOCAL_FILES = KeyFiles()


class TrustSet:
    """The trust set of one list of entries. Thread-safe; see the module docstring."""

    def __init__(self, entries: Sequence[str], *, derive_from: pathlib.Path | None = None,
                 clock: Callable[[], float] = time.monotonic, interval: float = CHECK_INTERVAL_S,
                 files: KeyFiles = LOCAL_FILES) -> None:
        self.entries = tuple(entries)
        self._pinned = frozenset(e.lower() for e in self.entries if _FINGERPRINT.fullmatch(e))
        self._files = [_File(pathlib.Path(e).expanduser(), derive_from)
                       for e in self.entries if not _FINGERPRINT.fullmatch(e)]
        self._clock, self._interval, self._key_files = clock, interval, files
        self._lock = threading.Lock()
        self._current: frozenset[str] | None = None  # None: no good set yet
        self._next_check = -math.inf
        self._unannounced = False  # the first set is logged only when asked (not by a command)

    def fingerprints(self, *, recheck: bool = False, announce: bool = False) -> frozenset[str]:
        """The trusted fingerprints; the files are looked at when a second has passed since the
        last look (`recheck`: now). GuardrailTrustUnavailable when there never was a good set.
        A change of the set is logged; the first set too when `announce` (a service's)."""
        if recheck or self._clock() >= self._next_check:
            with self._lock:
                now = self._clock()
                if recheck or now >= self._next_check:
                    self._refresh(now)
        current = self._current
        if announce and self._unannounced and current is not None:
            self._unannounced = False
            log.info("guardrail trust set", fingerprints=sorted(current), entries=list(self.entries))
        if current is None:
            raise GuardrailTrustUnavailable(  # no path in what a caller is told: the problems are logged
                "the guardrail trust set cannot be read; retry shortly",
                problems=[f"{f.path}: {f.problem}" for f in self._files if f.problem])
        return current

    def _refresh(self, now: float) -> None:
        for f in self._files:
            self._look(f, now)
        self._next_check = now + self._interval
        if any(f.seen is None for f in self._files):
            return  # a file never gave a conclusive answer: still no set
        trusted = self._pinned | {f.fingerprint for f in self._files if f.fingerprint}
        if trusted != self._current:
            if self._current is None:
                self._unannounced = True
            else:
                log.info("guardrail trust set", fingerprints=sorted(trusted), entries=list(self.entries))
            self._current = frozenset(trusted)
            if not trusted:
                log.warning("no trusted guardrail key: every layer is refused and none is served",
                            entries=list(self.entries),
                            hint="run `context-engine guardrail key` (or `up`), "
                                 "or set CONTEXT_ENGINE_GUARDRAIL_TRUSTED_KEYS")

    def _look(self, f: _File, now: float) -> None:
        try:
            sig: Stat | str = self._key_files.stat(f.path)
            if sig == _ABSENT and f.derive_from is not None:
                if self._key_files.derive(f.derive_from):  # an earlier release's home: the .pem only
                    log.info("guardrail public key derived from the operator key", path=str(f.path))
                    sig = self._key_files.stat(f.path)
                f.derive_from = None  # done (or there is no key at all): the .pem is not read again
            if sig == f.seen and f.problem is None:
                return
            found = None if sig == _ABSENT else self._key_files.fingerprint(f.path)
        except (OSError, ValueError) as exc:
            self._failed(f, now, str(exc) if isinstance(exc, ValueError) else f"cannot read: {exc.strerror or exc}")
            return
        if found is None and f.seen != _ABSENT:
            log.warning("guardrail trust entry gives no key", entry=str(f.path), problem="does not exist")
        if f.problem is not None:
            log.info("guardrail trust entry readable again", entry=str(f.path))
        # The stat taken before the read: a change after it is seen at the next look. A file
        # written in the last RACY_NS may be written again within the same mtime tick and the
        # same size (a PEM public key always has 113 bytes), which its stat would not show: it is
        # read again at the next look, as git treats racily clean files.
        racy = isinstance(sig, tuple) and time.time_ns() - sig[2] < RACY_NS
        f.seen, f.fingerprint, f.problem = ((*sig, "racy") if racy else sig), found, None

    def _failed(self, f: _File, now: float, problem: str) -> None:
        repeated = problem == f.problem and now - f.warned_at < WARN_INTERVAL_S
        f.problem = problem
        if repeated:
            return
        f.warned_at = now
        if f.seen is not None:
            log.warning("guardrail trust entry unreadable; keeping the key it gave last", entry=str(f.path),
                        problem=problem, kept=f.fingerprint)
        else:
            log.error("guardrail trust entry unreadable; no trust set until it is read (guardrail calls "
                      "answer UNAVAILABLE, guardrail layers wait)", entry=str(f.path), problem=problem)


RACY_NS = 2_000_000_000  # coarse file systems tick their mtimes in seconds


def trust_entries(settings: Settings) -> tuple[str, ...]:
    """The configured entries, or the home's operator public key when none are configured."""
    entries = tuple(e.strip() for e in settings.guardrail_trusted_keys if e.strip())
    return entries or (str(settings.home_dir / "keys" / PUBLIC_KEY_FILE_NAME),)


class TrustSets:
    """A process's trust sets, one per list of entries, each made with `clock` and `files`."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, files: KeyFiles = LOCAL_FILES) -> None:
        self._clock, self._files = clock, files
        self._sets: dict[tuple[tuple[str, ...], pathlib.Path | None], TrustSet] = {}
        self._lock = threading.Lock()

    def of(self, settings: Settings) -> TrustSet:
        configured = any(e.strip() for e in settings.guardrail_trusted_keys)
        derive_from = None if configured else settings.home_dir / "keys" / KEY_FILE_NAME
        key = (trust_entries(settings), derive_from)
        with self._lock:
            found = self._sets.get(key)
            if found is None:
                found = self._sets[key] = TrustSet(key[0], derive_from=derive_from, clock=self._clock,
                                                   files=self._files)
            return found


_process_sets = TrustSets()


def use_trust_sets(sets: TrustSets) -> TrustSets:
    """Make `sets` this process's trust sets (a test starts as a new process would, with no set
    read yet); returns the ones it replaces."""
    global _process_sets
    previous, _process_sets = _process_sets, sets
    return previous


def trust_set(settings: Settings) -> TrustSet:
    """This process's TrustSet for `settings` (one per list of entries)."""
    return _process_sets.of(settings)


def trusted_fingerprints(settings: Settings, *, recheck: bool = False, announce: bool = False) -> frozenset[str]:
    """The fingerprints of the keys `settings` trusts (see the module docstring; `recheck`: look
    at the files now, `announce`: log the first set). GuardrailTrustUnavailable."""
    return trust_set(settings).fingerprints(recheck=recheck, announce=announce)


def configured_trusted_fingerprints(*, recheck: bool = False) -> frozenset[str]:
    """The trust set of this process's settings (its environment): what the projector uses when
    it is given none. `context-engine` commands export their options to the environment, so the
    worker and replay read the same settings as the command that started them. A change of the
    set is logged, so the worker's log says which keys it accepted layers from."""
    return trusted_fingerprints(Settings(), recheck=recheck, announce=True)


class GuardrailTrustMisconfigured(RuntimeError):
    """At a service's start, a trust entry cannot be read or is no Ed25519 public key."""


def load_trust(settings: Settings) -> None:
    """Read the trust set now, at a service's start (the API, the worker), deriving the home's
    public key file if it is missing, so that no call pays for it. An entry that cannot be read
    or is no public key stops the start (GuardrailTrustMisconfigured, naming it): a service that
    started anyway would answer every guardrail call UNAVAILABLE, and its worker would hold its
    events partition, until someone read the log. Once a good set was read, a file that turns
    unreadable keeps the key it gave (TrustSet)."""
    try:
        trusted_fingerprints(settings, recheck=True, announce=True)
    except GuardrailTrustUnavailable as exc:
        raise GuardrailTrustMisconfigured(
            "the guardrail trust set cannot be read: " + "; ".join(exc.problems)
            + " (CONTEXT_ENGINE_GUARDRAIL_TRUSTED_KEYS takes fingerprints and public-key PEM files)") from exc


def public_key_fingerprint(path: pathlib.Path) -> str:
    """The fingerprint of the Ed25519 public key in a PEM file. OSError (unreadable), ValueError
    (not an Ed25519 public key; a private key is refused without being parsed)."""
    with open(path, "rb") as f:
        data = f.read(_MAX_KEY_FILE_BYTES + 1)
    if len(data) > _MAX_KEY_FILE_BYTES:
        raise ValueError(f"{path} is over {_MAX_KEY_FILE_BYTES} bytes: not a PEM public key")
    if b"PRIVATE KEY" in data:
        raise ValueError(f"{path} holds a private key: trust its public half (the .pub that "
                         "`context-engine guardrail key` writes beside it) or its fingerprint")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path} is not a PEM Ed25519 public key") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path} does not hold an Ed25519 key")
    return fingerprint(key)
