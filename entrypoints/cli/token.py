"""`token mint`: development tokens."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from entrypoints.cli.options import DataDir, parse_duration
from entrypoints.cli.settings import command_settings

token_app = typer.Typer(no_args_is_help=True, help="Development tokens.")


@token_app.command("mint")
def token_mint(
    org: Annotated[str, typer.Option(help="org_id claim")],
    clearance: Annotated[int, typer.Option(min=1, max=4, help="clearance level 1..4")],
    pillar: Annotated[str, typer.Option(help="pillar_id claim")] = "",
    team: Annotated[str, typer.Option(help="team_id claim")] = "",
    agent: Annotated[str, typer.Option(help="agent_id claim")] = "",
    subject: Annotated[Optional[str], typer.Option("--sub", help="sub claim (default dev:<scope path>)")] = None,
    ttl: Annotated[str, typer.Option(help="lifetime, e.g. 30m, 1h, 7d")] = "1h",
    data_dir: DataDir = None,
) -> None:
    """Print a token signed with the development HS256 key of the data directory."""
    from context_engine.auth import ensure_dev_key, mint_token
    from context_engine.errors import InvalidArgument

    settings = command_settings(home=data_dir)
    lifetime = parse_duration(ttl)
    if settings.jwt_max_lifetime_seconds and lifetime.total_seconds() > settings.jwt_max_lifetime_seconds:
        raise typer.BadParameter(f"{ttl} is longer than the API accepts: at most "
                                 f"{settings.jwt_max_lifetime_seconds} s (CONTEXT_ENGINE_JWT_MAX_LIFETIME_SECONDS)",
                                 param_hint="--ttl")
    key = ensure_dev_key(settings.hs256_key_path)
    try:
        token = mint_token(key, org=org, pillar=pillar, team=team, agent=agent, clearance=clearance,
                           subject=subject, ttl=lifetime)
    except InvalidArgument as exc:
        raise typer.BadParameter(exc.message) from exc
    typer.echo(token)
