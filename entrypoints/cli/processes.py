"""Running the engine: `up` (the whole stack), `serve api|detector` (one server process), `worker`,
and `migrate` (the schema, once, for processes run apart)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Optional

import typer

from entrypoints.cli.options import DataDir
from entrypoints.cli.settings import command_settings

serve_app = typer.Typer(no_args_is_help=True, help="Run one server process (what `up` starts).")


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
    from entrypoints.supervisor import run_stack

    settings = command_settings(home=data_dir, api_port=api_port, detector_port=detector_port,
                                kafka_bootstrap=kafka_bootstrap, database_url=database_url,
                                api_processes=api_processes, metrics_port=metrics_port)
    raise typer.Exit(run_stack(settings))


@serve_app.command("api")
def serve_api(
    data_dir: DataDir = None,
    process_index: Annotated[int, typer.Option(
        min=0, help="Which of the api_processes this is (its metrics port is metrics_port + index)")] = 0,
) -> None:
    """Serve upsquad.context.v1.ContextEngine."""
    from context_engine.logs import configure_logging
    from entrypoints.api.app import run_api

    settings = command_settings(home=data_dir)
    configure_logging(settings.log_level, process=f"api-{process_index}" if settings.api_processes > 1 else "api")
    asyncio.run(run_api(settings, process_index))


@serve_app.command("detector")
def serve_detector(data_dir: DataDir = None) -> None:
    """Serve upsquad.ml.v1.MLDetectorService."""
    from context_engine.logs import configure_logging
    from entrypoints.detector.server import run_detector

    settings = command_settings(home=data_dir)
    configure_logging(settings.log_level, process="detector")
    asyncio.run(run_detector(settings))


def worker(data_dir: DataDir = None) -> None:
    """Run the stream workers (the Faust app) against the configured broker."""
    from context_engine.logs import configure_logging
    from streams.app import run_worker

    settings = command_settings(home=data_dir)
    if not settings.kafka_bootstrap:
        raise typer.BadParameter("set CONTEXT_ENGINE_KAFKA_BOOTSTRAP (`up` does this for its children)")
    configure_logging(settings.log_level, process="worker")
    run_worker(settings, settings.kafka_bootstrap)


def migrate(
    data_dir: DataDir = None,
    database_url: Annotated[Optional[str], typer.Option(
        help="PostgreSQL admin URL (default CONTEXT_ENGINE_DATABASE_URL)")] = None,
) -> None:
    """Bring the database to the current schema and exit (what `up` does first), for a deployment
    that runs the API, workers and detector apart: each migration is applied once, however many
    processes migrate at the same time."""
    from entrypoints.supervisor import migrate_schema

    settings = command_settings(home=data_dir, database_url=database_url)
    if not settings.database_url:
        raise typer.BadParameter("set CONTEXT_ENGINE_DATABASE_URL or --database-url")
    applied = migrate_schema(settings, settings.database_url)
    typer.echo(f"schema migrations: {', '.join(applied) if applied else 'up to date'}")
