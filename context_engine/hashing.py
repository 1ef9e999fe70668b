"""Content hashes, the session version chain and Merkle roots. Hashes on the wire are lowercase hex.

Chain (ARCHITECTURE.md section 4): v0 = H("genesis" ‖ session key), vi = H(v(i-1) ‖ content_hash_i),
over the raw 32-byte digests. It is computed in log order by the projector, so a replay of the
same log reproduces every version bit for bit.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

import orjson

_HEX_SHA256 = re.compile(r"[0-9a-f]{64}")
GENESIS = b"context-engine/genesis/v1\x00"


def canonical_bytes(value: Any) -> bytes:
    """The one byte form of a JSON value that is hashed and signed: orjson, keys sorted, no
    whitespace (an event's payload, a guardrail layer)."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_sha256_hex(value: str) -> bool:
    return isinstance(value, str) and _HEX_SHA256.fullmatch(value) is not None  # not "…\n"


def genesis_version(session_key: str) -> str:
    return sha256_hex(GENESIS + session_key.encode())


def next_version(previous: str, content_hash: str) -> str:
    return sha256_hex(bytes.fromhex(previous) + bytes.fromhex(content_hash))


def chain(session_key: str, content_hashes: Iterable[str]) -> list[str]:
    """Every version of a session whose active items have these hashes, v0 first."""
    versions = [genesis_version(session_key)]
    for h in content_hashes:
        versions.append(next_version(versions[-1], h))
    return versions


def merkle_root(leaf_hashes: list[str]) -> str:
    """RFC 6962's Merkle Tree Hash over hex leaves, in the given order: a leaf is H(0x00 ‖ leaf),
    an inner node H(0x01 ‖ left ‖ right), a tree of n > 1 leaves splits after the largest power
    of two below n, and the empty tree is H(""). No node is ever paired with itself, so
    [a, b, c] and [a, b, c, c] have different roots (the odd-leaf duplication of CVE-2012-2459),
    and the prefixes make a leaf unable to pose as an inner node. Test vectors: docs/assembly.md."""
    if not leaf_hashes:
        return sha256_hex(b"")
    return _tree_hash([hashlib.sha256(b"\x00" + bytes.fromhex(h)).digest() for h in leaf_hashes]).hex()


def _tree_hash(nodes: list[bytes]) -> bytes:
    if len(nodes) == 1:
        return nodes[0]
    split = 1 << ((len(nodes) - 1).bit_length() - 1)  # the largest power of two below len(nodes)
    return hashlib.sha256(b"\x01" + _tree_hash(nodes[:split]) + _tree_hash(nodes[split:])).digest()
