"""No two modules of the engine import each other, directly or around a circle, counting the
imports made inside functions and those made only for type checking: a circle marks a concept
in the wrong module (tests/fixtures/imports.py reads every import of the syntax tree)."""

from __future__ import annotations

import pathlib

from tests.fixtures.imports import ROOT, imported_modules, module_name

FOLDERS = ("context_engine", "entrypoints", "commands", "projections", "streams", "inference")


def _graph() -> dict[str, set[str]]:
    files = {module_name(p): p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")}
    return {name: {n for n in imported_modules(path) if n in files and n != name} for name, path in files.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_around_a_circle():
    assert circles(_graph()) == []


def test_the_circle_finder_finds_a_deferred_or_type_only_circle(tmp_path: pathlib.Path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"x": {"y"}, "y": set()}) == []
