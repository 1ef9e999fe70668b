"""`history`: a session's versions in chain order (projections/reads/session_history.py), so a
RollbackContext target can be found."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Annotated

import orjson
import typer

from entrypoints.cli.options import DataDir
from entrypoints.cli.settings import admin_pool, stack_settings


def history(
    org: Annotated[str, typer.Option(help="the session's org")],
    session: Annotated[str, typer.Option(help="the session id")],
    json: Annotated[bool, typer.Option("--json", help="a JSON array instead of a table")] = False,
    data_dir: DataDir = None,
) -> None:
    """A session's versions, oldest first: each item (turn, memory, compaction summary) with the
    version it made, whether it is in the current state, and the rollback or compaction that took
    it out. Any listed version is a RollbackContext target_version_hash; `*` marks the current one."""
    from projections.reads.session_history import session_history
    from projections.store.pool import org_transaction

    settings = stack_settings(data_dir)

    async def go():
        async with admin_pool(settings) as pool, org_transaction(pool, org, readonly=True) as conn:
            return await session_history(conn, org, session)

    items = asyncio.run(go())
    if items is None:
        typer.echo(f"org {org!r} has no session {session!r}", err=True)
        raise typer.Exit(1)
    if json:
        typer.echo(orjson.dumps([dataclasses.asdict(i) for i in items], option=orjson.OPT_INDENT_2).decode())
        return
    typer.echo(f"  {'seq':>5} {'version':<64} {'kind':<12} {'state':<9} {'occurred_at':<32} event / removed by")
    for i in items:
        state = "active" if i.active else "inactive"
        what = i.event_id or "-"
        if i.replaced:
            what += f" (replaced {i.replaced} turns)"
        if i.removed_by:
            what += f" / removed by {i.removed_by}"
        typer.echo(f"{'*' if i.current else ' '} {i.seq:>5} {i.version:<64} {i.kind[:12]:<12} {state:<9} "
                   f"{i.occurred_at.isoformat():<32} {what}")
