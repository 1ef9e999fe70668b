"""`guardrail publish|list|key`: signed guardrail layers L1-L4."""

from __future__ import annotations

import asyncio
import os
import pathlib
from typing import Annotated, Optional

import typer

from entrypoints.cli.options import DataDir, parse_duration
from entrypoints.cli.settings import acknowledged_log, admin_pool, command_settings, stack_settings

guardrail_app = typer.Typer(no_args_is_help=True, help="Signed guardrail layers L1-L4 (docs/guardrails.md).")
GuardrailKeyFile = Annotated[Optional[pathlib.Path], typer.Option(
    "--key-file", envvar="CONTEXT_ENGINE_GUARDRAIL_KEY_FILE",
    help="Ed25519 private key (PEM); default <data dir>/keys/guardrail-ed25519.pem, generated on first use")]


@guardrail_app.command("publish")
def guardrail_publish(
    level: Annotated[int, typer.Option(help="1 platform, 2 org, 3 team, 4 agent")],
    file: Annotated[pathlib.Path, typer.Option(help="the layer text (UTF-8), published byte for byte")],
    org: Annotated[str, typer.Option(help="org_id (L2-L4; none for L1)")] = "",
    pillar: Annotated[str, typer.Option(help="pillar_id (L3, L4)")] = "",
    team: Annotated[str, typer.Option(help="team_id (L3, L4)")] = "",
    agent: Annotated[str, typer.Option(help="agent_id (L4)")] = "",
    force: Annotated[bool, typer.Option(help="publish a new version even if the content is unchanged")] = False,
    timeout: Annotated[str, typer.Option(help="wait this long for the projection (e.g. 30s)")] = "30s",
    key_file: GuardrailKeyFile = None,
    data_dir: DataDir = None,
) -> None:
    """Sign a guardrail layer, append it to the log, and wait until it is the current version."""
    from commands import publish_guardrail as pg
    from context_engine.errors import InvalidArgument
    from context_engine.guardrails.signing import ensure_signing_key, layer_scope, load_signing_key, operator_key_path
    from context_engine.guardrails.trust import GuardrailTrustUnavailable, trusted_fingerprints

    try:
        command = pg.PublishGuardrail(level, layer_scope(level, org, pillar, team, agent),
                                      pg.read_layer_file(file), force=force)
    except InvalidArgument as exc:
        raise typer.BadParameter(exc.message) from exc
    limit = parse_duration(timeout).total_seconds()
    settings = stack_settings(data_dir)
    try:
        key = (load_signing_key(key_file) if key_file is not None
               else ensure_signing_key(operator_key_path(settings.home_dir)))
        pg.require_trusted(key, trusted_fingerprints(settings))  # the worker would refuse it: say so now
    except GuardrailTrustUnavailable as exc:  # an OSError too: before the next clause
        raise typer.BadParameter(_trust_problem(exc)) from exc
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    except InvalidArgument as exc:
        raise typer.BadParameter(exc.message) from exc

    async def go():
        # The log's start creates the topics: it may run before the engine first starts.
        async with admin_pool(settings) as pool, acknowledged_log(settings, pool) as (log, watch):
            return await pg.publish_guardrail(command, key=key, pool=pool, log=log, watch=watch, timeout=limit,
                                              actor=f"cli:{os.environ.get('USER', 'operator')}")

    try:
        published = asyncio.run(go())
    except pg.GuardrailPublishError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(("unchanged (use --force to publish it again): " if published.unchanged else "published ")
               + pg.describe(published))


@guardrail_app.command("list")
def guardrail_list(
    org: Annotated[str, typer.Option(help="org_id of the caller")],
    pillar: Annotated[str, typer.Option(help="pillar_id")] = "",
    team: Annotated[str, typer.Option(help="team_id")] = "",
    agent: Annotated[str, typer.Option(help="agent_id")] = "",
    data_dir: DataDir = None,
) -> None:
    """Print the current layers a caller at this scope gets, L1 first."""
    from commands import publish_guardrail as pg
    from context_engine.errors import InvalidArgument
    from context_engine.guardrails.trust import GuardrailTrustUnavailable, trusted_fingerprints
    from context_engine.scope import Scope

    try:
        caller = Scope.parse(org, pillar, team, agent)
    except InvalidArgument as exc:
        raise typer.BadParameter(exc.message) from exc
    settings = stack_settings(data_dir)
    try:
        trusted = trusted_fingerprints(settings)
    except GuardrailTrustUnavailable as exc:
        typer.echo(f"error: {_trust_problem(exc)}", err=True)
        raise typer.Exit(1) from exc

    async def go():
        async with admin_pool(settings) as pool:
            return await pg.list_layers(pool, caller, trusted=trusted)

    rows = asyncio.run(go())
    for row in rows:
        typer.echo(pg.describe(row))
    if not rows:
        typer.echo(f"no guardrail layers for {caller.path}")


@guardrail_app.command("key")
def guardrail_key(key_file: GuardrailKeyFile = None, data_dir: DataDir = None) -> None:
    """Print the operator key's path and fingerprint (generating the default key if missing, and
    writing its public half beside it, which the API and the worker trust by default), and
    whether this configuration's trust set (CONTEXT_ENGINE_GUARDRAIL_TRUSTED_KEYS) takes it."""
    from context_engine.guardrails.signing import (
        ensure_signing_key,
        fingerprint,
        load_signing_key,
        operator_key_path,
        public_key_path,
    )
    from context_engine.guardrails.trust import GuardrailTrustUnavailable, trusted_fingerprints

    settings = command_settings(home=data_dir)
    path = key_file if key_file is not None else operator_key_path(settings.home_dir)
    try:
        key = load_signing_key(path) if key_file is not None else ensure_signing_key(path)
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    typer.echo(f"{path}\nfingerprint {fingerprint(key)}"
               + (f"\npublic key {public_key_path(path)}" if key_file is None else ""))
    try:
        trusted = trusted_fingerprints(settings)
    except GuardrailTrustUnavailable as exc:
        typer.echo(f"error: {_trust_problem(exc)}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"trusted {'yes' if fingerprint(key) in trusted else 'no'}"
               + "".join(f"\ntrusted key {fp}" for fp in sorted(trusted)))


def _trust_problem(exc) -> str:
    """A GuardrailTrustUnavailable for the operator: with the files and what is wrong with them."""
    return "; ".join([exc.message, *exc.problems])
