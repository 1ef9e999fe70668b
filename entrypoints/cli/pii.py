"""`pii rescan`: scan quarantined memory again."""

from __future__ import annotations

import asyncio
from typing import Annotated, Optional

import typer

from entrypoints.cli.options import DataDir, parse_duration
from entrypoints.cli.settings import admin_pool, stack_settings

pii_app = typer.Typer(no_args_is_help=True, help="The PII redaction of pushed memory.")


@pii_app.command("rescan")
def pii_rescan(
    org: Annotated[Optional[str], typer.Option(help="only this org (default: every org)")] = None,
    wait: Annotated[bool, typer.Option(help="follow the scans and report what they cleared")] = True,
    timeout: Annotated[str, typer.Option(help="give up following after this long (e.g. 10m)")] = "10m",
    data_dir: DataDir = None,
) -> None:
    """Scan quarantined memory again; with a healthy detector it becomes searchable."""
    from tqdm import tqdm

    from streams import pii_rescan as rescan
    from streams.kafka_security import client_security
    from streams.record_auth import signer_from_settings
    from streams.topics import LogTopics

    settings = stack_settings(data_dir)
    limit = parse_duration(timeout).total_seconds()

    async def go():
        async with admin_pool(settings) as pool:
            items = await rescan.quarantined(pool, org)
            typer.echo(f"{len(items)} quarantined memory version(s) to scan again")
            if not items:
                return None
            await rescan.request(settings.kafka_bootstrap, LogTopics.from_settings(settings), items,
                                 signer=signer_from_settings(settings), security=client_security(settings))
            if not wait:
                return None
            with tqdm(total=len(items), desc="pii rescan", unit="memory") as bar:
                return await rescan.follow(pool, items, timeout=limit, progress=bar.update)

    report = asyncio.run(go())
    if report is not None:
        typer.echo(f"cleared {report.cleared}, still quarantined {report.still_quarantined}, "
                   f"not scanned yet {report.unfinished}")
        if report.still_quarantined or report.unfinished:
            raise typer.Exit(1)
