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


@contextlib.asynccontextmanager
async def acknowledged_log(settings: Settings, pool):
    """The log and archive watch of a command that appends beside the stack as the API does
    (`guardrail publish`): (EventLog, ArchiveWatch), records signed with the stack's keyring. Its
    guard re-creates topics a restarted broker lost; restoring the log from the archive stays the
    supervisor's and the API's job."""
    from streams.acknowledgement import ArchiveWatch
    from streams.kafka_security import client_security
    from streams.log import EventLog
    from streams.record_auth import signer_from_settings
    from streams.topics import LogTopics, ensure_log_topics

    bootstrap = required(settings.kafka_bootstrap, "kafka_bootstrap")

    async def recover() -> None:
        await ensure_log_topics(settings, bootstrap)

    log = EventLog(bootstrap, LogTopics.from_settings(settings), recover, signer=signer_from_settings(settings),
                   security=client_security(settings))
    watch = ArchiveWatch(required(settings.database_url, "database_url"), pool)
    await log.start()
    try:
        await watch.start()
        yield log, watch
    finally:
        await watch.stop()
        await log.stop()
