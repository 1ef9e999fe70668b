"""`stats savings`: what the engine measured."""

from __future__ import annotations

import asyncio
from typing import Annotated, Optional

import typer

from context_engine.cli.options import DataDir
from context_engine.cli.settings import admin_pool, stack_settings

stats_app = typer.Typer(no_args_is_help=True, help="What the engine measured.")


@stats_app.command("savings")
def stats_savings(
    org: Annotated[Optional[str], typer.Option(help="only this org (default: every org)")] = None,
    data_dir: DataDir = None,
) -> None:
    """Token savings of AssembleContext against the naive prompt, per org and model, from the
    sampled calls (BaselineMetricEvent)."""
    from projections.savings_projection import savings

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
