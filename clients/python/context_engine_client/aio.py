"""The asyncio client: every RPC of ContextEngine and MLDetectorService, text in and out.

One instance holds one scope and its token source; calls carry `scope` and the token for it.
Writes (IngestEvent, PushContext) always carry an idempotency key (the caller's, or one the
client makes), so a retry after `UNAVAILABLE` — the transport's, or the engine's
`NOT_DURABLE_YET` — returns the first result if it was applied and writes it once otherwise
(docs/architecture.md "Retries and idempotency"). Reads retry `UNAVAILABLE` too; the writes a
retry could repeat (CreateShare, CreateSnapshot, RollbackContext, Compact) are never retried.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from context_engine_client._proto.upsquad.context.v1 import context_pb2 as pb
from context_engine_client._proto.upsquad.context.v1 import context_pb2_grpc
from context_engine_client._proto.upsquad.ml.v1 import detector_pb2 as ml
from context_engine_client._proto.upsquad.ml.v1 import detector_pb2_grpc
from context_engine_client.errors import EngineError
from context_engine_client.replies import Reply
from context_engine_client.scope import Scope
from context_engine_client.tokens import DevTokens, TokenSource, token_getter

R = TypeVar("R", bound=Message)

# Retrying these repeats nothing: reads, keyed writes, and a revocation (a retry answers with the
# first revocation's time).
RETRY_SAFE = frozenset({
    "AssembleContext", "IngestEvent", "PushContext", "PullContext", "Search", "Embed", "ValidatePrompt",
    "ListShares", "RevokeShare", "ResolveGuardrailLayers", "Classify", "Moderate", "DetectPII"})
# UNAVAILABLE that passes: the transport's (no reason), an unacknowledged write, the log, the
# database or a model still loading. A detector without its model (MODEL_NOT_LOADED,
# CANARY_FAILED...) or a summarizer that is off stays so: not retried.
TRANSIENT = frozenset({"", "UNAVAILABLE", "NOT_DURABLE_YET", "LOG_UNAVAILABLE", "LOG_RECOVERING",
                       "DATABASE_UNAVAILABLE", "BROKER_UNAVAILABLE", "MODEL_LOADING"})
PROMPT_GUARD = "prompt-guard-86m"
GLINER = "gliner-small-v2.1"


@dataclass(frozen=True)
class Turn:
    """One event of a batch ingest."""

    session_id: str
    content: str | bytes
    event_type: str = "message"
    metadata: Mapping[str, str] = field(default_factory=dict)
    idempotency_key: str | None = None


class BatchError(Exception):
    """Some turns of `ingest_many` were not acknowledged: `errors` by input index (each error's
    `idempotency_key` is the one a retry of that turn must send: an unacknowledged write may
    still be applied); `replies` holds the acknowledged ones (None where not). A session's turns
    after its first failure were not sent, so the session keeps its order."""

    def __init__(self, replies: list[Reply[pb.IngestEventResponse] | None], errors: dict[int, EngineError]) -> None:
        first = errors[min(errors)]
        super().__init__(f"{len(errors)} of {len(replies)} turns not acknowledged; first: {first}")
        self.replies, self.errors = replies, errors


def _bytes(content: str | bytes, name: str) -> bytes:
    if isinstance(content, str):
        return content.encode("utf-8")
    if isinstance(content, bytes | bytearray | memoryview):
        return bytes(content)
    raise TypeError(f"{name} must be str (sent as UTF-8) or bytes, got {type(content).__name__}")


def _write_key(given: str | None) -> str:
    """The caller's key, or one made for this write: never none, so every retry is safe."""
    if given is None:
        return f"cec-{uuid.uuid4().hex}"
    if not given or len(given) > 128 or not all("\x21" <= ch <= "\x7e" for ch in given):
        raise ValueError("idempotency_key must be 1-128 printable ASCII characters without spaces")
    return given


def _retryable(method: str):
    def check(error: BaseException) -> bool:
        if not isinstance(error, EngineError) or method not in RETRY_SAFE:
            return False
        return (error.code == grpc.StatusCode.UNAVAILABLE and error.reason in TRANSIENT) or (
            error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.reason == "ORG_WRITE_RATE_EXCEEDED")
    return check


class AsyncClient:
    """`address` is the API (host:port); `scope` the caller's (`acme/sales/emea`) and `token` a
    token for it: a string, a callable asked before each call, or `DevTokens`. The detector's
    RPCs go to `detector_address` with `detector_token` (its service token). `timeout_s` bounds
    each attempt; `attempts` counts the first. `Client` is the same, blocking."""

    def __init__(self, address: str = "127.0.0.1:50051", *, scope: str | Scope, token: TokenSource,
                 detector_address: str | None = None, detector_token: TokenSource | None = None,
                 credentials: grpc.ChannelCredentials | None = None, timeout_s: float = 30.0,
                 attempts: int = 5, max_backoff_s: float = 5.0) -> None:
        self.scope = Scope.parse(scope)
        self.address, self.detector_address = address, detector_address
        self._token = token_getter(token)
        self._detector_token = token_getter(detector_token) if detector_token is not None else None
        self._credentials, self.timeout_s = credentials, timeout_s
        self._attempts = attempts
        self._backoff = wait_exponential_jitter(multiplier=0.2, jitter=0.2, max=max_backoff_s)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._closed = False

    @classmethod
    def from_data_dir(cls, data_dir: str | pathlib.Path = ".context-engine", scope: str | Scope = "acme/sales/emea",
                      *, clearance: int = 2, **options: Any) -> "AsyncClient":
        """For development beside `context-engine up --data-dir DATA_DIR`: its addresses from
        `run/stack.json`, tokens minted from its key (the `dev-token` extra), its detector's
        service token."""
        home = pathlib.Path(data_dir)
        try:
            stack = json.loads((home / "run" / "stack.json").read_text())
        except (OSError, ValueError) as err:
            raise FileNotFoundError(f"no running stack in {home} (run/stack.json): start `context-engine up "
                                    f"--data-dir {home}`") from err
        detector_token_file = home / "keys" / "detector-service.token"
        options.setdefault("detector_address", stack.get("detector_address") or None)
        if detector_token_file.exists():
            options.setdefault("detector_token", detector_token_file.read_text().strip())
        return cls(stack["api_address"], scope=scope, token=DevTokens(home, scope, clearance=clearance), **options)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()

    # -- the calls ----------------------------------------------------------------------------

    def _channel(self, address: str) -> grpc.aio.Channel:
        if self._closed:
            raise RuntimeError("this client is closed: make a new one")
        if address not in self._channels:
            options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
            self._channels[address] = (grpc.aio.secure_channel(address, self._credentials, options)
                                       if self._credentials else grpc.aio.insecure_channel(address, options))
        return self._channels[address]

    async def _call(self, method: str, request: Message, *, key: str | None = None,
                    detector: bool = False) -> Reply[Any]:
        if detector:
            if self.detector_address is None or self._detector_token is None:
                raise ValueError(f"{method} needs detector_address and detector_token")
            stub: Any = detector_pb2_grpc.MLDetectorServiceStub(self._channel(self.detector_address))
            token = self._detector_token
        else:
            stub, token = context_pb2_grpc.ContextEngineStub(self._channel(self.address)), self._token
            request.scope.CopyFrom(self.scope.message())

        async def once() -> Reply[Any]:
            metadata = [("authorization", f"Bearer {token()}")] + ([("idempotency-key", key)] if key else [])
            call = getattr(stub, method)(request, metadata=metadata, timeout=self.timeout_s)
            try:
                response = await call
                trailers = await call.trailing_metadata()
            except grpc.RpcError as err:
                raise EngineError.from_rpc_error(method, err, idempotency_key=key) from None
            return Reply(response, {k: v for k, v in (trailers or ()) if k.startswith("engine.")
                                    and isinstance(v, str)})

        def wait(state: Any) -> float:
            error = state.outcome.exception()
            after = float(getattr(error, "metadata", {}).get("retry_after_seconds", 0) or 0)
            return max(after, self._backoff(state))

        async for attempt in AsyncRetrying(retry=retry_if_exception(_retryable(method)), wait=wait,
                                           stop=stop_after_attempt(self._attempts), reraise=True):
            with attempt:
                return await once()
        raise AssertionError("unreachable")

    # -- ContextEngine ------------------------------------------------------------------------

    async def ingest(self, session_id: str, content: str | bytes, *, event_type: str = "message",
                     metadata: Mapping[str, str] | None = None,
                     idempotency_key: str | None = None) -> Reply[pb.IngestEventResponse]:
        """IngestEvent: one conversation event (text is sent as UTF-8)."""
        request = pb.IngestEventRequest(session_id=session_id, event_type=event_type,
                                        content=_bytes(content, "content"), metadata=dict(metadata or {}))
        return await self._call("IngestEvent", request, key=_write_key(idempotency_key))

    async def ingest_many(self, turns: Iterable[Turn], *, concurrency: int = 16) -> list[Reply[pb.IngestEventResponse]]:
        """Many IngestEvents: sessions in parallel (up to `concurrency` at once), each session's
        turns one after another in the order given, so a session's log order is the input's.
        Every turn is checked before any is sent. Replies in input order; BatchError names what
        was not acknowledged (anything else raised cancels the sessions still sending)."""
        turns = list(turns)
        for i, turn in enumerate(turns):
            _bytes(turn.content, f"turns[{i}].content")
            if turn.idempotency_key is not None:
                _write_key(turn.idempotency_key)
        by_session: dict[str, list[int]] = {}
        for i, turn in enumerate(turns):
            by_session.setdefault(turn.session_id, []).append(i)
        replies: list[Reply[pb.IngestEventResponse] | None] = [None] * len(turns)
        errors: dict[int, EngineError] = {}
        gate = asyncio.Semaphore(concurrency)

        async def session(indexes: list[int]) -> None:
            async with gate:
                for i in indexes:
                    t = turns[i]
                    try:
                        replies[i] = await self.ingest(t.session_id, t.content, event_type=t.event_type,
                                                       metadata=t.metadata, idempotency_key=t.idempotency_key)
                    except EngineError as err:
                        errors[i] = err
                        return

        async with asyncio.TaskGroup() as group:
            for indexes in by_session.values():
                group.create_task(session(indexes))
        if errors:
            raise BatchError(replies, errors)
        return [r for r in replies if r is not None]

    async def assemble_context(self, session_id: str, task: str = "", *, token_budget: int = 4000,
                               model_id: str = "gpt-4o",
                               hints: Mapping[str, str] | None = None) -> Reply[pb.AssembleContextResponse]:
        """AssembleContext: the prompt for `task` within `token_budget` tokens of `model_id`'s
        tokenizer (`reply.assembled_prompt`)."""
        request = pb.AssembleContextRequest(session_id=session_id, task_description=task, token_budget=token_budget,
                                            model_id=model_id, hints=dict(hints or {}))
        return await self._call("AssembleContext", request)

    async def compact(self, session_id: str, *, strategy: str = "sliding_window") -> Reply[pb.CompactResponse]:
        return await self._call("Compact", pb.CompactRequest(session_id=session_id, strategy=strategy))

    async def push_context(self, session_id: str, content: str | bytes, *, memory_type: str = "semantic",
                           metadata: Mapping[str, str] | None = None,
                           idempotency_key: str | None = None) -> Reply[pb.PushContextResponse]:
        """PushContext: a memory (episodic | semantic | working) of this scope's agent in a session."""
        request = pb.PushContextRequest(session_id=session_id, memory_type=memory_type,
                                        content=_bytes(content, "content"), metadata=dict(metadata or {}))
        return await self._call("PushContext", request, key=_write_key(idempotency_key))

    async def pull_context(self, agent_id: str | None = None, *, session_id: str = "",
                           snapshot_name: str = "") -> Reply[pb.PullContextResponse]:
        """PullContext: the latest memory (or a named snapshot); `reply.text` is its content.
        `agent_id` defaults to the scope's agent."""
        request = pb.PullContextRequest(agent_id=self.scope.agent if agent_id is None else agent_id,
                                        session_id=session_id, snapshot_name=snapshot_name)
        return await self._call("PullContext", request)

    async def rollback(self, session_id: str, target_version_hash: str) -> Reply[pb.RollbackContextResponse]:
        """RollbackContext to a version `context-engine history` lists."""
        request = pb.RollbackContextRequest(session_id=session_id, target_version_hash=target_version_hash)
        return await self._call("RollbackContext", request)

    async def create_snapshot(self, session_id: str, name: str) -> Reply[pb.CreateSnapshotResponse]:
        return await self._call("CreateSnapshot", pb.CreateSnapshotRequest(session_id=session_id, snapshot_name=name))

    async def validate_prompt(self, prompt: str, layer_hashes: Sequence[str] = ()) -> Reply[pb.ValidatePromptResponse]:
        request = pb.ValidatePromptRequest(prompt=prompt, layer_hashes=list(layer_hashes))
        return await self._call("ValidatePrompt", request)

    async def search(self, query: str, *, top_k: int = 10, min_score: float = 0.0,
                     domain: str = "") -> Reply[pb.SearchResponse]:
        """Search: `reply.results`, each with its content, score and the metadata that says why."""
        request = pb.SearchRequest(query=query, top_k=top_k, min_score=min_score, domain=domain)
        return await self._call("Search", request)

    async def embed(self, texts: Sequence[str], *, model_version: str = "") -> Reply[pb.EmbedResponse]:
        return await self._call("Embed", pb.EmbedRequest(texts=list(texts), model_version=model_version))

    async def create_share(self, resource_id: str, resource_type: str, grantee_scope: str, grantee_scope_id: str,
                           *, permissions: Sequence[str] = ("read",),
                           reason: str = "") -> Reply[pb.CreateShareResponse]:
        """CreateShare: `grantee_scope` is org | pillar | team | agent, `grantee_scope_id` the
        grantee's scope path (`acme/sales/apac`)."""
        request = pb.CreateShareRequest(resource_id=resource_id, resource_type=resource_type,
                                        grantee_scope=grantee_scope, grantee_scope_id=grantee_scope_id,
                                        permissions=list(permissions), reason=reason)
        return await self._call("CreateShare", request)

    async def revoke_share(self, share_id: str, *, reason: str = "") -> Reply[pb.RevokeShareResponse]:
        return await self._call("RevokeShare", pb.RevokeShareRequest(share_id=share_id, reason=reason))

    async def list_shares(self, *, page: int = 1, page_size: int = 100) -> Reply[pb.ListSharesResponse]:
        return await self._call("ListShares", pb.ListSharesRequest(page=page, page_size=page_size))

    async def resolve_guardrail_layers(self) -> Reply[pb.ResolveGuardrailLayersResponse]:
        return await self._call("ResolveGuardrailLayers", pb.ResolveGuardrailLayersRequest())

    # -- MLDetectorService --------------------------------------------------------------------

    async def classify(self, text: str, *, session_id: str = "", warn_threshold: float | None = None,
                       block_threshold: float | None = None) -> Reply[ml.ClassifyResponse]:
        """Classify: prompt-injection scores and a verdict (allow | warn | block)."""
        request = ml.ClassifyRequest(text=text, tenant_id=self.scope.org, session_id=session_id,
                                     agent_id=self.scope.agent, model_hint=PROMPT_GUARD,
                                     warn_threshold=warn_threshold, block_threshold=block_threshold)
        return await self._call("Classify", request, detector=True)

    async def moderate(self, text: str, *, session_id: str = "") -> Reply[ml.ModerateResponse]:
        request = ml.ModerateRequest(text=text, tenant_id=self.scope.org, session_id=session_id,
                                     agent_id=self.scope.agent)
        return await self._call("Moderate", request, detector=True)

    async def detect_pii(self, text: str, *, session_id: str = "") -> Reply[ml.DetectPIIResponse]:
        """DetectPII: spans (UTF-8 byte offsets) of person | dob | address."""
        request = ml.DetectPIIRequest(text=text, tenant_id=self.scope.org, session_id=session_id,
                                      agent_id=self.scope.agent, model_hint=GLINER)
        return await self._call("DetectPII", request, detector=True)
