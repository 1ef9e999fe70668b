"""The retrieval projection: chunks, BM25 postings, corpus statistics and recorded vectors.

Driven by the session projector (projections/projector/org_applier.py) inside its transaction, so the
chunks of a content up to INLINE_INDEX_BYTES appear atomically with the event that produced them
(a longer content's after the commit: projections/projector/deferred_indexing.py), and replay rebuilds them
the same way:

- `session.event_ingested` -> the event's chunks (every event type);
- `memory.scrubbed` of a semantic memory -> the memory's chunks, from the REDACTED content, with
  its PII status (quarantined chunks are kept but not searchable; a rescan replaces them);
- `session.rolled_back` -> the chunks of items leaving the state become inactive (and those of
  items coming back, active again);
- `embedding.recorded` -> `content_vectors` rows, and a `vector_assignments` note: after the
  commit the worker's VectorAssigner gives the vectors to every chunk of the org with that
  content hash (`assign_vectors_recorded_by`; a bulk load does it once at the end instead). A
  new chunk takes its vector from `content_vectors` on insert when its content was embedded
  before (content-hash dedup), so only content never seen gets an EmbeddingJob, and replay
  restores vectors without recomputing them: both orders of "chunk, then its vector" and
  "vector, then a chunk with that content" end in the same rows (the latest recorded vector of
  the content).

Chunking follows `retrieval.chunking` (a conversation turn stays one chunk unless it is longer
than 256 cl100k tokens); the chunk's domain is the source's `metadata["domain"]` ("" = none).
`corpus_stats` holds N, the total document length and the total tokens of searchable chunks per
(scope, domain), maintained by deltas whenever a chunk enters or leaves the searchable set;
`term_stats` holds df per (scope, domain, term) the same way. Both are aggregates of the
searchable chunks and postings, and a row exists only while its count is above zero, so a
recount (`recount_statistics`) gives exactly the rows the deltas give. A bulk load (replay into
an empty database) skips the deltas and recounts once at the end.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import numpy as np
import orjson
from pgvector import Vector

from context_engine.validation import MAX_LABEL, refused_character
from projections.retrieval.bm25 import K1, B, DocumentTerms, term_frequencies
from projections.retrieval.chunking import Chunk, chunk_content, summary_line_chunk
from projections.store.statement_batch import NOTHING, StatementBatch

SEMANTIC = "semantic"
DOMAIN_KEY = "domain"
IMPACT_REFERENCE_LENGTH = 16.0  # analysed terms; a typical conversation turn


def posting_impact(tf: int, doc_length: int) -> float:
    """BM25's term weight without idf, at a reference average length: orders a term's postings
    by how much they can contribute (the lexical leg reads the best of each term first)."""
    return tf * (K1 + 1) / (tf + K1 * (1 - B + B * doc_length / IMPACT_REFERENCE_LENGTH))


def vector_to_b64(vector: np.ndarray) -> str:
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def vector_from_b64(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<f4")


def _content_type(content: bytes, metadata: dict[str, Any]) -> str:
    declared = str(metadata.get("content_type") or "")
    if declared:
        return declared
    head = content.lstrip()[:1]
    return "application/json" if head in (b"{", b"[") else "text/plain"


def _domain(metadata: dict[str, Any]) -> str:
    """The chunks' domain: metadata["domain"], or none when it is not what the API accepts (a
    label: validation.metadata) — a record written to the log by other means must neither fail
    on the statistics' index nor be indexed differently live and on replay."""
    value = metadata.get(DOMAIN_KEY)
    if not isinstance(value, str) or len(value) > MAX_LABEL or refused_character(value) is not None:
        return ""
    return value


# Contents longer than this are indexed after the projector's commit, and cut on a thread: one
# tenant's megabyte (0.8-1 s of chunking and postings), or 64 KiB (25-64 ms), must not hold up the
# acknowledgements of every event batched with it or behind it. A conversation turn is shorter.
INLINE_INDEX_BYTES = 8 * 1024


async def analyse(event_id: str, content: bytes, metadata: dict[str, Any]) -> list[tuple[Chunk, DocumentTerms]]:
    """A source's chunks and their terms; a long content on a thread, off the worker's event loop."""
    if len(content) > INLINE_INDEX_BYTES:
        return await asyncio.to_thread(analysed_chunks, event_id, content, metadata)
    return analysed_chunks(event_id, content, metadata)


def analysed_chunks(event_id: str, content: bytes, metadata: dict[str, Any]) -> list[tuple[Chunk, DocumentTerms]]:
    chunks = chunk_content(event_id, content, content_type=_content_type(content, metadata))
    return [(c, term_frequencies(c.content)) for c in chunks]


def _no_totals() -> list[int]:
    return [0, 0, 0]


@dataclass
class PendingChunks:
    """Rows to write; picklable (the chunk indexer builds them in a process of its own)."""
    chunks: list[tuple] = field(default_factory=list)
    terms: list[tuple] = field(default_factory=list)
    # (scope, domain) -> [N, total length, total tokens] of the searchable chunks added
    stats: dict[tuple[str, str], list[int]] = field(default_factory=lambda: defaultdict(_no_totals))
    term_df: dict[tuple[str, str, str], int] = field(default_factory=lambda: defaultdict(int))

    def __bool__(self) -> bool:
        return bool(self.chunks)


_POSTING_COLUMNS = ("org_id", "term", "chunk_id", "tf", "doc_length", "scope_path", "domain", "searchable",
                    "impact")


@dataclass(frozen=True)
class BulkLoad:
    """How a replay into an empty database writes the retrieval projection: no statistics deltas
    (`recount_statistics` runs once at the end), and postings by COPY when `copy` (only a role
    that bypasses row-level security may COPY into these tables)."""

    copy: bool


class ChunkRows:
    """One org's chunk rows as they are built, before anything writes them: no connection, so a
    background process can build them (projections/projector/deferred_indexing.py)."""

    def __init__(self, org_id: str) -> None:
        self.org_id = org_id
        self.pending = PendingChunks()
        self.added_by: dict[str, str] = {}  # chunk id -> the event that added it in this batch

    def add_analysed(self, analysed: list[tuple[Chunk, DocumentTerms]], *, event_id: str, source_kind: str,
                     session_id: str | None, scope_path: str, metadata: dict[str, Any], created_at: dt.datetime,
                     pii_status: str = "clear", active: bool = True, added_by: str | None = None,
                     seq: int | None = None) -> None:
        """`add` of chunks already cut and analysed (`analyse`)."""
        domain = _domain(metadata)
        searchable = active and pii_status == "clear"
        meta_json = orjson.dumps(metadata).decode()
        for c, doc in analysed:
            cid = str(c.id)
            self.added_by[cid] = added_by or event_id
            self.pending.chunks.append((cid, scope_path, event_id, source_kind, session_id, c.index,
                                        domain, c.content, c.content_hash, c.token_count,
                                        doc.length, meta_json, created_at, active, pii_status, seq))
            for term, tf in doc.tf.items():
                self.pending.terms.append((self.org_id, term, c.id, tf, doc.length, scope_path, domain,
                                           searchable, posting_impact(tf, doc.length)))
                if searchable:
                    self.pending.term_df[(scope_path, domain, term)] += 1
            if searchable:
                stat = self.pending.stats[(scope_path, domain)]
                stat[0] += 1
                stat[1] += doc.length
                stat[2] += c.token_count

    def take_slices(self, size: int) -> tuple[list[PendingChunks], PendingChunks]:
        """Split what is pending into slices of at most `size` chunks with their postings, and
        the statistics deltas of them all: to write the slices one statement each, and the
        statistics last, so that their row locks are held for the commit only."""
        pending, self.pending = self.pending, PendingChunks()
        slice_of = {row[0]: i // size for i, row in enumerate(pending.chunks)}
        slices = [PendingChunks() for _ in range(-(-len(pending.chunks) // size))]
        for row in pending.chunks:
            slices[slice_of[row[0]]].chunks.append(row)
        for term in pending.terms:
            slices[slice_of[str(term[2])]].terms.append(term)
        statistics = PendingChunks(stats=pending.stats, term_df=pending.term_df)
        return slices, statistics


class ChunkProjection(ChunkRows):
    """One org's chunk writes within a projector batch."""

    def __init__(self, conn: asyncpg.Connection, org_id: str, *, bulk: BulkLoad | None = None,
                 defer_long: bool = True) -> None:
        super().__init__(org_id)
        self.conn = conn
        self.bulk = bulk
        # Live, a content longer than INLINE_INDEX_BYTES is indexed after the batch's commit
        # (projections/projector/deferred_indexing.py); a bulk load indexes everything in place.
        self.defer_long = defer_long and bulk is None
        self.deferred: dict[str, tuple[str, str]] = {}  # source -> (kind, the event that asked)
        self.requested: dict[str, list[str]] = {}  # event that asked -> the sources to index
        self.awaiting_vector: dict[str, str] = {}  # of `added_by`, searchable without a vector -> content hash
        self._to_copy: list[tuple] | None = None  # postings a bulk load COPYs after the batch
        self.recorded: set[str] = set()  # content hashes whose vectors this batch recorded

    async def add(self, *, event_id: str, source_kind: str, session_id: str | None, scope_path: str,
                  content: bytes, metadata: dict[str, Any], created_at: dt.datetime,
                  pii_status: str = "clear", active: bool = True, added_by: str | None = None,
                  seq: int | None = None) -> None:
        """Chunk a source's content. `added_by`: the event applying this (default: the source
        itself; a memory's chunks are added by its memory.scrubbed event); `seq`: a turn's
        position in its session (Search's adjacent-turn lift). A content longer than
        INLINE_INDEX_BYTES is only asked for here (`defer_long`): it is indexed after the commit."""
        if self.defer_long and len(content) > INLINE_INDEX_BYTES:
            self.deferred[event_id] = (source_kind, added_by or event_id)
            return
        self.add_analysed(await analyse(event_id, content, metadata), event_id=event_id,
                          source_kind=source_kind,
                          session_id=session_id, scope_path=scope_path, metadata=metadata, created_at=created_at,
                          pii_status=pii_status, active=active, added_by=added_by, seq=seq)

    def add_summary_line(self, *, event_id: str, session_id: str, scope_path: str, text: str, tokens: int,
                         metadata: dict[str, Any], created_at: dt.datetime) -> None:
        """The one chunk of a compaction summary's line (chunking rule 5): shown, never retrieved,
        so it has no postings, no statistics and no vector (source_kind 'summary' is not searchable)."""
        c = summary_line_chunk(event_id, text, tokens)
        self.pending.chunks.append((str(c.id), scope_path, event_id, "summary", session_id, c.index, _domain(metadata),
                                    c.content, c.content_hash, c.token_count, 0, orjson.dumps(metadata).decode(),
                                    created_at, True, "clear", None))

    async def flush(self) -> None:
        """Write pending chunks, each with the latest vector already recorded for its content."""
        batch = StatementBatch()
        select = self.stage(batch)
        rows = await batch.run(self.conn, select or NOTHING)  # statistics alone, too
        if select is not None:
            await self.written(rows)

    def stage(self, batch: StatementBatch) -> str | None:
        """Queue the pending chunk writes on `batch` (the session projector sends its own rows in
        the same round trip). Returns the query that reads back the inserted chunks, whose rows go
        to `written`; None when nothing is pending."""
        if self.deferred:
            deferred, self.deferred = self.deferred, {}
            for source, (_kind, by) in deferred.items():
                self.requested.setdefault(by, []).append(source)
            batch.add(_REQUEST_INDEXING, self.org_id, list(deferred), [k for k, _ in deferred.values()],
                      [uuid.UUID(by) for _, by in deferred.values()])
        pending, self.pending = self.pending, PendingChunks()
        if not pending:
            self._stage_statistics(batch, pending)
            return None
        cols = list(zip(*pending.chunks))
        inserted = batch.add(_INSERT_CHUNKS, self.org_id, *[list(c) for c in cols])
        if self.bulk and self.bulk.copy:
            self._to_copy = pending.terms  # after the batch: COPY cannot be a WITH clause
        else:
            tcols: list[Sequence[Any]] = list(zip(*pending.terms)) if pending.terms else [[] for _ in _POSTING_COLUMNS]
            batch.add(_INSERT_POSTINGS, self.org_id, *[list(c) for c in tcols[1:]])
        self._stage_statistics(batch, pending)
        return f"SELECT chunk_id, content_hash, awaiting_vector FROM {inserted}"

    def _stage_statistics(self, batch: StatementBatch, pending: PendingChunks) -> None:
        """The statistics deltas, in key order: every writer of these rows takes their locks in
        one order (the projector and the chunk indexer write them concurrently)."""
        if self.bulk:
            return
        if rows := sorted((s, d, *totals) for (s, d), totals in pending.stats.items()):
            batch.add(_ADD_CORPUS_STATS, self.org_id, *(list(c) for c in zip(*rows)))
        if rows := sorted((s, d, t, n) for (s, d, t), n in pending.term_df.items()):
            batch.add(_ADD_TERM_STATS, self.org_id, *(list(c) for c in zip(*rows)))

    async def written(self, inserted: Sequence[asyncpg.Record]) -> None:
        self.awaiting_vector.update((str(r["chunk_id"]), r["content_hash"]) for r in inserted if r["awaiting_vector"])
        if self._to_copy is not None:
            # Replay: one COPY instead of arrays of every column (asyncpg checks each element).
            rows, self._to_copy = self._to_copy, None
            await self.conn.copy_records_to_table("chunk_terms", records=rows, columns=_POSTING_COLUMNS)

    def unembedded(self) -> dict[str, list[str]]:
        """Searchable chunks added in this batch still without a vector, by the event that added
        them (quarantined chunks are not embedded: a rescan replaces them)."""
        out: dict[str, list[str]] = {}
        for cid, by in self.added_by.items():
            if cid in self.awaiting_vector:
                out.setdefault(by, []).append(cid)
        return out

    async def set_active(self, changes: Sequence[tuple[Any, bool]]) -> None:
        """A rollback changed these sources' `active` flags: follow on their chunks."""
        if not changes:
            return
        await self.flush()
        ids, flags = [c[0] for c in changes], [c[1] for c in changes]
        rows = await self.conn.fetch(
            "WITH before AS ("
            "  SELECT c.chunk_id, c.searchable AS was FROM chunks c "
            "  JOIN unnest($2::uuid[]) AS u(event_id) ON c.source_event_id = u.event_id "
            "  WHERE c.org_id = $1) "
            "UPDATE chunks c SET active = u.active "
            "FROM unnest($2::uuid[], $3::bool[]) AS u(event_id, active), before b "
            "WHERE c.org_id = $1 AND c.source_event_id = u.event_id AND b.chunk_id = c.chunk_id "
            "  AND c.active IS DISTINCT FROM u.active "
            "RETURNING c.chunk_id, c.scope_path, c.domain, c.term_count, c.token_count, b.was, c.searchable, "
            "  c.embedding IS NULL AS unembedded, c.content_hash",
            self.org_id, ids, flags)
        for r in rows:
            if (cid := str(r["chunk_id"])) in self.added_by:
                if r["searchable"] and r["unembedded"] and r["content_hash"] not in self.recorded:
                    self.awaiting_vector[cid] = r["content_hash"]
                else:
                    self.awaiting_vector.pop(cid, None)
        await self._searchable_changed(rows)

    async def remove_source(self, event_id: str) -> None:
        """Drop a source's chunks (a new PII scan result replaces them), with their statistics,
        and any indexing still asked for it."""
        self.deferred.pop(event_id, None)
        await self.flush()
        await self.conn.execute("DELETE FROM indexing_requests WHERE org_id = $1 AND source_event_id = $2",
                                self.org_id, event_id)
        gone = await self.conn.fetch(
            "DELETE FROM chunks WHERE org_id = $1 AND source_event_id = $2 "
            "RETURNING chunk_id, scope_path, domain, term_count, token_count, searchable",
            self.org_id, event_id)
        if not gone:
            return
        for r in gone:
            self.awaiting_vector.pop(str(r["chunk_id"]), None)
        await self._term_stats_follow([(r["chunk_id"], -1) for r in gone if r["searchable"]])
        await self.conn.execute("DELETE FROM chunk_terms WHERE org_id = $1 AND chunk_id = ANY($2::uuid[])",
                                self.org_id, [r["chunk_id"] for r in gone])
        await self._add_stats(_stat_deltas([(r, -1) for r in gone if r["searchable"]]))

    async def _searchable_changed(self, rows: Sequence[asyncpg.Record]) -> None:
        moved = [r for r in rows if r["was"] != r["searchable"]]
        if not moved:
            return
        await self.conn.execute(
            "UPDATE chunk_terms t SET searchable = u.s "
            "FROM unnest($2::uuid[], $3::bool[]) AS u(chunk_id, s) "
            "WHERE t.org_id = $1 AND t.chunk_id = u.chunk_id",
            self.org_id, [r["chunk_id"] for r in moved], [r["searchable"] for r in moved])
        await self._term_stats_follow([(r["chunk_id"], 1 if r["searchable"] else -1) for r in moved])
        await self._add_stats(_stat_deltas([(r, 1 if r["searchable"] else -1) for r in moved]))

    async def _term_stats_follow(self, signed_chunks: list[tuple[Any, int]]) -> None:
        """Chunks entering (+1) or leaving (-1) the searchable set: their terms' df follow."""
        if not signed_chunks or self.bulk:
            return
        rows = await self.conn.fetch(
            "SELECT t.scope_path, t.domain, t.term, sum(u.sign)::bigint AS delta FROM chunk_terms t "
            "JOIN unnest($2::uuid[], $3::int[]) AS u(chunk_id, sign) ON t.chunk_id = u.chunk_id "
            "WHERE t.org_id = $1 GROUP BY 1, 2, 3",
            self.org_id, [c for c, _ in signed_chunks], [n for _, n in signed_chunks])
        await self._add_term_stats([(r["scope_path"], r["domain"], r["term"], r["delta"]) for r in rows])

    async def _add_term_stats(self, rows: list[tuple[str, str, str, int]]) -> None:
        if not rows or self.bulk:
            return
        scopes, domains, terms, deltas = (list(c) for c in zip(*rows))
        await self.conn.execute(_ADD_TERM_STATS, self.org_id, scopes, domains, terms, deltas)
        if min(deltas) < 0:
            await self.conn.execute("DELETE FROM term_stats WHERE org_id = $1 AND term = ANY($2::text[]) AND df = 0",
                                    self.org_id, sorted({t for t, n in zip(terms, deltas) if n < 0}))

    async def _add_stats(self, rows: list[tuple[str, str, int, int, int]]) -> None:
        """Add (scope, domain, N, total length, total tokens) deltas to corpus_stats."""
        if not rows or self.bulk:
            return
        scopes, domains, ns, lengths, tokens = (list(c) for c in zip(*rows))
        await self.conn.execute(_ADD_CORPUS_STATS, self.org_id, scopes, domains, ns, lengths, tokens)
        if min(ns) < 0:
            await self.conn.execute("DELETE FROM corpus_stats WHERE org_id = $1 AND n_docs = 0", self.org_id)

    async def record_vectors(self, *, event_id: str, model_version: str,
                             vectors: Sequence[dict[str, str]], recorded_at: dt.datetime) -> None:
        """Apply `embedding.recorded`: payload vectors are {content_hash, vector (base64 f32 LE)}.
        Only recorded here: chunks written after this (in this batch too) take them on insert;
        chunks already written get them from `assign_vectors_recorded_by` after the commit (the
        worker's VectorAssigner), or, in a bulk load, from `assign_recorded_vectors` at the end.
        Putting a vector into the HNSW graph costs ~1 ms; inside this transaction it held up
        every acknowledgement of the batch."""
        if not model_version or not vectors:
            raise ValueError("embedding.recorded needs model_version and vectors")
        hashes = [str(v["content_hash"]) for v in vectors]
        # Binary, through pgvector's codec on the connection: formatting 384 floats as text per
        # vector was a tenth of replay's time.
        arrays = [Vector(vector_from_b64(v["vector"])) for v in vectors]  # not sequences: one element each
        batch = StatementBatch()
        batch.add(
            "INSERT INTO content_vectors (org_id, content_hash, model_version, embedding, recorded_at, event_id) "
            "SELECT $1, u.h, $2, u.v, $5, $6 FROM unnest($3::text[], $4::vector[]) AS u(h, v) "
            "ON CONFLICT (org_id, content_hash, model_version) DO UPDATE "
            "SET embedding = EXCLUDED.embedding, recorded_at = EXCLUDED.recorded_at, event_id = EXCLUDED.event_id",
            self.org_id, model_version, hashes, arrays, recorded_at, event_id)
        if not self.bulk:  # the worker's VectorAssigner takes it from here, after the commit
            batch.add("INSERT INTO vector_assignments (org_id, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                      self.org_id, event_id)
        await batch.run(self.conn)
        self.recorded.update(hashes)
        self.awaiting_vector = {c: h for c, h in self.awaiting_vector.items() if h not in self.recorded}


_REQUEST_INDEXING = """
INSERT INTO indexing_requests (org_id, source_event_id, source_kind, added_by, requested_at)
SELECT $1, u.*, now() FROM unnest($2::uuid[], $3::text[], $4::uuid[]) AS u
ON CONFLICT (org_id, source_event_id) DO UPDATE
SET source_kind = EXCLUDED.source_kind, added_by = EXCLUDED.added_by, requested_at = EXCLUDED.requested_at,
    attempts = 0, last_error = NULL
"""
_INSERT_POSTINGS = """
INSERT INTO chunk_terms (org_id, term, chunk_id, tf, doc_length, scope_path, domain, searchable, impact)
SELECT $1, u.* FROM unnest($2::text[], $3::uuid[], $4::int[], $5::int[], $6::text[], $7::text[], $8::bool[],
                           $9::real[]) AS u
ON CONFLICT DO NOTHING
"""
# Deltas of (N, total length, total tokens) per (scope, domain), and of df per (scope, domain, term).
_ADD_CORPUS_STATS = """
INSERT INTO corpus_stats (org_id, scope_path, domain, n_docs, total_length, token_total)
SELECT $1, u.* FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[]) AS u
ON CONFLICT (org_id, scope_path, domain) DO UPDATE
SET n_docs = corpus_stats.n_docs + EXCLUDED.n_docs,
    total_length = corpus_stats.total_length + EXCLUDED.total_length,
    token_total = corpus_stats.token_total + EXCLUDED.token_total
"""
_ADD_TERM_STATS = """
INSERT INTO term_stats (org_id, scope_path, domain, term, df)
SELECT $1, u.* FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[]) AS u
ON CONFLICT (org_id, term, scope_path, domain) DO UPDATE SET df = term_stats.df + EXCLUDED.df
"""
# New chunks, each with the latest vector recorded for its content (content-hash dedup) when
# there is one. Written with its vector, a chunk is written once.
_INSERT_CHUNKS = """
INSERT INTO chunks (org_id, chunk_id, scope_path, source_event_id, source_kind, session_id, chunk_index,
                    domain, content, content_hash, token_count, term_count, metadata, created_at, active,
                    pii_status, seq, embedding, embedding_model)
SELECT $1, u.*, v.embedding, v.model_version
FROM unnest($2::uuid[], $3::text[], $4::uuid[], $5::text[], $6::text[], $7::int[], $8::text[], $9::text[],
            $10::text[], $11::int[], $12::int[], $13::text[]::jsonb[], $14::timestamptz[], $15::bool[],
            $16::text[], $17::bigint[])
     AS u(chunk_id, scope_path, source_event_id, source_kind, session_id, chunk_index, domain, content,
          content_hash, token_count, term_count, metadata, created_at, active, pii_status, seq)
LEFT JOIN LATERAL (SELECT embedding, model_version FROM content_vectors cv
                   WHERE cv.org_id = $1 AND cv.content_hash = u.content_hash
                   ORDER BY recorded_at DESC, model_version DESC LIMIT 1) v ON true
ON CONFLICT (chunk_id) DO NOTHING
RETURNING chunk_id, content_hash, embedding IS NULL AND searchable AS awaiting_vector
"""


async def assign_recorded_vectors(conn: asyncpg.Connection, org_id: str) -> None:
    """Every chunk of an org gets the latest vector recorded for its content: what the live
    projection keeps chunk by chunk, done once at the end of a bulk load."""
    await conn.execute(
        "UPDATE chunks c SET embedding = v.embedding, embedding_model = v.model_version "
        "FROM (SELECT DISTINCT ON (content_hash) content_hash, embedding, model_version "
        "      FROM content_vectors WHERE org_id = $1 ORDER BY content_hash, recorded_at DESC, model_version DESC) v "
        "WHERE c.org_id = $1 AND c.content_hash = v.content_hash", org_id)


async def assign_vectors_recorded_by(conn: asyncpg.Connection, org_id: str, event_id: str) -> int:
    """Give the org's chunks the vectors one `embedding.recorded` event recorded, for each content
    where that vector is still the latest recorded (by recorded_at, then model version: what a
    chunk written now would take, and what a replay assigns), so the order in which events are
    assigned, or whether an earlier one was assigned at all, does not matter. Returns how many
    chunks changed."""
    status = await conn.execute(
        "UPDATE chunks c SET embedding = cv.embedding, embedding_model = cv.model_version "
        "FROM content_vectors cv "
        "WHERE cv.org_id = $1 AND cv.event_id = $2 AND c.org_id = $1 AND c.content_hash = cv.content_hash "
        "  AND (c.embedding IS DISTINCT FROM cv.embedding OR c.embedding_model IS DISTINCT FROM cv.model_version) "
        "  AND NOT EXISTS (SELECT 1 FROM content_vectors later "
        "                  WHERE later.org_id = $1 AND later.content_hash = cv.content_hash "
        "                    AND (later.recorded_at, later.model_version) > (cv.recorded_at, cv.model_version))",
        org_id, uuid.UUID(event_id))
    await conn.execute("DELETE FROM vector_assignments WHERE org_id = $1 AND event_id = $2",
                       org_id, uuid.UUID(event_id))
    return int(status.split()[-1])


async def pending_vector_assignments(conn: asyncpg.Connection) -> list[tuple[str, str]]:
    """(org, event) of every `embedding.recorded` whose vectors are not yet assigned; read under
    app.org_id '_system'."""
    return [(r["org_id"], str(r["event_id"])) for r in await conn.fetch(
        "SELECT org_id, event_id FROM vector_assignments ORDER BY org_id, event_id")]


async def recount_statistics(conn: asyncpg.Connection, org_id: str) -> None:
    """Set one org's corpus_stats and term_stats to a count over its searchable chunks and
    postings: what the deltas maintain, computed from scratch (the end of a bulk load)."""
    await conn.execute("DELETE FROM corpus_stats WHERE org_id = $1", org_id)
    await conn.execute(
        "INSERT INTO corpus_stats (org_id, scope_path, domain, n_docs, total_length, token_total) "
        "SELECT org_id, scope_path, domain, count(*), sum(term_count), sum(token_count) FROM chunks "
        "WHERE org_id = $1 AND searchable GROUP BY org_id, scope_path, domain", org_id)
    await conn.execute("DELETE FROM term_stats WHERE org_id = $1", org_id)
    await conn.execute(
        "INSERT INTO term_stats (org_id, scope_path, domain, term, df) "
        "SELECT org_id, scope_path, domain, term, count(*) FROM chunk_terms "
        "WHERE org_id = $1 AND searchable GROUP BY org_id, scope_path, domain, term", org_id)


def _stat_deltas(signed_rows: Sequence[tuple[Any, int]]) -> list[tuple[str, str, int, int, int]]:
    """Chunks (rows with scope_path, domain, term_count, token_count) entering (+1) or leaving
    (-1) the searchable set -> corpus_stats deltas per (scope, domain)."""
    deltas: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for r, sign in signed_rows:
        d = deltas[(r["scope_path"], r["domain"])]
        d[0] += sign
        d[1] += sign * r["term_count"]
        d[2] += sign * r["token_count"]
    return [(s, d, n, length, tokens) for (s, d), (n, length, tokens) in deltas.items()]
