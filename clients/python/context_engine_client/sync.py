"""The blocking client: `AsyncClient`'s calls run on an event loop of the client's own, in a
daemon thread, so a script or a synchronous agent framework calls them directly. One
implementation, two faces: every method here is the asyncio one, run to completion."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from context_engine_client.aio import AsyncClient
from context_engine_client.scope import Scope

P = ParamSpec("P")
T = TypeVar("T")


def _blocking(method: Callable[Concatenate[AsyncClient, P], Awaitable[T]]) -> Callable[Concatenate["Client", P], T]:
    def run(self: "Client", *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(method(self.aio, *args, **kwargs))

    run.__name__, run.__doc__ = method.__name__, method.__doc__
    return run


class Client:
    """Blocking: `Client(address, scope=..., token=...)` takes `AsyncClient`'s arguments;
    `Client.from_data_dir()` its development set-up. Use it as a context manager, or `close()`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._start(AsyncClient(*args, **kwargs))

    @classmethod
    def from_data_dir(cls, *args: Any, **kwargs: Any) -> "Client":
        client = cls.__new__(cls)
        client._start(AsyncClient.from_data_dir(*args, **kwargs))
        return client

    def _start(self, aio: AsyncClient) -> None:
        self.aio = aio  # its channels are made on the loop below, at the first call
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="context-engine-client", daemon=True)
        self._thread.start()

    def _run(self, coroutine: Coroutine[Any, Any, T] | Awaitable[T]) -> T:
        async def wrapped() -> T:
            return await coroutine
        if self._closed:
            raise RuntimeError("this client is closed: make a new one")
        future = asyncio.run_coroutine_threadsafe(wrapped(), self._loop)
        try:
            return future.result()
        except BaseException:  # Ctrl-C included: the call and its retries stop too
            future.cancel()
            raise

    @property
    def scope(self) -> Scope:
        return self.aio.scope

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._run(self.aio.close())
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    ingest = _blocking(AsyncClient.ingest)
    ingest_many = _blocking(AsyncClient.ingest_many)
    assemble_context = _blocking(AsyncClient.assemble_context)
    compact = _blocking(AsyncClient.compact)
    push_context = _blocking(AsyncClient.push_context)
    pull_context = _blocking(AsyncClient.pull_context)
    rollback = _blocking(AsyncClient.rollback)
    create_snapshot = _blocking(AsyncClient.create_snapshot)
    validate_prompt = _blocking(AsyncClient.validate_prompt)
    search = _blocking(AsyncClient.search)
    embed = _blocking(AsyncClient.embed)
    create_share = _blocking(AsyncClient.create_share)
    revoke_share = _blocking(AsyncClient.revoke_share)
    list_shares = _blocking(AsyncClient.list_shares)
    resolve_guardrail_layers = _blocking(AsyncClient.resolve_guardrail_layers)
    classify = _blocking(AsyncClient.classify)
    moderate = _blocking(AsyncClient.moderate)
    detect_pii = _blocking(AsyncClient.detect_pii)
