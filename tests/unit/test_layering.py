"""The layers' import rules, read from every module's syntax tree: the read side (projections/)
knows neither the log (streams/), nor the protobuf (upsquad), nor the gRPC edge
(context_engine.api), nor the commands that use it; a command knows nothing of the gRPC edge
either. And the events package is imported by its own name (its __init__ is its public surface)."""

import pytest

from tests.fixtures.imports import ROOT, imported_modules, is_within

FORBIDDEN = {
    "projections": ("streams", "upsquad", "context_engine.api", "commands"),
    "commands": ("context_engine.api",),
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
    for folder in ("commands", "projections", "streams", "inference", "context_engine", "bench", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.is_relative_to(ROOT / EVENTS):
                continue
            if found := sorted(imported_modules(path) & submodules):
                offenders[str(path.relative_to(ROOT))] = found
    assert not offenders, f"import these names from context_engine.events instead; offenders: {offenders}"
