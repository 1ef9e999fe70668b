"""Regenerate the Python code for every .proto under proto/proto/ (``make proto``).

The sources and the generated package live in proto/proto/ because the user's contract checker
(`../shared/tools/check_contract.py .`) runs protoc from inside proto/ with `-I./proto`: the
import root must be proto/proto for that command to compile them.

``--check`` regenerates into a scratch directory and exits 1 when the committed
code differs, so CI catches a .proto edited without regenerating.
"""

from __future__ import annotations

import argparse
import filecmp
import pathlib
import subprocess
import sys
import tempfile

import grpc_tools

ROOT = pathlib.Path(__file__).resolve().parent / "proto"  # the import root: upsquad/... below it
WELL_KNOWN = pathlib.Path(grpc_tools.__file__).parent / "_proto"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def sources() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.proto"))


def generate(out: pathlib.Path) -> None:
    cmd = [
        sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT}", f"-I{WELL_KNOWN}",
        f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}", *sources(),
    ]
    subprocess.run(cmd, cwd=ROOT, check=True)
    for proto in sources():
        package = (out / proto).parent
        while package != out:
            (package / "__init__.py").touch()
            package = package.parent


def generated_files(root: pathlib.Path) -> set[str]:
    return {
        str(p.relative_to(root)) for p in root.rglob("*")
        if p.name.endswith(GENERATED_SUFFIXES) and ".venv" not in p.parts
    }


def check() -> int:
    with tempfile.TemporaryDirectory() as scratch:
        fresh = pathlib.Path(scratch)
        generate(fresh)
        want, have = generated_files(fresh), generated_files(ROOT)
        stale = sorted(want ^ have) + sorted(
            f for f in want & have if not filecmp.cmp(fresh / f, ROOT / f, shallow=False)
        )
    for name in stale:
        print(f"stale generated code: proto/proto/{name}")
    if stale:
        print("run `make proto` and commit the result")
        return 1
    print(f"generated code is current ({len(want)} files)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    if parser.parse_args().check:
        return check()
    for name in generated_files(ROOT):
        (ROOT / name).unlink()
    generate(ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
