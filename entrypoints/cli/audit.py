"""`audit`: the audit trail of cross-scope access (projections/projector/audit_rows.py), one org at a time."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import enum
from typing import Annotated, Optional

import orjson
import typer

from context_engine.errors import InvalidArgument
from context_engine.scope import Scope
from entrypoints.cli.options import DataDir
from entrypoints.cli.settings import admin_pool, stack_settings


class Outcome(str, enum.Enum):
    allowed = "allowed"
    denied = "denied"


def _moment(value: str | None, option: str) -> dt.datetime | None:
    if value is None:
        return None
    try:
        moment = dt.datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not an ISO 8601 time (e.g. 2026-03-01T12:00:00Z)",
                                 param_hint=option) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def _actor(path: str | None, org: str) -> Scope | None:
    if path is None:
        return None
    try:
        actor = Scope.parse(*path.split("/"), field="actor") if path.count("/") <= 3 else None
    except InvalidArgument as exc:
        raise typer.BadParameter(str(exc), param_hint="--actor") from None
    if actor is None or actor.org_id != org:
        raise typer.BadParameter(f"{path!r} is not a scope path of org {org!r} (org/pillar/team/agent)",
                                 param_hint="--actor")
    return actor


def audit(
    org: Annotated[str, typer.Option(help="the org whose trail to read")],
    actor: Annotated[Optional[str], typer.Option(
        help="only this actor and the scopes below it: a scope path, org/pillar/team/agent or a prefix of one")] = None,
    resource: Annotated[Optional[str], typer.Option(help="only accesses to this resource id")] = None,
    operation: Annotated[Optional[str], typer.Option(
        help="only this operation: read, use_in_assembly, create_share, revoke_share")] = None,
    outcome: Annotated[Optional[Outcome], typer.Option(help="only allowed or only denied attempts")] = None,
    since: Annotated[Optional[str], typer.Option(help="from this time on (ISO 8601; UTC unless it says)")] = None,
    until: Annotated[Optional[str], typer.Option(help="before this time (ISO 8601; UTC unless it says)")] = None,
    limit: Annotated[int, typer.Option(min=1, help="at most this many rows, newest first")] = 100,
    json: Annotated[bool, typer.Option("--json", help="a JSON array instead of a table")] = False,
    data_dir: DataDir = None,
) -> None:
    """An org's audit trail: cross-scope accesses, allowed and denied.

    Reads and assemblies through share grants, shares created and revoked, and refused
    cross-scope attempts (AuditAccessEvent), newest first."""
    from projections.reads.audit import audit_rows
    from projections.store.pool import org_transaction

    who = _actor(actor, org)
    start, end = _moment(since, "--since"), _moment(until, "--until")
    settings = stack_settings(data_dir)

    async def go():
        async with admin_pool(settings) as pool, org_transaction(pool, org, readonly=True) as conn:
            return await audit_rows(conn, org, actor=who, resource_id=resource, operation=operation,
                                    outcome=outcome.value if outcome else None, since=start, until=end, limit=limit)

    rows = asyncio.run(go())
    if json:
        typer.echo(orjson.dumps([{**dataclasses.asdict(r), "actor": r.actor.path} for r in rows],
                                option=orjson.OPT_INDENT_2).decode())
        return
    if not rows:
        typer.echo(f"no audit rows for org {org} that match")
        return
    typer.echo(f"{'occurred_at':<32} {'outcome':<8} {'operation':<16} {'actor':<40} {'resource':<46} "
               f"{'share_id':<36} denial_reason")
    for r in rows:
        typer.echo(f"{r.occurred_at.isoformat():<32} {r.outcome:<8} {r.operation:<16} {r.actor.path:<40} "
                   f"{r.resource_type + ' ' + r.resource_id:<46} {r.share_id or '-':<36} {r.denial_reason or '-'}")
