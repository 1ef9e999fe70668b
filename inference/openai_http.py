"""One JSON POST to an OpenAI-compatible API, with retries and backoff: what the embeddings
backend (inference/openai_embedder.py) and the chat-completions summarizer
(inference/summarizers/chat_completions.py) share.

429, 5xx, connection errors and timeouts are retried up to `max_attempts` times in all, with
jittered exponential backoff; a numeric ``Retry-After`` is honoured, capped at `backoff_max_s`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson


class Retryable(Exception):
    """An attempt that may succeed if repeated (the last one's detail ends up in the error)."""

    def __init__(self, detail: str, *, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 4
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 8.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")


def retry_after_seconds(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # HTTP-date form: fall back to our own backoff


def error_detail(body: bytes) -> str:
    """The API's error message (``{"error": {"message": ...}}``), else the body's start."""
    try:
        doc = orjson.loads(body)
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            msg = doc["error"].get("message")
            if msg:
                return str(msg)[:500]
    except orjson.JSONDecodeError:
        pass
    return body[:500].decode("utf-8", errors="replace")


async def post_json(session: Any, url: str, payload: dict[str, Any], policy: RetryPolicy, *,
                    exhausted: Callable[[Retryable], Exception],
                    rejected: Callable[[int, str], Exception]) -> bytes:
    """The body of a 200 answer to ``POST url`` with `payload` on the aiohttp `session`. Raises
    ``exhausted(last)`` when every attempt failed retryably, ``rejected(status, detail)`` at once
    for any other status."""
    from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

    backoff = wait_exponential_jitter(multiplier=policy.backoff_initial_s, max=policy.backoff_max_s,
                                      jitter=policy.backoff_initial_s)

    def wait(state: Any) -> float:
        exc = state.outcome.exception() if state.outcome else None
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            return min(retry_after, policy.backoff_max_s)
        return backoff(state)

    try:
        async for attempt in AsyncRetrying(stop=stop_after_attempt(policy.max_attempts), wait=wait,
                                           retry=retry_if_exception_type(Retryable), reraise=True):
            with attempt:
                return await _post_once(session, url, payload, rejected)
    except Retryable as exc:
        raise exhausted(exc) from exc
    raise AssertionError("unreachable")  # pragma: no cover


async def _post_once(session: Any, url: str, payload: dict[str, Any],
                     rejected: Callable[[int, str], Exception]) -> bytes:
    import aiohttp

    try:
        async with session.post(url, data=orjson.dumps(payload)) as resp:
            body = await resp.read()
            status = resp.status
            retry_after = retry_after_seconds(resp.headers.get("Retry-After"))
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
        raise Retryable(f"{type(exc).__name__}: {exc}") from exc
    if status == 429 or status >= 500:
        raise Retryable(f"HTTP {status}: {error_detail(body)}", status=status, retry_after=retry_after)
    if status != 200:
        raise rejected(status, error_detail(body))
    return body


def json_session(api_key: str | None, timeout_s: float) -> Any:
    """An aiohttp session that sends and accepts JSON, with the bearer key when there is one."""
    import aiohttp

    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s))
