"""The Embed RPC: vectors from the running embedder, cached per caller scope by content hash and
model (the cache's reads and writes: projections/store/embedding_cache.py).

- Up to `MAX_TEXTS` texts; each at most the configured content limit.
- `model_version` in the request is an assertion, never a selector: empty or exactly the
  running embedder's value, anything else INVALID_ARGUMENT (the cache is keyed by the model
  the server actually ran, so a caller can never file vectors under another model's name).
- A vector is `cached` when it came from `embedding_cache` (this caller's scope, this model,
  younger than `embed_cache_ttl_days`) or from `content_vectors` (what the embedding pipeline
  recorded on the log) for content of a chunk the caller sees (context_engine.visibility):
  identical content is embedded once. Fresh vectors are written to `embedding_cache` with the
  time they were computed; an expired entry is recomputed and replaced. The cache is per scope
  on purpose: a shared one would tell a caller, through `cached` (or its speed), which texts
  another tenant or a sibling team embedded or wrote.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commands.deps import Deps
from context_engine.errors import InvalidArgument
from context_engine.hashing import sha256_hex
from context_engine.scope import Scope
from context_engine.visibility import Visibility
from inference.embedder import Embedder
from projections.store import embedding_cache
from projections.store.pool import org_transaction

MAX_TEXTS = 100


@dataclass(frozen=True)
class EmbedTexts:
    texts: list[str]
    model_version: str = ""


@dataclass(frozen=True)
class EmbeddedTexts:
    vectors: list[np.ndarray]
    cached: list[bool]
    model_version: str


def validate(cmd: EmbedTexts, embedder: Embedder, max_bytes: int) -> None:
    if cmd.model_version and cmd.model_version != embedder.model_version:
        raise InvalidArgument(
            "model_version", f"is only an assertion about the running embedder: leave it empty or "
                             f"send {embedder.model_version!r}, got {cmd.model_version!r}")
    if not cmd.texts:
        raise InvalidArgument("texts", "must hold at least one text")
    if len(cmd.texts) > MAX_TEXTS:
        raise InvalidArgument("texts", f"holds {len(cmd.texts)} texts; at most {MAX_TEXTS} per request")
    for i, text in enumerate(cmd.texts):
        if len(text.encode()) > max_bytes:
            raise InvalidArgument(f"texts[{i}]", f"is larger than {max_bytes} bytes")


async def embed_texts(deps: Deps, embedder: Embedder, caller: Scope, cmd: EmbedTexts) -> EmbeddedTexts:
    validate(cmd, embedder, deps.settings.max_content_bytes)
    org_id, visible = caller.org_id, Visibility.of(caller)
    model = embedder.model_version
    hashes = [sha256_hex(t.encode()) for t in cmd.texts]
    wanted = sorted(set(hashes))
    async with org_transaction(deps.pool, org_id, readonly=True) as conn:
        found = await embedding_cache.lookup(conn, caller, visible, model, wanted, deps.settings.embed_cache_ttl_days)
    missing = [h for h in wanted if h not in found]
    fresh: dict[str, np.ndarray] = {}
    if missing:
        text_of = dict(zip(hashes, cmd.texts))
        vectors = await embedder.embed([text_of[h] for h in missing])
        fresh = dict(zip(missing, vectors))
        async with org_transaction(deps.pool, org_id) as conn:
            await embedding_cache.store(conn, caller, model, fresh)
    return EmbeddedTexts([fresh[h] if h in fresh else found[h] for h in hashes],
                         [h not in fresh for h in hashes], model)
