"""The settings a command runs with, and its admin connection beside a running stack."""

from __future__ import annotations

import contextlib
import os
import pathlib

import typer

from context_engine.config import ENV_PREFIX, Settings, required


def command_settings(**overrides: object) -> Settings:
    """Settings from the environment, with CLI options on top. Options are exported to the
    environment too, so child processes started by `up` resolve the same settings."""
    for name, value in overrides.items():
        if value is not None:
            os.environ[f"{ENV_PREFIX}{name.upper()}"] = str(value)
    return Settings()


def stack_settings(data_dir: pathlib.Path | None) -> Settings:
    """Settings for commands run beside a running stack: the database and broker come from the
    environment, else from the stack file `up` writes into the data directory."""
    from entrypoints.supervisor import read_stack_file

    settings = command_settings(home=data_dir)
    running = read_stack_file(settings.home_dir)
    settings = command_settings(database_url=settings.database_url or running.get("database_url"),
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
    from projections.store.pool import create_pool

    pool = await create_pool(required(settings.database_url, "database_url"), org_scoped=False, min_size=1,
                             max_size=1)
    try:
        yield pool
    finally:
        await pool.close()
