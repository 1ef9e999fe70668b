"""Which records of the log come from a writer the engine trusts.

Any client of the broker can produce to the engine's topics (the bundled broker authenticates no
one), so a record's bytes prove nothing. Every trusted producer (the API's EventLog, the worker's
own sends, the restore from the archive, the operator's commands) adds one header

    ce-auth: v1.<key id>.<base64url, unpadded, of HMAC-SHA256(key, canonical bytes)>

and every consumer that acts on a record checks it first (`RecordVerifier.check`); a record that
fails is dropped by its consumer, unread.

The canonical bytes bind the record to where it was written:

    "context-engine/log-record/v1" 0x00 ‖ key id ‖ 0x00 ‖ topic ‖ 0x00 ‖ key length (4 bytes,
    big-endian; FF FF FF FF for no key) ‖ key ‖ value

The topic names the stream's role (events, or one job stream) and the deployment (its prefix),
so a record cannot be moved to another stream or another deployment's topics, nor re-keyed. The
partition is not in the MAC: a producer learns it only when the broker answers. It is bound
through the key instead: every trusted producer sends with a key and Kafka's default partitioner,
murmur2(key) & 0x7fffffff % partitions (aiokafka's and Faust's), onto topics whose partition
counts the settings fix (streams/topics.py: never changed once created), so the verifier refuses
a record that is not on the partition its key maps to (`WRONG_PARTITION`), and one without a key,
which maps to none. Without this a genuine record copied to another partition of its topic would
verify, and could be applied ahead of its session's earlier events (one session, one partition,
is what orders them). An authentic record produced again unchanged, to its own partition, still
verifies: every consumer is idempotent on event_id or message_id, so a copy changes nothing.

The keys live in a keyring file (JSON, mode 0600; `Settings.log_keyring_path`), made with one key
on first use. A key signs from its `signing_from` on; the newest key whose time has come signs,
and every key in the file verifies. `rotate` adds a key, `retire` removes one. Running processes
follow the file: a signer looks at it at most once a second, a verifier once per batch it checks
(`refresh`) and, rate-limited, when a record names a key it does not know. A file that is gone
or does not parse leaves a running process with the keys it had. Secrets are never logged: a
`LogKey`'s repr leaves the secret out.
"""

from __future__ import annotations

import base64
import datetime as dt
import hmac
import json
import math
import os
import pathlib
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

import structlog
from aiokafka.partitioner import murmur2

from context_engine import keyfiles
from streams.topics import LogTopics

log = structlog.get_logger("context_engine.record_auth")

HEADER = "ce-auth"
KEYRING_FORMAT = "context-engine/log-keyring/v1"
_SCHEME = b"v1"
_DOMAIN = b"context-engine/log-record/v1\x00"
_NO_KEY = b"\xff\xff\xff\xff"
_KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SECRET_BYTES = 32

# A signer looks at the keyring file at most this often (a rotation reaches it within a second).
SIGNER_RECHECK_S = 1.0
# A verifier that meets an unknown key id looks again at most this often (a forger's random ids
# cost at most this many stat calls a second, and a re-read only when the file changed).
UNKNOWN_KEY_RECHECK_S = 0.5
# A key is retired only this long after a newer key began signing: every running signer has
# switched by then (SIGNER_RECHECK_S), and what the old key signed just before has been sent
# (the producers' request timeout is 5 s).
RETIRE_SETTLE_S = SIGNER_RECHECK_S + 5.0

# Why a record was refused (the worker's metric label). WRONG_PARTITION: a genuine record (its MAC
# verifies) on another partition than its key maps to, or without a key.
MISSING, MALFORMED, UNKNOWN_KEY, BAD_MAC = "missing", "malformed", "unknown_key", "bad_mac"
WRONG_PARTITION = "wrong_partition"
REASONS = (MISSING, MALFORMED, UNKNOWN_KEY, BAD_MAC, WRONG_PARTITION)


class KeyringError(RuntimeError):
    """The keyring is missing, does not parse, or an operation on it is not allowed."""


@dataclass(frozen=True)
class LogKey:
    key_id: str
    secret: bytes = field(repr=False)
    created_at: dt.datetime
    signing_from: dt.datetime


class Refusal(NamedTuple):
    reason: str  # one of REASONS
    key_id: str | None  # the key the record named, when it named a well-formed one


# -- the keyring file ---------------------------------------------------------------------------


def _new_key(now: dt.datetime, activate_in: float = 0.0) -> LogKey:
    key_id = f"{now:%Y%m%d}-{secrets.token_hex(4)}"
    return LogKey(key_id, secrets.token_bytes(_SECRET_BYTES), now, now + dt.timedelta(seconds=activate_in))


def _dump(keys: list[LogKey]) -> bytes:
    return json.dumps({"format": KEYRING_FORMAT, "keys": [
        {"id": k.key_id, "secret": k.secret.hex(), "created_at": k.created_at.isoformat(),
         "signing_from": k.signing_from.isoformat()} for k in keys]}, indent=1).encode() + b"\n"


def _parse(data: bytes, path: pathlib.Path) -> list[LogKey]:
    try:
        doc = json.loads(data)
        if doc.get("format") != KEYRING_FORMAT:
            raise ValueError(f"format is not {KEYRING_FORMAT!r}")
        keys = [LogKey(str(k["id"]), bytes.fromhex(k["secret"]), dt.datetime.fromisoformat(k["created_at"]),
                       dt.datetime.fromisoformat(k["signing_from"])) for k in doc["keys"]]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # never the text: it holds secrets
        raise KeyringError(f"the log keyring {path} does not parse ({type(exc).__name__})") from None
    for k in keys:
        if not _KEY_ID.fullmatch(k.key_id) or len(k.secret) < 16:
            raise KeyringError(f"the log keyring {path} holds a key with a bad id or a secret under 16 bytes")
        if k.created_at.tzinfo is None or k.signing_from.tzinfo is None:
            raise KeyringError(f"the log keyring {path} holds a time without a time zone")
    if not keys or len({k.key_id for k in keys}) != len(keys):
        raise KeyringError(f"the log keyring {path} holds no key, or one id twice")
    return keys


def read_keys(path: pathlib.Path) -> list[LogKey]:
    try:
        return _parse(path.read_bytes(), path)
    except FileNotFoundError:
        raise KeyringError(f"no log keyring at {path}") from None


def ensure_keyring(path: pathlib.Path) -> list[LogKey]:
    """The keyring's keys, making it with one new key (0600) when it does not exist."""
    return _parse(keyfiles.ensure(path, lambda: _dump([_new_key(_now())])), path)


def signing_key(keys: list[LogKey], now: dt.datetime) -> LogKey:
    """The key that signs at `now`: the newest whose signing_from has come (else the oldest)."""
    ready = [k for k in keys if k.signing_from <= now]
    return max(ready, key=lambda k: (k.signing_from, k.created_at)) if ready else min(keys, key=lambda k: k.created_at)


def rotate(path: pathlib.Path, *, activate_in: float = 0.0) -> LogKey:
    """Add a key that signs from `activate_in` seconds on; older keys keep verifying. Makes the
    keyring when there is none."""
    if activate_in < 0:
        raise KeyringError("activate_in must be >= 0")
    with keyfiles.locked(path):
        keys = _parse(path.read_bytes(), path) if path.exists() else []
        key = _new_key(_now(), activate_in)
        while key.key_id in {k.key_id for k in keys}:
            key = _new_key(_now(), activate_in)
        keyfiles.replace(path, _dump([*keys, key]))
    return key


def retire(path: pathlib.Path, key_id: str, *, settle_s: float = RETIRE_SETTLE_S, sleep=time.sleep) -> float:
    """Remove a key: records it signed are refused from then on. Not the key that signs now (rotate
    first). Waits until the key signing now has been signing for `settle_s`; returns how long it waited."""
    with keyfiles.locked(path):
        keys = read_keys(path)
        now = _now()
        current = signing_key(keys, now)
        if key_id not in {k.key_id for k in keys}:
            raise KeyringError(f"no key {key_id!r} in {path}")
        if key_id == current.key_id:
            raise KeyringError(f"{key_id} is the key signing now: rotate first (`context-engine keys rotate-log-key`)")
        waited = 0.0
        if key_id in {k.key_id for k in keys if k.signing_from <= now}:  # an older key, not one still to come
            waited = max(0.0, settle_s - (now - current.signing_from).total_seconds())
            if waited:
                sleep(waited)
        keyfiles.replace(path, _dump([k for k in keys if k.key_id != key_id]))
    return waited


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Keyring:
    """The keys of a keyring file as one process holds them, following the file."""

    def __init__(self, path: pathlib.Path, *, create: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`clock`: the monotonic clock its rechecks, and its verifiers', are timed by."""
        self.path = path
        self.clock = clock
        keys = ensure_keyring(path) if create else read_keys(path)
        self._stamp = self._stat()
        self._checked_at = clock()
        self._install(keys)
        self._warn_if_readable_by_others()

    @classmethod
    def from_settings(cls, settings: Any) -> "Keyring":
        """The deployment's keyring. Only the default one is made when missing: a configured path
        that does not exist is a host the keyring was not copied to, where a fresh key would sign
        records no other host accepts."""
        return cls(settings.log_keyring_path, create=settings.log_keyring_file is None)

    def _install(self, keys: list[LogKey]) -> None:
        self._keys = {k.key_id: k for k in keys}
        self._macs = {k.key_id: hmac.new(k.secret, digestmod="sha256") for k in keys}
        self._signing = signing_key(keys, _now())

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def refresh(self, max_age: float = 0.0) -> bool:
        """Look at the file unless it was looked at less than `max_age` seconds ago; re-read it when
        it changed. Returns whether the keys changed."""
        now = self.clock()
        if now - self._checked_at < max_age:
            return False
        self._checked_at = now
        self._signing = signing_key(list(self._keys.values()), _now())  # a key whose time has come
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return False
        try:
            keys = read_keys(self.path)
        except KeyringError as exc:
            log.warning("log keyring changed and cannot be read; keeping the keys held", error=str(exc))
            return False
        self._stamp = stamp
        self._install(keys)
        log.info("log keyring re-read", keys=sorted(self._keys), signing=self._signing.key_id)
        return True

    def _warn_if_readable_by_others(self) -> None:
        try:
            mode = os.stat(self.path).st_mode
        except OSError:
            return
        if mode & 0o077:
            log.warning("the log keyring is readable or writable by others than its owner; chmod 600 it",
                        path=str(self.path), mode=oct(mode & 0o777))

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._keys)

    @property
    def signing(self) -> LogKey:
        return self._signing

    def mac(self, key_id: str) -> "hmac.HMAC | None":
        return self._macs.get(key_id)


# -- signing and checking -----------------------------------------------------------------------


def _token(mac: "hmac.HMAC", key_id: bytes, topic: str, key: bytes | None, value: bytes) -> bytes:
    h = mac.copy()
    h.update(b"".join((_DOMAIN, key_id, b"\x00", topic.encode(), b"\x00",
                       _NO_KEY if key is None else len(key).to_bytes(4, "big"), key or b"")))
    h.update(value)
    return base64.urlsafe_b64encode(h.digest()).rstrip(b"=")


class RecordSigner:
    """Makes the header of each record a trusted producer writes."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring

    def header(self, topic: str, key: bytes | None, value: bytes) -> tuple[str, bytes]:
        self.keyring.refresh(SIGNER_RECHECK_S)
        signing = self.keyring.signing
        key_id = signing.key_id.encode()
        mac = self.keyring.mac(signing.key_id)
        return HEADER, b".".join((_SCHEME, key_id, _token(mac, key_id, topic, key, value)))  # type: ignore[arg-type]

    def headers(self, topic: str, key: bytes | None, value: bytes) -> list[tuple[str, bytes]]:
        """The headers of the record, as aiokafka and Faust take them."""
        return [self.header(topic, key, value)]


@lru_cache(maxsize=8192)  # murmur2 is pure Python (7 µs for a session key); keys repeat
def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (aiokafka's, and so Faust's) sends a record with
    this key to, on a topic of `partitions` partitions."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class RecordVerifier:
    """Checks the header of each record before its consumer uses it, and that the record is on
    the partition its key maps to. `partitions`: each topic's partition count (the settings',
    `LogTopics.partitions`); a topic missing from it is learnt from the broker by `read_log`
    (`expect_partitions`), and a record of a topic whose count is known neither way is refused."""

    def __init__(self, keyring: Keyring, partitions: Mapping[str, int] | None = None) -> None:
        self.keyring = keyring
        self._partitions = dict(partitions or {})
        self._unknown_checked_at = -math.inf

    def refresh(self) -> None:
        """Once per batch: a rotated or retired key counts from the next batch on."""
        self.keyring.refresh()

    def expect_partitions(self, topic: str, count: int) -> None:
        """`topic` has `count` partitions on the broker. Taken for a topic the verifier was not
        given; for one it was given, another count is an error: the topic was repartitioned (or
        the settings are not the deployment's), so keys no longer say where records belong."""
        configured = self._partitions.setdefault(topic, count)
        if configured != count:
            raise ValueError(f"topic {topic!r} has {count} partitions on the broker, {configured} configured: "
                             "its records cannot be checked against their keys' partitions")

    def check(self, topic: str, partition: int, key: bytes | None, value: bytes | None, headers) -> Refusal | None:
        """None when the record carries a valid authenticator for this topic, key and value and
        is on the partition its key maps to; else why not. One HMAC per record, compared in
        constant time; the partition only for a record whose HMAC verified."""
        token = None
        for name, header_value in headers or ():
            if name == HEADER:
                if token is not None:
                    return Refusal(MALFORMED, None)  # two: which would count?
                token = header_value
        if token is None:
            return Refusal(MISSING, None)
        if not isinstance(token, bytes) or value is None:
            return Refusal(MALFORMED, None)
        parts = token.split(b".")
        if len(parts) != 3 or parts[0] != _SCHEME:
            return Refusal(MALFORMED, None)
        key_id = parts[1].decode("ascii", "replace")
        if not _KEY_ID.fullmatch(key_id):
            return Refusal(MALFORMED, None)
        mac = self.keyring.mac(key_id)
        if mac is None:
            now = self.keyring.clock()
            if now - self._unknown_checked_at >= UNKNOWN_KEY_RECHECK_S:  # rotated since the last look?
                self._unknown_checked_at = now
                self.keyring.refresh()
                mac = self.keyring.mac(key_id)
            if mac is None:
                return Refusal(UNKNOWN_KEY, key_id)
        if not hmac.compare_digest(_token(mac, parts[1], topic, key, value), parts[2]):
            return Refusal(BAD_MAC, key_id)
        count = self._partitions.get(topic)
        if key is None or count is None or partition != partition_for(key, count):
            return Refusal(WRONG_PARTITION, key_id)  # a copy of a genuine record, elsewhere
        return None


def signer_from_settings(settings: Any) -> RecordSigner:
    return RecordSigner(Keyring.from_settings(settings))


def verifier_from_settings(settings: Any) -> RecordVerifier:
    return RecordVerifier(Keyring.from_settings(settings), LogTopics.from_settings(settings).partitions)
