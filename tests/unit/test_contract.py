"""The proto files against the user's spec, and the generated code against the proto files."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECKER = ROOT.parent / "shared" / "tools" / "check_contract.py"


def test_generated_code_is_current():
    result = subprocess.run([sys.executable, str(ROOT / "proto" / "generate.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(not CHECKER.exists(), reason="shared/tools/check_contract.py is not beside this checkout")
def test_proto_matches_the_spec():
    # exactly as the user runs it: from the checkout, with "." as the project
    result = subprocess.run([sys.executable, str(CHECKER), "."], cwd=ROOT, capture_output=True, text=True)
    assert result.stdout.strip().endswith("0 shortfalls"), result.stdout + result.stderr
