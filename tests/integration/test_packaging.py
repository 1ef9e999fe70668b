"""The built wheel, installed where the editable install cannot reach, runs the services' files.

The image the Dockerfile builds for compose.yaml installs the wheel (`pip install .`), not the
editable tree of `make up` / `make test`: a file the code opens by path (the migrations under
projections/sql) that the wheel lacks fails only there. So the wheel is built here, offline, from
a copy of the source tree, installed into a fresh venv that sees the dev venv's dependencies but
not its editable finder, and its migrations are run against a real PostgreSQL.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import uuid
import zipfile

import pytest

from context_engine.embedded.postgres import drop_database, ensure_database

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]
MIGRATION_SOURCES = ROOT / "projections" / "sql"


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


def package_roots() -> dict[str, pathlib.Path]:
    """Import name -> source directory, from pyproject.toml's [tool.setuptools] (no hand list)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = config.get("package-dir", {})

    def directory(package: str) -> pathlib.Path:  # setuptools' rule: the longest mapped prefix
        parts = package.split(".")
        for cut in range(len(parts), 0, -1):
            if (prefix := ".".join(parts[:cut])) in dirs:
                return ROOT / dirs[prefix] / "/".join(parts[cut:])
        return ROOT / dirs.get("", "") / "/".join(parts)

    return {package: directory(package) for package in config["packages"]}


def test_the_wheel_holds_every_migration_and_module(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())

    migrations = sorted(p.name for p in MIGRATION_SOURCES.glob("*.sql"))
    assert migrations, f"no migrations found under {MIGRATION_SOURCES}"
    missing = [m for m in migrations if f"context_engine/projections/sql/{m}" not in names]
    assert not missing, f"migrations missing from {wheel.name}: {missing}"

    # Every module and data file of every package the configuration names (a subpackage left out
    # of `packages` would be missing here too).
    expected = set()
    for package, directory in package_roots().items():
        for path in directory.iterdir():
            if path.is_file() and path.suffix in (".py", ".sql", ".proto", ".pyi"):
                expected.add(f"{package.replace('.', '/')}/{path.name}")
    assert not expected - names, f"missing from {wheel.name}: {sorted(expected - names)}"

    # And no directory of .py files under a package root that the configuration forgot.
    configured = {d.resolve() for d in package_roots().values()}
    forgotten = sorted(str(p.parent.relative_to(ROOT)) for d in configured for p in d.rglob("*.py")
                       if "__pycache__" not in p.parts and p.parent.resolve() not in configured)
    assert not forgotten, f"directories with modules that no `packages` entry names: {sorted(set(forgotten))}"


def test_the_installed_wheel_migrates_a_real_database(installed, postgres_url, tmp_path):
    name = f"context_engine_wheel_{uuid.uuid4().hex[:8]}"
    url = ensure_database(postgres_url, name)
    try:
        out = run_installed(installed, """
import asyncio, os, pathlib, sys
import asyncpg
import context_engine
from context_engine.projections import migrate
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
        assert int(tables) > len(expected)  # schema_migrations and the tables the files create
    finally:
        drop_database(postgres_url, name)


def test_the_installed_wheel_imports_every_service(installed, tmp_path):
    out = run_installed(installed, """
import pathlib
import context_engine.cli, context_engine.api.app, context_engine.streams.app
import context_engine.inference.detector.server, context_engine.supervisor
from upsquad.context.v1 import context_pb2
print(pathlib.Path(context_engine.streams.app.__file__).resolve())
""", tmp_path)
    assert out.strip().startswith(str(installed.parent.parent)), out
