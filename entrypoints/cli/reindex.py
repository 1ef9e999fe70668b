"""`reindex`: re-embed a scope's chunks with the running embedder."""

from __future__ import annotations

import asyncio
import os
from typing import Annotated

import typer

from context_engine.config import required
from entrypoints.cli.options import DataDir, parse_duration
from entrypoints.cli.settings import admin_pool, stack_settings


def reindex(
    org: Annotated[str, typer.Argument(help="org_id of the scope to re-embed")],
    pillar: Annotated[str, typer.Option(help="pillar_id (empty: the whole org)")] = "",
    team: Annotated[str, typer.Option(help="team_id")] = "",
    agent: Annotated[str, typer.Option(help="agent_id")] = "",
    wait: Annotated[bool, typer.Option(help="show progress until every chunk has a current vector")] = True,
    timeout: Annotated[str, typer.Option(help="give up waiting after this long (e.g. 30m)")] = "1h",
    data_dir: DataDir = None,
) -> None:
    """Re-embed a scope's chunks with the running embedder (after a model change)."""
    import time

    from context_engine.scope import Scope
    from inference.embedder_choice import embedder_from_settings
    from streams import reindex as reindexing
    from streams.kafka_security import client_security
    from streams.record_auth import signer_from_settings
    from streams.topics import LogTopics

    settings = stack_settings(data_dir)
    scope = Scope.parse(org, pillar, team, agent)
    limit = parse_duration(timeout).total_seconds()
    model = embedder_from_settings(settings).model_version

    async def go() -> bool:
        async with admin_pool(settings) as pool:
            before = await reindexing.progress(pool, scope, model)
            await reindexing.request(required(settings.kafka_bootstrap, "kafka_bootstrap"),
                                     LogTopics.from_settings(settings), scope,
                                     old_model_version=before.previous_model, new_model_version=model,
                                     initiated_by=f"cli:{os.environ.get('USER', 'operator')}",
                                     signer=signer_from_settings(settings), security=client_security(settings))
            typer.echo(f"reindex of {scope.path} to {model} requested: {before.total - before.current} "
                       f"of {before.total} chunks need a vector (previous model: {before.previous_model or '-'})")
            if not wait:
                return True
            from tqdm import tqdm

            deadline = time.monotonic() + limit
            with tqdm(total=before.total, initial=before.current, desc="reindex", unit="chunk") as bar:
                while True:
                    now = await reindexing.progress(pool, scope, model)
                    bar.total = now.total
                    bar.update(now.current - bar.n)
                    if now.done:
                        return True
                    if time.monotonic() > deadline:
                        return False
                    await asyncio.sleep(0.5)

    if not asyncio.run(go()):
        typer.echo(f"reindex not finished after {timeout}; it continues in the worker", err=True)
        raise typer.Exit(1)
