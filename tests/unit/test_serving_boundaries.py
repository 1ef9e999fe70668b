"""The detector sidecar and the API share one serving package (entrypoints/serving/); the
detector depends on nothing of the API's, neither directly nor through what it imports."""

import subprocess
import sys

import pytest

from tests.fixtures.imports import ROOT, imported_modules, is_within

API = "entrypoints.api"


def _is_api(name: str) -> bool:
    return is_within(name, API)


@pytest.mark.parametrize("folder", ["inference/detector", "entrypoints/detector", "entrypoints/serving"])
def test_no_module_of_the_detector_or_of_serving_imports_the_api(folder):
    files = sorted((ROOT / folder).glob("*.py"))
    assert files
    offending = {str(f.relative_to(ROOT)): sorted(filter(_is_api, imported_modules(f))) for f in files}
    assert {f: names for f, names in offending.items() if names} == {}


def test_importing_the_detector_server_loads_nothing_of_the_api():
    probe = ("import sys, entrypoints.detector.server; "
             f"print(sorted(m for m in sys.modules if m == {API!r} or m.startswith({API + '.'!r})))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
