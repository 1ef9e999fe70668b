"""`context-engine up`: the whole stack in one process tree.

Start order: PostgreSQL (embedded unless a database URL is given) and its schema migrations,
the broker (embedded unless a bootstrap is given) and its topics, then the children — stream
workers, the API (one process or --api-processes N) and the ML detector — each a `context-engine`
subprocess that reads the same settings from the environment.

A child that exits during start-up fails the start (most likely its configuration is wrong).
Once SERVING, `up` restarts a child that exits (kill -9, a crash) with a bounded back-off
(`Stack.supervise`); while the worker is down the API's health says NOT_SERVING
(streams/readiness.py). The embedded broker and the embedded PostgreSQL are started again on
their ports when they die (PostgreSQL recovers from its write-ahead log; the worker and the API
reconnect). What is being brought back, and what was lately, is in run/recovery.json, which
`status` shows (entrypoints/recovery.py). `up` returns when it gets SIGINT/SIGTERM (exit 0) or
when a child, the embedded broker or the embedded PostgreSQL dies more often than its restart
budget allows (exit 1); either way it stops every child (SIGTERM, then SIGKILL after a grace
period), then the broker, then PostgreSQL.
Children also get PR_SET_PDEATHSIG so they cannot outlive a killed `up`. One `up` per data
directory: the first thing `up` does is lock `run/up.lock` (claim_home); a second one is refused
there, before it touches anything of the running stack's.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from context_engine.auth import ensure_dev_key, ensure_secret
from context_engine.config import ENV_PREFIX, Settings
from context_engine.guardrails.signing import ensure_signing_key, operator_key_path
from entrypoints.capabilities import degraded_capabilities
from entrypoints.embedded.process import child_preexec
from entrypoints.recovery import RecoveryRecord
from inference.detector.token import service_token as detector_service_token
from projections.store.migrations import migrate

if TYPE_CHECKING:
    from entrypoints.embedded.broker import EmbeddedBroker
    from entrypoints.embedded.postgres import EmbeddedPostgres
from streams import readiness
from streams.topics import ensure_log_topics

DATABASE_NAME = "context_engine"
# The scope of the banner's token and call commands: the README's examples' (acme/sales/emea). A
# token reads what its own scope and the scopes above it own, so an org-level token would find
# nothing the README's examples write (tests/unit/test_banner_and_readme.py holds them together).
EXAMPLE_SCOPE = {"org": "acme", "pillar": "sales", "team": "emea"}
EXAMPLE_CLEARANCE = 3
# The detector reaches neither PostgreSQL nor the broker, and signs nothing: it is given none of
# their settings (URLs, passwords and password files, TLS keys, the log keyring, the JWT key,
# the embedding API key).
DETECTOR_WITHHELD = re.compile(rf"{ENV_PREFIX}(.*DATABASE.*|KAFKA_.*|.*PASSWORD.*|.*KEYRING.*|JWT_.*|.*API_KEY.*)")
BROKER_RESTARTS_PER_MINUTE = 10
POSTGRES_RESTARTS_PER_MINUTE = 5
# Crash recovery replays the write-ahead log since the last checkpoint before PostgreSQL accepts
# connections again.
POSTGRES_RECOVERY_TIMEOUT_S = 120.0
# A child's restarts: at most this many in any minute, the n-th of them after
# restart_delay(n) seconds (0, 1, 2, 4 then 8 s): a child that crashes at once on every start
# stops the stack in ~15 s instead of spinning.
CHILD_RESTARTS_PER_MINUTE = 5
RESTART_DELAY_MAX_S = 8.0


def restart_delay(earlier_restarts: int) -> float:
    """Seconds to wait before restarting a child that was restarted `earlier_restarts` times in
    the last minute: none the first time (writes wait on the worker; an API process's clients
    wait on it when it is the only one), then doubling from 1 s up to RESTART_DELAY_MAX_S."""
    if earlier_restarts <= 0:
        return 0.0
    return min(RESTART_DELAY_MAX_S, 2.0 ** (earlier_restarts - 1))


@dataclass
class Child:
    name: str
    args: list[str]
    log_path: os.PathLike
    proc: subprocess.Popen | None = field(default=None, repr=False)
    restarts: list[float] = field(default_factory=list)  # monotonic times of restarts in the last minute
    restart_at: float | None = None  # when a dead child is due to start again
    withheld: re.Pattern[str] | None = None  # environment variables (credentials) this child does not need

    def start(self, env: dict[str, str]) -> int:
        """Start the child; its pid."""
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "context_engine", *self.args],
            env={k: v for k, v in env.items() if not (self.withheld and self.withheld.fullmatch(k))},
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=child_preexec(own_process_group=True))
        log.close()
        return self.proc.pid

    @property
    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_or_kill(self, deadline: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Stack:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = settings.home_dir
        self.logs = self.home / "logs"
        self.postgres: EmbeddedPostgres | None = None
        self.broker: EmbeddedBroker | None = None
        self.children: list[Child] = []
        self.stopping = threading.Event()
        self.broker_restarts: list[float] = []  # monotonic times of restarts in the last minute
        self.postgres_restarts: list[float] = []
        self.postgres_retry_at = 0.0  # after a failed restart, when to try again
        self.env: dict[str, str] = {}
        self.claim: int | None = None  # the data directory's lock (claim_home), once this `up` holds it
        self.recovery = RecoveryRecord(self.home, say=self.say)  # what `status` says is recovering

    def say(self, message: str) -> None:
        print(f"[up] {message}", flush=True)

    # -- start ---------------------------------------------------------------------------
    def start(self) -> dict[str, str]:
        # First: another `up` on this data directory is named, and none of its files is touched.
        self.claim = claim_home(self.home)
        self.recovery.start_afresh()
        check_ports(self.settings)  # before anything starts: a taken port is named, not "api exited with 1"
        self.logs.mkdir(parents=True, exist_ok=True)
        keys = self.home / "keys"  # earlier releases made it 0755; closed to the engine's user here
        keys.mkdir(mode=0o700, parents=True, exist_ok=True)
        keys.chmod(0o700)
        ensure_dev_key(self.settings.hs256_key_path)
        # Before any child starts: the home's guardrail operator key with its public half
        # (keys/guardrail-ed25519.pub, written beside it), which is what layers are trusted from
        # by default (the API and the worker read only the .pub, never the private key), and the
        # detector's service token, which the detector requires and its clients send (both read
        # it from the home; it is never printed).
        ensure_signing_key(operator_key_path(self.home))
        try:
            detector_service_token(self.settings)
        except ValueError as exc:
            raise RuntimeError(str(exc)) from exc
        env = {k: v for k, v in os.environ.items()}
        env[f"{ENV_PREFIX}HOME"] = str(self.home)

        database_url = self.settings.database_url
        if database_url is None:
            from entrypoints.embedded.postgres import EmbeddedPostgres, default_shared_buffers_mb

            buffers = self.settings.embedded_postgres_shared_buffers_mb or default_shared_buffers_mb()
            self.postgres = EmbeddedPostgres(self.home / "postgres", self.settings.embedded_postgres_port,
                                             settings={"shared_buffers": f"{buffers}MB"})
            self.postgres.start()
            database_url = self.postgres.ensure_database(DATABASE_NAME)
            self.say(f"PostgreSQL (embedded, pid {self.postgres.pid}) at {redact_url(database_url)}")
        else:
            self.say(f"PostgreSQL (external) at {redact_url(database_url)}")
        env[f"{ENV_PREFIX}DATABASE_URL"] = database_url
        applied = migrate_schema(self.settings, database_url)
        self.say(f"schema migrations: {', '.join(applied) if applied else 'up to date'}")

        bootstrap = self.settings.kafka_bootstrap
        if bootstrap is None:
            from entrypoints.embedded.broker import EmbeddedBroker

            self.broker = EmbeddedBroker(self.settings.embedded_kafka_port, log_path=self.logs / "broker.log")
            self.broker.start()
            bootstrap = self.broker.bootstrap
            self.say(f"broker (embedded tansu, pid {self.broker.pid}) at {bootstrap}")
        else:
            self.say(f"broker (external) at {bootstrap}")
        env[f"{ENV_PREFIX}KAFKA_BOOTSTRAP"] = bootstrap
        # Before any client touches the broker: a Metadata request would auto-create a topic
        # with the wrong partition count.
        asyncio.run(ensure_log_topics(self.settings, bootstrap))

        write_stack_file(self.home, database_url, bootstrap, api_address=self.settings.api_address,
                         detector_address=self.settings.detector_address)
        readiness.clear(self.home)  # SERVING waits for this worker's word, not an earlier one's
        env[readiness.HEALTH_FOLLOWS_WORKER_ENV] = "1"  # the API's health: NOT_SERVING while no worker projects
        self.env = env
        apis = self.settings.api_processes
        self.children = [
            Child("worker", ["worker"], self.logs / "worker.log"),
            *(Child("api" if apis == 1 else f"api-{i}", ["serve", "api", "--process-index", str(i)],
                    self.logs / ("api.log" if apis == 1 else f"api-{i}.log")) for i in range(apis)),
            Child("detector", ["serve", "detector"], self.logs / "detector.log", withheld=DETECTOR_WITHHELD),
        ]
        for child in self.children:
            pid = child.start(env)
            self.say(f"{child.name} started (pid {pid}, log {child.log_path})")
        return env

    def wait_until_serving(self) -> None:
        deadline = time.monotonic() + self.settings.ready_timeout_s
        # An ingest is acknowledged only once the worker has projected it: SERVING waits until
        # the worker has joined its group (streams/readiness.py), and so does the API's health.
        self._wait_for(lambda: readiness.is_ready(self.home), deadline, "the worker not projecting", "worker")
        for name, address in (("api", self.settings.api_address), ("detector", self.settings.detector_address)):
            self._wait_for(lambda address=address: is_serving(address), deadline,
                           f"{name} not SERVING at {address}", name)

    def _wait_for(self, condition, deadline: float, failure: str, log_name: str) -> None:
        while not condition():
            self._raise_if_child_died()
            if self.stopping.is_set():
                raise InterruptedError("stop requested during start-up")
            if time.monotonic() > deadline:
                waited = self.settings.ready_timeout_s
                raise TimeoutError(f"{failure} after {waited:.0f}s (CONTEXT_ENGINE_READY_TIMEOUT_S); "
                                   f"see {self.logs / (log_name + '.log')}")
            time.sleep(0.1)

    def _raise_if_child_died(self) -> None:
        for child in self.children:
            if child.exited is not None:
                raise ChildDied(child)

    # -- run -------------------------------------------------------------------------------
    def monitor(self) -> int:
        while not self.stopping.wait(0.2):
            if self.postgres is not None and not self.postgres.is_running() \
                    and time.monotonic() >= self.postgres_retry_at:
                if not self._restart_postgres():
                    return 1
            if self.broker is not None and not self.broker.is_running():
                if not self._restart_broker():
                    return 1
            for child in self.children:
                if not self.supervise(child):
                    return 1
            if self.recovery.recovering("worker") and readiness.is_ready(self.home):
                self.recovery.recovered("worker")
        return 0

    def supervise(self, child: Child) -> bool:
        """Restart `child` if it has exited: at once the first time, then after restart_delay(n)
        for the n-th restart within a minute. When it exits again after CHILD_RESTARTS_PER_MINUTE
        restarts in the last minute the budget is exhausted: returns False, and `up` stops the
        whole stack and exits 1 (as it did on any child's exit before restarts existed). A
        worker's death clears its ready mark at once, so the API's health says NOT_SERVING until
        the new worker has its partitions."""
        now = time.monotonic()
        if child.restart_at is None:
            code = child.exited
            if code is None:
                return True
            if child.name == "worker":
                readiness.clear(self.home)
            child.restarts = [t for t in child.restarts if now - t < 60]
            if len(child.restarts) >= CHILD_RESTARTS_PER_MINUTE:
                self.say(f"{child.name} exited with {code} after {len(child.restarts)} restarts in a minute; "
                         f"stopping the stack (see {child.log_path})")
                return False
            delay = restart_delay(len(child.restarts))
            child.restart_at = now + delay
            self.recovery.died(child.name, len(child.restarts) + 1)
            self.say(f"{child.name} exited with {code}; restarting it"
                     + (f" in {delay:.0f}s" if delay else "") + f" (see {child.log_path})")
        if now < child.restart_at:
            return True
        child.restart_at = None
        child.restarts.append(now)
        try:
            pid = child.start(self.env)
        except OSError as exc:
            self.say(f"{child.name} could not be restarted ({exc}); stopping the stack")
            return False
        self.say(f"{child.name} restarted (pid {pid})")
        if child.name != "worker":  # the worker is back when it has its partitions again (monitor)
            self.recovery.recovered(child.name)
        return True

    def _restart_broker(self) -> bool:
        """The embedded broker keeps nothing worth keeping (memory storage): when it dies, start
        it again on the same port; the API holds appends and restores the log from the archive.
        Measured: the bundled tansu can crash (SIGSEGV) answering a produce that reaches it in
        its first milliseconds, so a restart may need a second try."""
        now = time.monotonic()
        self.broker_restarts = [t for t in self.broker_restarts if now - t < 60] + [now]
        if len(self.broker_restarts) > BROKER_RESTARTS_PER_MINUTE:
            self.say(f"broker died {len(self.broker_restarts)} times in a minute; stopping the stack")
            return False
        self.say("broker exited; restarting it (the API restores the log from the archive)")
        self.recovery.died("broker", len(self.broker_restarts))
        assert self.broker is not None, "only the embedded broker is restarted"
        try:
            self.broker.restart()
        except Exception as exc:  # it may crash again at once: the next pass retries
            self.say(f"broker restart failed: {str(exc).splitlines()[0]}")
            self.recovery.waiting("broker", "a restart failed; trying again")
            return True
        self.recovery.recovered("broker")
        return True

    def _restart_postgres(self) -> bool:
        """The embedded PostgreSQL died (kill -9, out of memory): reap what is left of it (orphaned
        backends would hold its shared memory and block the start) and start it again on its port;
        it replays its write-ahead log, so every committed row is back. Meanwhile the worker retries
        its batch (or exits and is restarted) and the API answers UNAVAILABLE, then both reconnect."""
        now = time.monotonic()
        self.postgres_restarts = [t for t in self.postgres_restarts if now - t < 60] + [now]
        if len(self.postgres_restarts) > POSTGRES_RESTARTS_PER_MINUTE:
            self.say(f"PostgreSQL died {len(self.postgres_restarts)} times in a minute; stopping the stack "
                     f"(see {self.home / 'postgres.log'})")
            return False
        assert self.postgres is not None, "only the embedded PostgreSQL is restarted"
        self.say("PostgreSQL exited; restarting it (crash recovery from its write-ahead log)")
        self.recovery.died("postgres", len(self.postgres_restarts))
        started = time.monotonic()
        try:
            self.postgres.kill()
            self.postgres.start(timeout=POSTGRES_RECOVERY_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - tried again after a growing delay, within the budget
            delay = restart_delay(len(self.postgres_restarts))
            self.postgres_retry_at = time.monotonic() + delay
            self.say(f"PostgreSQL restart failed: {str(exc).splitlines()[0]}; trying again in {delay:.0f}s")
            self.recovery.waiting("postgres", f"a restart failed; trying again in {delay:.0f}s")
            return True
        self.say(f"PostgreSQL restarted (pid {self.postgres.pid}) after {time.monotonic() - started:.1f}s")
        self.recovery.recovered("postgres")
        return True

    # -- stop ------------------------------------------------------------------------------
    def stop(self) -> None:
        if self.claim is None:  # refused before anything started: the directory is another `up`'s
            return
        deadline = time.monotonic() + self.settings.shutdown_grace_seconds + 5.0
        for child in reversed(self.children):
            child.terminate()
        for child in reversed(self.children):
            child.wait_or_kill(deadline)
        if self.broker is not None:
            with contextlib.suppress(Exception):
                self.broker.stop()
        if self.postgres is not None:
            with contextlib.suppress(Exception):
                self.postgres.stop()
        stack_file(self.home).unlink(missing_ok=True)
        os.close(self.claim)
        self.claim = None
        self.say("stopped")


def migrate_schema(settings: Settings, database_url: str) -> list[str]:
    """Bring the database of `database_url` (an admin URL) to the current schema; the versions
    applied now. Each migration runs once whatever else migrates at the same time (an advisory
    lock, projections/store/migrations.py). The API's role gets its own password (the API reads the same
    file), unless the operator gave the API's URL: then that role and its password are theirs."""
    app_password = None if settings.api_database_url else ensure_secret(settings.app_password_path)
    return asyncio.run(migrate(database_url, app_password=app_password))


def stack_file(home: Path) -> Path:
    return home / "run" / "stack.json"


class StackRunning(RuntimeError):
    """Another `up` holds the data directory."""


def claim_home(home: Path) -> int:
    """Take the data directory for this `up`: an exclusive lock on `run/up.lock` (which holds the
    pid), kept by the returned descriptor until it is closed or the process ends, however it ends.
    StackRunning, naming the `up` that holds it and its API, when another does: nothing of that
    stack's (its run/stack.json, its readiness mark) is touched."""
    run = home / "run"
    run.mkdir(parents=True, exist_ok=True)
    fd = os.open(run / "up.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        api = read_stack_file(home).get("api_address")
        raise StackRunning(
            f"a stack already runs in {home}: `up` pid {holder}, "
            + (f"ContextEngine at {api}" if api else "still starting")
            + f" ({command_line()} status --data-dir {home}); stop it (kill -TERM {holder}) first, "
            "or start this one with another --data-dir") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def write_stack_file(home: Path, database_url: str, bootstrap: str, *, api_address: str = "",
                     detector_address: str = "") -> None:
    """Where the running stack's PostgreSQL, broker, API and detector are, for CLI commands
    (replay, verify, status…) run beside it: `context-engine verify --data-dir DIR` then needs no
    other option."""
    path = stack_file(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    # 0600: the URL carries the admin's password. A new file replaces one an earlier release
    # left readable.
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # O_CREAT keeps the mode of a file already there
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps({"database_url": database_url, "kafka_bootstrap": bootstrap, "api_address": api_address,
                            "detector_address": detector_address}))
    os.replace(tmp, path)


def read_stack_file(home: Path) -> dict[str, str]:
    try:
        return json.loads(stack_file(home).read_text())
    except (OSError, ValueError):
        return {}


def command_line() -> str:
    """How to run `context-engine` from a shell, as this process was run: the entry point's
    absolute path (a venv's bin is rarely on PATH), or the interpreter with -m."""
    entry = Path(sys.argv[0])
    if entry.name == "context-engine" and entry.exists():
        return str(entry.resolve())
    return f"{sys.executable} -m context_engine"


class PortTaken(OSError):
    pass


def check_ports(settings: Settings) -> None:
    """PortTaken naming the first port the stack would listen on that another process holds,
    and the setting (and `up` option) that moves it."""
    wanted: list[tuple[str, int, str, str, str | None]] = [
        (settings.api_host, settings.api_port, "ContextEngine gRPC", "CONTEXT_ENGINE_API_PORT", "--api-port"),
        (settings.detector_host, settings.detector_port, "ML detector gRPC", "CONTEXT_ENGINE_DETECTOR_PORT",
         "--detector-port")]
    if settings.metrics_port > 0:
        wanted += [(settings.api_host, settings.metrics_port + i, "API metrics", "CONTEXT_ENGINE_METRICS_PORT",
                    "--metrics-port") for i in range(settings.api_processes)]
    if settings.worker_metrics_port > 0:
        wanted.append((settings.api_host, settings.worker_metrics_port, "worker metrics",
                       "CONTEXT_ENGINE_WORKER_METRICS_PORT", None))
    for host, port, what, setting, option in wanted:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: TIME_WAIT is free
            try:
                probe.bind((host, port))
            except OSError as exc:
                moved = f"{setting}" + (f" or `up {option} PORT`" if option else "")
                raise PortTaken(f"port {port} on {host} ({what}) is taken: {exc.strerror}; another process "
                                f"listens there (an earlier stack?); stop it, or move the port with {moved}") from None


class ChildDied(RuntimeError):
    def __init__(self, child: Child) -> None:
        super().__init__(f"{child.name} exited with {child.exited} during start-up; see {child.log_path}")


def is_serving(address: str, service: str = "") -> bool:
    """Whether the gRPC health of `service` (the server's own: "") at `address` is SERVING."""
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                             timeout=0.5)
        return reply.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def redact_url(url: str) -> str:
    """`url` with its password masked (`postgresql://postgres:***@host/db`), to print."""
    head, sep, tail = url.partition("@")
    if not sep or ":" not in head.split("//", 1)[-1]:
        return url
    scheme, _, userinfo = head.partition("//")
    return f"{scheme}//{userinfo.split(':', 1)[0]}:***@{tail}"


def banner_commands(home: Path) -> list[str]:
    """The banner's lines that say how to call the stack: a token command and a `call`, both in
    EXAMPLE_SCOPE (the README's), and why the scope matters."""
    scope = " ".join(f"--{level} {name}" for level, name in EXAMPLE_SCOPE.items())
    return [f"get a token:     {command_line()} token mint {scope} --clearance {EXAMPLE_CLEARANCE} --data-dir {home}",
            f"or call it:      {command_line()} call Search '{{\"query\": \"refund policy\"}}' {scope} "
            f"--data-dir {home}",
            "scopes:          a token reads what its own scope and the scopes above it wrote: "
            "read with the --org/--pillar/--team you wrote with"]


def stop_on_signal(stopping: threading.Event, say: Callable[[str], None]) -> Callable[[int, object], None]:
    """A handler of SIGINT and SIGTERM that sets `stopping`, from a thread: a handler runs in the
    main thread between two bytecodes, maybe inside stopping.wait() holding the lock that
    stopping.set() takes (or inside a print, whose lock `say` takes), and would wait for itself."""
    said = threading.Lock()

    def stop(signum: int) -> None:
        if said.acquire(blocking=False):  # a second signal (make's and the shell's) changes nothing
            say(f"{signal.Signals(signum).name} received")
        stopping.set()

    def on_signal(signum: int, _frame: object) -> None:
        threading.Thread(target=stop, args=(signum,), name="stop-signal", daemon=True).start()

    return on_signal


def run_stack(settings: Settings) -> int:
    stack = Stack(settings)

    on_signal = stop_on_signal(stack.stopping, stack.say)
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    try:
        stack.start()
        stack.wait_until_serving()
        stack.say(f"SERVING after {time.monotonic() - started:.1f}s")
        stack.say(f"ContextEngine    grpc://{settings.api_address}  (upsquad.context.v1.ContextEngine"
                  + (f", {settings.api_processes} processes)" if settings.api_processes > 1 else ")"))
        if settings.metrics_port > 0:
            stack.say(f"metrics          http://{settings.api_host}:{settings.metrics_port}/metrics"
                      + (" (+1 per API process)" if settings.api_processes > 1 else ""))
        stack.say(f"ML detector      grpc://{settings.detector_address}  (upsquad.ml.v1.MLDetectorService)")
        stack.say(f"data directory   {settings.home_dir}")
        for line in banner_commands(settings.home_dir):
            stack.say(line)
        for line in degraded_capabilities(settings, command_line()):
            stack.say(f"degraded: {line}")
        stack.say("Ctrl-C or SIGTERM stops everything")
        return stack.monitor()
    except (ChildDied, TimeoutError, InterruptedError, OSError, RuntimeError) as exc:
        stack.say(f"start-up failed: {exc}")
        return 0 if isinstance(exc, InterruptedError) else 1
    finally:
        stack.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
