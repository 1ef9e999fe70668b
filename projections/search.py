"""Hybrid retrieval over the chunk read models: the Search RPC's query, reused by assembly.

One pass (`_Retriever.run`) for a `Pool`:
1. corpus statistics of the caller's visible corpus — searchable chunks owned at the caller's
   scope or an ancestor's (ARCHITECTURE.md section 6), within `domain` when given: N and total
   length from `corpus_stats`, df per query term from `term_stats` (both maintained by the
   projector, so their cost does not grow with the corpus);
2. the lexical leg: for each query term its best `postings_per_term` postings by impact (BM25's
   term weight at a reference length, indexed), Okapi BM25 (k1 1.2, b 0.75, retrieval/bm25.py)
   over that union, top `bm25_k` candidates holding the pool's share of the query terms. Reading
   the best postings per term instead of all of them bounds the leg's cost for common terms;
   the exact BM25 of every kept candidate is computed in step 4;
3. the vector leg: cosine over the HNSW index of the running embedder's dimension, top
   `vector_k`, filtered by the same visibility (pgvector iterative scan, so filtering does not
   starve the result);
4. for the union of both legs, the other leg's signal too (the cosine of every candidate, BM25
   of every candidate recomputed in Python from its postings with the same statistics), then
   `retrieval.fusion.HYBRID` -> one score in [0, 1].
The confidence gate (retrieval/confidence_gate.py) runs one broadened pass when the top fused
score is below the effective floor, and `retrieval.outcome.classify` — the one classification
function — applies the floor, the top_k cap and names the outcome.

Row-level security is on (the API's role, `app.org_id` set per transaction); every statement
also filters on org_id to keep the indexes in use.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass
from typing import Any

import asyncpg
import numpy as np
import orjson

from context_engine.errors import InvalidArgument
from context_engine.inference.embedder import Embedder
from context_engine.projections.database import org_transaction
from context_engine.projections.retrieval.bm25 import (
    CorpusStats,
    DocumentTerms,
    analyze,
    bm25_score,
    minimum_should_match,
    query_idf_mass,
)
from context_engine.projections.retrieval.confidence_gate import Pool, retrieve_with_gate_async
from context_engine.projections.retrieval.fusion import HYBRID, Candidate, ScoredCandidate
from context_engine.projections.retrieval.outcome import RetrievalResult, classify, resolve_min_score, resolve_top_k
from context_engine.scope import Scope

MAX_QUERY_BYTES = 16 * 1024
MAX_DOMAIN_CHARS = 128
MIN_POOL = 50
POSTINGS_PER_TERM = 300  # best postings read per query term (x4 when the gate broadens)
BROADEN_POSTINGS = 4


@dataclass(frozen=True)
class SearchQuery:
    query: str
    domain: str = ""
    top_k: int = 0
    min_score: float = 0.0


@dataclass(frozen=True)
class ChunkHit:
    """What a result carries besides its scores."""

    chunk_id: str
    content: str
    source_kind: str
    source_event_id: str
    session_id: str | None
    chunk_index: int
    domain: str
    scope_path: str
    metadata: dict[str, Any]
    created_at: dt.datetime
    bm25: float

    @property
    def source(self) -> str:
        return f"{self.source_kind}:{self.source_event_id}"


@dataclass(frozen=True)
class SearchOutcome:
    result: RetrievalResult  # results are ScoredCandidate with payload = ChunkHit
    expansion_applied: bool
    model_version: str


def validate(q: SearchQuery) -> tuple[str, str]:
    query = q.query.strip()
    if not query:
        raise InvalidArgument("query", "must not be empty")
    if len(q.query.encode()) > MAX_QUERY_BYTES:
        raise InvalidArgument("query", f"must be at most {MAX_QUERY_BYTES} bytes")
    domain = q.domain.strip()
    if len(domain) > MAX_DOMAIN_CHARS:
        raise InvalidArgument("domain", f"must be at most {MAX_DOMAIN_CHARS} characters")
    return query, domain


async def search(pool: asyncpg.Pool, embedder: Embedder, scope: Scope, q: SearchQuery,
                 tenant_min_score: float, *, now: dt.datetime | None = None) -> SearchOutcome:
    query, domain = validate(q)
    top_k = resolve_top_k(q.top_k)
    floor = resolve_min_score(q.min_score, tenant_min_score)
    terms = analyze(query)
    vector = (await embedder.embed([query]))[0]
    retriever = _Retriever(pool, scope, domain, terms, vector, embedder.model_version,
                           now or dt.datetime.now(dt.UTC))
    first = Pool(vector_k=max(MIN_POOL, 2 * top_k), bm25_k=max(MIN_POOL, 2 * top_k))
    gate = await retrieve_with_gate_async(retriever.run, floor, first)
    return SearchOutcome(classify(gate.candidates, floor, top_k), gate.expansion_applied,
                         embedder.model_version)


_STATS = """
SELECT coalesce(sum(n_docs), 0)::bigint AS n, coalesce(sum(total_length), 0)::bigint AS total
FROM corpus_stats WHERE org_id = $1 AND scope_path = ANY($2::text[]) AND ($3 = '' OR domain = $3)
"""

_DF = """
SELECT term, sum(df)::bigint AS df FROM term_stats
WHERE org_id = $1 AND term = ANY($2::text[]) AND scope_path = ANY($3::text[]) AND ($4 = '' OR domain = $4)
GROUP BY term
"""

# The best `$5` postings of each query term by impact (the partial index on searchable rows),
# within the caller's visibility: the lexical leg's candidates and their partial postings.
_TOP_POSTINGS = """
SELECT p.chunk_id, q.term, p.tf, p.doc_length
FROM unnest($2::text[]) AS q(term)
CROSS JOIN LATERAL (
    SELECT chunk_id, tf, doc_length FROM chunk_terms
    WHERE org_id = $1 AND term = q.term AND searchable AND scope_path = ANY($3::text[])
      AND ($4 = '' OR domain = $4)
    ORDER BY impact DESC LIMIT $5
) AS p
"""


def _vector_leg(dims: int) -> str:
    return f"""
SELECT chunk_id FROM chunks
WHERE org_id = $1 AND embedding_dims = {dims} AND embedding_model = $3 AND searchable
  AND scope_path = ANY($4::text[]) AND ($5 = '' OR domain = $5)
ORDER BY embedding::vector({dims}) <=> $2::vector({dims})
LIMIT $6
"""


def _candidates(dims: int) -> str:
    return f"""
SELECT chunk_id, content, source_kind, source_event_id, session_id, chunk_index, domain, scope_path,
       metadata::text AS metadata, created_at,
       CASE WHEN embedding_dims = {dims} AND embedding_model = $3
            THEN 1 - (embedding::vector({dims}) <=> $2::vector({dims})) END AS cosine
FROM chunks WHERE org_id = $1 AND chunk_id = ANY($4::uuid[])
"""


_POSTINGS = """
SELECT chunk_id, term, tf, doc_length FROM chunk_terms
WHERE org_id = $1 AND chunk_id = ANY($2::uuid[]) AND term = ANY($3::text[])
"""


class _Retriever:
    def __init__(self, pool: asyncpg.Pool, scope: Scope, domain: str, terms: list[str], vector: Any,
                 model_version: str, now: dt.datetime) -> None:
        self.pool = pool
        self.org_id = scope.org_id
        self.scopes = [s.path for s in scope.ancestors()]
        self.domain = domain
        self.terms = terms
        self.query_tf = Counter(terms)
        self.vector = np.asarray(vector, dtype=np.float32)  # pooled connections carry pgvector's codec
        self.dims = len(vector)
        self.model_version = model_version
        self.now = now

    async def run(self, p: Pool) -> list[ScoredCandidate]:
        async with org_transaction(self.pool, self.org_id, readonly=True) as conn:
            await conn.execute(f"SET LOCAL hnsw.ef_search = {int(p.ef_search)}")
            await conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
            stats = await self._stats(conn)
            lexical = await self._bm25_leg(conn, stats, p)
            vector_rows = await conn.fetch(_vector_leg(self.dims), self.org_id, self.vector,
                                           self.model_version, self.scopes, self.domain, p.vector_k)
            ids = list(dict.fromkeys([*lexical, *(r["chunk_id"] for r in vector_rows)]))
            if not ids:
                return []
            rows = await conn.fetch(_candidates(self.dims), self.org_id, self.vector,
                                    self.model_version, ids)
            postings = await conn.fetch(_POSTINGS, self.org_id, ids, list(self.query_tf)) if self.terms else []
        docs: dict[Any, dict[str, int]] = {}
        lengths: dict[Any, int] = {}
        for r in postings:
            docs.setdefault(r["chunk_id"], {})[r["term"]] = r["tf"]
            lengths[r["chunk_id"]] = r["doc_length"]
        mass = query_idf_mass(self.terms, stats) if self.terms else 0.0
        candidates = []
        for r in rows:
            cid = r["chunk_id"]
            bm25 = bm25_score(self.terms, DocumentTerms(docs.get(cid, {}), lengths.get(cid, 0)), stats) \
                if cid in docs else 0.0
            hit = ChunkHit(str(cid), r["content"], r["source_kind"], str(r["source_event_id"]),
                           r["session_id"], r["chunk_index"], r["domain"], r["scope_path"],
                           _metadata(r["metadata"]), r["created_at"], bm25)
            cosine = r["cosine"]
            candidates.append(Candidate(str(cid), None if cosine is None else float(cosine), bm25,
                                        r["created_at"], hit))
        return HYBRID.fuse(candidates, now=self.now, query_idf_mass=mass)

    async def _stats(self, conn: asyncpg.Connection) -> CorpusStats:
        row = await conn.fetchrow(_STATS, self.org_id, self.scopes, self.domain)
        df: dict[str, int] = {}
        if self.terms:
            df = {r["term"]: r["df"] for r in await conn.fetch(
                _DF, self.org_id, list(self.query_tf), self.scopes, self.domain)}
        return CorpusStats.from_totals(row["n"], row["total"], df)

    async def _bm25_leg(self, conn: asyncpg.Connection, stats: CorpusStats, p: Pool) -> list[Any]:
        """Top `bm25_k` by BM25 over the union of each term's best postings (`postings_per_term`
        of them). A candidate's score here counts the terms whose best postings it is among; the
        exact score of every candidate kept is computed afterwards from all its postings."""
        present = [t for t in self.query_tf if stats.df.get(t)]
        if not present or stats.n_docs == 0:
            return []
        # Terms the visible corpus does not hold at all cannot be required of a candidate.
        required = max(1, min(minimum_should_match(len(self.query_tf), p.bm25_min_match_fraction), len(present)))
        per_term = max(POSTINGS_PER_TERM, 2 * p.bm25_k) * (BROADEN_POSTINGS if p.expanded else 1)
        rows = await conn.fetch(_TOP_POSTINGS, self.org_id, present, self.scopes, self.domain, per_term)
        docs: dict[Any, dict[str, int]] = {}
        lengths: dict[Any, int] = {}
        for r in rows:
            docs.setdefault(r["chunk_id"], {})[r["term"]] = r["tf"]
            lengths[r["chunk_id"]] = r["doc_length"]
        scored = [(bm25_score(self.terms, DocumentTerms(tf, lengths[cid]), stats), str(cid), cid)
                  for cid, tf in docs.items() if len(tf) >= required]
        scored.sort(key=lambda x: (-x[0], x[1]))
        return [cid for _, _, cid in scored[:p.bm25_k]]


def _metadata(text: str) -> dict[str, Any]:
    value = orjson.loads(text) if text else {}
    return value if isinstance(value, dict) else {}
