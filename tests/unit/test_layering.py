"""The layers' import rules, read from every module's syntax tree: the read side (projections/)
knows neither the log (streams/), nor the protobuf (upsquad), nor the gRPC edge
(entrypoints.api), nor the commands that use it; a command knows nothing of the gRPC edge
either. And the events package is imported by its own name (its __init__ is its public surface)."""

import ast
import re

import pytest

from tests.fixtures.imports import ROOT, imported_modules, is_within

FORBIDDEN = {
    "projections": ("streams", "upsquad", "entrypoints.api", "commands"),
    "commands": ("entrypoints.api",),
}
EVENTS = "context_engine/events"


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_module_of_a_layer_imports_what_the_layer_must_not_know(layer):
    files = sorted((ROOT / layer).rglob("*.py"))
    assert files
    offenders = {}
    for path in files:
        found = sorted(n for n in imported_modules(path) if any(is_within(n, p) for p in FORBIDDEN[layer]))
        if found:
            offenders[str(path.relative_to(ROOT))] = found
    assert not offenders, f"{layer}/ must not import {', '.join(FORBIDDEN[layer])}; offenders: {offenders}"


def test_the_events_package_is_imported_by_its_name_not_by_its_modules():
    submodules = {f"context_engine.events.{p.stem}" for p in (ROOT / EVENTS).glob("*.py") if p.stem != "__init__"}
    assert submodules
    offenders = {}
    for folder in ("commands", "projections", "streams", "inference", "context_engine", "entrypoints", "bench",
                   "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.is_relative_to(ROOT / EVENTS):
                continue
            if found := sorted(imported_modules(path) & submodules):
                offenders[str(path.relative_to(ROOT))] = found
    assert not offenders, f"import these names from context_engine.events instead; offenders: {offenders}"


# Every SQL statement lives in projections/ (docs/architecture.md); the acknowledgement protocol's
# own poll is the one exception outside it.
SQL_FREE = ("commands", "streams", "entrypoints/api", "entrypoints/serving", "entrypoints/cli")
SQL_EXCEPTIONS = {"streams/acknowledgement.py"}
SQL_START = re.compile(r"\(?\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b", re.IGNORECASE)


def _sql_literals(path) -> list[tuple[int, str]]:
    """(line, start) of each str constant or f-string of the file that begins like a SQL statement;
    docstrings and the pieces of an f-string are not literals of their own."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skipped.add(id(first.value))
        elif isinstance(node, ast.JoinedStr):
            skipped.update(id(v) for v in node.values)
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        else:
            continue
        if SQL_START.match(text.strip()):
            found.append((node.lineno, " ".join(text.split())[:60]))
    return sorted(found)


def test_no_sql_statement_outside_projections():
    offenders = {}
    for folder in SQL_FREE:
        files = sorted((ROOT / folder).rglob("*.py"))
        assert files, folder
        for path in files:
            name = str(path.relative_to(ROOT))
            if name not in SQL_EXCEPTIONS and (found := _sql_literals(path)):
                offenders[name] = found
    assert not offenders, f"SQL belongs in a projections/ query function; offenders: {offenders}"


def test_the_sql_rule_sees_statements_and_f_strings_but_not_docstrings(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Select what the module does."""\n'
                      'def f(t):\n'
                      '    """With a docstring."""\n'
                      '    log("nothing to select")\n'
                      '    q = "  select 1"\n'
                      '    return f"WITH x AS (SELECT 1 FROM {t}) SELECT * FROM x", q\n')
    assert [line for line, _ in _sql_literals(module)] == [5, 6]


def test_no_test_module_imports_another_and_bench_imports_no_test_code():
    """Helpers live in tests/fixtures/ (or a suite's own helper module, such as
    tests/security/world.py): a test module is run, never imported; the benches stand on the
    engine alone."""
    offenders = {}
    for path in sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "bench").rglob("*.py")):
        names = imported_modules(path)
        found = sorted(n for n in names if n.split(".")[-1].startswith("test_") and is_within(n, "tests"))
        if path.is_relative_to(ROOT / "bench"):
            found = sorted(n for n in names if is_within(n, "tests"))
        if found:
            offenders[str(path.relative_to(ROOT))] = found
    assert not offenders, f"move the helpers to tests/fixtures/; offenders: {offenders}"
