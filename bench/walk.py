"""The walk of one IngestEvent, one keyed PushContext and one AssembleContext through the API's code, traced as it runs:
the project files the call runs in, its hops (distinct caller file -> callee file pairs), and
among them its climbs (a call into a floor above the caller's: a callback) and its sideways jumps
(one command's module calling into another command's module).

    python bench/walk.py                  # this checkout
    python bench/walk.py --repo DIR       # another checkout, e.g. `git worktree add DIR <commit>`

Starts `context-engine up` from the checkout (bench/stack.py), opens the API's dependencies in
this process as an API process does (`open_deps`), and calls the servicer's methods directly as
an authenticated caller, each once to warm up and once traced with sys.setprofile: a function
counts when it runs in the call's task or a task the call started (not in the process's
background listeners, nor on threads). Floors, low to high: the kernel (context_engine/), inference/,
projections/, streams/, commands/, the faces (entrypoints/, or context_engine/'s api, serving,
cli, embedded and supervisor where they lived there). The numbers are the same on every machine
for one checkout: they count code, not time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import os
import pathlib
import re
import sys
import tempfile
import types
import uuid
from collections.abc import Awaitable, Callable

HERE = pathlib.Path(__file__).resolve().parent
FLOORS = ("context_engine", "inference", "projections", "streams", "commands", "entrypoints")
OLD_FACES = re.compile(r"context_engine/(api|serving|cli|embedded|supervisor)\b")


def floor(rel: str) -> int:
    if OLD_FACES.match(rel):
        return FLOORS.index("entrypoints")
    return FLOORS.index(rel.split("/", 1)[0])


def handler_modules(repo: pathlib.Path) -> set[str]:
    """commands/ modules that hold a command's handler: one defining a function named as the module."""
    return {f"commands/{p.name}" for p in (repo / "commands").glob("*.py")
            if re.search(rf"^(async )?def {p.stem}\(", p.read_text(), re.M)}


class CallContext:
    """What the servicer asks of a gRPC call's context: its headers, and the trailers it sets."""

    def __init__(self, **headers: str) -> None:
        self.headers = tuple((k.replace("_", "-"), v) for k, v in headers.items())
        self.trailers: tuple = ()

    def invocation_metadata(self) -> tuple:
        return self.headers

    def set_trailing_metadata(self, metadata: tuple) -> None:
        self.trailers = metadata


_walking: contextvars.ContextVar[bool] = contextvars.ContextVar("walking", default=False)


class Walk:
    """The project-file call edges of one call, traced by sys.setprofile: in the call's task and
    the tasks it starts (they inherit its context), not in the process's other tasks."""

    def __init__(self, repo: pathlib.Path) -> None:
        self.repo = str(repo) + os.sep
        self.edges: dict[tuple[str, str], set[str]] = {}  # (caller file, callee file) -> callee functions
        self.files: set[str] = set()

    def _rel(self, filename: str) -> str | None:
        if not filename.startswith(self.repo) or "/.venv/" in filename or filename.startswith(str(HERE)):
            return None
        rel = filename[len(self.repo):]
        return rel if rel.split("/", 1)[0] in FLOORS else None

    def profile(self, frame: types.FrameType, event: str, arg: object) -> None:
        if event != "call" or not _walking.get() or (callee := self._rel(frame.f_code.co_filename)) is None:
            return
        self.files.add(callee)
        caller = frame.f_back
        while caller is not None and (rel := self._rel(caller.f_code.co_filename)) is None:
            caller = caller.f_back  # through the library frames between two of ours
        if caller is not None and rel is not None and rel != callee:
            self.edges.setdefault((rel, callee), set()).add(frame.f_code.co_qualname)

    async def trace(self, call: Callable[[], Awaitable[object]]) -> None:
        token = _walking.set(True)
        sys.setprofile(self.profile)
        try:
            await call()
        finally:
            sys.setprofile(None)
            _walking.reset(token)


def report(name: str, walk: Walk, handlers: set[str]) -> None:
    climbs = sorted((a, b) for a, b in walk.edges if floor(b) > floor(a))
    sideways = sorted((a, b) for a, b in walk.edges if b in handlers and a.startswith("commands/") and a != b)
    print(f"{name}: {len(walk.files)} files, {len(walk.edges)} hops, {len(climbs)} climbs, "
          f"{len(sideways)} sideways jumps")
    for a, b in climbs:
        print(f"  climb     {a} -> {b} ({', '.join(sorted(walk.edges[a, b]))})")
    for a, b in sideways:
        print(f"  sideways  {a} -> {b}")
    print("  files: " + " ".join(sorted(walk.files)))


def api_modules():
    """The API's composition root, servicer and caller hook, wherever this checkout keeps them."""
    try:
        from entrypoints.api.app import open_deps
        from entrypoints.api.context_servicer import ContextEngineServicer
        from entrypoints.serving.interceptors import set_caller
    except ImportError:
        from context_engine.api.app import open_deps  # type: ignore[no-redef]
        from context_engine.api.context_servicer import ContextEngineServicer  # type: ignore[no-redef]
        from context_engine.serving.interceptors import set_caller  # type: ignore[no-redef]
    return open_deps, ContextEngineServicer, set_caller


async def walk_calls(repo: pathlib.Path) -> None:
    from context_engine.auth import Principal
    from context_engine.config import Settings
    from context_engine.scope import Scope
    from upsquad.context.v1 import context_pb2 as pb

    open_deps, Servicer, set_caller = api_modules()
    scope = Scope("walk-org", "pillar", "team", "agent")
    set_caller(Principal("walker", scope, 3))
    handlers = handler_modules(repo)
    async with open_deps(Settings()) as deps:
        servicer = Servicer(deps)
        session = f"walk-{uuid.uuid4().hex[:8]}"
        pb_scope = pb.ScopePath(org_id=scope.org_id, pillar_id=scope.pillar_id, team_id=scope.team_id,
                                agent_id=scope.agent_id)

        def ingest(text: str) -> Callable[[], Awaitable[object]]:
            return lambda: servicer.IngestEvent(pb.IngestEventRequest(
                scope=pb_scope, session_id=session, event_type="message", content=text.encode(),
                metadata={"role": "user"}), CallContext())

        def assemble() -> Awaitable[object]:
            return servicer.AssembleContext(pb.AssembleContextRequest(
                scope=pb_scope, session_id=session, task_description="when is the delivery due?",
                token_budget=2000), CallContext())

        def push(key: str) -> Callable[[], Awaitable[object]]:
            return lambda: servicer.PushContext(pb.PushContextRequest(
                scope=pb_scope, session_id=session, memory_type="semantic", content=b"Ana prefers email.",
                metadata={"source": "walk"}), CallContext(idempotency_key=key))

        for text in ("The delivery of 40 chairs is due on 12 December.", "Send the invoice to Ana."):
            await ingest(text)()  # warm-up: first-call imports and caches are not the walk
        await assemble()
        await push("warm-up")()
        for name, call in (("IngestEvent", ingest("Ana confirmed the delivery address.")),
                           ("PushContext with an idempotency key", push("walk-1")),
                           ("AssembleContext", assemble)):
            walk = Walk(repo)
            await walk.trace(call)
            report(name, walk, handlers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=pathlib.Path, default=HERE.parent,
                        help="the checkout to walk (default: this one)")
    args = parser.parse_args()
    repo = args.repo.resolve()
    paths = [str(repo), str(repo / "proto" / "proto")]  # this checkout's engine, before the installed one
    sys.path[:0] = paths
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])
    os.chdir(repo)
    from stack import Stack

    with tempfile.TemporaryDirectory(prefix="walk-") as home:
        # A loaded machine starts slowly; an older checkout ignores the setting it does not know.
        stack = Stack(pathlib.Path(home), settings={"CONTEXT_ENGINE_READY_TIMEOUT_S": "300"})
        try:
            stack.wait_serving(timeout=360)
            endpoints = stack.endpoints()
            os.environ.update({"CONTEXT_ENGINE_HOME": home,
                               "CONTEXT_ENGINE_DATABASE_URL": endpoints["database_url"],
                               "CONTEXT_ENGINE_KAFKA_BOOTSTRAP": endpoints["kafka_bootstrap"]})
            print(f"checkout {repo}")
            asyncio.run(walk_calls(repo))
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
