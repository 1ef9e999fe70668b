"""Search and Embed through gRPC with real tokens, the real worker (projector + embedding
pipeline) and PostgreSQL/pgvector: outcomes, the floor, isolation, BM25 against a reference,
the embedding cache."""

from __future__ import annotations

import dataclasses
import datetime as dt

import asyncpg
import grpc
import numpy as np
import orjson
import pytest
from pgvector.asyncpg import register_vector
from prometheus_client import REGISTRY

from context_engine.scope import Scope
from entrypoints.api.app import api_database_url
from inference.text_analysis import analyze
from inference.tokens import count_tokens
from projections.reads.search import _LEXICAL, SearchQuery, _fused, _Retriever
from projections.reads.search import search as search_projection
from projections.retrieval.bm25 import CorpusStats, bm25_scorer, query_idf_mass
from projections.retrieval.confidence_gate import Pool
from projections.retrieval.fusion import HYBRID, Candidate
from projections.retrieval.outcome import classify
from projections.retrieval.recipe import EXACT_VECTOR_LEG_MAX_DOCS, FIRST_EF_SEARCH, NEIGHBOUR_REACH
from projections.retrieval.recipes import assembly
from projections.store.migrations import APP_ROLE
from projections.store.pool import create_pool
from streams.record_auth import verifier_from_settings
from streams.replay import read_log, replay
from streams.topics import LogTopics
from tests.fixtures.bm25_reference import rank_bm25_lucene_idf
from tests.fixtures.calls import expect_error, ingest, session_version, wait_embedded
from tests.fixtures.databases import fresh_database
from tests.fixtures.engine import unique
from upsquad.context.v1 import context_pb2 as pb

pytestmark = pytest.mark.integration

OK, NO_RESULTS, BELOW = (pb.RETRIEVAL_OUTCOME_OK, pb.RETRIEVAL_OUTCOME_NO_RESULTS,
                         pb.RETRIEVAL_OUTCOME_BELOW_THRESHOLD)

TURNS = [
    "Caroline: I went to the LGBTQ support group yesterday and it was so powerful.",
    "Melanie: That's great! I painted a sunrise over the lake last week.",
    "Caroline: I'm researching adoption agencies, I want to give a child a loving home.",
    "Melanie: My kids loved the camping trip to the mountains in July.",
    "Caroline: The transgender conference in Boston was inspiring.",
]


async def search(caller, query: str, **fields) -> pb.SearchResponse:
    return await caller("Search", pb.SearchRequest(query=query, **fields))


@pytest.fixture(scope="module")
async def corpus(engine):
    org = unique("org")
    caller = engine.caller(org, "p", "t", "bot", clearance=1)
    await ingest(caller, "conv-1", TURNS)
    await wait_embedded(engine, org)
    return org, caller


async def test_search_finds_the_turn_and_says_why(corpus, engine):
    org, caller = corpus
    reply = await search(caller, "When did Caroline go to the LGBTQ support group?")
    assert reply.outcome == OK
    assert reply.effective_min_score == pytest.approx(engine.settings.retrieval_min_score)
    top = reply.results[0]
    assert "LGBTQ support group" in top.content
    assert 0 < top.score <= 1
    assert top.source.startswith("event:")
    meta = dict(top.metadata)
    assert meta["engine.session_id"] == "conv-1"
    assert float(meta["engine.score.vector"]) > 0 and float(meta["engine.score.lexical"]) > 0
    assert meta["engine.fusion"] == "hybrid-v3"
    assert [r.score for r in reply.results] == sorted((r.score for r in reply.results), reverse=True)


def _near(turn: int) -> list[int]:
    """The turns whose pre-lift score can lift `turn`'s: up to NEIGHBOUR_REACH before and after it."""
    return [turn + d for d in range(-NEIGHBOUR_REACH, NEIGHBOUR_REACH + 1) if d]


async def test_a_turn_rises_toward_the_better_turn_beside_it_in_its_session(engine):
    """The adjacent-turn lift, checked against its rule over a corpus small enough to come back
    whole: each result's `engine.score.neighbour` is the best pre-lift score of the results up to
    NEIGHBOUR_REACH turns before or after it in its own session, and its score is HYBRID.lift of its own."""
    org = unique("org")
    caller = engine.caller(org, "p", "t", "bot", clearance=1)
    sessions = {"conv-a": TURNS, "conv-b": ["Melanie: Did you go to the LGBTQ support group again?",
                                            "Caroline: Yes, on Tuesday, with my mum."]}
    position: dict[str, tuple[str, int]] = {}
    for session, texts in sessions.items():
        ids = await ingest(caller, session, texts)
        position.update({event_id: (session, i) for i, event_id in enumerate(ids)})
    await wait_embedded(engine, org)
    reply = await search(caller, "When did Caroline go to the LGBTQ support group?", min_score=1e-6, top_k=50)
    assert len(reply.results) == len(position)

    def own_score(m: dict[str, str]) -> float:
        return (HYBRID.w_vector * float(m["engine.score.vector"]) + HYBRID.w_bm25 * float(m["engine.score.lexical"])
                + HYBRID.w_recency * float(m["engine.score.recency"]))
    own = {position[dict(r.metadata)["engine.source_event_id"]]: own_score(dict(r.metadata)) for r in reply.results}
    lifted = set()
    for r in reply.results:
        meta = dict(r.metadata)
        session, i = position[meta["engine.source_event_id"]]
        neighbour = max((own[(session, j)] for j in _near(i) if (session, j) in own), default=None)
        assert float(meta["engine.score.neighbour"]) == pytest.approx(neighbour or 0.0, abs=1e-5), (session, i)
        assert r.score == pytest.approx(HYBRID.lift(own[(session, i)], neighbour), abs=1e-5), (session, i)
        if r.score > own[(session, i)] + 1e-4:
            lifted.add((session, i))
    assert ("conv-b", 1) in lifted  # the answer, beside the question that names the group


async def test_min_score_absent_zero_and_explicit(corpus, engine):
    _org, caller = corpus
    default = engine.settings.retrieval_min_score
    assert (await search(caller, "camping")).effective_min_score == pytest.approx(default)
    assert (await search(caller, "camping", min_score=0)).effective_min_score == pytest.approx(default)
    assert (await search(caller, "camping", min_score=0.05)).effective_min_score == pytest.approx(0.05)
    for bad in (-0.1, 1.5, float("nan")):
        await expect_error(grpc.StatusCode.INVALID_ARGUMENT, search(caller, "camping", min_score=bad),
                           field="min_score")


async def test_bad_search_input_names_the_field(corpus):
    _org, caller = corpus
    await expect_error(grpc.StatusCode.INVALID_ARGUMENT, search(caller, "   "), field="query")
    await expect_error(grpc.StatusCode.INVALID_ARGUMENT, search(caller, "x", top_k=-1), field="top_k")
    await expect_error(grpc.StatusCode.INVALID_ARGUMENT, search(caller, "x", top_k=257), field="top_k")


async def test_outcomes_and_the_below_threshold_denominator(corpus):
    _org, caller = corpus
    everything = await search(caller, "Caroline adoption agencies child", min_score=1e-6, top_k=50)
    assert everything.outcome == OK and everything.results_below_threshold == 0
    scores = [r.score for r in everything.results]
    total = len(scores)
    assert total == len(TURNS)  # a corpus this small: every visible chunk is a candidate

    floor = (scores[1] + scores[2]) / 2  # two clear it, the rest do not
    partial = await search(caller, "Caroline adoption agencies child", min_score=floor, top_k=50)
    assert partial.outcome == OK
    assert len(partial.results) == 2
    assert partial.results_below_threshold == total - 2

    capped = await search(caller, "Caroline adoption agencies child", min_score=floor, top_k=1)
    assert len(capped.results) == 1
    assert capped.results_below_threshold == total - 2  # the top_k cap is not the floor

    none_clear = await search(caller, "Caroline adoption agencies child", min_score=0.9999)
    assert none_clear.outcome == BELOW and not none_clear.results
    assert none_clear.results_below_threshold == total
    assert none_clear.effective_min_score == pytest.approx(0.9999)


def query_vectors(source: str) -> float:
    return REGISTRY.get_sample_value("context_engine_query_vectors_total", {"source": source}) or 0.0


async def test_a_repeated_query_reuses_its_vector_within_the_org_only(corpus, engine):
    org, caller = corpus
    query = f"What did Melanie paint? {unique('q')}"
    computed, remembered = query_vectors("computed"), query_vectors("remembered")
    first = await search(caller, query)
    again = await search(caller, query)
    assert (query_vectors("computed"), query_vectors("remembered")) == (computed + 1, remembered + 1)
    assert first.results and [r.chunk_id for r in again.results] == [r.chunk_id for r in first.results]
    # the same cosines and BM25; only the recency term moves with the clock between the calls
    assert [r.score for r in again.results] == pytest.approx([r.score for r in first.results], abs=1e-6)
    await search(engine.caller(unique("org"), clearance=1), query)  # another org: its own run
    assert (query_vectors("computed"), query_vectors("remembered")) == (computed + 2, remembered + 1)


async def test_no_results_in_an_empty_corpus(engine):
    caller = engine.caller(unique("org"), clearance=1)
    reply = await search(caller, "anything at all")
    assert reply.outcome == NO_RESULTS
    assert not reply.results and reply.results_below_threshold == 0
    assert reply.effective_min_score > 0


async def test_visibility_own_scope_and_ancestors_never_siblings_or_other_orgs(engine):
    org = unique("org")
    org_level = engine.caller(org, clearance=1)
    team_a = engine.caller(org, "p", "team-a", "bot", clearance=1)
    team_b = engine.caller(org, "p", "team-b", "bot", clearance=1)
    await ingest(org_level, "handbook", ["Expense reports are due on the fifth working day."])
    await ingest(team_a, "notes", ["The zebra migration dashboard lives at go/zebra."])
    await wait_embedded(engine, org)

    def contents(reply):
        return " ".join(r.content for r in reply.results)

    assert "zebra" in contents(await search(team_a, "zebra migration dashboard", min_score=1e-6))
    assert "Expense" in contents(await search(team_a, "expense reports due", min_score=1e-6))
    sibling = await search(team_b, "zebra migration dashboard", min_score=1e-6)
    assert "zebra" not in contents(sibling)
    assert "zebra" not in contents(await search(org_level, "zebra migration dashboard", min_score=1e-6))
    stranger = engine.caller(unique("org"), "p", "team-a", "bot", clearance=1)
    assert (await search(stranger, "zebra migration dashboard", min_score=1e-6)).outcome == NO_RESULTS


async def test_domain_filter(engine):
    org = unique("org")
    caller = engine.caller(org, clearance=1)
    await ingest(caller, "s", ["Refund policy: thirty days for every order."], domain="billing")
    await ingest(caller, "s", ["Refund the customer when the router fails twice."], domain="support")
    await wait_embedded(engine, org)
    billing = await search(caller, "refund", domain="billing", min_score=1e-6)
    assert [dict(r.metadata)["engine.domain"] for r in billing.results] == ["billing"]


async def test_rolled_back_turns_leave_the_search(engine):
    org = unique("org")
    caller = engine.caller(org, clearance=4)
    await ingest(caller, "s", ["The launch codename is Bluebird."])
    version = await session_version(engine, org, "s")
    await ingest(caller, "s", ["Correction: the launch codename is Kestrel."])
    before = await search(caller, "launch codename Kestrel", min_score=1e-6)
    assert any("Kestrel" in r.content for r in before.results)
    await caller("RollbackContext", pb.RollbackContextRequest(session_id="s", target_version_hash=version))
    after = await search(caller, "launch codename Kestrel", min_score=1e-6)
    assert all("Kestrel" not in r.content for r in after.results)
    assert any("Bluebird" in r.content for r in after.results)


async def test_bm25_equals_the_reference_over_the_visible_corpus(engine):
    org = unique("org")
    caller = engine.caller(org, "p", "t", clearance=1)
    hidden = engine.caller(org, "p", "other", clearance=1)  # a sibling: not in the caller's corpus
    docs = ["the quick brown fox jumps over the lazy dog", "a quick brown dog outpaces a quick red fox",
            "lazy afternoons by the river", "foxes and dogs are rarely friends", "quick quick quick"]
    await ingest(caller, "s", docs)
    await ingest(hidden, "s-other", ["quick fox " * 20])
    await wait_embedded(engine, org)
    query = "quick fox dog"
    reply = await search(caller, query, min_score=1e-6, top_k=50)
    reference = rank_bm25_lucene_idf()([analyze(d) for d in docs], k1=1.2, b=0.75)
    expected = dict(zip(docs, reference.get_scores(analyze(query))))
    got = {r.content: float(dict(r.metadata)["engine.bm25"]) for r in reply.results}
    assert set(got) <= set(expected)
    for content, score in got.items():
        assert score == pytest.approx(expected[content], abs=1e-5), content
    assert {d for d, s in expected.items() if s > 0} <= set(got)

    # The lexical leg ranks in PostgreSQL: the reference's order over the visible corpus (ties by
    # chunk id), keeping chunks that hold at least half the distinct query terms (2 of 3).
    conn = await asyncpg.connect(engine.settings.database_url)
    retriever = _Retriever(conn, Scope(org, "p", "t"), "", analyze(query), None, "", None, 1e-6, 50)
    try:
        async with conn.transaction():
            await conn.execute("SELECT set_config('app.org_id', $1, true)", org)
            _stats, ranked = await retriever._lexical_leg(Pool(bm25_k=50))
            content = dict(await conn.fetch("SELECT chunk_id, content FROM chunks WHERE chunk_id = ANY($1::uuid[])",
                                            ranked))
    finally:
        await conn.close()
    terms = set(analyze(query))
    held = {d: len(terms & set(analyze(d))) for d in docs}
    assert [content[c] for c in ranked] == sorted((d for d in docs if held[d] >= 2), key=lambda d: -expected[d])


def plan_nodes(node: dict):
    yield node
    for child in node.get("Plans", ()):
        yield from plan_nodes(child)


async def _fused_as_app(engine, org: str, query: str, *, floor: float, top_k: int, vector_k: int = 50,
                        explain: bool = False, scopes: list[str] | None = None, lexical: bool = True,
                        vector_order: str = "chunk_id", shared_first: bool = False):
    """The fusion statement (`_fused`) as the API's role: every chunk of the org a lexical
    candidate (none unless `lexical`), the vector of the first chunk in `vector_order` as the
    query vector. Returns its rows, the statistics it was given, each chunk's postings of the
    query terms (and its length under ""), the ids, the time it scored recency at, and the plan
    when `explain`. `shared_first`: that first chunk is shared with the caller, as by a grant."""
    terms = analyze(query)
    now = dt.datetime.now(dt.UTC)
    conn = await asyncpg.connect(engine.settings.database_url)
    # the corpus's caller
    retriever = _Retriever(conn, Scope(org, "p", "t", "bot"), "", terms, None, "", None, floor, top_k)
    try:
        await register_vector(conn)
        async with conn.transaction():
            await conn.execute(f"SET LOCAL ROLE {APP_ROLE}")
            await conn.execute("SELECT set_config('app.org_id', $1, true)", org)
            stats, _ranked = await retriever._lexical_leg(Pool(bm25_k=50))
            vector, model, ids, first = await conn.fetchrow(
                f"SELECT (array_agg(embedding ORDER BY {vector_order}))[1], max(embedding_model), array_agg(chunk_id), "
                f"(array_agg(chunk_id ORDER BY {vector_order}))[1] FROM chunks")
            distinct = list(retriever.term_counts)
            args = (org, vector, model, scopes or retriever.scopes, "", vector_k, ids if lexical else [], distinct,
                    [stats.idf(t) * n for t, n in retriever.term_counts.items()], stats.avgdl,
                    query_idf_mass(terms, stats), now, floor, top_k, [first] if shared_first else [])
            plan = await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + _fused(384), *args) if explain else None
            rows = await conn.fetch(_fused(384), *args)
            postings = {r["chunk_id"]: dict(zip(r["terms"], r["tfs"])) | {"": r["doc_length"]}
                        for r in await conn.fetch(
                "SELECT chunk_id, array_agg(term) AS terms, array_agg(tf) AS tfs, max(doc_length) AS doc_length "
                "FROM chunk_terms WHERE term = ANY($1::text[]) GROUP BY chunk_id", distinct)}
    finally:
        await conn.close()
    return rows, stats, postings, ids, now, plan


async def test_the_candidates_postings_are_read_once_under_row_level_security(corpus, engine):
    """As the API's role, in an org of a few chunks, the planner misjudged the candidates at one
    row and read their postings once per candidate (234 ms at 419 candidates): the statement must
    read chunk_terms in one pass whatever it estimates."""
    org, _caller = corpus
    rows, _stats, postings, ids, _now, plan = await _fused_as_app(
        engine, org, "support group sunrise camping conference", floor=1e-6, top_k=50, explain=True)
    reads = [n for n in plan_nodes(orjson.loads(plan)[0]["Plan"]) if n.get("Relation Name") == "chunk_terms"]
    assert reads and all(n["Actual Loops"] == 1 for n in reads)
    summary = next(r for r in rows if r["summary"])
    assert summary["total"] == summary["above"] == len(ids)
    assert sorted(str(r["chunk_id"]) for r in rows if not r["summary"]) == sorted(map(str, ids))
    assert len(postings) == 4  # the turns holding a query term: all but the adoption one


async def test_the_turns_beside_a_leading_candidate_are_scored_when_no_pool_held_them(corpus, engine):
    """The lift reaches past the pools: a pool of one turn (the first, the query being its own
    vector; no lexical candidate) brings the turns within NEIGHBOUR_REACH of it into the fusion,
    scored exactly as when every turn is a candidate, and no turn further away."""
    org, _caller = corpus
    query = "support group camping trip with the kids"
    alone, *_ = await _fused_as_app(engine, org, query, floor=1e-6, top_k=50, vector_k=1, lexical=False,
                                    vector_order="seq")
    every, *_ = await _fused_as_app(engine, org, query, floor=1e-6, top_k=50, vector_order="seq")
    got = {TURNS.index(r["content"]): r for r in alone if not r["summary"]}
    assert sorted(got) == list(range(NEIGHBOUR_REACH + 1))  # the first turn and the ones after it within reach
    assert next(r for r in alone if r["summary"])["total"] == NEIGHBOUR_REACH + 1
    reference = {TURNS.index(r["content"]): r for r in every if not r["summary"]}
    for turn, row in got.items():
        for name in ("cosine", "bm25", "vector", "lexical"):
            assert row[name] == pytest.approx(reference[turn][name], rel=1e-12, abs=1e-12), (turn, name)
        assert row["recency"] == pytest.approx(reference[turn]["recency"], abs=1e-5)  # the two calls' clocks
    assert got[0]["score"] == pytest.approx(reference[0]["score"], abs=1e-5)  # all its neighbours are there


async def test_the_fusion_statement_computes_hybrid_exactly(corpus, engine):
    """PostgreSQL fuses (`_fused`); `WeightedFusion.score_one`, `WeightedFusion.lift` and
    `bm25_scorer` stay the reference: every kept candidate's BM25, components, neighbour and score
    equal theirs (the corpus is one session of TURNS, in order), the floor and top_k cut where
    `classify` would, and the summary counts what the floor removed."""
    org, _caller = corpus
    query = "support group camping trip with the kids"
    rows, stats, postings, ids, now, _plan = await _fused_as_app(engine, org, query, floor=1e-6, top_k=50)
    scorer = bm25_scorer(analyze(query), stats)
    fused = {}
    for r in (r for r in rows if not r["summary"]):
        held = postings.get(r["chunk_id"], {"": 0})
        bm25 = scorer({t: n for t, n in held.items() if t}, held[""]) if r["chunk_id"] in postings else 0.0
        assert r["bm25"] == pytest.approx(bm25, rel=1e-12, abs=1e-12)
        fused[TURNS.index(r["content"])] = HYBRID.score_one(
            Candidate(str(r["chunk_id"]), r["cosine"], bm25, r["created_at"]), now=now,
            query_idf_mass=query_idf_mass(analyze(query), stats))
    reference = {}
    for r in (r for r in rows if not r["summary"]):
        turn = TURNS.index(r["content"])
        neighbour = max((fused[t].score for t in _near(turn) if t in fused), default=None)
        expected = dataclasses.replace(fused[turn], score=HYBRID.lift(fused[turn].score, neighbour),
                                       neighbour=neighbour or 0.0)
        for name in ("score", "vector", "lexical", "recency", "neighbour"):
            assert r[name] == pytest.approx(getattr(expected, name), rel=1e-12, abs=1e-12), name
        reference[str(r["chunk_id"])] = expected
    assert len(reference) == len(ids)
    assert [t for t, own in fused.items() if reference[own.chunk_id].score > own.score]  # a turn was lifted
    assert any(s.lexical > 0 for s in reference.values()) and any(s.lexical == 0 for s in reference.values())

    scores = sorted(s.score for s in reference.values())
    floor = (scores[1] + scores[2]) / 2  # two candidates under it
    rows, *_ = await _fused_as_app(engine, org, query, floor=floor, top_k=2)
    want = classify(list(reference.values()), floor, 2)
    summary = next(r for r in rows if r["summary"])
    assert [str(r["chunk_id"]) for r in sorted((r for r in rows if not r["summary"]), key=lambda r: -r["score"])] \
        == [c.chunk_id for c in want.results]
    assert (summary["total"], summary["total"] - summary["above"]) == (len(ids), want.results_below_threshold) \
        == (len(ids), 2)
    assert summary["score"] == max(r["score"] for r in rows if not r["summary"])
    assert summary["score"] == pytest.approx(scores[-1], abs=1e-6)  # a moment later: recency moved


async def test_the_gate_broadens_once_within_the_retrieval_transaction(corpus, engine):
    """A top score under the floor runs the one broadened pass (wider pools, a larger
    ef_search set on the transaction the first pass used): two passes, one answer."""
    _org, caller = corpus

    def passes(kind: str) -> float:
        return REGISTRY.get_sample_value("context_engine_retrieval_passes_total", {"pass": kind}) or 0.0

    first, broadened = passes("first"), passes("broadened")
    reply = await search(caller, "camping trip in the mountains", min_score=0.9999)
    assert (passes("first") - first, passes("broadened") - broadened) == (1, 1)
    assert reply.outcome == BELOW and reply.results_below_threshold == len(TURNS)
    ok = await search(caller, "camping trip in the mountains", min_score=1e-6)
    assert ok.outcome == OK and dict(ok.results[0].metadata)["engine.expansion_applied"] == "false"


async def test_search_plans_generically_and_assembly_depth_lets_postgresql_choose(corpus, engine):
    """Search's two statements run on generic plans from the first call (no custom planning per
    call); with a depth (AssembleContext) PostgreSQL's own choice applies, which plans its first
    executions custom. Read from the server's own counts for the API role's one connection."""
    org, _caller = corpus
    pool = await create_pool(api_database_url(engine.settings), min_size=1, max_size=1)
    vectors = engine.deps.query_vectors  # the in-process API's own

    async def plans() -> list[tuple[int, int]]:
        async with pool.acquire() as conn:
            rows = {r["statement"]: (r["generic_plans"], r["custom_plans"]) for r in await conn.fetch(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")}
        return [rows.get(_LEXICAL), rows.get(_fused(384, exact=True))]  # a small corpus: ranked exactly

    try:
        for _ in range(3):
            result = await search_projection(pool, vectors, Scope(org, "p", "t", "bot"),
                                             SearchQuery("camping trip in the mountains"), 0.35)
            assert result.result.results
        assert await plans() == [(3, 0), (3, 0)]
        await search_projection(pool, vectors, Scope(org, "p", "t", "bot"),
                                SearchQuery("camping trip in the mountains"), 0.35, recipe=assembly(60))
        assert [custom for _generic, custom in await plans()] == [1, 1]
    finally:
        await pool.close()


async def test_the_fusion_statement_rechecks_the_visibility_of_lexical_ids(corpus, engine):
    """The lexical leg's ids come from an earlier statement: the fusion statement keeps only
    those still visible to the caller (here: a scope that owns none of them)."""
    org, _caller = corpus
    rows, *_ = await _fused_as_app(engine, org, "support group camping", floor=1e-6, top_k=50,
                                   scopes=[f"{org}/elsewhere"])
    assert [r["total"] for r in rows if r["summary"]] == [0] and not [r for r in rows if not r["summary"]]


async def test_the_turns_beside_a_shared_turn_stay_out_of_sight(corpus, engine):
    """A caller that sees one turn of a session only through a share gets that turn, and none
    of the turns beside it that the lift would look up: each neighbour is read under the same
    visibility as the legs."""
    org, _caller = corpus
    rows, *_ = await _fused_as_app(engine, org, "support group camping", floor=1e-6, top_k=50, vector_k=5,
                                   lexical=False, vector_order="seq", scopes=[f"{org}/elsewhere"], shared_first=True)
    assert [TURNS.index(r["content"]) for r in rows if not r["summary"]] == [0]
    assert [r["total"] for r in rows if r["summary"]] == [1]
    own, *_ = await _fused_as_app(engine, org, "support group camping", floor=1e-6, top_k=50, vector_k=1,
                                  lexical=False, vector_order="seq")
    assert sorted(TURNS.index(r["content"]) for r in own if not r["summary"]) == [0, 1, 2]  # the owner's call


async def test_the_floor_count_holds_what_the_rankers_produced_whatever_top_k(corpus, engine):
    """results_below_threshold counts what the floor removed from the rankers' candidates, not
    from the turns looked up beside the first top_k of them: at the same pools, a call of 1 and a
    call of 2 count the same (here the floor removes everything: the two pooled turns)."""
    org, _caller = corpus
    counts = []
    for top_k in (1, 2):
        rows, *_ = await _fused_as_app(engine, org, "support group camping", floor=0.99, top_k=top_k, vector_k=2,
                                       lexical=False, vector_order="seq")
        summary = next(r for r in rows if r["summary"])
        counts.append((summary["total"], summary["above"]))
    assert counts == [(2, 0), (2, 0)]


async def test_a_long_message_beside_a_leader_adds_only_its_nearest_chunks(engine):
    """Of a message of many chunks after a leading turn, only its first NEIGHBOUR_REACH chunks are
    looked up: what the neighbours cost does not grow with a message's size."""
    org = unique("org")
    caller = engine.caller(org, "p", "t", "bot", clearance=1)
    long_text = " ".join(f"Sentence {i} says the garden grew tomatoes, beans and squash all summer." for i in range(80))
    first, long_id, last = await ingest(caller, "conv-1", [TURNS[0], long_text, TURNS[1]])
    await wait_embedded(engine, org)
    every, *_ = await _fused_as_app(engine, org, "garden support group", floor=1e-6, top_k=50)
    assert sum(str(r["source_event_id"]) == long_id for r in every if not r["summary"]) > 2 * NEIGHBOUR_REACH
    rows, *_ = await _fused_as_app(engine, org, "garden support group", floor=1e-6, top_k=50, vector_k=1,
                                   lexical=False, vector_order="seq, chunk_index")
    got = sorted((str(r["source_event_id"]), r["chunk_index"]) for r in rows if not r["summary"])
    assert got == sorted([(first, 0), *((long_id, i) for i in range(NEIGHBOUR_REACH)), (last, 0)])


async def test_a_small_corpus_is_searched_exactly_whatever_other_orgs_hold(engine):
    """pgvector's HNSW graph holds every org's vectors, filters by org after the walk, and its
    iterative scan stops at `hnsw.max_scan_tuples`: when the planner walked the index (it does
    once the table is large, whatever the org's size), a small org behind a crowd of nearer
    vectors of another org lost candidates. A visible corpus of up to EXACT_VECTOR_LEG_MAX_DOCS
    chunks is ranked exactly, so every visible chunk is a candidate at any scan budget, even
    with the planner pushed towards the index (sorts and sequential scans off)."""
    crowd_org, org = unique("org"), unique("org")
    crowd = engine.caller(crowd_org, "p", "t", "bot", clearance=1)
    query = "Caroline adoption agencies child"
    await ingest(crowd, "crowd", [f"{query} {i}" for i in range(3 * FIRST_EF_SEARCH)])
    await ingest(engine.caller(org, "p", "t", "bot", clearance=1), "conv-1", TURNS)
    await wait_embedded(engine, crowd_org)
    await wait_embedded(engine, org)
    pool = await create_pool(api_database_url(engine.settings), min_size=1, max_size=1,
                             server_settings={"hnsw.max_scan_tuples": "1", "enable_sort": "off",
                                              "enable_seqscan": "off"})
    try:
        outcome = await search_projection(pool, engine.deps.query_vectors, Scope(org, "p", "t", "bot"),
                                          SearchQuery(query, min_score=1e-6, top_k=50), 0.35)
    finally:
        await pool.close()
    assert len(outcome.result.results) + outcome.result.results_below_threshold == len(TURNS)


def test_the_vector_leg_walks_the_index_only_past_the_exact_limit():
    retriever = _Retriever(None, Scope("org", "p", "t", "bot"), "", ["camping"], None, "m", None, 0.25, 10)
    vector = np.zeros(384, dtype=np.float32)
    for n_docs, exact in ((0, True), (EXACT_VECTOR_LEG_MAX_DOCS, True), (EXACT_VECTOR_LEG_MAX_DOCS + 1, False)):
        statement, _args = retriever.fused_statement(Pool(), CorpusStats(n_docs, 10.0), [], vector)
        assert statement == _fused(384, exact=exact) and ("halfvec" in statement.split("LIMIT $6")[0]) != exact


async def test_the_vector_leg_can_use_the_half_precision_hnsw_index(corpus, engine):
    """The vector leg's ORDER BY must be the index's expression (half precision since migration
    0012), or the leg silently becomes an exact scan of the whole org: with sequential scans and
    sorts off (for a few chunks the planner prefers reading them all and sorting), the plan walks
    chunks_embedding_384, the one path that yields the rows in distance order."""
    org, _caller = corpus
    conn = await asyncpg.connect(engine.settings.database_url)
    try:
        await register_vector(conn)
        assert "halfvec_cosine_ops" in await conn.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'chunks_embedding_384'")
        async with conn.transaction():
            await conn.execute(f"SET LOCAL ROLE {APP_ROLE}")
            await conn.execute("SELECT set_config('app.org_id', $1, true)", org)
            await conn.execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off")
            vector, model = await conn.fetchrow("SELECT (array_agg(embedding))[1], max(embedding_model) FROM chunks")
            plan = await conn.fetchval("EXPLAIN (FORMAT JSON) " + _fused(384), org, vector, model, [org], "", 50,
                                       [], ["support"], [1.0], 10.0, 1.0, dt.datetime.now(dt.UTC), 0.25, 10, [])
    finally:
        await conn.close()
    assert "chunks_embedding_384" in {n.get("Index Name") for n in plan_nodes(orjson.loads(plan)[0]["Plan"])}


async def test_embed_limits_and_model_assertion(engine):
    caller = engine.caller(unique("org"), clearance=1)
    await expect_error(grpc.StatusCode.INVALID_ARGUMENT,
                       caller("Embed", pb.EmbedRequest(texts=["x"] * 101)), field="texts")
    await expect_error(grpc.StatusCode.INVALID_ARGUMENT, caller("Embed", pb.EmbedRequest(texts=[])), field="texts")
    await expect_error(grpc.StatusCode.INVALID_ARGUMENT,
                       caller("Embed", pb.EmbedRequest(texts=["x"], model_version="text-embedding-3-small")),
                       field="model_version")
    full = await caller("Embed", pb.EmbedRequest(texts=["x"] * 100))
    assert len(full.embeddings) == 100
    again = await caller("Embed", pb.EmbedRequest(texts=["x"], model_version=full.model_version))
    assert again.model_version == full.model_version


async def test_embed_cached_vs_fresh(engine):
    org = unique("org")
    caller = engine.caller(org, clearance=1)
    texts = [f"fresh text {unique('t')}", "the second text", "the second text"]
    first = await caller("Embed", pb.EmbedRequest(texts=texts))
    assert [e.cached for e in first.embeddings] == [False, False, False]
    assert len(first.embeddings[0].values) == 384
    vectors = [np.array(e.values) for e in first.embeddings]
    assert np.linalg.norm(vectors[0]) == pytest.approx(1.0, abs=1e-4)
    assert np.allclose(vectors[1], vectors[2])
    second = await caller("Embed", pb.EmbedRequest(texts=[texts[1], texts[0], "new one"]))
    assert [e.cached for e in second.embeddings] == [True, True, False]
    assert np.allclose(np.array(second.embeddings[0].values), vectors[1], atol=1e-6)
    other_org = engine.caller(unique("org"), clearance=1)  # the cache is per org
    assert not (await other_org("Embed", pb.EmbedRequest(texts=[texts[1]]))).embeddings[0].cached


async def test_embed_reuses_vectors_the_pipeline_recorded(corpus):
    _org, caller = corpus
    reply = await caller("Embed", pb.EmbedRequest(texts=[TURNS[0]]))
    assert reply.embeddings[0].cached


async def test_replay_restores_chunks_and_vectors_without_an_embedder(corpus, engine):
    """Vectors are facts on the log (embedding.recorded): a replay into an empty database gives
    the same chunks, postings, statistics and vectors, and computes no embedding."""
    org, _caller = corpus
    settings = engine.settings
    async with fresh_database(settings.database_url, "ce_test_replay_chunks") as target:
        await replay(read_log(settings.kafka_bootstrap, LogTopics.from_settings(settings).events,
                              verifier=verifier_from_settings(settings)), target)
        queries = [
            "SELECT chunk_id, content_hash, term_count, searchable, embedding_model, embedding::text "
            "FROM chunks WHERE org_id = $1 ORDER BY chunk_id",
            "SELECT term, chunk_id, tf, impact FROM chunk_terms WHERE org_id = $1 ORDER BY term, chunk_id",
            "SELECT scope_path, domain, term, df FROM term_stats WHERE org_id = $1 ORDER BY 1, 2, 3",
            "SELECT scope_path, domain, n_docs, total_length, token_total FROM corpus_stats WHERE org_id = $1 "
            "ORDER BY 1, 2",
        ]
        live, rebuilt = await asyncpg.connect(settings.database_url), await asyncpg.connect(target)
        try:
            for sql in queries:
                expected = [tuple(r) for r in await live.fetch(sql, org)]
                assert expected and [tuple(r) for r in await rebuilt.fetch(sql, org)] == expected, sql
            assert await rebuilt.fetchval(
                "SELECT count(*) FROM chunks WHERE org_id = $1 AND embedding IS NULL", org) == 0
            # Replay builds the vector and posting indexes after the last event: all are there again,
            # the primary key as a constraint.
            index_defs = ("SELECT indexname, indexdef FROM pg_indexes WHERE tablename IN ('chunks', 'chunk_terms') "
                          "ORDER BY 1")
            assert ([tuple(r) for r in await rebuilt.fetch(index_defs)]
                    == [tuple(r) for r in await live.fetch(index_defs)])
            assert {"chunks_embedding_384", "chunk_terms_impact", "chunk_terms_pkey"} <= {
                r["indexname"] for r in await rebuilt.fetch(index_defs)}
            assert await rebuilt.fetchval("SELECT count(*) FROM pg_constraint "
                                          "WHERE conrelid = 'chunk_terms'::regclass AND contype = 'p'") == 1
        finally:
            await live.close()
            await rebuilt.close()


async def test_term_statistics_follow_rollbacks(engine):
    """df per term is kept by deltas; after a rollback it equals a count over the searchable
    postings, rows that reach zero are gone, and a replay (which recounts instead of adding
    deltas) gives the same rows."""
    org = unique("org")
    caller = engine.caller(org, clearance=4)
    await ingest(caller, "s", ["apples and pears", "apples again"])
    version = await session_version(engine, org, "s")
    await ingest(caller, "s", ["apples a third time", "plums"])
    await caller("RollbackContext", pb.RollbackContextRequest(session_id="s", target_version_hash=version))
    conn = await asyncpg.connect(engine.settings.database_url)
    try:
        kept = {r["term"]: r["df"] for r in await conn.fetch(
            "SELECT term, sum(df) AS df FROM term_stats WHERE org_id = $1 GROUP BY term", org)}
        counted = {r["term"]: r["n"] for r in await conn.fetch(
            "SELECT term, count(*) AS n FROM chunk_terms WHERE org_id = $1 AND searchable GROUP BY term", org)}
        n_docs, tokens = await conn.fetchrow(
            "SELECT sum(n_docs), sum(token_total) FROM corpus_stats WHERE org_id = $1", org)
        counted_tokens = await conn.fetchval(
            "SELECT sum(token_count) FROM chunks WHERE org_id = $1 AND searchable", org)
    finally:
        await conn.close()
    assert kept == counted == {"apples": 2, "pears": 1, "again": 1}
    assert n_docs == 2
    assert tokens == counted_tokens == count_tokens("apples and pears") + count_tokens("apples again")

    settings = engine.settings
    async with fresh_database(settings.database_url, "ce_test_replay_stats") as target:
        await replay(read_log(settings.kafka_bootstrap, LogTopics.from_settings(settings).events,
                              verifier=verifier_from_settings(settings)), target)
        live, rebuilt = await asyncpg.connect(settings.database_url), await asyncpg.connect(target)
        try:
            for sql in ("SELECT scope_path, domain, term, df FROM term_stats WHERE org_id = $1 ORDER BY 1, 2, 3",
                        "SELECT scope_path, domain, n_docs, total_length, token_total FROM corpus_stats "
                        "WHERE org_id = $1 ORDER BY 1, 2"):
                assert ([tuple(r) for r in await rebuilt.fetch(sql, org)]
                        == [tuple(r) for r in await live.fetch(sql, org)])
        finally:
            await live.close()
            await rebuilt.close()


async def test_the_backlog_sweep_pages_through_every_unembedded_chunk_once(engine):
    """What the worker's sweep walks after a broker restart lost the queued EmbeddingJobs: pages
    by (created_at, chunk_id), so chunks embedded meanwhile (their vectors still on the way
    through the log) are never fetched twice and a large backlog is covered in one sweep."""
    from projections.store.pool import create_pool
    from streams.embedding_pipeline import EmbeddingPipeline

    org = unique("backlog")
    caller = engine.caller(org, clearance=1)
    await ingest(caller, "s", TURNS)
    await wait_embedded(engine, org)
    admin = await create_pool(engine.settings.database_url, org_scoped=False)
    try:
        ours = {str(r["chunk_id"]) for r in await admin.fetch(
            "UPDATE chunks SET embedding = NULL, embedding_model = NULL WHERE org_id = $1 RETURNING chunk_id", org)}
        assert len(ours) == len(TURNS)
        pipeline = EmbeddingPipeline(admin, engine.deps.embedder, send=None)
        seen: list[str] = []
        pages, after = 0, None
        while True:
            page, after = await pipeline.backlog(older_than=dt.timedelta(0), limit=2, after=after)
            pages += 1
            assert sum(map(len, page.values())) <= 2
            seen += page.get(org, [])
            if after is None:
                break
        assert sorted(seen) == sorted(ours) and len(seen) == len(ours)  # each exactly once
        assert pages >= 3
    finally:
        await admin.close()
