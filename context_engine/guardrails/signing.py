"""Guardrail layers: which scope owns which level, what the operator signs, and how it is checked.

The chain of trust (docs/guardrails.md) has four levels, each owned by one scope:

    L1 platform  the platform itself: events under the reserved org id `_platform`
    L2 org       an org                                   (scope org)
    L3 team      a team of an org                         (scope org/pillar/team)
    L4 agent     an agent of a team                       (scope org/pillar/team/agent)

`_platform` can never be a tenant: `Scope.parse` (hence every token) rejects ids that start with
"_", so no caller can act as, or read as, the platform org. Events are internal, built by the
operator command, so they may carry it.

What is signed (Ed25519, the operator's key) is a domain-separated canonical message binding the
owner scope path, the level, the SHA-256 of the content and the signing time:

    b"context-engine/guardrail-layer/v1\\n" + canonical JSON
        {"content_sha256": <hex>, "level": <1..4>, "scope_path": <path>, "signed_at_ms": <int>}

(sorted keys, no whitespace: `context_engine.events.canonical_bytes`). The store's version number
is not signed: it is assigned by the projection in log order. A signature therefore cannot be
moved to another scope or level, or to other content; that an old signed layer cannot be
re-appended to roll a layer back is the projection's rule (signed_at must increase per
(scope, level)).

The content is text; its hash is the SHA-256 of its UTF-8 bytes, i.e. of the published file as it
is (`sha256sum layer.txt` prints the layer's content_hash).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import pathlib
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from context_engine import keyfiles
from context_engine.errors import InvalidArgument
from context_engine.hashing import canonical_bytes, is_sha256_hex, sha256_hex
from context_engine.scope import Scope

PLATFORM_ORG = "_platform"
LEVELS = (1, 2, 3, 4)
LEVEL_NAMES = {1: "platform", 2: "org", 3: "team", 4: "agent"}
KEY_FILE_NAME = "guardrail-ed25519.pem"
PUBLIC_KEY_FILE_NAME = "guardrail-ed25519.pub"  # its public half, beside it: what is trusted by default
SIGNATURE_DOMAIN = b"context-engine/guardrail-layer/v1\n"
MAX_LAYER_BYTES = 64 * 1024  # a layer is pinned into every prompt; larger is a mistake
SIGNATURE_BYTES = 64
PUBLIC_KEY_BYTES = 32


class LayerFormatError(ValueError):
    """A guardrail.published payload is not well-formed."""


# -- levels and owner scopes ---------------------------------------------------------------


def layer_scope(level: int, org: str = "", pillar: str = "", team: str = "", agent: str = "") -> Scope:
    """The owner scope of a layer at `level`, validated: L1 takes no ids (the platform), L2 an
    org only, L3 org/pillar/team, L4 org/pillar/team/agent. Raises InvalidArgument."""
    if level not in LEVELS:
        raise InvalidArgument("level", f"must be 1..4 (L1 platform, L2 org, L3 team, L4 agent), got {level}")
    given = {"org": org, "pillar": pillar, "team": team, "agent": agent}
    wanted = {1: (), 2: ("org",), 3: ("org", "pillar", "team"), 4: ("org", "pillar", "team", "agent")}[level]
    extra = [name for name, value in given.items() if value and name not in wanted]
    missing = [name for name in wanted if not given[name]]
    shape = {1: "no org/pillar/team/agent (the platform)", 2: "--org only",
             3: "--org, --pillar and --team (no --agent)", 4: "--org, --pillar, --team and --agent"}[level]
    if extra or missing:
        problem = "; ".join(filter(None, [
            f"{', '.join(extra)} must not be given" if extra else "",
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required" if missing else ""]))
        raise InvalidArgument("scope", f"an L{level} ({LEVEL_NAMES[level]}) layer takes {shape}: {problem}")
    if level == 1:
        return Scope(PLATFORM_ORG)
    return Scope.parse(org, pillar, team, agent, field="scope")


def owner_level(scope: Scope) -> int | None:
    """The level a layer owned by `scope` has (None: no level is owned at a pillar)."""
    if scope.org_id == PLATFORM_ORG:
        return 1 if not (scope.pillar_id or scope.team_id or scope.agent_id) else None
    return {"org": 2, "team": 3, "agent": 4}.get(scope.level)


def chain_scopes(caller: Scope) -> list[tuple[int, Scope]]:
    """The owners of a caller's layers, L1 first: the platform, its org, its team (when the
    caller has one), its agent (when it has one)."""
    chain = [(1, Scope(PLATFORM_ORG)), (2, Scope(caller.org_id))]
    if caller.team_id:
        chain.append((3, Scope(caller.org_id, caller.pillar_id, caller.team_id)))
    if caller.agent_id:
        chain.append((4, caller))
    return chain


def guardrail_aggregate(scope_path: str, level: int) -> str:
    """Partition key of a (scope, level): its versions are totally ordered in one partition."""
    return f"guardrail/{scope_path}/L{level}"


# -- keys ------------------------------------------------------------------------------------


def operator_key_path(home: pathlib.Path, configured: pathlib.Path | None = None) -> pathlib.Path:
    """The configured PEM, else `<home>/keys/guardrail-ed25519.pem`."""
    return configured if configured is not None else home / "keys" / KEY_FILE_NAME


def public_key_path(private_path: pathlib.Path) -> pathlib.Path:
    """Where the public half of a private key file is written: beside it, `.pub` for `.pem`
    (`<home>/keys/guardrail-ed25519.pub` for the operator key)."""
    return private_path.with_suffix(".pub")


def load_signing_key(path: pathlib.Path) -> Ed25519PrivateKey:
    """An unencrypted PKCS#8 PEM holding an Ed25519 private key."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the guardrail signing key {path}: {exc}") from exc
    return _private_key(path, data)


def _private_key(path: pathlib.Path, data: bytes) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"cannot read the guardrail signing key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"the guardrail signing key {path} is not an Ed25519 key")
    return key


def ensure_signing_key(path: pathlib.Path) -> Ed25519PrivateKey:
    """Load the operator key, generating it on first use: mode 0600, in a directory made 0700,
    linked into place whole, so that of two processes making it at once (`up` and a command) the
    first one's file wins and both use it. Its public half is (re)written beside it
    (`public_key_path`) whenever that file is missing or holds another key: the verifiers (the
    API, the worker) read only that file, never the private key."""
    keyfiles.ensure(path, lambda: Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    key = load_signing_key(path)
    write_public_key(path, key)
    return key


def public_key_pem(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    """The public key as PEM SubjectPublicKeyInfo (`-----BEGIN PUBLIC KEY-----`)."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def write_public_key(private_path: pathlib.Path, key: Ed25519PrivateKey) -> pathlib.Path:
    """Write `key`'s public half to `public_key_path(private_path)` (mode 0644) unless that file
    already holds exactly it. Atomic (written beside, renamed into place): a verifier following
    the file sees the old key or the new, never a part. OSError."""
    target = public_key_path(private_path)
    pem = public_key_pem(key)
    with contextlib.suppress(FileNotFoundError):
        if target.read_bytes() == pem:
            return target
    keyfiles.replace(target, pem, mode=0o644)
    return target


def derive_public_key(private_path: pathlib.Path) -> bool:
    """For a home made before public key files: write the public half of the private key at
    `private_path` beside it when it is missing. False when there is no private key either (then
    nothing is written). The one time a verifier reads the private key, at its start; the key is
    not kept. OSError, ValueError (not an Ed25519 private key)."""
    if public_key_path(private_path).exists():
        return True
    try:
        data = private_path.read_bytes()
    except FileNotFoundError:
        return False
    write_public_key(private_path, _private_key(private_path, data))
    return True


def raw_public_key(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def fingerprint(public_key: bytes | Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """SHA-256 of the raw 32-byte public key, lowercase hex."""
    raw = public_key if isinstance(public_key, bytes) else raw_public_key(public_key)
    return hashlib.sha256(raw).hexdigest()


# -- signing and verification ------------------------------------------------------------------


def content_sha256(content: str) -> str:
    return sha256_hex(content.encode("utf-8"))


def signed_message(*, scope_path: str, level: int, content_sha256: str, signed_at_ms: int) -> bytes:
    return SIGNATURE_DOMAIN + canonical_bytes({
        "content_sha256": content_sha256, "level": level, "scope_path": scope_path,
        "signed_at_ms": signed_at_ms})


@dataclass(frozen=True, slots=True)
class SignedLayer:
    """A layer as published: the payload of `guardrail.published` (schema 1)."""

    level: int
    scope_path: str
    content: str
    content_sha256: str
    signed_at_ms: int
    signature: bytes       # 64 bytes, Ed25519 over signed_message(...)
    public_key: bytes      # 32 bytes, raw Ed25519 public key
    key_fingerprint: str   # fingerprint(public_key)

    def message(self) -> bytes:
        return signed_message(scope_path=self.scope_path, level=self.level,
                              content_sha256=self.content_sha256, signed_at_ms=self.signed_at_ms)

    def payload(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "scope_path": self.scope_path,
            "content": self.content,
            "content_sha256": self.content_sha256,
            "signed_at_ms": self.signed_at_ms,
            "signature_b64": base64.b64encode(self.signature).decode(),
            "public_key_b64": base64.b64encode(self.public_key).decode(),
            "key_fingerprint": self.key_fingerprint,
        }

    @classmethod
    def from_payload(cls, payload: Any) -> SignedLayer:
        """Parse a payload, checking types and sizes only (not the signature): LayerFormatError."""
        if not isinstance(payload, dict):
            raise LayerFormatError("payload is not an object")

        def field(name: str, kind: type) -> Any:
            value = payload.get(name)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise LayerFormatError(f"payload.{name} is missing or not a {kind.__name__}")
            return value

        level = field("level", int)
        if level not in LEVELS:
            raise LayerFormatError(f"payload.level {level} is not 1..4")
        signed_at_ms = field("signed_at_ms", int)
        if signed_at_ms < 0:
            raise LayerFormatError("payload.signed_at_ms is negative")
        digest = field("content_sha256", str)
        if not is_sha256_hex(digest):
            raise LayerFormatError("payload.content_sha256 is not a lowercase hex SHA-256")
        try:
            signature = base64.b64decode(field("signature_b64", str), validate=True)
            public_key = base64.b64decode(field("public_key_b64", str), validate=True)
        except binascii.Error as exc:
            raise LayerFormatError(f"payload signature or public key is not base64: {exc}") from exc
        if len(signature) != SIGNATURE_BYTES or len(public_key) != PUBLIC_KEY_BYTES:
            raise LayerFormatError("payload signature must be 64 bytes and public key 32 bytes")
        return cls(level=level, scope_path=field("scope_path", str), content=field("content", str),
                   content_sha256=digest, signed_at_ms=signed_at_ms, signature=signature,
                   public_key=public_key, key_fingerprint=field("key_fingerprint", str))


def sign_layer(key: Ed25519PrivateKey, *, level: int, scope_path: str, content: str,
               signed_at_ms: int) -> SignedLayer:
    digest = content_sha256(content)
    public = raw_public_key(key)
    message = signed_message(scope_path=scope_path, level=level, content_sha256=digest,
                             signed_at_ms=signed_at_ms)
    return SignedLayer(level=level, scope_path=scope_path, content=content, content_sha256=digest,
                       signed_at_ms=signed_at_ms, signature=key.sign(message), public_key=public,
                       key_fingerprint=fingerprint(public))


def verify_signature(public_key: bytes, message: bytes, signature: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def verify_layer(layer: SignedLayer) -> str | None:
    """Why this layer must not be served, or None when it is intact: the content hashes to
    content_sha256, the fingerprint is the public key's, and the signature verifies over the
    message binding scope, level, content hash and signing time."""
    if content_sha256(layer.content) != layer.content_sha256:
        return "content does not hash to content_sha256"
    if fingerprint(layer.public_key) != layer.key_fingerprint:
        return "key_fingerprint is not the SHA-256 of public_key"
    if not verify_signature(layer.public_key, layer.message(), layer.signature):
        return "the Ed25519 signature does not verify"
    return None
