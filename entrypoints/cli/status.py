"""`status`: what a stack runs, its versions, what it cannot do yet (and the command that fixes
each), and the background work it still owes."""

from __future__ import annotations

import asyncio
import importlib.metadata

import orjson
import typer

from entrypoints.cli.options import DataDir


def status(
    json: bool = typer.Option(False, "--json", help="one JSON object instead of lines"),
    data_dir: DataDir = None,
) -> None:
    """The running stack of the data directory: its processes' health, versions, degraded
    capabilities with the command that fixes each, what `up` is restarting or restarted in the last
    hour, and its backlog of embeddings, indexing, PII scans and compactions. Exit 1 if no stack
    runs there."""
    from entrypoints.capabilities import degraded_capabilities
    from entrypoints.cli.settings import admin_pool, command_settings, stack_settings
    from entrypoints.recovery import describe, recent_recoveries
    from entrypoints.supervisor import command_line, is_serving, read_stack_file
    from inference.detector.settings import GLINER_NAME, PROMPT_GUARD_NAME
    from projections.reads.stack_backlog import backlog
    from projections.store.pool import SYSTEM_ORG, org_transaction
    from streams import readiness

    settings = command_settings(home=data_dir)
    running = read_stack_file(settings.home_dir)
    if not running.get("database_url"):
        typer.echo(f"no stack runs in {settings.home_dir} (no run/stack.json): start one with "
                   f"{command_line()} up --data-dir {settings.home_dir}", err=True)
        raise typer.Exit(1)
    settings = stack_settings(data_dir)  # its database, as every command run beside a stack finds it
    api = running.get("api_address") or settings.api_address
    detector = running.get("detector_address") or settings.detector_address

    serving = {"api": is_serving(api), "detector": is_serving(detector),
               "worker": readiness.is_ready(settings.home_dir)}
    models = {name: is_serving(detector, name) for name in (PROMPT_GUARD_NAME, GLINER_NAME)}

    async def owed() -> dict[str, int] | str:
        try:
            async with admin_pool(settings) as pool, org_transaction(pool, SYSTEM_ORG, readonly=True) as conn:
                return await backlog(conn)
        except Exception as exc:  # the database is down: say so, the rest still holds
            return f"unreadable: {type(exc).__name__}: {exc}"

    owed_now = asyncio.run(owed())
    degraded = degraded_capabilities(settings, command_line())
    recovery = recent_recoveries(settings.home_dir)
    report = {
        "data_directory": str(settings.home_dir),
        "version": importlib.metadata.version("context-engine"),
        "api": {"address": api, "serving": serving["api"]},
        "detector": {"address": detector, "serving": serving["detector"], "models_serving": models},
        "worker": {"projecting": serving["worker"]},
        "degraded": degraded,
        "recovery": recovery,
        "backlog": owed_now,
    }
    if json:
        typer.echo(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
        return
    typer.echo(f"context-engine {report['version']}, data directory {report['data_directory']}")
    typer.echo(f"api        {api}: {'SERVING' if serving['api'] else 'NOT SERVING'}")
    typer.echo(f"worker     {'projecting' if serving['worker'] else 'NOT projecting'}")
    typer.echo(f"detector   {detector}: {'SERVING' if serving['detector'] else 'NOT SERVING'}; models "
               + ", ".join(f"{n} {'SERVING' if ok else 'NOT SERVING'}" for n, ok in models.items()))
    for line in degraded:
        typer.echo(f"degraded: {line}")
    for entry in recovery:
        typer.echo(f"recovery: {describe(entry)}")
    typer.echo("backlog    " + (owed_now if isinstance(owed_now, str)
                                else ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in owed_now.items())))
