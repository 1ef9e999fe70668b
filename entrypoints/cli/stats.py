"""`stats savings`, `stats compaction`: what the engine measured."""

from __future__ import annotations

import asyncio
from typing import Annotated, Optional

import typer

from entrypoints.cli.options import DataDir
from entrypoints.cli.settings import admin_pool, stack_settings

stats_app = typer.Typer(no_args_is_help=True, help="What the engine measured.")


@stats_app.command("savings")
def stats_savings(
    org: Annotated[Optional[str], typer.Option(help="only this org (default: every org)")] = None,
    data_dir: DataDir = None,
) -> None:
    """Token savings of AssembleContext against the naive prompt, per org and model, from the
    sampled calls (BaselineMetricEvent)."""
    from projections.projector.savings import savings

    settings = stack_settings(data_dir)

    async def go():
        async with admin_pool(settings) as pool:
            return await savings(pool, org)

    rows = asyncio.run(go())
    if not rows:
        typer.echo("no sampled AssembleContext calls yet")
        return
    typer.echo(f"{'org':<24} {'model':<24} {'samples':>8} {'assembled':>12} {'naive':>12} {'savings':>8}")
    for r in rows:
        typer.echo(f"{r.org_id:<24} {r.model_id or '(default)':<24} {r.samples:>8} {r.assembled_tokens:>12} "
                   f"{r.naive_tokens:>12} {r.savings_ratio:>8.1%}")


@stats_app.command("compaction")
def stats_compaction(
    org: Annotated[Optional[str], typer.Option(help="only this org (default: every org)")] = None,
    data_dir: DataDir = None,
) -> None:
    """Compaction per org: the requests AssembleContext opened (at 80 % of a session's budget) and
    how they closed, and the compactions applied (by the worker or the Compact RPC), their tokens
    before and after and their fact_retention_score. Refusals (the quality gate, too few turns) are
    counted by the worker's context_engine_compactions metric; their requests stay open."""
    from projections.reads.compaction import compaction_stats

    settings = stack_settings(data_dir)

    async def go():
        async with admin_pool(settings) as pool:
            return await compaction_stats(pool, org)

    rows = asyncio.run(go())
    if not rows:
        typer.echo("no compaction requested or done yet")
        return
    typer.echo(f"{'org':<24} {'requests':>8} {'open':>5} {'compacted':>9} {'rolled back':>11} {'below':>5} "
               f"{'refused':>7} "
               f"{'compactions':>11} {'by worker':>9} {'tokens before':>13} {'after':>10} {'reduction':>9} "
               f"{'min score':>9} {'mean score':>10}")
    for r in rows:
        reduction = 1 - r.compacted_tokens / r.original_tokens if r.original_tokens else 0.0
        scores = (f"{r.min_score:>9.4f} {r.mean_score:>10.4f}" if r.min_score is not None
                  else f"{'-':>9} {'-':>10}")
        typer.echo(f"{r.org_id:<24} {r.requests_opened:>8} {r.requests_open:>5} {r.closed_compacted:>9} "
                   f"{r.closed_rolled_back:>11} {r.closed_below_threshold:>5} {r.closed_refused:>7} "
                   f"{r.compactions:>11} {r.by_worker:>9} "
                   f"{r.original_tokens:>13} {r.compacted_tokens:>10} {reduction:>9.1%} {scores}")
