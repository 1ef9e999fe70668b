"""`replay` (rebuild the read models from the log) and `verify` (compare them with it)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Optional

import typer

from context_engine.config import Settings, required
from entrypoints.cli.options import DataDir
from entrypoints.cli.settings import stack_settings


def _progress(description: str):
    from tqdm import tqdm

    bar = tqdm(desc=description, unit="event")  # whole events: unit_scale printed 0.00/49.0

    def set_total(total: int) -> None:
        bar.total = total
        bar.refresh()

    return bar, set_total


SourceOption = Annotated[Optional[str], typer.Option(
    "--source", help="log (the broker's topic) or archive (its copy in PostgreSQL); "
                     "default: archive when the log is restored from it, else log")]


def _records(settings: Settings, source_name: str | None, on_total, on_refused=None):
    from streams.kafka_security import client_security
    from streams.record_auth import verifier_from_settings
    from streams.replay import source
    from streams.topics import LogTopics

    name = source_name or ("archive" if settings.restore_log_from_archive else "log")
    return source(name, bootstrap=required(settings.kafka_bootstrap, "kafka_bootstrap"),
                  topic=LogTopics.from_settings(settings).events,
                  admin_url=required(settings.database_url, "database_url"), verifier=verifier_from_settings(settings),
                  security=client_security(settings), on_total=on_total, on_refused=on_refused)


def replay(
    into: Annotated[Optional[str], typer.Option(
        help="PostgreSQL URL of an empty database to rebuild into "
             "(default: a new database beside the live one)")] = None,
    source_name: SourceOption = None,
    data_dir: DataDir = None,
) -> None:
    """Rebuild every read model from the log into an empty database, and the audit trail from
    its stream. Without --into the new database stays: its name is printed, with the SQL that
    drops it."""
    from entrypoints.supervisor import redact_url
    from projections.store import admin
    from streams.replay import replay as run_replay

    settings = stack_settings(data_dir)
    admin_url = required(settings.database_url, "database_url")
    refused: list = []
    created = None if into else admin.timestamped_name("context_engine_replay")

    async def go():
        target = into or await admin.create_database(admin_url, created)
        bar, set_total = _progress("replay")
        with bar:
            report = await run_replay(_records(settings, source_name, set_total, refused.append), target,
                                      progress=bar.update)
        return target, report, await _audit_rows(settings, target)

    target, report, audit_rows = asyncio.run(go())
    for record in refused:
        typer.echo(str(record))
    typer.echo(f"replayed {report.events} events in {report.seconds:.2f}s "
               f"({report.rate:,.0f} events/s) and {audit_rows} audit rows into {redact_url(target)}"
               + (f"; left out {len(refused)} record(s) no trusted writer signed" if refused else ""))
    if created:
        typer.echo(f"database {created} is new and stays; to drop it, run as the admin of {redact_url(admin_url)} "
                   f"(the database_url of run/stack.json, or CONTEXT_ENGINE_DATABASE_URL): "
                   f"{admin.drop_database_sql(created)};")


async def _audit_rows(settings: Settings, target: str) -> int:
    """The audit:access stream into `target`, as the audit writer stores it."""
    from projections.store.pool import create_pool
    from streams.agents.audit import write_from_log
    from streams.kafka_security import client_security
    from streams.record_auth import verifier_from_settings
    from streams.topics import LogTopics

    pool = await create_pool(target, org_scoped=False, min_size=1, max_size=1)
    try:
        return await write_from_log(required(settings.kafka_bootstrap, "kafka_bootstrap"),
                                    LogTopics.from_settings(settings).jobs["audit:access"], pool,
                                    verifier=verifier_from_settings(settings), security=client_security(settings))
    finally:
        await pool.close()


def verify(source_name: SourceOption = None, data_dir: DataDir = None) -> None:
    """Recompute every version hash from the log and report each difference from the read models,
    and every event that is on the log and not in the archive (nor set aside), or the other way.

    Records on the log that no trusted writer signed are listed apart, by position: the worker
    refused them, so they are no difference (the exit status counts differences only)."""
    from streams.kafka_security import client_security
    from streams.record_auth import verifier_from_settings
    from streams.replay import read_log
    from streams.replay import verify as run_verify
    from streams.topics import LogTopics

    settings = stack_settings(data_dir)
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
