"""Hybrid retrieval over the chunk read models: the Search RPC's query, reused by assembly.

One read-only transaction for the retrieval (and for its broadened pass when the gate fires); one
pass (`_Retriever.run`) for a `Pool` is two statements, the query embedding computed on a thread
meanwhile:
1. corpus statistics of the caller's visible corpus — searchable chunks owned at the caller's
   scope or an ancestor's (ARCHITECTURE.md section 6), within `domain` when given: N and total
   length from `corpus_stats`, df per query term from `term_stats` (both maintained by the
   projector, so their cost does not grow with the corpus) — the same statement as step 2;
2. the lexical leg: for each query term its best `postings_per_term` postings by impact (BM25's
   term weight at a reference length, indexed), Okapi BM25 (k1 1.2, b 0.75, retrieval/bm25.py)
   over that union, top `bm25_k` candidates holding the pool's share of the query terms. Reading
   the best postings per term instead of all of them bounds the leg's cost for common terms;
   the exact BM25 of every kept candidate is computed in step 4;
3. the vector leg: cosine over the HNSW index of the running embedder's dimension, top
   `vector_k`, filtered by the same visibility (pgvector iterative scan, so filtering does not
   starve the result) — the same statement as step 4;
4. for the union of both legs, the other leg's signal too (the cosine of every candidate, the
   exact BM25 of every candidate from all its postings with the same statistics), then
   `retrieval.fusion.HYBRID` -> one score in [0, 1], the floor and the top_k cap, all in
   PostgreSQL: the statement returns only the candidates kept and the counts (`_fused`).
   `WeightedFusion.score_one` stays the formula's reference; a test holds the statement to it.
The confidence gate (retrieval/confidence_gate.py) runs one broadened pass when the top fused
score is below the effective floor, and `retrieval.outcome.classify_ranked` — the one
classification rule — names the outcome from the counts.

Row-level security is on (the API's role, `app.org_id` set per transaction); every statement
also filters on org_id to keep the indexes in use. Each stage's time is a Prometheus histogram
(context_engine/metrics.py, operation "search").
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable

import asyncpg
import numpy as np
import orjson

from context_engine import validation
from context_engine.concurrency import alongside
from context_engine.errors import InvalidArgument
from context_engine.metrics import RETRIEVAL_PASSES, timed
from context_engine.scope import Scope
from context_engine.visibility import Visibility
from inference.query_vectors import QueryVectors
from inference.text_analysis import analyze
from projections.reads.corpus_totals import visible_totals
from projections.reads.quarantined_matches import Quarantined, quarantined_matches
from projections.reads.share_grants import held_sql
from projections.retrieval.bm25 import CorpusStats, idf_sql, minimum_should_match, query_idf_mass, term_score_sql
from projections.retrieval.confidence_gate import Pool, retrieve_with_gate_async
from projections.retrieval.fusion import HYBRID, ScoredCandidate, bm25_sql, cosine_sql, recency_sql
from projections.retrieval.outcome import RetrievalResult, classify_ranked, resolve_min_score, resolve_top_k
from projections.retrieval.recipe import (
    BROADEN_POSTINGS,
    EXACT_VECTOR_LEG_MAX_DOCS,
    FIRST_EF_SEARCH,
    MIN_POOL,
    NEIGHBOUR_REACH,
    POOL_PER_RESULT,
    POSTINGS_PER_TERM,
)
from projections.retrieval.recipes import SEARCH, BudgetDepth, RetrievalRecipe
from projections.store.pool import org_transaction

MAX_QUERY_BYTES = 16 * 1024
MAX_DOMAIN_CHARS = 128
# Search's two statements run on generic plans, planned once per connection: at Search's pools
# PostgreSQL's own choice kept planning the fusion statement for each call, and its generic plan
# runs faster too (7.3 -> 5.9 ms a call at 100,000 chunks, same results; docs/benchmarks.md,
# "Search under load"). At AssembleContext's deeper pools it made no difference, so there
# PostgreSQL chooses.
GENERIC_PLANS = {"plan_cache_mode": "force_generic_plan"}


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
    shared: dict[str, str] = field(default_factory=dict)  # result chunk id -> the share it came through
    quarantined: Quarantined = Quarantined(0)  # matches held back (projections/reads/quarantined_matches.py)

    def share_of(self, chunk_id: str) -> str:
        """The share a result came through, or "" for a chunk the caller sees by ownership."""
        return self.shared.get(chunk_id, "")


def validate(q: SearchQuery) -> tuple[str, str]:
    query = q.query.strip()
    if not query:
        raise InvalidArgument("query", "must not be empty")
    if len(q.query.encode()) > MAX_QUERY_BYTES:
        raise InvalidArgument("query", f"must be at most {MAX_QUERY_BYTES} bytes")
    domain = validation.label(q.domain.strip(), "domain", MAX_DOMAIN_CHARS)
    return query, domain


async def search(pool: asyncpg.Pool, query_vectors: QueryVectors, scope: Scope, q: SearchQuery,
                 tenant_min_score: float, *, recipe: RetrievalRecipe = SEARCH,
                 now: dt.datetime | None = None) -> SearchOutcome:
    """Retrieve for `q` as `recipe` says (projections/retrieval/recipes.py): its depth replaces
    `q.top_k` when it follows a budget (read from the visible corpus's totals on the retrieval's
    own transaction), its permission says which grants share a chunk, its plan mode how the
    statements are planned."""
    query, domain = validate(q)
    top_k = resolve_top_k(q.top_k)
    floor = resolve_min_score(q.min_score, tenant_min_score)
    settings = _pass_settings(FIRST_EF_SEARCH) | (GENERIC_PLANS if recipe.generic_plans else {})
    # The query embedding runs on its own thread while the statements before it need no vector.
    async with alongside(_embed_query(query_vectors, scope.org_id, query)) as embedding, \
            org_transaction(pool, scope.org_id, readonly=True, local=settings) as conn:
        if isinstance(recipe.depth, BudgetDepth):
            totals = await visible_totals(conn, scope.org_id, Visibility.of(scope))
            top_k = recipe.depth.of(totals.tokens, totals.chunks)
        retriever = _Retriever(conn, scope, domain, analyze(query), embedding, query_vectors.model_version,
                               now or dt.datetime.now(dt.UTC), floor, top_k, permission=recipe.permission)
        size = max(MIN_POOL, POOL_PER_RESULT * top_k)
        first = Pool(vector_k=size, bm25_k=size, ef_search=FIRST_EF_SEARCH)
        gate = await retrieve_with_gate_async(retriever.run, floor, first, top_score=lambda p: p.top_score)
        quarantined = await quarantined_matches(conn, scope.org_id, retriever.distinct_terms, retriever.scopes,
                                                domain)
    with timed("search", "classify"):
        fused: FusedPass = gate.candidates
        result = classify_ranked(fused.best, fused.above, fused.total, floor, top_k)
    shared = {c.chunk_id: retriever.shared[c.chunk_id] for c in result.results if c.chunk_id in retriever.shared}
    return SearchOutcome(result, gate.expansion_applied, query_vectors.model_version, shared, quarantined)


def _pass_settings(ef_search: int) -> dict[str, str]:
    return {"hnsw.ef_search": str(int(ef_search)), "hnsw.iterative_scan": "relaxed_order"}


def _scored(r: asyncpg.Record) -> ScoredCandidate:
    """A kept candidate of the fusion statement, with its ChunkHit."""
    chunk_id = str(r["chunk_id"])
    hit = ChunkHit(chunk_id, r["content"], r["source_kind"], str(r["source_event_id"]), r["session_id"],
                   r["chunk_index"], r["domain"], r["scope_path"], _metadata(r["metadata"]), r["created_at"], r["bm25"])
    return ScoredCandidate(chunk_id, r["score"], r["vector"], r["lexical"], r["recency"], hit, r["neighbour"])


async def _embed_query(query_vectors: QueryVectors, org_id: str, query: str) -> np.ndarray:
    with timed("search", "query_embedding"):
        return await query_vectors.vector(org_id, query)


# The visible corpus's N, total length and the query terms' df (maintained by the projector, plus
# the chunks shared with the caller by a live grant with permission `$9` it does not own-see,
# counted from their own rows: `shared`, returned with the grant each came through), and
# the lexical leg ranked: the best `$5` postings of each query term by impact (the partial index on
# searchable rows) within the caller's visibility, Okapi BM25 of each chunk over those postings
# (k1 1.2, b 0.75; a term weighs its idf times its count in the query, `$6`; a shared chunk's
# postings of the query terms are all read, once, for its df and its score), chunks holding at
# least `$7` distinct query terms (at most as many as the corpus holds), best first, ties in
# chunk-id text order, the first `$8`. Ranking in PostgreSQL returns `$8` ids instead of every
# posting read (~2,500 per query at Search's pools, ~5,000 at assembly's) for the API to decode.
_LEXICAL = f"""
WITH shared AS MATERIALIZED (
    SELECT h.resource_id AS chunk_id, h.share_id, h.term_count
    FROM ({held_sql("chunk", org="$1", paths="$3::text[]", permission="$9::text", columns="r.term_count",
                    resource_filter="r.searchable AND NOT (r.scope_path = ANY($3::text[])) "
                                    "AND ($4 = '' OR r.domain = $4)")}) AS h
), shared_postings AS MATERIALIZED (
    SELECT t.term, t.chunk_id, t.tf, t.doc_length FROM chunk_terms t
    WHERE t.org_id = $1 AND t.term = ANY($2::text[]) AND t.chunk_id = ANY(ARRAY(SELECT chunk_id FROM shared))
), s AS (
    SELECT (coalesce(sum(n_docs), 0) + (SELECT count(*) FROM shared))::bigint AS n,
           (coalesce(sum(total_length), 0) + (SELECT coalesce(sum(term_count), 0) FROM shared))::bigint AS total
    FROM corpus_stats WHERE org_id = $1 AND scope_path = ANY($3::text[]) AND ($4 = '' OR domain = $4)
), df AS (
    SELECT term, sum(df)::bigint AS df FROM (
        SELECT term, df FROM term_stats
        WHERE org_id = $1 AND term = ANY($2::text[]) AND scope_path = ANY($3::text[]) AND ($4 = '' OR domain = $4)
        UNION ALL
        SELECT term, count(*) FROM shared_postings GROUP BY term
    ) AS d
    GROUP BY term
), weights AS (
    SELECT q.term, {idf_sql("s.n", "df.df")} * q.times AS weight
    FROM unnest($2::text[], $6::int[]) AS q(term, times) JOIN df ON df.term = q.term CROSS JOIN s
    WHERE df.df > 0
), postings AS (
    SELECT p.chunk_id, w.weight, p.tf, p.doc_length
    FROM weights w
    CROSS JOIN LATERAL (
        SELECT chunk_id, tf, doc_length FROM chunk_terms
        WHERE org_id = $1 AND term = w.term AND searchable AND scope_path = ANY($3::text[])
          AND ($4 = '' OR domain = $4)
        ORDER BY impact DESC LIMIT $5
    ) AS p
    UNION ALL
    SELECT sp.chunk_id, w.weight, sp.tf, sp.doc_length FROM weights w JOIN shared_postings sp ON sp.term = w.term
), scored AS (
    SELECT p.chunk_id,
           sum({term_score_sql("p.weight", "p.tf", "p.doc_length", "(s.total::float8 / s.n)",
                               avgdl_positive="s.total > 0")}) AS score,
           count(*) AS held
    FROM postings p CROSS JOIN s
    GROUP BY p.chunk_id
), ranked AS (
    SELECT chunk_id FROM scored
    WHERE held >= least($7, (SELECT count(*) FROM weights))
    ORDER BY score DESC, chunk_id::text
    LIMIT $8
)
SELECT s.n, s.total,
       (SELECT array_agg(term) FROM df) AS df_terms, (SELECT array_agg(df) FROM df) AS df_values,
       (SELECT array_agg(chunk_id) FROM ranked) AS ranked,
       (SELECT array_agg(chunk_id ORDER BY chunk_id) FROM shared) AS shared_ids,
       (SELECT array_agg(share_id ORDER BY chunk_id) FROM shared) AS shared_via
FROM s
"""


def _neighbours_sql(reach: int) -> str:
    """The pre-lift scores of the candidates within `reach` places of this one in its session, as
    the arguments of `greatest`: the `reach` rows before and after it in the window's order (`seq`,
    then chunk index) that lie within `reach` turns (another event's chunk, `seq` up to `reach`
    away) or `reach` chunks of the same message. A row without a session (a pushed memory, a
    summary line) has a NULL `seq` and so no neighbour."""
    near = []
    for k in range(1, reach + 1):
        for fn in ("lag", "lead"):
            seq, index = f"{fn}(seq, {k}) OVER w", f"{fn}(chunk_index, {k}) OVER w"
            near.append(f"CASE WHEN ({seq} <> seq AND abs({seq} - seq) <= {reach})\n"
                        f"                      OR ({seq} = seq AND abs({index} - chunk_index) <= {reach})\n"
                        f"                    THEN {fn}(fused, {k}) OVER w END")
    return ",\n               ".join(near)


def _scored_sql(ids: str, dims: int) -> str:
    """The CTEs ending in `{ids}_scored`: each chunk of the CTE `ids` that the caller sees
    (searchable, scope or shared, domain), with its cosine (on the float32 vector), its exact
    BM25 from all its postings of the query terms, its recency, its session position and its
    HYBRID score before the lift. A pushed memory or a summary line has no session here."""
    w = HYBRID
    return f"""{ids}_signals AS (
    SELECT c.chunk_id, true AS candidate, c.created_at,
           CASE WHEN c.embedding_dims = {dims} AND c.embedding_model = $3
                THEN 1 - (c.embedding::vector({dims}) <=> $2::vector({dims})) END AS cosine,
           NULL::float8 AS bm25,
           CASE WHEN c.source_kind = 'event' THEN c.session_id END AS session_id, c.chunk_index, c.seq
    FROM chunks c
    WHERE c.org_id = $1 AND c.chunk_id = ANY(ARRAY(SELECT chunk_id FROM {ids})) AND c.searchable
      AND (c.scope_path = ANY($4::text[]) OR c.chunk_id = ANY($15::uuid[])) AND ($5 = '' OR c.domain = $5)
    UNION ALL
    SELECT t.chunk_id, false, NULL, NULL,
           {term_score_sql("q.weight", "t.tf", "t.doc_length", "$10::float8")}, NULL, NULL, NULL
    FROM chunk_terms t JOIN unnest($8::text[], $9::float8[]) AS q(term, weight) ON q.term = t.term
    WHERE t.org_id = $1 AND t.term = ANY($8::text[]) AND t.chunk_id = ANY(ARRAY(SELECT chunk_id FROM {ids}))
), {ids}_candidates AS (
    SELECT chunk_id, max(created_at) AS created_at, max(cosine) AS cosine, coalesce(sum(bm25), 0) AS bm25,
           max(session_id) AS session_id, max(chunk_index) AS chunk_index, max(seq) AS seq
    FROM {ids}_signals GROUP BY chunk_id HAVING bool_or(candidate)
), {ids}_components AS (
    SELECT chunk_id, created_at, cosine, bm25, session_id, chunk_index, seq,
           {cosine_sql("cosine")} AS vector,
           {bm25_sql("bm25", "$11::float8")} AS lexical,
           {recency_sql("created_at", "$12::timestamptz", w.recency_half_life_seconds)} AS recency
    FROM {ids}_candidates
), {ids}_scored AS MATERIALIZED (
    SELECT *, {w.score_sql("vector", "lexical", "recency")} AS fused
    FROM {ids}_components
)"""


def _fused(dims: int, *, exact: bool = False) -> str:
    """The vector leg (cosine over the HNSW index of the running embedder's dimension, whose
    graph holds half-precision copies of the vectors (migration 0012), top `$6`, same
    visibility; pgvector's iterative scan keeps filtering from starving it, up to its
    `hnsw.max_scan_tuples`; `exact`: ordered by the float32 cosine, an expression no index
    serves, for a visible corpus small enough to rank whole; the chunks shared with the caller
    `$15` are visible to it like its own), its union with the
    lexical leg's `$7`, and `retrieval.fusion.HYBRID` over that union: each candidate's cosine
    (on the float32 vector), its exact BM25 from all its postings of the query terms (`$8`, each
    term's weight idf x count in the query `$9`, mean length `$10`) normalised by the query's idf
    mass `$11`, its recency at `$12`, and the weighted score clamped to [0, 1] (`_scored_sql`).
    The turns within `NEIGHBOUR_REACH` of the first `$14` of that pool by this score are scored
    the same way and join the candidates (`near`): of the messages up to that many turns before
    or after a leader, their last or first `NEIGHBOUR_REACH` chunks, and of the leader's own
    message the chunks that many either side of it, each read on `chunks_session` (so a long
    message adds at most that many chunks, whatever its size). The lift below then reaches a turn
    beside a leading candidate whether or not a leg's pool held it, so the first results of a
    shallow call rank as those of a deep one (on LoCoMo, AssembleContext's prompt at 2,000 tokens
    held .839 of the evidence without them, .863 with them, as much as pools of 512 per leg gave).
    Every candidate is then lifted toward the best score of the candidates near it in its session
    (`WeightedFusion.lift`: in the session's order of `seq` then chunk index, the candidates up to
    `NEIGHBOUR_REACH` places before and after it that lie within that many turns, or chunks of the
    same message; a pushed memory or a summary has none, `_neighbours_sql`). The position comes
    with the chunk row the vector leg reads anyway (chunks.seq, migration 0026) and the neighbours
    from window functions in one pass: a join of the candidates with themselves ran as a nested
    loop under row-level security's estimates (3x the CPU of a Search), and a seq read from
    session_events per candidate cost +22%. For the same reason every set of ids is read through
    `= ANY(ARRAY(...))`, which the planner turns into index conditions whatever it estimates (a
    join of the pool with chunks scanned the pool once per chunk of the org). It returns the
    first `$14` candidates whose score clears the floor `$13`, best first, with their rows, and
    one summary row (`summary` true): how many candidates there were, how many cleared the floor
    and the top score (for the confidence gate). The pools' candidates are all counted, the turns
    beside the leaders only when they clear the floor: which turns those are depends on `$14`,
    and `results_below_threshold` counts what the floor removed from what the rankers produced,
    whatever top_k the caller asked for. One round trip, and ~150 rows instead of every
    candidate's row and postings (~1,100 at assembly's pools) for the API to decode and fuse.

    A candidate is read again under the same visibility as the legs (searchable, scope or
    shared, domain):
    the lexical ids come from an earlier statement, and a chunk quarantined or rolled back since
    then drops out. NaN and NULL score 0 as in Python (PostgreSQL orders NaN above every number
    and `greatest` skips NULLs, so both are spelled out). The arithmetic is the Python's, term
    by term, so the scores equal it up to rounding (the sums run in another order).

    The postings are not joined to the candidates: both are rows of one UNION ALL grouped by
    chunk id. Under row-level security the planner estimates one candidate row for an org of a
    few hundred chunks, and a join then ran by nested loop, aggregating the postings once per
    candidate (234 ms instead of 3 ms at 419 candidates on LoCoMo). Only the kept rows are read
    again, each by its key, for their content."""
    w = HYBRID
    at_place = "org_id = $1 AND session_id = place.session_id AND seq = place.seq"
    distance = (f"embedding::vector({dims}) <=> $2::vector({dims})" if exact
                else f"embedding::halfvec({dims}) <=> $2::vector({dims})::halfvec({dims})")
    return f"""
WITH vector_leg AS (
    SELECT chunk_id FROM chunks
    WHERE org_id = $1 AND embedding_dims = {dims} AND embedding_model = $3 AND searchable
      AND (scope_path = ANY($4::text[]) OR chunk_id = ANY($15::uuid[])) AND ($5 = '' OR domain = $5)
    ORDER BY {distance}
    LIMIT $6
), pool AS MATERIALIZED (
    SELECT chunk_id FROM vector_leg UNION SELECT unnest($7::uuid[])
), {_scored_sql("pool", dims)}, place AS MATERIALIZED (
    SELECT DISTINCT lead.session_id, lead.seq + d AS seq, d, CASE WHEN d = 0 THEN lead.chunk_index END AS at
    FROM (SELECT session_id, seq, chunk_index FROM pool_scored WHERE seq IS NOT NULL
          ORDER BY fused DESC, chunk_id::text LIMIT $14) AS lead
    CROSS JOIN generate_series(-{NEIGHBOUR_REACH}, {NEIGHBOUR_REACH}) AS d
), near AS MATERIALIZED (
    SELECT DISTINCT n.chunk_id FROM place CROSS JOIN LATERAL (
        (SELECT chunk_id FROM chunks WHERE place.d = 0 AND {at_place}
           AND chunk_index BETWEEN place.at - {NEIGHBOUR_REACH} AND place.at + {NEIGHBOUR_REACH})
        UNION ALL
        (SELECT chunk_id FROM chunks WHERE place.d > 0 AND {at_place} ORDER BY chunk_index LIMIT {NEIGHBOUR_REACH})
        UNION ALL
        (SELECT chunk_id FROM chunks WHERE place.d < 0 AND {at_place}
         ORDER BY chunk_index DESC LIMIT {NEIGHBOUR_REACH})
    ) AS n
    WHERE n.chunk_id <> ALL(ARRAY(SELECT chunk_id FROM pool))
), {_scored_sql("near", dims)}, scored AS (
    SELECT *, true AS pooled FROM pool_scored UNION ALL SELECT *, false FROM near_scored
), beside AS (
    SELECT *,
           greatest({_neighbours_sql(NEIGHBOUR_REACH)}) AS neighbour
    FROM scored WINDOW w AS (PARTITION BY session_id ORDER BY seq, chunk_index)
), lifted AS MATERIALIZED (
    SELECT *, {w.lift_sql("fused", "neighbour")} AS score FROM beside
), kept AS (
    SELECT * FROM lifted WHERE score >= $13::float8 ORDER BY score DESC, chunk_id::text LIMIT $14
)
SELECT false AS summary, k.chunk_id, c.content, c.source_kind, c.source_event_id, c.session_id, c.chunk_index,
       c.domain, c.scope_path, c.metadata::text AS metadata, k.created_at, k.cosine, k.bm25,
       k.vector, k.lexical, k.recency, coalesce(k.neighbour, 0.0::float8) AS neighbour, k.score,
       NULL::bigint AS total, NULL::bigint AS above
FROM kept k CROSS JOIN LATERAL (
    SELECT content, source_kind, source_event_id, session_id, chunk_index, domain, scope_path, metadata
    FROM chunks WHERE org_id = $1 AND chunk_id = k.chunk_id
) AS c
UNION ALL
SELECT true, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       max(score), count(*) FILTER (WHERE pooled OR score >= $13::float8),
       count(*) FILTER (WHERE score >= $13::float8)
FROM lifted
"""


@dataclass(frozen=True)
class FusedPass:
    """One retrieval pass as the statement returns it: the first `top_k` candidates that clear
    the floor, best first (ScoredCandidate, payload = its ChunkHit), how many candidates
    cleared it, how many there were, and the top fused score (None without candidates)."""

    best: list[ScoredCandidate]
    above: int
    total: int
    top_score: float | None


class _Retriever:
    """The passes of one retrieval, on the connection and read-only transaction `search` holds
    (begun with the first pass's HNSW settings)."""

    def __init__(self, conn: asyncpg.Connection, scope: Scope, domain: str, terms: list[str],
                 vector: Awaitable[np.ndarray], model_version: str, now: dt.datetime, floor: float,
                 top_k: int, *, permission: str = "read") -> None:
        self.conn = conn
        self.org_id = scope.org_id
        self.scopes = Visibility.of(scope).sql_paths
        self.domain = domain
        self.terms = terms
        self.term_counts = Counter(terms)  # each distinct term (first-seen order) and its count in the query
        self.distinct_terms = list(self.term_counts)
        self.vector = vector
        self.model_version = model_version
        self.now = now
        self.floor = floor
        self.top_k = top_k
        self.permission = permission  # the grants' permission that shares a chunk with this retrieval
        self.shared: dict[str, str] = {}  # chunk id -> share id, set by the lexical leg

    async def run(self, p: Pool) -> FusedPass:
        RETRIEVAL_PASSES.labels("broadened" if p.expanded else "first").inc()
        conn = self.conn
        if p.ef_search != FIRST_EF_SEARCH:  # the broadened pass explores more of the graph
            await conn.execute("SELECT set_config('hnsw.ef_search', $1, true)", str(int(p.ef_search)))
        with timed("search", "lexical_leg"):
            stats, lexical = await self._lexical_leg(p)
        with timed("search", "query_embedding_wait"):
            vector = await self.vector
        with timed("search", "vector_leg_and_fusion"):
            statement, args = self.fused_statement(p, stats, lexical, vector)
            rows = await conn.fetch(statement, *args)
        with timed("search", "results"):
            summary = next(r for r in rows if r["summary"])
            best = sorted((_scored(r) for r in rows if not r["summary"]), key=lambda c: (-c.score, c.chunk_id))
        return FusedPass(best, summary["above"], summary["total"], summary["score"])

    async def _lexical_leg(self, p: Pool) -> tuple[CorpusStats, list[Any]]:
        """The visible corpus's statistics, and the top `bm25_k` by BM25 over the union of each
        term's best postings (`postings_per_term` of them), ranked in PostgreSQL. A candidate's
        score here counts the terms whose best postings it is among; the exact score of every
        candidate is computed by the fusion statement from all its postings."""
        statement, args = self.lexical_statement(p)  # without terms: the statistics alone
        row = await self.conn.fetchrow(statement, *args)
        stats = CorpusStats.from_totals(row["n"], row["total"],
                                        dict(zip(row["df_terms"] or (), row["df_values"] or ())))
        self.shared = {str(c): str(g) for c, g in zip(row["shared_ids"] or (), row["shared_via"] or ())}
        return stats, list(row["ranked"] or ())

    def lexical_statement(self, p: Pool) -> tuple[str, tuple[Any, ...]]:
        """The lexical leg's statement and its arguments for pool `p` (bench/retrieval_floor.py
        times this and `fused_statement` on their own)."""
        per_term = max(POSTINGS_PER_TERM, 2 * p.bm25_k) * (BROADEN_POSTINGS if p.expanded else 1)
        # Terms the visible corpus does not hold at all cannot be required of a candidate: the
        # statement caps this at the number of query terms it holds.
        required = max(1, minimum_should_match(len(self.distinct_terms), p.bm25_min_match_fraction))
        return _LEXICAL, (self.org_id, self.distinct_terms, self.scopes, self.domain, per_term,
                          list(self.term_counts.values()), required, p.bm25_k, self.permission)

    def fused_statement(self, p: Pool, stats: CorpusStats, lexical: list[Any],
                        vector: np.ndarray) -> tuple[str, tuple[Any, ...]]:
        """The vector leg and fusion statement (`_fused`) and its arguments for pool `p`, given
        the lexical leg's statistics and ids and the query vector."""
        weights = [stats.idf(t) * n for t, n in self.term_counts.items()]
        mass = query_idf_mass(self.terms, stats) if self.terms else 0.0
        exact = stats.n_docs <= EXACT_VECTOR_LEG_MAX_DOCS
        return _fused(len(vector), exact=exact), (
            self.org_id, vector, self.model_version, self.scopes, self.domain, p.vector_k, lexical,
            self.distinct_terms, weights, stats.avgdl, mass, self.now, self.floor, self.top_k,
            [uuid.UUID(c) for c in self.shared])


def _metadata(text: str) -> dict[str, Any]:
    value = orjson.loads(text) if text else {}
    return value if isinstance(value, dict) else {}
