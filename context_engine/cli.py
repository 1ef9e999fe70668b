"""The `context-engine` command line."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import os
import pathlib
import re
from typing import Annotated, Optional

import typer

from context_engine.config import ENV_PREFIX, Settings
from inference.detector.cli import ModelsDir as _ModelsDir
from inference.detector.cli import models_app as _models_app
from inference.detector.cli import status as _detector_models_status

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Context Engine: event-sourced context and memory for LLM agents.")
token_app = typer.Typer(no_args_is_help=True, help="Development tokens.")
serve_app = typer.Typer(no_args_is_help=True, help="Run one server process (what `up` starts).")
app.add_typer(token_app, name="token")
app.add_typer(serve_app, name="serve")
pii_app = typer.Typer(no_args_is_help=True, help="The PII redaction of pushed memory.")
app.add_typer(pii_app, name="pii")
stats_app = typer.Typer(no_args_is_help=True, help="What the engine measured.")
app.add_typer(stats_app, name="stats")


def _embedder_status(settings: Settings) -> dict[str, object]:
    """The configured embedder, for `models status`; the local MiniLM is loaded (one thread) so that
    its int8 self-check says which products this CPU computes with."""
    if settings.embedder == "openai":
        return {"model": settings.embedder_model, "embedder": "openai", "url": settings.embedder_url}
    from inference.minilm_embedder import MiniLMEmbedder

    row: dict[str, object] = {"model": "all-MiniLM-L6-v2", "embedder": "minilm"}
    try:
        embedder = MiniLMEmbedder(intra_op_threads=1, matmul=settings.minilm_matmul)
    except Exception as exc:  # noqa: BLE001 - reported, as a detector model that is not installed is
        return {**row, "installed": False, "problem": f"{type(exc).__name__}: {exc}"}
    return {**row, "installed": True, "model_version": embedder.model_version, **embedder.matmul_status()}


def _models_status(
    models_dir: _ModelsDir = None,
    embedder: Annotated[bool, typer.Option(
        "--embedder/--no-embedder", help="Also load the local embedder and show the products its int8 self-check "
                                          "chose on this CPU (~1 s)")] = True,
) -> None:
    """Show, as JSON lines, the detector models installed and the embedder's products on this CPU.

    A row per detector model (where the service looks, what is installed there), then the embedder's:
    its model_version and matmul, int8 or float32 when the int8 self-check disagreed on this CPU."""
    _detector_models_status(models_dir=models_dir)
    if embedder:
        import json
        import sys

        with contextlib.redirect_stdout(sys.stderr):  # the self-check's log line, not among the rows
            row = _embedder_status(_settings())
        typer.echo(json.dumps(row))


def _mount_models_app() -> None:
    # `models status` is the detector's command with the embedder's row after its rows; a copy of the
    # detector's sub-app, so that models_app itself stays as the detector module defines it.
    models = copy.copy(_models_app)
    models.registered_commands = [copy.copy(c) for c in _models_app.registered_commands]
    (status,) = [c for c in models.registered_commands if c.name == "status"]
    status.callback = _models_status
    app.add_typer(models, name="models", help="Import and inspect the ML detector's model weights.")


_mount_models_app()

DataDir = Annotated[Optional[pathlib.Path], typer.Option(
    "--data-dir", help="Data directory (env CONTEXT_ENGINE_HOME; default ./.context-engine)")]


def _settings(**overrides: object) -> Settings:
    """Settings from the environment, with CLI options on top. Options are exported to the
    environment too, so child processes started by `up` resolve the same settings."""
    for name, value in overrides.items():
        if value is not None:
            os.environ[f"{ENV_PREFIX}{name.upper()}"] = str(value)
    return Settings()


def _stack_settings(data_dir: pathlib.Path | None) -> Settings:
    """Settings for commands run beside a running stack: the database and broker come from the
    environment, else from the stack file `up` writes into the data directory."""
    from context_engine.supervisor import read_stack_file

    settings = _settings(home=data_dir)
    running = read_stack_file(settings.home_dir)
    settings = _settings(database_url=settings.database_url or running.get("database_url"),
                         kafka_bootstrap=settings.kafka_bootstrap or running.get("kafka_bootstrap"))
    if not settings.database_url or not settings.kafka_bootstrap:
        raise typer.BadParameter(
            f"no running stack in {settings.home_dir} and no CONTEXT_ENGINE_DATABASE_URL / "
            "CONTEXT_ENGINE_KAFKA_BOOTSTRAP: start `context-engine up` or set both")
    return settings


@contextlib.asynccontextmanager
async def admin_pool(settings: Settings):
    """One admin connection for a command run beside the stack (RLS still applies: every query
    sets app.org_id)."""
    from projections.database import create_pool

    pool = await create_pool(settings.database_url, org_scoped=False, min_size=1, max_size=1)
    try:
        yield pool
    finally:
        await pool.close()


def _progress(description: str):
    from tqdm import tqdm

    bar = tqdm(desc=description, unit="event", unit_scale=True)

    def set_total(total: int) -> None:
        bar.total = total
        bar.refresh()

    return bar, set_total


def parse_duration(text: str) -> dt.timedelta:
    match = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if not match:
        raise typer.BadParameter("use a number and a unit: 90s, 30m, 1h, 7d")
    amount, unit = int(match[1]), match[2]
    return dt.timedelta(**{{"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[unit]: amount})


@app.command()
def up(
    data_dir: DataDir = None,
    api_port: Annotated[Optional[int], typer.Option(help="ContextEngine gRPC port (default 50051)")] = None,
    detector_port: Annotated[Optional[int], typer.Option(help="ML detector gRPC port (default 50052)")] = None,
    kafka_bootstrap: Annotated[Optional[str], typer.Option(
        help="Use this Kafka-compatible cluster instead of the embedded broker")] = None,
    database_url: Annotated[Optional[str], typer.Option(
        help="Use this PostgreSQL (with pgvector) instead of the embedded one")] = None,
    api_processes: Annotated[Optional[int], typer.Option(
        min=1, max=64, help="API processes sharing the gRPC port (default 1)")] = None,
    metrics_port: Annotated[Optional[int], typer.Option(
        min=-1, help="Prometheus /metrics port of the API (default 9464; 0 = free port, -1 = off)")] = None,
) -> None:
    """Run the whole stack: PostgreSQL, broker, migrations, workers, API and detector."""
    from context_engine.supervisor import run_stack

    settings = _settings(home=data_dir, api_port=api_port, detector_port=detector_port,
                         kafka_bootstrap=kafka_bootstrap, database_url=database_url,
                         api_processes=api_processes, metrics_port=metrics_port)
    raise typer.Exit(run_stack(settings))


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

    settings = _settings(home=data_dir)
    key = ensure_dev_key(settings.hs256_key_path)
    try:
        token = mint_token(key, org=org, pillar=pillar, team=team, agent=agent, clearance=clearance,
                           subject=subject, ttl=parse_duration(ttl))
    except InvalidArgument as exc:
        raise typer.BadParameter(exc.message) from exc
    typer.echo(token)


@serve_app.command("api")
def serve_api(
    data_dir: DataDir = None,
    process_index: Annotated[int, typer.Option(
        min=0, help="Which of the api_processes this is (its metrics port is metrics_port + index)")] = 0,
) -> None:
    """Serve upsquad.context.v1.ContextEngine."""
    from context_engine.api.app import run_api
    from context_engine.logs import configure_logging

    settings = _settings(home=data_dir)
    configure_logging(settings.log_level, process=f"api-{process_index}" if settings.api_processes > 1 else "api")
    asyncio.run(run_api(settings, process_index))


@serve_app.command("detector")
def serve_detector(data_dir: DataDir = None) -> None:
    """Serve upsquad.ml.v1.MLDetectorService."""
    from inference.detector.server import run_detector
    from context_engine.logs import configure_logging

    settings = _settings(home=data_dir)
    configure_logging(settings.log_level, process="detector")
    asyncio.run(run_detector(settings))


SourceOption = Annotated[Optional[str], typer.Option(
    "--source", help="log (the broker's topic) or archive (its copy in PostgreSQL); "
                     "default: archive when the log is restored from it, else log")]


def _records(settings: Settings, source_name: str | None, on_total, on_refused=None):
    from streams.kafka_security import client_security
    from streams.record_auth import verifier_from_settings
    from streams.replay import source
    from streams.topics import LogTopics

    name = source_name or ("archive" if settings.restore_log_from_archive else "log")
    return source(name, bootstrap=settings.kafka_bootstrap, topic=LogTopics.from_settings(settings).events,
                  admin_url=settings.database_url, verifier=verifier_from_settings(settings),
                  security=client_security(settings), on_total=on_total, on_refused=on_refused)


@app.command()
def replay(
    into: Annotated[Optional[str], typer.Option(
        help="PostgreSQL URL of an empty database to rebuild into (default: a new database beside the live one)")] = None,
    source_name: SourceOption = None,
    data_dir: DataDir = None,
) -> None:
    """Rebuild every read model from the log into an empty database."""
    from streams.replay import create_database, replay as run_replay

    settings = _stack_settings(data_dir)
    refused: list = []

    async def go():
        target = into or await create_database(settings.database_url, "context_engine_replay")
        bar, set_total = _progress("replay")
        with bar:
            report = await run_replay(_records(settings, source_name, set_total, refused.append), target,
                                      progress=bar.update)
        return target, report

    target, report = asyncio.run(go())
    for record in refused:
        typer.echo(str(record))
    typer.echo(f"replayed {report.events} events in {report.seconds:.2f}s "
               f"({report.rate:,.0f} events/s) into {target}"
               + (f"; left out {len(refused)} record(s) no trusted writer signed" if refused else ""))


@app.command()
def verify(source_name: SourceOption = None, data_dir: DataDir = None) -> None:
    """Recompute every version hash from the log and report each difference from the read models,
    and every event that is on the log and not in the archive (nor set aside), or the other way.

    Records on the log that no trusted writer signed are listed apart, by position: the worker
    refused them, so they are no difference (the exit status counts differences only)."""
    from streams.kafka_security import client_security
    from streams.record_auth import verifier_from_settings
    from streams.replay import read_log, verify as run_verify
    from streams.topics import LogTopics

    settings = _stack_settings(data_dir)
    topic = LogTopics.from_settings(settings).events
    refused: dict[tuple[int, int], object] = {}  # the log is read twice with --source log: once each

    def note(record) -> None:
        refused[(record.partition, record.offset)] = record

    async def go():
        bar, set_total = _progress("verify")
        with bar:
            log_records = read_log(settings.kafka_bootstrap, topic, verifier=verifier_from_settings(settings),
                                   security=client_security(settings), on_refused=note)
            return await run_verify(_records(settings, source_name, set_total, note), settings.database_url,
                                    log=(log_records, topic), progress=bar.update)

    report, differences = asyncio.run(go())
    for difference in differences:
        typer.echo(str(difference))
    for _, record in sorted(refused.items()):
        typer.echo(str(record))
    typer.echo(f"verified {report.events} events ({report.rate:,.0f} events/s): "
               f"{len(differences)} difference(s)"
               + (f"; {len(refused)} record(s) on the log no trusted writer signed, refused" if refused else ""))
    raise typer.Exit(1 if differences else 0)


@app.command()
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

    from inference.embedder import embedder_from_settings
    from context_engine.scope import Scope
    from streams import reindex as reindexing
    from streams.kafka_security import client_security
    from streams.record_auth import signer_from_settings
    from streams.topics import LogTopics

    settings = _stack_settings(data_dir)
    scope = Scope.parse(org, pillar, team, agent)
    limit = parse_duration(timeout).total_seconds()
    model = embedder_from_settings(settings).model_version

    async def go() -> bool:
        async with admin_pool(settings) as pool:
            before = await reindexing.progress(pool, scope, model)
            await reindexing.request(settings.kafka_bootstrap, LogTopics.from_settings(settings), scope,
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

    settings = _stack_settings(data_dir)
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


@stats_app.command("savings")
def stats_savings(
    org: Annotated[Optional[str], typer.Option(help="only this org (default: every org)")] = None,
    data_dir: DataDir = None,
) -> None:
    """Token savings of AssembleContext against the naive prompt, per org and model, from the
    sampled calls (BaselineMetricEvent)."""
    from projections.savings_projection import savings

    settings = _stack_settings(data_dir)

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


@app.command()
def worker(data_dir: DataDir = None) -> None:
    """Run the stream workers (the Faust app) against the configured broker."""
    from context_engine.logs import configure_logging
    from streams.app import run_worker

    settings = _settings(home=data_dir)
    if not settings.kafka_bootstrap:
        raise typer.BadParameter("set CONTEXT_ENGINE_KAFKA_BOOTSTRAP (`up` does this for its children)")
    configure_logging(settings.log_level, process="worker")
    run_worker(settings, settings.kafka_bootstrap)


guardrail_app = typer.Typer(no_args_is_help=True, help="Signed guardrail layers L1-L4 (docs/guardrails.md).")
app.add_typer(guardrail_app, name="guardrail")
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
    from streams.kafka_security import client_security
    from streams.record_auth import signer_from_settings
    from streams.topics import LogTopics

    try:
        command = pg.PublishGuardrail(level, layer_scope(level, org, pillar, team, agent),
                                      pg.read_layer_file(file), force=force)
    except InvalidArgument as exc:
        raise typer.BadParameter(exc.message) from exc
    limit = parse_duration(timeout).total_seconds()
    settings = _stack_settings(data_dir)
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
    topics = LogTopics.from_settings(settings)

    async def go():
        async with admin_pool(settings) as pool:
            return await pg.publish_guardrail(
                command, key=key, pool=pool, bootstrap=settings.kafka_bootstrap, topic=topics.events,
                partitions=topics.partitions[topics.events], timeout=limit,
                actor=f"cli:{os.environ.get('USER', 'operator')}",
                signer=signer_from_settings(settings), security=client_security(settings))

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
    settings = _stack_settings(data_dir)
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

    settings = _settings(home=data_dir)
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


keys_app = typer.Typer(no_args_is_help=True,
                       help="The keys that sign the log's records (docs/operations.md, \"Log keys\").")
app.add_typer(keys_app, name="keys")


@keys_app.command("rotate-log-key")
def keys_rotate_log_key(
    activate_in: Annotated[Optional[str], typer.Option(
        help="sign with it only after this long (e.g. 10m: time to copy the keyring to every host)")] = None,
    data_dir: DataDir = None,
) -> None:
    """Add a new key to the log keyring, signing from now (or after --activate-in). Older keys keep
    verifying until retired; running processes follow the file (producers within a second)."""
    from streams import record_auth

    path = _settings(home=data_dir).log_keyring_path
    try:
        key = record_auth.rotate(path, activate_in=parse_duration(activate_in).total_seconds() if activate_in else 0.0)
    except record_auth.KeyringError as exc:
        raise typer.BadParameter(str(exc)) from exc
    typer.echo(f"added log key {key.key_id} to {path}; it signs from {key.signing_from.isoformat(timespec='seconds')}")


@keys_app.command("retire-log-key")
def keys_retire_log_key(
    key_id: Annotated[str, typer.Argument(help="the key to remove (`context-engine keys list-log-keys`)")],
    data_dir: DataDir = None,
) -> None:
    """Remove a key from the log keyring: records it signed are refused from then on (the key that
    signs now cannot be retired; rotate first). Waits until the newer key has signed for a few seconds."""
    from streams import record_auth

    path = _settings(home=data_dir).log_keyring_path
    try:
        waited = record_auth.retire(path, key_id)
    except record_auth.KeyringError as exc:
        raise typer.BadParameter(str(exc)) from exc
    typer.echo(f"retired log key {key_id} from {path}" + (f" (after waiting {waited:.1f}s for producers to switch)"
                                                         if waited else ""))


@keys_app.command("list-log-keys")
def keys_list_log_keys(data_dir: DataDir = None) -> None:
    """Show the log keyring's keys (ids and times, never the secrets)."""
    from streams import record_auth

    path = _settings(home=data_dir).log_keyring_path
    try:
        keys = record_auth.read_keys(path)
    except record_auth.KeyringError as exc:
        raise typer.BadParameter(str(exc)) from exc
    now = dt.datetime.now(dt.UTC)
    signing = record_auth.signing_key(keys, now)
    for key in sorted(keys, key=lambda k: k.created_at):
        state = "signs" if key is signing else ("verifies" if key.signing_from <= now else "signs later")
        typer.echo(f"{key.key_id}  created {key.created_at.isoformat(timespec='seconds')}  "
                   f"signing from {key.signing_from.isoformat(timespec='seconds')}  {state}")


def main() -> None:
    app()
