"""PostgreSQL's own time for one AssembleContext retrieval, with nothing else running.

Starts only the embedded PostgreSQL of a data directory a load bench left (`bench/search.py
--home DIR --keep`), and for LoCoMo questions embedded by the default model runs, as the API's
role under row-level security, the two statements of a retrieval pass at AssembleContext's depth
for the given budget (the lexical leg, then the vector leg with fusion), each under `EXPLAIN
(ANALYZE, TIMING OFF)`: execution and planning time as the server reports them. Each question is
run twice, and only the second run counts (warm buffers). The sum is a floor under the CPU one
call costs the machine (PostgreSQL does nothing else for it that is not in these statements but
the session read, which runs beside them), so `cores / floor` bounds the calls/s any API could
serve on this design at this depth.

`--plans generic` times the statements as Search runs them (`plan_cache_mode =
force_generic_plan`): each is PREPAREd once and timed with `EXPLAIN (ANALYZE) EXECUTE`, its
arguments written as literals (EXECUTE takes no bound parameters); planning is then the cached
plan's lookup.

    .venv/bin/python bench/retrieval_floor.py --home /tmp/ce100k
    .venv/bin/python bench/retrieval_floor.py --home /tmp/ce100k --budget 2000 --questions 300
    .venv/bin/python bench/retrieval_floor.py --home /tmp/ce100k --top-k 10 --plans generic   # as Search runs
    .venv/bin/python bench/retrieval_floor.py --home /tmp/asm --org locomo-26 --budget 2000   # a LoCoMo org
                    # (bench/locomo_assembly.py --home /tmp/asm --keep), its own questions, the org's caller
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import pathlib
import statistics
import sys

import asyncpg
import numpy as np
import orjson
from pgvector.asyncpg import register_vector

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from entrypoints.embedded.process import disable_grpc_fork_handlers  # noqa: E402

disable_grpc_fork_handlers()  # an entry point: before anything below loads gRPC and forks PostgreSQL

from bench.locomo import load_locomo, org_of  # noqa: E402
from bench.report import machine  # noqa: E402
from context_engine.scope import Scope  # noqa: E402
from entrypoints.embedded.postgres import EmbeddedPostgres, default_shared_buffers_mb  # noqa: E402
from entrypoints.supervisor import DATABASE_NAME  # noqa: E402
from inference.embedder_choice import build_embedder  # noqa: E402
from inference.text_analysis import analyze  # noqa: E402
from projections.reads.search import FIRST_EF_SEARCH, GENERIC_PLANS, MIN_POOL, _pass_settings, _Retriever  # noqa: E402
from projections.retrieval.confidence_gate import Pool  # noqa: E402
from projections.retrieval.recipes import retrieval_depth  # noqa: E402
from projections.store.migrations import API_GROUP_ROLE  # noqa: E402
from projections.store.pool import set_config_sql, sql_literal  # noqa: E402

ORG = "bench-search"
CALLER = Scope(ORG, "bench", "assembly", "agent-1")  # bench/assemble.py's caller
FLOOR = 0.25


async def explain(conn: asyncpg.Connection, sql: str, args: tuple) -> tuple[float, float]:
    plan = orjson.loads(await conn.fetchval("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) " + sql, *args))[0]
    return plan["Execution Time"], plan["Planning Time"]


def literal(value: object) -> str:
    """An argument of the retrieval's statements as an untyped SQL literal (PostgreSQL casts it to
    the prepared statement's parameter type)."""
    if isinstance(value, np.ndarray):
        return sql_literal("[" + ",".join(repr(float(x)) for x in value) + "]")
    if isinstance(value, (list, tuple)):
        return sql_literal("{" + ",".join('"' + str(x).replace("\\", "\\\\").replace('"', '\\"') + '"'
                                          for x in value) + "}")
    if isinstance(value, dt.datetime):
        return sql_literal(value.isoformat())
    if isinstance(value, str):
        return sql_literal(value)
    return repr(value)


async def explain_prepared(conn: asyncpg.Connection, name: str, args: tuple) -> tuple[float, float]:
    plan = orjson.loads(await conn.fetchval(
        f"EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) EXECUTE {name}({', '.join(map(literal, args))})"))[0]
    return plan["Execution Time"], plan["Planning Time"]


async def measure(dsn: str, questions: list[str], budget: int, top_k: int | None,
                  generic: bool, caller: Scope) -> dict[str, list[float]]:
    vectors = await build_embedder("minilm").embed(questions)
    conn = await asyncpg.connect(dsn)
    await register_vector(conn)
    times: dict[str, list[float]] = {k: [] for k in ("lexical", "lexical planning", "fusion", "fusion planning")}
    try:
        model = await conn.fetchval("SELECT max(embedding_model) FROM chunks WHERE org_id = $1", caller.org_id)
        tokens, chunks = await conn.fetchrow(  # the caller's visible corpus, as AssembleContext reads it
            "SELECT sum(token_total), sum(n_docs) FROM corpus_stats WHERE org_id = $1 AND scope_path = ANY($2::text[])",
            caller.org_id, [s.path for s in caller.ancestors()])
        if top_k is None:
            top_k = retrieval_depth(budget, int(tokens), int(chunks))
            print(f"depth at a {budget}-token budget: ", end="")
        size = max(MIN_POOL, 2 * top_k)  # as projections.reads.search.search sizes the first pass
        print(f"top_k {top_k}, pools of {size} per leg")
        pool = Pool(vector_k=size, bm25_k=size, ef_search=FIRST_EF_SEARCH)
        settings = {"app.org_id": caller.org_id, **_pass_settings(FIRST_EF_SEARCH),
                    **(GENERIC_PLANS if generic else {})}
        prepared = False
        for question, vector in zip(questions, vectors):
            for counted in (False, True):
                async with conn.transaction(readonly=True):
                    await conn.execute(f"SET LOCAL ROLE {API_GROUP_ROLE}")
                    await conn.execute(set_config_sql(settings))
                    r = _Retriever(conn, caller, "", analyze(question), None, model, dt.datetime.now(dt.UTC),
                                   FLOOR, top_k)
                    if not generic:
                        lexical = await explain(conn, *r.lexical_statement(pool))
                        stats, ids = await r._lexical_leg(pool)
                        fusion = await explain(conn, *r.fused_statement(pool, stats, ids, vector))
                    else:
                        lexical_sql, lexical_args = r.lexical_statement(pool)
                        stats, ids = await r._lexical_leg(pool)
                        fused_sql, fused_args = r.fused_statement(pool, stats, ids, vector)
                        if not prepared:  # session-level, as the API's role, once
                            await conn.execute(f"PREPARE lexical_leg AS {lexical_sql}")
                            await conn.execute(f"PREPARE fusion AS {fused_sql}")
                            prepared = True
                        lexical = await explain_prepared(conn, "lexical_leg", lexical_args)
                        fusion = await explain_prepared(conn, "fusion", fused_args)
                if counted:
                    for key, value in zip(times, (*lexical, *fusion)):
                        times[key].append(value)
    finally:
        await conn.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=pathlib.Path, required=True, help="a data directory bench/search.py kept")
    parser.add_argument("--budget", type=int, default=4000)
    parser.add_argument("--top-k", type=int, help="Search's depth instead of the budget's (Search's default: 10)")
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--plans", choices=("custom", "generic"), default="custom",
                        help="custom: planned per call (AssembleContext); generic: as Search runs them")
    parser.add_argument("--org", default=ORG, help=f"the org to retrieve from, as its org-level caller unless {ORG} "
                                                    "(bench/assemble.py's agent); a LoCoMo org asks its own questions")
    args = parser.parse_args()
    caller = CALLER if args.org == ORG else Scope(args.org)
    conversations = [c for c in load_locomo() if args.org in (ORG, org_of(c))]
    questions = [q.text for c in conversations for q in c.questions][:args.questions]
    buffers = default_shared_buffers_mb()
    with EmbeddedPostgres(args.home / "postgres", settings={"shared_buffers": f"{buffers}MB"}) as pg:
        times = asyncio.run(measure(pg.dsn_for(DATABASE_NAME), questions, args.budget, args.top_k,
                                    args.plans == "generic", caller))
    print(f"machine: {machine()}; PostgreSQL shared_buffers {buffers} MB; {len(questions)} LoCoMo questions, "
          f"each run twice, the second counted; one at a time, nothing else running; {args.plans} plans")
    print(f"{'statement (server-side)':<28}{'mean ms':>9}{'p50 ms':>9}{'p10 ms':>9}{'p90 ms':>9}")
    for name, values in times.items():
        ordered = sorted(values)
        print(f"{name:<28}{statistics.mean(values):>9.2f}{statistics.median(values):>9.2f}"
              f"{ordered[len(ordered) // 10]:>9.2f}{ordered[9 * len(ordered) // 10]:>9.2f}")
    per_call = [sum(v) for v in zip(*times.values())]
    mean = statistics.mean(per_call)
    print(f"{'per call, both statements':<28}{mean:>9.2f}{statistics.median(per_call):>9.2f}")
    cores = os.cpu_count() or 1
    print(f"bound: {cores} cores / {mean:.2f} ms = {cores * 1000 / mean:.0f} calls/s if everything else were free")


if __name__ == "__main__":
    main()
