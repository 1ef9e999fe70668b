"""The guardrail trust set without a database (context_engine/guardrails/trust.py): which keys an
entry names, the stat-based reload (at most one stat a second, a read only when the stat
changed, no file contents kept), the last good set kept when a file cannot be read, no set at all
(UNAVAILABLE, and a batch the projector tries again) when it never could, and a verifier that
never reads the operator's private key."""

from __future__ import annotations

import errno
import os
import pathlib
import sys
from collections.abc import Iterator

import grpc
import pytest
import structlog
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from commands.publish_guardrail import PublishGuardrail, build_event
from context_engine.config import Settings
from context_engine.errors import DomainError
from context_engine.guardrails import trust
from context_engine.guardrails.signing import (
    ensure_signing_key,
    fingerprint,
    layer_scope,
    operator_key_path,
    public_key_path,
    public_key_pem,
)
from context_engine.guardrails.trust import (
    TRUST_UNAVAILABLE,
    GuardrailTrustUnavailable,
    TrustSet,
    configured_trusted_fingerprints,
    load_trust,
    public_key_fingerprint,
    trusted_fingerprints,
)
from entrypoints.serving.status import status_code_for
from projections.projector.guardrail_layers import REJECTED_UNTRUSTED_KEY, refuse_layers
from projections.projector.rejections import is_infrastructure_failure


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    """Each test starts as a new process would: no trust set read yet."""
    previous = trust.use_trust_sets(trust.TrustSets())
    yield
    trust.use_trust_sets(previous)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Counting(trust.KeyFiles):
    """The real key files, counting the stats and the reads the trust set makes; a stat or a read
    fails with `stat_error` / `read_error` while one is set."""

    def __init__(self) -> None:
        self.stats: list[pathlib.Path] = []
        self.reads: list[pathlib.Path] = []
        self.stat_error: OSError | None = None
        self.read_error: OSError | None = None

    def stat(self, path):
        self.stats.append(path)
        if self.stat_error is not None:
            raise self.stat_error
        return super().stat(path)

    def fingerprint(self, path):
        self.reads.append(path)
        if self.read_error is not None:
            raise self.read_error
        return super().fingerprint(path)


EMFILE = OSError(errno.EMFILE, "Too many open files")
EACCES = PermissionError(errno.EACCES, "Permission denied")


_written = iter(range(1, 10**6))


def _public(path: pathlib.Path, key: Ed25519PrivateKey, *, just_now: bool = False) -> str:
    """Write `key`'s public half as a rotation does: beside, then renamed into place. Its mtime is
    set long ago (each write's its own), unless `just_now`: a file written in the last two
    seconds is read again at every look (trust.RACY_NS)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(public_key_pem(key))
    if not just_now:
        long_ago = 10**18 + next(_written) * 10**9
        os.utime(tmp, ns=(long_ago, long_ago))
    os.replace(tmp, path)
    return str(path)


def _private_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


# -- what the entries name ----------------------------------------------------------------------


def test_by_default_the_homes_public_key_file_is_trusted(tmp_path: pathlib.Path) -> None:
    settings = Settings(home=tmp_path)
    assert trust.trust_entries(settings) == (str(tmp_path / "keys" / "guardrail-ed25519.pub"),)
    assert trusted_fingerprints(settings) == frozenset()  # no key yet: nothing is trusted
    key = ensure_signing_key(operator_key_path(tmp_path))  # what `up` and `guardrail key` make
    assert trusted_fingerprints(settings, recheck=True) == {fingerprint(key)}
    os.unlink(operator_key_path(tmp_path))
    other = ensure_signing_key(operator_key_path(tmp_path))  # a new home key replaces the old one
    assert trusted_fingerprints(settings, recheck=True) == {fingerprint(other)}


@pytest.mark.parametrize("entry", ["fingerprint", "FINGERPRINT", "public pem"])
def test_a_configured_entry_names_a_key(tmp_path: pathlib.Path, entry: str) -> None:
    key, home_key = Ed25519PrivateKey.generate(), ensure_signing_key(operator_key_path(tmp_path))
    if entry.lower() == "fingerprint":
        value = fingerprint(key).upper() if entry.isupper() else fingerprint(key)
    else:
        value = _public(tmp_path / "k.pub", key)
    # A configured list replaces the default: the home's key is no longer trusted.
    assert trusted_fingerprints(Settings(home=tmp_path, guardrail_trusted_keys=[value])) == {fingerprint(key)}
    assert fingerprint(home_key) not in trusted_fingerprints(Settings(home=tmp_path, guardrail_trusted_keys=[value]))


def test_a_missing_file_trusts_nothing_and_the_others_count(tmp_path: pathlib.Path) -> None:
    good = Ed25519PrivateKey.generate()
    settings = Settings(home=tmp_path, guardrail_trusted_keys=[str(tmp_path / "absent.pub"), fingerprint(good)])
    assert trusted_fingerprints(settings) == {fingerprint(good)}


@pytest.mark.parametrize("contents", [
    b"", b"not a key", b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", "ec", "private",
], ids=["empty", "text", "broken pem", "an EC key", "a private key"])
def test_a_file_that_never_gave_a_key_leaves_no_trust_set(tmp_path: pathlib.Path, contents) -> None:
    """Not "trust the others": a prompt is not served without the layers that file's key signed."""
    if contents == "ec":
        contents = generate_private_key(SECP256R1()).public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    elif contents == "private":
        contents = _private_pem(Ed25519PrivateKey.generate())
    (tmp_path / "bad.pem").write_bytes(contents)
    settings = Settings(home=tmp_path, guardrail_trusted_keys=[str(tmp_path / "bad.pem"),
                                                              fingerprint(Ed25519PrivateKey.generate())])
    with pytest.raises(GuardrailTrustUnavailable) as raised:
        trusted_fingerprints(settings)
    assert str(tmp_path / "bad.pem") in raised.value.problems[0]
    with pytest.raises(ValueError, match="private key: trust its public half" if contents.startswith(
            b"-----BEGIN PRIVATE") else "not|does not hold"):
        public_key_fingerprint(tmp_path / "bad.pem")


def test_the_configured_set_is_read_from_the_environment(tmp_path: pathlib.Path, monkeypatch) -> None:
    key = Ed25519PrivateKey.generate()
    monkeypatch.setenv("CONTEXT_ENGINE_HOME", str(tmp_path))
    assert configured_trusted_fingerprints() == frozenset()
    monkeypatch.setenv("CONTEXT_ENGINE_GUARDRAIL_TRUSTED_KEYS", f'["{fingerprint(key)}"]')
    assert configured_trusted_fingerprints() == {fingerprint(key)}


# -- reload: a stat a second, a read when it changed ----------------------------------------------


def test_files_are_stated_at_most_once_a_second_and_read_only_when_changed(tmp_path) -> None:
    clock, seen = Clock(), Counting()
    first, second = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    path = tmp_path / "ops.pub"
    ts = TrustSet([_public(path, first)], clock=clock, files=seen)
    assert ts.fingerprints() == {fingerprint(first)}
    assert (len(seen.stats), len(seen.reads)) == (1, 1)
    for _ in range(100):  # calls within the second: not even a stat
        assert ts.fingerprints() == {fingerprint(first)}
    assert (len(seen.stats), len(seen.reads)) == (1, 1)

    clock.now += 1.0  # a second later, unchanged: one stat, no read
    assert ts.fingerprints() == {fingerprint(first)}
    assert (len(seen.stats), len(seen.reads)) == (2, 1)

    _public(path, second)  # rotated: still the old set until the next check...
    assert ts.fingerprints() == {fingerprint(first)}
    clock.now += 1.0  # ...which sees the new inode and reads it
    assert ts.fingerprints() == {fingerprint(second)}
    assert (len(seen.stats), len(seen.reads)) == (3, 2)

    os.utime(path, ns=(1, 1))  # same bytes, another mtime: read again, same set
    clock.now += 1.0
    assert ts.fingerprints() == {fingerprint(second)}
    assert (len(seen.stats), len(seen.reads)) == (4, 3)

    os.unlink(path)  # gone: trusts nothing (a missing file is an answer, not a failure)
    clock.now += 1.0
    assert ts.fingerprints() == frozenset()
    assert (len(seen.stats), len(seen.reads)) == (5, 3)
    # `recheck` (the projector, before it refuses a key for good) looks now.
    _public(path, first)
    assert ts.fingerprints(recheck=True) == {fingerprint(first)}


def test_no_file_contents_are_kept(tmp_path: pathlib.Path) -> None:
    key = Ed25519PrivateKey.generate()
    ts = TrustSet([_public(tmp_path / "ops.pub", key)])
    ts.fingerprints()

    def held(value, depth=0) -> list:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return [value]
        if depth > 3:
            return []
        if isinstance(value, (list, tuple, set, frozenset)):
            return [b for v in value for b in held(v, depth + 1)]
        if hasattr(value, "__dict__"):
            return [b for v in vars(value).values() for b in held(v, depth + 1)]
        return []

    assert held(ts) == []


# -- a failure keeps the last good set -------------------------------------------------------------


def test_an_unreadable_or_broken_file_keeps_the_key_it_gave_last(tmp_path) -> None:
    clock, files = Clock(), Counting()
    key, rotated = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    path = tmp_path / "ops.pub"
    ts = TrustSet([_public(path, key)], clock=clock, files=files)
    assert ts.fingerprints() == {fingerprint(key)}

    with structlog.testing.capture_logs() as logs:
        os.utime(path, ns=(2, 2))  # changed, so it is read again at each check
        files.read_error = EMFILE
        for _ in range(5):  # five checks, a second apart, all failing
            clock.now += 1.0
            assert ts.fingerprints() == {fingerprint(key)}
        files.read_error = None
        path.write_bytes(b"-----BEGIN PUBLIC KEY-----\n")  # a writer half-way: not parsable
        for _ in range(3):
            clock.now += 1.0
            assert ts.fingerprints() == {fingerprint(key)}
        clock.now += 60.0
        assert ts.fingerprints() == {fingerprint(key)}  # still broken a minute on: said again
        files.stat_error = EACCES
        clock.now += 1.0
        assert ts.fingerprints() == {fingerprint(key)}
        files.stat_error = None
        _public(path, rotated)  # fixed
        clock.now += 1.0
        assert ts.fingerprints() == {fingerprint(rotated)}
    warnings = [e for e in logs if e["log_level"] == "warning"]
    # Rate-limited: once per problem, not once per check, and again after a minute.
    broken = f"{path} is not a PEM Ed25519 public key"
    assert [w["problem"] for w in warnings] == [
        "cannot read: Too many open files", broken, broken, "cannot read: Permission denied"]
    assert all(w["kept"] == fingerprint(key) for w in warnings)
    assert any(e["event"] == "guardrail trust entry readable again" for e in logs)
    assert any(e["event"] == "guardrail trust set" and e["fingerprints"] == [fingerprint(rotated)] for e in logs)


def test_a_first_load_that_fails_is_unavailable_until_it_succeeds(tmp_path) -> None:
    clock, key, files = Clock(), Ed25519PrivateKey.generate(), Counting()
    path = tmp_path / "ops.pub"
    ts = TrustSet([_public(path, key), fingerprint(Ed25519PrivateKey.generate())], clock=clock, files=files)
    files.read_error = EACCES
    with pytest.raises(GuardrailTrustUnavailable) as raised:
        ts.fingerprints()
    error = raised.value
    # The API answers it UNAVAILABLE with its reason, naming no path; the projector takes it for
    # an infrastructure failure and tries the batch again rather than refuse a layer for good.
    assert isinstance(error, DomainError) and error.reason == TRUST_UNAVAILABLE == "GUARDRAIL_TRUST_UNAVAILABLE"
    assert status_code_for(error) == grpc.StatusCode.UNAVAILABLE
    assert str(tmp_path) not in error.message and not error.metadata
    assert "Permission denied" in error.problems[0]
    assert is_infrastructure_failure(error)
    files.read_error = None
    with pytest.raises(GuardrailTrustUnavailable):
        ts.fingerprints()  # within the second: not looked at again
    clock.now += 1.0
    assert fingerprint(key) in ts.fingerprints()


class _NoRows:
    """A connection on which no layer was applied yet (what refuse_layers asks)."""

    async def fetch(self, *args):
        return []

    async def fetchrow(self, *args):
        return None


async def test_the_projector_retries_without_a_set_and_looks_again_before_refusing(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CONTEXT_ENGINE_HOME", str(tmp_path))
    key = Ed25519PrivateKey.generate()
    event = build_event(key, PublishGuardrail(2, layer_scope(2, "acme"), "rules\n"), actor="op", now_ms=1, current=None)
    assert configured_trusted_fingerprints() == frozenset()  # no key in the home yet (remembered a second)
    keys = tmp_path / "keys"
    keys.mkdir()
    _public(keys / "guardrail-ed25519.pub", key)  # `guardrail key` just made it
    assert await refuse_layers(_NoRows(), "acme", [event]) == {}  # looked again: accepted
    stranger = build_event(Ed25519PrivateKey.generate(), PublishGuardrail(2, layer_scope(2, "acme"), "x\n"),
                           actor="op", now_ms=2, current=None)
    refused = await refuse_layers(_NoRows(), "acme", [stranger], report=False)
    assert refused[stranger.event_id].outcome == REJECTED_UNTRUSTED_KEY

    monkeypatch.setenv("CONTEXT_ENGINE_GUARDRAIL_TRUSTED_KEYS", f'["{tmp_path / "broken.pub"}"]')
    (tmp_path / "broken.pub").write_bytes(b"garbage")
    with pytest.raises(GuardrailTrustUnavailable) as raised:
        await refuse_layers(_NoRows(), "acme", [event])  # nothing refused: the batch waits
    assert is_infrastructure_failure(raised.value)


# -- the private key stays with the operator -------------------------------------------------------


_opened: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _opened is not None and isinstance(args[0], (str, bytes, os.PathLike)):
        _opened.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # permanent once added; records only while a test sets _opened


@pytest.fixture
def opened() -> list[str]:
    global _opened
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


def test_the_verifier_never_reads_the_private_key(tmp_path: pathlib.Path, opened: list[str], monkeypatch) -> None:
    private = operator_key_path(tmp_path)
    key = ensure_signing_key(private)  # `up`: the .pem and its .pub
    opened.clear()
    settings = Settings(home=tmp_path)
    load_trust(settings)  # the API's start
    assert trusted_fingerprints(settings, recheck=True) == {fingerprint(key)}  # its calls
    monkeypatch.setenv("CONTEXT_ENGINE_HOME", str(tmp_path))
    trust.use_trust_sets(trust.TrustSets())  # another process: the worker
    assert configured_trusted_fingerprints(recheck=True) == {fingerprint(key)}  # the worker's
    assert str(public_key_path(private)) in opened
    assert str(private) not in opened


def test_an_earlier_homes_private_key_is_read_once_to_derive_its_public_half(tmp_path, opened, monkeypatch) -> None:
    private = operator_key_path(tmp_path)
    private.parent.mkdir(mode=0o700)
    key = Ed25519PrivateKey.generate()
    private.write_bytes(_private_pem(key))  # a home of an earlier release: no .pub
    clock = Clock()
    trust.use_trust_sets(trust.TrustSets(clock=clock))
    settings = Settings(home=tmp_path)
    opened.clear()
    load_trust(settings)  # whoever starts first derives it
    assert opened.count(str(private)) == 1
    assert public_key_path(private).read_bytes() == public_key_pem(key)
    assert oct(public_key_path(private).stat().st_mode & 0o777) == "0o644"
    assert trusted_fingerprints(settings) == {fingerprint(key)}
    # From then on only the .pub: not even when it goes away (then nothing is trusted).
    os.unlink(public_key_path(private))
    clock.now += 1.0
    assert trusted_fingerprints(settings) == frozenset()
    trust.use_trust_sets(trust.TrustSets())  # another process, started after: the .pub is there again
    ensure_signing_key(private)
    opened.clear()
    assert trusted_fingerprints(settings) == {fingerprint(key)}
    assert str(private) not in opened


@pytest.mark.parametrize("entry", ["private", "garbage", "directory"])
def test_a_service_does_not_start_on_an_entry_it_cannot_read(tmp_path: pathlib.Path, monkeypatch, entry) -> None:
    """The API and the worker load the set at start: an unreadable or wrong entry (here a private
    key, a file that is no key, a directory) stops the start naming it, instead of a service that
    answers every guardrail call UNAVAILABLE and a worker that holds its partition."""
    path = tmp_path / entry
    if entry == "private":
        path.write_bytes(_private_pem(Ed25519PrivateKey.generate()))
    elif entry == "garbage":
        path.write_bytes(b"not a key")
    else:
        path.mkdir()
    with pytest.raises(trust.GuardrailTrustMisconfigured, match=str(path)):
        load_trust(Settings(home=tmp_path, guardrail_trusted_keys=[str(path)]))


def test_a_file_written_within_its_mtime_tick_is_read_again(tmp_path) -> None:
    """Rewritten in place with the same size inside one mtime tick, a file's stat does not change:
    while its mtime is recent, every look reads it, so the second key is not missed."""
    clock, seen = Clock(), Counting()
    first, second = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    path = tmp_path / "ops.pub"
    path.write_bytes(public_key_pem(first))
    ts = TrustSet([str(path)], clock=clock, files=seen)
    assert ts.fingerprints() == {fingerprint(first)}
    before = os.stat(path)
    path.write_bytes(public_key_pem(second))  # in place: same inode, same size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # ... and the same tick
    clock.now += 1.0
    assert ts.fingerprints() == {fingerprint(second)}
    assert len(seen.reads) == 2
