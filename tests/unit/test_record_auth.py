"""The log's record authenticators (streams/record_auth.py): what verifies, what is refused and why
(a genuine record on another partition than its key's included), and how a keyring is made,
rotated, retired and followed by running signers and verifiers."""

from __future__ import annotations

import datetime as dt
import json
import os
import threading

import pytest

from context_engine.config import Settings
from streams import record_auth
from streams.record_auth import (
    BAD_MAC,
    HEADER,
    MALFORMED,
    MISSING,
    UNKNOWN_KEY,
    WRONG_PARTITION,
    Keyring,
    KeyringError,
    RecordSigner,
    RecordVerifier,
    partition_for,
)
from streams.topics import LogTopics

TOPIC, KEY, VALUE = "ce.events", b"session/acme/s1", b'{"event_id": "e1", "payload": {}}'
PARTITIONS = {**LogTopics("ce", 4, 3).partitions, "other.events": 4}


def home(key: bytes | None, topic: str = TOPIC) -> int:
    """The partition a trusted producer's record with this key is on."""
    return partition_for(key, PARTITIONS.get(topic, 4)) if key is not None else 0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def verifier_of(keyring: Keyring) -> RecordVerifier:
    return RecordVerifier(keyring, PARTITIONS)


@pytest.fixture
def keyring_path(tmp_path):
    return tmp_path / "home" / "keys" / "log-hmac.keyring"


@pytest.fixture
def pair(keyring_path):
    keyring = Keyring(keyring_path)
    return RecordSigner(keyring), verifier_of(keyring)


def header_value(signer: RecordSigner, topic=TOPIC, key=KEY, value=VALUE) -> bytes:
    (name, value_), = signer.headers(topic, key, value)
    assert name == HEADER
    return value_


def test_a_signed_record_verifies(pair):
    signer, verifier = pair
    assert verifier.check(TOPIC, home(KEY), KEY, VALUE, signer.headers(TOPIC, KEY, VALUE)) is None
    assert verifier.check(TOPIC, home(b""), b"", VALUE, signer.headers(TOPIC, b"", VALUE)) is None
    assert verifier.check(TOPIC, home(KEY), KEY, b"", signer.headers(TOPIC, KEY, b"")) is None
    # other headers beside it are ignored (a client library may add its own)
    assert verifier.check(TOPIC, home(KEY), KEY, VALUE, [("trace", b"x"), *signer.headers(TOPIC, KEY, VALUE)]) is None
    job = "ce.embedding"  # job topics have their own count
    assert verifier.check(job, home(b"acme", job), b"acme", VALUE, signer.headers(job, b"acme", VALUE)) is None


def _other_key_with_the_same_id(signer, tmp_path):
    """A forger who read a genuine record's key id and signs with a secret of their own."""
    forged_path = tmp_path / "forger.keyring"
    genuine = signer.keyring.signing
    forged_path.write_text(json.dumps({"format": record_auth.KEYRING_FORMAT, "keys": [{
        "id": genuine.key_id, "secret": os.urandom(32).hex(), "created_at": genuine.created_at.isoformat(),
        "signing_from": genuine.signing_from.isoformat()}]}))
    return RecordSigner(Keyring(forged_path, create=False))


REFUSED = [
    # (case, how the record is made from a signer -> (topic, key, value, headers), reason)
    ("no header", lambda s, _t: (TOPIC, KEY, VALUE, []), MISSING),
    ("headers None", lambda s, _t: (TOPIC, KEY, VALUE, None), MISSING),
    ("header under another name", lambda s, _t: (TOPIC, KEY, VALUE, [("ce-auth2", header_value(s))]), MISSING),
    ("two headers", lambda s, _t: (TOPIC, KEY, VALUE, s.headers(TOPIC, KEY, VALUE) * 2), MALFORMED),
    ("header not bytes", lambda s, _t: (TOPIC, KEY, VALUE, [(HEADER, header_value(s).decode())]), MALFORMED),
    ("no value (tombstone)", lambda s, _t: (TOPIC, KEY, None, s.headers(TOPIC, KEY, b"")), MALFORMED),
    ("empty header", lambda s, _t: (TOPIC, KEY, VALUE, [(HEADER, b"")]), MALFORMED),
    ("other scheme", lambda s, _t: (TOPIC, KEY, VALUE, [(HEADER, b"v2" + header_value(s)[2:])]), MALFORMED),
    ("a fourth part", lambda s, _t: (TOPIC, KEY, VALUE, [(HEADER, header_value(s) + b".x")]), MALFORMED),
    ("key id with a bad character", lambda s, _t: (TOPIC, KEY, VALUE, [(HEADER, b"v1.k\xff1.AAAA")]), MALFORMED),
    ("key id too long", lambda s, _t: (TOPIC, KEY, VALUE, [(HEADER, b"v1." + b"k" * 65 + b".AAAA")]), MALFORMED),
    ("unknown key id", lambda s, _t: (TOPIC, KEY, VALUE, [(HEADER, b"v1.nobody." + header_value(s).split(b".")[2])]),
     UNKNOWN_KEY),
    ("wrong secret, right key id", lambda s, t: (TOPIC, KEY, VALUE, _other_key_with_the_same_id(s, t).headers(
        TOPIC, KEY, VALUE)), BAD_MAC),
    ("value altered", lambda s, _t: (TOPIC, KEY, VALUE + b" ", s.headers(TOPIC, KEY, VALUE)), BAD_MAC),
    ("value truncated", lambda s, _t: (TOPIC, KEY, VALUE[:-1], s.headers(TOPIC, KEY, VALUE)), BAD_MAC),
    ("key altered", lambda s, _t: (TOPIC, b"session/other/s1", VALUE, s.headers(TOPIC, KEY, VALUE)), BAD_MAC),
    ("key dropped", lambda s, _t: (TOPIC, None, VALUE, s.headers(TOPIC, KEY, VALUE)), BAD_MAC),
    ("no key vs empty key", lambda s, _t: (TOPIC, b"", VALUE, s.headers(TOPIC, None, VALUE)), BAD_MAC),
    ("moved to a job stream", lambda s, _t: ("ce.embedding", KEY, VALUE, s.headers(TOPIC, KEY, VALUE)), BAD_MAC),
    ("moved between job streams", lambda s, _t: ("ce.reindex", KEY, VALUE, s.headers("ce.pii", KEY, VALUE)), BAD_MAC),
    ("moved to another deployment", lambda s, _t: ("other.events", KEY, VALUE, s.headers(TOPIC, KEY, VALUE)), BAD_MAC),
    ("mac truncated", lambda s, _t: (TOPIC, KEY, VALUE, [(HEADER, header_value(s)[:-1])]), BAD_MAC),
    ("mac padded", lambda s, _t: (TOPIC, KEY, VALUE, [(HEADER, header_value(s) + b"=")]), BAD_MAC),
    ("mac empty", lambda s, _t: (TOPIC, KEY, VALUE, [(HEADER, b".".join(header_value(s).split(b".")[:2]) + b".")]),
     BAD_MAC),
    # key-id / topic boundary: the id ends where the topic begins only by the NUL in between
    ("key id and topic shifted", lambda s, _t: (TOPIC[1:], KEY, VALUE, s.headers(TOPIC, KEY, VALUE)), BAD_MAC),
]


@pytest.mark.parametrize("case, make, reason", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused(pair, tmp_path, case, make, reason):
    signer, verifier = pair
    topic, key, value, headers = make(signer, tmp_path)
    refusal = verifier.check(topic, home(key, topic), key, value, headers)  # each on its key's partition
    assert refusal is not None and refusal.reason == reason, case
    if reason in (BAD_MAC, UNKNOWN_KEY, WRONG_PARTITION):
        assert refusal.key_id  # logged by key id
    else:
        assert refusal.key_id is None  # nothing a malformed header says is repeated


def test_the_partition_is_the_one_kafkas_default_partitioner_gives_the_key():
    """What every trusted producer uses: aiokafka's default partitioner (Faust's producer takes the
    same class), the Java client's murmur2."""
    from aiokafka.partitioner import DefaultPartitioner, murmur2
    from aiokafka.producer.producer import _DEFAULT_PARTITIONER
    from faust.transport.drivers import aiokafka as faust_aiokafka

    assert murmur2(b"21") == -973932308 & 0xFFFFFFFF  # Kafka's own Utils.murmur2 test vector
    assert isinstance(_DEFAULT_PARTITIONER, DefaultPartitioner)
    assert faust_aiokafka.DefaultPartitioner is DefaultPartitioner
    keys = [KEY, b"", b"acme", *(f"session/org-{i}/s{i}".encode() for i in range(200))]
    for n in (1, 3, 4, 7):
        assert [partition_for(k, n) for k in keys] == [_DEFAULT_PARTITIONER(k, list(range(n)), []) for k in keys]
    assert len({partition_for(k, 4) for k in keys}) == 4  # the keys above do land on every partition


JOB_KEY = next(k for k in (f"org-{i}".encode() for i in range(100)) if partition_for(k, 4) != partition_for(k, 3))
MOVED = [
    # (case, topic, key the record is signed with, partition it is found on)
    *((f"copied to partition {p}", TOPIC, KEY, p) for p in range(4) if p != home(KEY)),
    ("beyond the topic's partitions", TOPIC, KEY, home(KEY) + 4),
    ("a negative partition", TOPIC, KEY, home(KEY) - 4),
    ("a job copied to another partition", "ce.pii", b"acme", (home(b"acme", "ce.pii") + 1) % 3),
    # where the key would go with the events topic's 4 partitions, on a job topic of 3
    ("a job placed by another partition count", "ce.pii", JOB_KEY, partition_for(JOB_KEY, 4)),
    *((f"no key, on partition {p}", TOPIC, None, p) for p in range(4)),
    ("a topic of no known count", "ce.unknown", KEY, 0),
]


@pytest.mark.parametrize("case, topic, key, partition", MOVED, ids=[c[0] for c in MOVED])
def test_a_genuine_record_off_its_keys_partition_is_refused(pair, case, topic, key, partition):
    """Headers, key and value unchanged: the MAC verifies, the place does not. A record without a
    key has no partition of its own (the default partitioner scatters it), so it is refused
    anywhere: no trusted producer writes one."""
    signer, verifier = pair
    headers = signer.headers(topic, key, VALUE)
    refusal = verifier.check(topic, partition, key, VALUE, headers)
    assert refusal == (WRONG_PARTITION, signer.keyring.signing.key_id), case
    if key is not None and topic in PARTITIONS:  # the same record where it belongs verifies
        assert verifier.check(topic, home(key, topic), key, VALUE, headers) is None


def test_a_forgery_is_refused_for_its_authenticator_wherever_it_is(pair):
    """The partition is looked at only once the MAC verified: a forgery's reason stays what it is."""
    signer, verifier = pair
    for p in range(4):
        assert verifier.check(TOPIC, p, KEY, VALUE, []).reason == MISSING
        assert verifier.check(TOPIC, p, KEY, VALUE + b"x", signer.headers(TOPIC, KEY, VALUE)).reason == BAD_MAC


def test_the_broker_count_of_a_topic_is_taken_unless_configured_otherwise(keyring_path):
    """replay's read_log tells the verifier each topic's count on the broker: taken for a topic it
    was not given, an error for one configured with another count (a repartitioned topic)."""
    keyring = Keyring(keyring_path)
    signer = RecordSigner(keyring)
    headers = signer.headers("ad-hoc", KEY, VALUE)
    verifier = RecordVerifier(keyring)
    assert verifier.check("ad-hoc", partition_for(KEY, 2), KEY, VALUE, headers).reason == WRONG_PARTITION
    verifier.expect_partitions("ad-hoc", 2)
    assert verifier.check("ad-hoc", partition_for(KEY, 2), KEY, VALUE, headers) is None
    configured = verifier_of(keyring)
    configured.expect_partitions(TOPIC, 4)  # as configured: nothing changes
    assert configured.check(TOPIC, home(KEY), KEY, VALUE, signer.headers(TOPIC, KEY, VALUE)) is None
    with pytest.raises(ValueError, match="has 8 partitions on the broker, 4 configured"):
        configured.expect_partitions(TOPIC, 8)


def test_the_keyring_is_made_once_private_and_shared_by_processes_starting_together(keyring_path):
    keyrings: list[Keyring] = []
    threads = [threading.Thread(target=lambda: keyrings.append(Keyring(keyring_path))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({tuple(k.key_ids) for k in keyrings}) == 1
    assert os.stat(keyring_path).st_mode & 0o777 == 0o600
    assert os.stat(keyring_path.parent).st_mode & 0o777 == 0o700
    assert [p.name for p in keyring_path.parent.iterdir() if p.name.endswith(".tmp")] == []
    signer = RecordSigner(keyrings[0])
    assert all(verifier_of(k).check(TOPIC, home(KEY), KEY, VALUE, signer.headers(TOPIC, KEY, VALUE)) is None
               for k in keyrings)


def test_a_configured_keyring_is_never_made(tmp_path):
    """On a host the keyring was not copied to, a fresh key would sign what no other host accepts."""
    settings = Settings(home=tmp_path / "home", log_keyring_file=tmp_path / "elsewhere" / "log.keyring")
    with pytest.raises(KeyringError, match="no log keyring"):
        Keyring.from_settings(settings)
    assert not settings.log_keyring_path.exists()
    made = Keyring.from_settings(Settings(home=tmp_path / "home"))  # the default one is made
    assert made.path == tmp_path / "home" / "keys" / "log-hmac.keyring" and made.path.exists()


def test_secrets_stay_out_of_reprs_and_errors(keyring_path):
    keyring = Keyring(keyring_path)
    secret = keyring.signing.secret.hex()
    assert secret not in repr(keyring.signing)
    keyring_path.write_text(keyring_path.read_text().replace('"format"', '"formt"'))
    with pytest.raises(KeyringError) as err:
        Keyring(keyring_path)
    assert secret not in str(err.value)


def test_rotation_old_and_new_keys_verify_and_a_running_verifier_learns_the_new_key(pair, keyring_path):
    old_signer, verifier = pair
    old_id = old_signer.keyring.signing.key_id
    new = record_auth.rotate(keyring_path)
    new_signer = RecordSigner(Keyring(keyring_path))  # a producer started after the rotation
    assert new_signer.keyring.signing.key_id == new.key_id != old_id
    assert header_value(new_signer).split(b".")[1] == new.key_id.encode()
    # the verifier was built before the rotation and was not refreshed: an unknown id makes it look
    assert verifier.check(TOPIC, home(KEY), KEY, VALUE, new_signer.headers(TOPIC, KEY, VALUE)) is None
    assert verifier.check(TOPIC, home(KEY), KEY, VALUE, old_signer.headers(TOPIC, KEY, VALUE)) is None


def test_an_unknown_key_id_makes_the_verifier_look_at_most_twice_a_second(keyring_path):
    """An unknown key id makes the verifier look at the keyring file once per
    UNKNOWN_KEY_RECHECK_S, however many records carry one: a key rotated in meanwhile is
    unknown until the next look, and known from it on."""
    clock = Clock()
    signer, verifier = RecordSigner(Keyring(keyring_path)), verifier_of(Keyring(keyring_path, clock=clock))
    forged = [(HEADER, b"v1.random-id." + header_value(signer).split(b".")[2])]
    for _ in range(100):
        assert verifier.check(TOPIC, home(KEY), KEY, VALUE, forged).reason == UNKNOWN_KEY
    record_auth.rotate(keyring_path)
    new_headers = RecordSigner(Keyring(keyring_path)).headers(TOPIC, KEY, VALUE)
    clock.now += record_auth.UNKNOWN_KEY_RECHECK_S / 2
    assert verifier.check(TOPIC, home(KEY), KEY, VALUE, new_headers).reason == UNKNOWN_KEY  # not looked again
    clock.now += record_auth.UNKNOWN_KEY_RECHECK_S / 2
    assert verifier.check(TOPIC, home(KEY), KEY, VALUE, new_headers) is None


def test_a_running_signer_follows_the_keyring_within_a_second(keyring_path):
    clock = Clock()
    signer, verifier = RecordSigner(Keyring(keyring_path, clock=clock)), verifier_of(Keyring(keyring_path))
    old_id = signer.keyring.signing.key_id
    signer.headers(TOPIC, KEY, VALUE)
    new = record_auth.rotate(keyring_path)
    assert header_value(signer).split(b".")[1] == old_id.encode()  # looked less than a second ago
    clock.now += record_auth.SIGNER_RECHECK_S
    assert header_value(signer).split(b".")[1] == new.key_id.encode()
    assert verifier.check(TOPIC, home(KEY), KEY, VALUE, signer.headers(TOPIC, KEY, VALUE)) is None


def test_a_key_activated_later_signs_only_from_its_time(keyring_path):
    keys = record_auth.ensure_keyring(keyring_path)
    later = record_auth.rotate(keyring_path, activate_in=600)
    keys = record_auth.read_keys(keyring_path)
    now = dt.datetime.now(dt.UTC)
    assert record_auth.signing_key(keys, now).key_id != later.key_id
    assert record_auth.signing_key(keys, now + dt.timedelta(seconds=601)).key_id == later.key_id
    # ... but verifies at once, so a host that has the new file early refuses nothing
    assert verifier_of(Keyring(keyring_path)).keyring.mac(later.key_id) is not None


def test_retire(pair, keyring_path):
    old_signer, verifier = pair
    old_id = old_signer.keyring.signing.key_id
    with pytest.raises(KeyringError, match="signing now"):
        record_auth.retire(keyring_path, old_id)  # the only key, and the one signing
    with pytest.raises(KeyringError, match="no key"):
        record_auth.retire(keyring_path, "nobody")
    record_auth.rotate(keyring_path)
    slept = []
    waited = record_auth.retire(keyring_path, old_id, sleep=slept.append)
    assert slept == [waited] and 0 < waited <= record_auth.RETIRE_SETTLE_S  # producers get time to switch
    stale = old_signer.headers(TOPIC, KEY, VALUE)  # this signer looked at the file before the retirement
    assert stale[0][1].split(b".")[1] == old_id.encode()
    verifier.refresh()  # the worker's next batch
    assert verifier.check(TOPIC, home(KEY), KEY, VALUE, stale).reason == UNKNOWN_KEY
    assert old_id not in record_auth.read_keys(keyring_path)[0].key_id
    # a key still to come can be withdrawn without waiting
    pending = record_auth.rotate(keyring_path, activate_in=600)
    assert record_auth.retire(keyring_path, pending.key_id, sleep=slept.append) == 0.0


def test_a_running_process_keeps_its_keys_when_the_file_breaks_or_goes(pair, keyring_path):
    signer, verifier = pair
    headers = signer.headers(TOPIC, KEY, VALUE)
    keyring_path.write_text("{ half written")
    verifier.refresh()
    assert verifier.check(TOPIC, home(KEY), KEY, VALUE, headers) is None
    keyring_path.unlink()
    verifier.refresh()
    assert verifier.check(TOPIC, home(KEY), KEY, VALUE, headers) is None


def _keyring(*keys: dict) -> dict:
    return {"format": record_auth.KEYRING_FORMAT, "keys": list(keys)}


def _key(key_id="k1", secret="00" * 32, at="2026-01-01T00:00:00+00:00") -> dict:
    return {"id": key_id, "secret": secret, "created_at": at, "signing_from": at}


@pytest.mark.parametrize("doc", [
    {"format": "something else", "keys": [_key()]},
    _keyring(),
    _keyring(_key("a.b")),
    _keyring(_key(secret="00" * 8)),
    _keyring(_key(at="2026-01-01T00:00:00")),
    _keyring(_key(), _key()),
    _keyring({"id": "k", "secret": "zz"}),
], ids=["format", "no keys", "bad id", "short secret", "naive time", "one id twice", "fields missing"])
def test_a_keyring_that_does_not_parse_is_refused_at_start(keyring_path, doc):
    keyring_path.parent.mkdir(parents=True)
    keyring_path.write_text(json.dumps(doc))
    with pytest.raises(KeyringError):
        Keyring(keyring_path)
