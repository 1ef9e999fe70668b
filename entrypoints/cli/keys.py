"""`keys rotate-log-key|retire-log-key|list-log-keys`: the log keyring."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Optional

import typer

from entrypoints.cli.options import DataDir, parse_duration
from entrypoints.cli.settings import command_settings

keys_app = typer.Typer(no_args_is_help=True,
                       help="The keys that sign the log's records (docs/operations.md, \"Log keys\").")


@keys_app.command("rotate-log-key")
def keys_rotate_log_key(
    activate_in: Annotated[Optional[str], typer.Option(
        help="sign with it only after this long (e.g. 10m: time to copy the keyring to every host)")] = None,
    data_dir: DataDir = None,
) -> None:
    """Add a new key to the log keyring, signing from now (or after --activate-in). Older keys keep
    verifying until retired; running processes follow the file (producers within a second)."""
    from streams import record_auth

    path = command_settings(home=data_dir).log_keyring_path
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

    path = command_settings(home=data_dir).log_keyring_path
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

    path = command_settings(home=data_dir).log_keyring_path
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
