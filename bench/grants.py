"""`--grants N` for bench/search.py and bench/assemble.py: the same load phases measured three
times: without grants, with N live share grants in the org held by another team, and with N held
by the measured caller (issue 21 asks for throughput within 10 % with 1,000 grants in the org).

N extra chunks (bench/search.py's corpus maker, the texts after the main corpus's) are owned by
the team OWNER (one IngestEvent each, sessions of their own), a scope whose chunks the measured
caller does not see by ownership. After the run without grants, CreateShare grants each of them
with read + use_in_assembly to BYSTANDER (a team in another pillar: grants in the org the caller
does not hold); after that run `--held M` of them (default all N) are revoked and their chunks
granted to the caller's team instead, so the org still holds N live grants and every Search /
AssembleContext of the third run holds M of them (clearance 3, 4 when the grantee is in another
pillar).
"""

from __future__ import annotations

import asyncio
import sys
import time

import asyncpg
import grpc
from grpc_load import call_with_retry
from tqdm import tqdm

from upsquad.context.v1 import context_pb2 as pb
from upsquad.context.v1 import context_pb2_grpc

OWNER = ("sales", "emea")  # pillar, team
BYSTANDER = ("support", "desk")  # the grantee of the second run: not the measured caller
OWNER_SESSIONS = 100
PERMISSIONS = ("read", "use_in_assembly")


def add_grants_option(parser) -> None:
    parser.add_argument("--grants", type=int, default=0,
                        help="measure the load phases without grants, with this many live grants in the org held "
                             "by another team, and with --held of them held by the caller instead")
    parser.add_argument("--held", type=int, default=None,
                        help="with --grants N: how many of the N grants the caller holds in the third run "
                             "(default N)")


def _owner_scope(org: str) -> pb.ScopePath:
    return pb.ScopePath(org_id=org, pillar_id=OWNER[0], team_id=OWNER[1])


async def _owned(database_url: str, org: str) -> list[str]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT chunk_id::text AS id FROM chunks WHERE org_id = $1 AND scope_path = $2 "
                                "ORDER BY chunk_id", org, "/".join((org, *OWNER)))
        return [r["id"] for r in rows]
    finally:
        await conn.close()


async def live_grants(database_url: str, org: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetchval("SELECT count(*) FROM share_grants WHERE org_id = $1 AND revoked_at IS NULL", org)
    finally:
        await conn.close()


async def ingest_owned(stack, org: str, texts: list[str], concurrency: int) -> float:
    """One IngestEvent per text as the owner team (an idempotency key each, so a reused data
    directory ingests nothing twice); returns the seconds of calls."""
    async def ingest(stub, metadata, item: tuple[int, str]) -> None:
        i, text = item
        request = pb.IngestEventRequest(scope=_owner_scope(org), session_id=f"grants-s{i % OWNER_SESSIONS:03d}",
                                        event_type="message", content=text.encode(), metadata={"grant_seq": str(i)})
        await call_with_retry(stub.IngestEvent, request, (*metadata, ("idempotency-key", f"{org}/grants/{i}")))

    return await _as_owner(stack, org, 1, "IngestEvent (owner team)", list(enumerate(texts)), ingest, concurrency,
                           unit="chunk")


async def create_grants(stack, database_url: str, org: str, grantee: tuple[str, ...], n: int,
                        concurrency: int = 8) -> tuple[dict[str, str], float]:
    """CreateShare of n owned chunks to the team `grantee` (its ids below the org), read +
    use_in_assembly, `concurrency` calls in flight; then ANALYZE share_grants. Returns chunk id ->
    share id and the seconds of calls. Not retried: CreateShare takes no idempotency key."""
    chunk_ids = (await _owned(database_url, org))[:n]
    if len(chunk_ids) < n:
        raise RuntimeError(f"{len(chunk_ids)} chunks owned by {'/'.join((org, *OWNER))}, {n} wanted")
    granted: dict[str, str] = {}

    async def create(stub, metadata, chunk_id: str) -> None:
        response = await stub.CreateShare(pb.CreateShareRequest(
            scope=_owner_scope(org), resource_id=chunk_id, resource_type="chunk", grantee_scope="team",
            grantee_scope_id="/".join((org, *grantee)), permissions=list(PERMISSIONS),
            reason="bench: grants beside the load"), metadata=metadata, timeout=60)
        granted[chunk_id] = response.share_id

    seconds = await _as_owner(stack, org, _clearance(grantee), f"CreateShare to {'/'.join(grantee)}", chunk_ids,
                              create, concurrency)
    await _analyze(database_url)
    return granted, seconds


async def revoke_grants(stack, database_url: str, org: str, share_ids: list[str], concurrency: int = 8) -> float:
    """RevokeShare of each grant by its creator; returns the seconds of calls."""
    async def revoke(stub, metadata, share_id: str) -> None:
        await stub.RevokeShare(pb.RevokeShareRequest(scope=_owner_scope(org), share_id=share_id),
                               metadata=metadata, timeout=60)

    seconds = await _as_owner(stack, org, 3, "RevokeShare", share_ids, revoke, concurrency)
    await _analyze(database_url)
    return seconds


def _clearance(grantee: tuple[str, ...]) -> int:
    return 3 if grantee[0] == OWNER[0] else 4  # the spec: L4+ for a grantee in another pillar


async def _as_owner(stack, org: str, clearance: int, what: str, items: list, call, concurrency: int, *,
                    unit: str = "grant") -> float:
    """`call(stub, metadata, item)` for each item as the owner team, `concurrency` in flight;
    returns the seconds of calls."""
    token = stack.token(org, pillar=OWNER[0], team=OWNER[1], clearance=clearance)
    metadata = (("authorization", f"Bearer {token}"),)
    async with grpc.aio.insecure_channel(stack.address) as channel:
        stub = context_pb2_grpc.ContextEngineStub(channel)
        bar = tqdm(total=len(items), desc=f"{what} (L{clearance})", unit=unit, file=sys.stderr)
        queue = iter(items)

        async def client() -> None:
            for item in queue:
                await call(stub, metadata, item)
                bar.update()

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        bar.close()
        return time.perf_counter() - started


async def _analyze(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("ANALYZE share_grants")
    finally:
        await conn.close()


def held_count(args) -> int:
    """--held, checked against --grants."""
    held = args.grants if args.held is None else args.held
    if not 0 <= held <= args.grants:
        raise SystemExit(f"--held {held}: must be between 0 and --grants ({args.grants})")
    return held


def grant_runs(stack, database_url: str, org: str, caller_team: tuple[str, ...], n: int, m: int, run, wait_quiet,
               report: dict) -> tuple[list, list, frozenset[str]]:
    """The second and third runs: `run(granted)` with n grants held by BYSTANDER, then, m of
    those revoked and their chunks granted to `caller_team`, with m of the org's n held by the
    caller. Returns both runs' phases and the chunks the caller holds; the seconds of the calls
    go in `report`."""
    elsewhere, report["grants_elsewhere_s"] = asyncio.run(create_grants(stack, database_url, org, BYSTANDER, n))
    wait_quiet(stack)
    bystanders = run(frozenset())
    moved = sorted(elsewhere)[:m]  # the chunks create_grants gives the caller: the first m owned, by id
    report["revoke_s"] = asyncio.run(revoke_grants(stack, database_url, org, [elsewhere[c] for c in moved]))
    held, report["grants_s"] = asyncio.run(create_grants(stack, database_url, org, caller_team, m))
    assert sorted(held) == moved, "the caller's grants are not the revoked grants' chunks"
    wait_quiet(stack)
    return bystanders, run(frozenset(held)), frozenset(held)


def describe(org: str, caller: str, n: int, m: int, report: dict) -> str:
    return (f"grants: {n:,} more chunks owned by {org}/{'/'.join(OWNER)} ({report['owned_ingest_s']:.0f} s of "
            f"IngestEvent); run 2: each granted to {org}/{'/'.join(BYSTANDER)} (read + use_in_assembly, "
            f"L{_clearance(BYSTANDER)}, {report['grants_elsewhere_s']:.0f} s of CreateShare, 8 in flight); run 3: "
            f"{m:,} of those revoked ({report['revoke_s']:.0f} s) and their chunks granted to the caller {caller} "
            f"({report['grants_s']:.0f} s): {n:,} live grants in the org, {m:,} held by the caller")


def print_side_by_side(runs: list[list], n: int, m: int) -> None:
    """Each phase's line in each run (without grants, n grants held elsewhere, m of n held by
    the caller), its throughput ratio to the first, and the saturation ratio (the best closed
    loop of each run)."""
    labels = ("no grants", f"{n:,} grants elsewhere", f"{m:,} of {n:,} held")
    width = max(map(len, labels)) + 2
    for phases in zip(*runs, strict=True):
        for label, p in zip(labels, phases):
            ratio = f"   throughput ratio {p.achieved / phases[0].achieved:.3f}" if p is not phases[0] else ""
            print(f"{label:<{width}}{p.line()}{ratio}")
    best = [max((p.achieved for p in run if p.name.startswith("closed")), default=float("nan")) for run in runs]
    print("saturation (best closed loop): " + ", ".join(f"{label} {b:.1f}/s" for label, b in zip(labels, best))
          + "; ratios " + ", ".join(f"{b / best[0]:.3f}" for b in best[1:]) + " (issue 21: within 10 %)")


def print_phases(without: list, elsewhere: list, held: list, n: int, m: int, granted_items: str) -> None:
    """The load phases' lines: side by side with the grants' runs when there are some, then how
    many of the last run's `granted_items` were granted chunks."""
    if not held:
        for phase in without:
            print(phase.line())
        return
    print_side_by_side([without, elsewhere, held], n, m)
    print(f"{granted_items} that are granted chunks, with the grants held: {sum(p.via_grants for p in held):,} in "
          f"{sum(len(p.latencies) for p in held):,} calls")


def fresh_queries(args) -> None:
    """With --grants every query vector is computed (QUERY_VECTORS_REMEMBERED=0 unless --setting
    says otherwise): the second run repeats the first's questions, and vectors the API
    remembered from the first would favour it."""
    if args.grants and not any(s.upper().removeprefix("CONTEXT_ENGINE_").startswith("QUERY_VECTORS_REMEMBERED=")
                               for s in args.setting):
        args.setting.append("QUERY_VECTORS_REMEMBERED=0")
