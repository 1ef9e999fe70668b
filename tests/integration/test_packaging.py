"""The built wheel, installed where the editable install cannot reach, runs the services' files.

The image the Dockerfile builds for compose.yaml installs the wheel (`pip install .`), not the
editable tree of `make up` / `make test`: a file the code opens by path (the migrations under
projections/store/sql) that the wheel lacks fails only there. So the wheel is built here, offline, from
a copy of the source tree, installed into a fresh venv that sees the dev venv's dependencies but
not its editable finder, and its migrations are run against a real PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import asyncpg
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from context_engine.auth import ensure_dev_key, mint_token
from entrypoints.embedded.process import child_preexec, free_port
from tests.fixtures.databases import fresh_database
from tests.fixtures.engine import unique
from tests.fixtures.infra import START_TIMEOUT_S, deployment_env
from upsquad.context.v1 import context_pb2 as pb
from upsquad.context.v1 import context_pb2_grpc

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]
MIGRATION_SOURCES = ROOT / "projections" / "store" / "sql"


def source_files() -> list[str]:
    """The tree as a checkout holds it: tracked files and new ones not ignored (no build/, .venv…)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, check=True, capture_output=True).stdout.decode()
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The project's wheel, built from a copy of the tree (a build in place would write build/ and
    egg-info into the shared checkout) with the venv's setuptools: no network, no isolation."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    for name in source_files():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "--quiet", "--wheel-dir", str(root / "dist"), str(src)], check=True)
    (built,) = (root / "dist").glob("context_engine-*.whl")
    return built


@pytest.fixture(scope="session")
def installed(wheel: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A fresh venv's python with the wheel installed. The dev venv's site-packages is on its path
    through a .pth line, which adds the directory without running the .pth files in it, so the
    editable install's finder (a .pth there) never loads: only the wheel provides context_engine."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = pathlib.Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                          check=True, capture_output=True, text=True).stdout.strip())
    (purelib / "dev-venv-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "--quiet", str(wheel)], check=True)
    return python


def run_installed(python: pathlib.Path, code: str, cwd: pathlib.Path, **env: str) -> str:
    """Run `code` under the installed wheel, from a directory that holds no source tree."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    environ.update(PYTHONNOUSERSITE="1", **env)
    done = subprocess.run([str(python), "-c", code], cwd=cwd, env=environ, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


# The layout's rule (docs/architecture.md): a service folder is the package of that name; the
# generated protobuf code under proto/proto/ is `upsquad`. What the wheel must hold follows from it.
SOURCE_FOLDERS = ("context_engine", "entrypoints", "commands", "projections", "streams", "inference")
GENERATED = "proto/proto/"


def shipped_files() -> dict[str, str]:
    """Path in the wheel -> path in the tree, for every tracked module and data file the services load."""
    out = {}
    for name in source_files():
        if not name.endswith((".py", ".sql", ".proto", ".pyi")):
            continue
        if name.split("/", 1)[0] in SOURCE_FOLDERS:
            out[name] = name
        elif name.startswith(GENERATED + "upsquad/"):
            out[name[len(GENERATED):]] = name
    return out


def test_the_wheel_holds_every_migration_and_module(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())

    migrations = sorted(p.name for p in MIGRATION_SOURCES.glob("*.sql"))
    assert migrations, f"no migrations found under {MIGRATION_SOURCES}"
    missing = [m for m in migrations if f"projections/store/sql/{m}" not in names]
    assert not missing, f"migrations missing from {wheel.name}: {missing}"

    # Every module and data file under the service folders, at the path its import names.
    expected = shipped_files()
    assert "commands/ingest_event.py" in expected and "upsquad/context/v1/context_pb2.py" in expected
    assert not expected.keys() - names, f"missing from {wheel.name}: {sorted(expected.keys() - names)}"
    # And nothing else at the top level: no tests, bench or docs in the wheel.
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == set(SOURCE_FOLDERS) | {"upsquad"}, sorted(tops)


async def test_the_installed_wheel_migrates_a_real_database(installed, postgres_url, tmp_path):
    async with fresh_database(postgres_url, "context_engine_wheel") as url:
        out = run_installed(installed, """
import asyncio, os, pathlib, sys
import asyncpg
import context_engine
from projections.store import migrations as migrate
print(pathlib.Path(context_engine.__file__).resolve())
print(pathlib.Path(migrate.MIGRATIONS_DIR).resolve())
print(",".join(asyncio.run(migrate.migrate(os.environ["URL"]))))

async def tables():
    conn = await asyncpg.connect(os.environ["URL"])
    try:
        versions = [r[0] for r in await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")]
        count = await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        return versions, count
    finally:
        await conn.close()
versions, count = asyncio.run(tables())
print(",".join(versions))
print(count)
""", tmp_path, URL=url)
        package, migrations_dir, applied, recorded, tables = out.splitlines()
        prefix = str(installed.parent.parent)
        assert package.startswith(prefix), f"context_engine came from {package}, not the wheel in {prefix}"
        assert migrations_dir.startswith(prefix), migrations_dir
        expected = [p.name[:4] for p in sorted(MIGRATION_SOURCES.glob("*.sql"))]
        assert applied.split(",") == expected
        assert recorded.split(",") == expected
        created = {m.lower() for f in sorted(MIGRATION_SOURCES.glob("*.sql"))
                   for m in re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", f.read_text(), flags=re.I)}
        assert int(tables) == len(created) + 1  # the tables the files create, and schema_migrations


def test_the_installed_wheel_imports_every_service(installed, tmp_path):
    out = run_installed(installed, """
import pathlib
import context_engine.__main__, entrypoints.api.app, streams.app
import entrypoints.detector.server, entrypoints.supervisor, commands.ingest_event, projections.store.migrations
from upsquad.context.v1 import context_pb2
print(pathlib.Path(streams.app.__file__).resolve())
""", tmp_path)
    assert out.strip().startswith(str(installed.parent.parent)), out


async def test_the_installed_wheel_runs_its_parts_apart_as_compose_does(installed, postgres_url, kafka_bootstrap,
                                                                        tmp_path):
    """compose.yaml's services with the image's install: `migrate`, then `worker`, `serve api` and
    `serve detector` as separate processes on a real PostgreSQL and broker. A write through the API
    is acknowledged, which needs the worker to have projected it, and the detector serves."""
    api_port, detector_port = free_port(), free_port()
    async with fresh_database(postgres_url, "context_engine_apart") as url:
        environ = {k: v for k, v in deployment_env().items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        engine = {**environ, "PYTHONNOUSERSITE": "1", "CONTEXT_ENGINE_HOME": str(tmp_path / "data"),
                  "CONTEXT_ENGINE_DATABASE_URL": url, "CONTEXT_ENGINE_KAFKA_BOOTSTRAP": kafka_bootstrap,
                  "CONTEXT_ENGINE_TOPIC_PREFIX": unique("apart"), "CONTEXT_ENGINE_API_PORT": str(api_port),
                  "CONTEXT_ENGINE_DETECTOR_PORT": str(detector_port), "CONTEXT_ENGINE_METRICS_PORT": "-1",
                  "CONTEXT_ENGINE_DETECTOR_SERVICE_TOKEN": "apart-token"}
        detector = {**environ, "PYTHONNOUSERSITE": "1", "CONTEXT_ENGINE_HOME": str(tmp_path / "detector"),
                    "CONTEXT_ENGINE_DETECTOR_PORT": str(detector_port),
                    "CONTEXT_ENGINE_DETECTOR_SERVICE_TOKEN": "apart-token"}
        migrated = subprocess.run([str(installed), "-m", "context_engine", "migrate"], cwd=tmp_path, env=engine,
                                  capture_output=True, text=True, timeout=120)
        assert migrated.returncode == 0 and migrated.stdout.startswith("schema migrations: 0001"), migrated.stderr
        procs = []
        try:
            for name, args, env in (("worker", ["worker"], engine), ("api", ["serve", "api"], engine),
                                    ("detector", ["serve", "detector"], detector)):
                with open(tmp_path / f"{name}.log", "wb") as log:
                    procs.append(subprocess.Popen([str(installed), "-m", "context_engine", *args], cwd=tmp_path,
                                                  env=env, stdout=log, stderr=subprocess.STDOUT,
                                                  preexec_fn=child_preexec()))
            key = ensure_dev_key(tmp_path / "data" / "keys" / "jwt-hs256.key")
            token = mint_token(key, org="apart", clearance=1)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{api_port}") as channel, \
                    grpc.aio.insecure_channel(f"127.0.0.1:{detector_port}") as detector_channel:
                stub = context_pb2_grpc.ContextEngineStub(channel)
                request = pb.IngestEventRequest(scope=pb.ScopePath(org_id="apart"), session_id="s",
                                                event_type="message", content=b"user: hello from apart")
                seen: list[str] = []

                async def acknowledged() -> pb.IngestEventResponse:
                    while True:  # until the API listens and the worker has joined its group
                        assert all(p.poll() is None for p in procs), _logs(tmp_path)
                        try:
                            return await stub.IngestEvent(request, metadata=(("authorization", f"Bearer {token}"),
                                                                             ("idempotency-key", "apart-1")),
                                                          timeout=10)
                        except grpc.aio.AioRpcError as err:
                            seen.append(err.code().name)
                            await asyncio.sleep(0.2)

                reply = await asyncio.wait_for(acknowledged(), START_TIMEOUT_S)
                assert reply.event_id and len(reply.version_hash) == 64, seen
                health = health_pb2_grpc.HealthStub(detector_channel)
                status = await health.Check(health_pb2.HealthCheckRequest(service="upsquad.ml.v1.MLDetectorService"),
                                            timeout=30, wait_for_ready=True)
                assert status.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
        conn = await asyncpg.connect(url)
        try:
            assert await conn.fetchval("SELECT count(*) FROM session_events WHERE org_id = 'apart'") == 1
        finally:
            await conn.close()


def _logs(tmp_path: pathlib.Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("*.log")))
