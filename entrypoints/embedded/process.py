"""Child processes of the embedded stack: parent-death signals, process-tree kills, ports."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def disable_grpc_fork_handlers() -> None:
    """gRPC core's fork handlers restart its epoll poller thread in a forked child; when
    subprocess then closes inherited descriptors before exec, that thread hits EBADF and aborts
    the child (grpc/grpc#43055). The engine forks only to exec (the embedded PostgreSQL, the
    broker, workers), so the handlers buy nothing. gRPC reads the setting once, when it
    initialises: call this before anything imports grpc. An explicit setting in the environment wins."""
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

_PR_SET_PDEATHSIG = 1


def child_preexec(death_signal: int = signal.SIGTERM, *,
                  own_process_group: bool = False) -> Callable[[], None] | None:
    """A preexec_fn that makes the child get `death_signal` when the spawning *thread* exits.

    The kernel ties PDEATHSIG to the thread that forked, not the process: spawn long-lived
    children from the main thread (or one that lives as long as they do), not from
    asyncio.to_thread. Returns None where prctl is unavailable (non-Linux).
    `own_process_group` moves the child out of the terminal's foreground group, so a Ctrl-C
    reaches only the supervisor, which then stops its children in order.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(death_signal))
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
        if own_process_group:
            os.setpgid(0, 0)

    return preexec



def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"



def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])



def _alive(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the child still runs, *without* reaping it (see kill_tree)."""
    if proc.returncode is not None:
        return False
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False



def kill_tree(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    """SIGKILL a child and its direct children, then reap it and wait for them to be gone.

    PostgreSQL backends each lead their own session, so a process-group kill misses them;
    orphans would keep the shared memory segment attached and block the next start. The
    parent is stopped first so that it can neither fork nor reap: every pid we then signal
    is still the process we listed, never a reused number."""
    children: list[int] = []
    if proc.returncode is None:
        try:
            os.kill(proc.pid, signal.SIGSTOP)
            children = _children_of(proc.pid)
            for child in children:
                _signal(child, signal.SIGKILL)
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    deadline = time.monotonic() + timeout
    while any(_exists(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.01)



def _children_of(pid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat_fields = _stat_fields(int(entry.name))
            if stat_fields and int(stat_fields[1]) == pid:
                found.append(int(entry.name))
    return found



def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from field 3 (state) on; comm may hold spaces, so split after ')'."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None



def _exists(pid: int) -> bool:
    """Alive and not a zombie (a zombie holds no resources; init reaps it)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"



def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
