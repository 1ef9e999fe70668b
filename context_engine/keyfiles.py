"""Private files under the data directory's `keys/`: made once, mode 0600, never seen half-written.

Several processes of one stack start together (`up` starts the worker and the API side by side),
and each may be the first to need a key. `ensure` writes a candidate beside the file and links it
into place, which fails when another process was first: every process then reads the one file
that won. `replace` swaps a file for new contents atomically (a key rotation), under `locked` when
the new contents are computed from the old.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import tempfile
from collections.abc import Callable, Iterator


def ensure(path: pathlib.Path, make: Callable[[], bytes]) -> bytes:
    """The file's contents, creating it from `make()` (mode 0600) when it does not exist."""
    with contextlib.suppress(FileNotFoundError):
        return path.read_bytes()
    candidate = _write_beside(path, make())
    try:
        os.link(candidate, path)  # atomic, and refuses to replace a file another process made first
    except FileExistsError:
        pass
    finally:
        os.unlink(candidate)
    return path.read_bytes()


def replace(path: pathlib.Path, data: bytes, *, mode: int = 0o600) -> None:
    """Give the file new contents (mode 0600, or `mode` for a file that holds no secret, a public
    key): a reader sees the old file or the new, never a part."""
    os.replace(_write_beside(path, data, mode), path)


@contextlib.contextmanager
def locked(path: pathlib.Path) -> Iterator[None]:
    """Hold an exclusive lock on `<path>.lock` (read-modify-write of `path` by several commands)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _write_beside(path: pathlib.Path, data: bytes, mode: int = 0o600) -> pathlib.Path:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # 0600
    try:
        with os.fdopen(fd, "wb") as f:
            if mode != 0o600:
                os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(name)
        raise
    return pathlib.Path(name)
