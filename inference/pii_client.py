"""Async client for `upsquad.ml.v1.MLDetectorService.DetectPII` (the ML half of PII redaction).

The detector answers `person | dob | address` spans on UTF-8 **byte** offsets; national IDs are
found by the engine itself (`inference.natid`). Every way the call can go wrong,
a gRPC status (UNAVAILABLE when the canary fails or no weights are loaded, DEADLINE_EXCEEDED,
a refused connection, UNAUTHENTICATED ...) or a response that breaks the contract, raises
`DetectorError`; callers fall back to regex detection and quarantine (`pii_scrub`).

Texts over the service's 64 KiB limit are split into overlapping pieces of at most
`max_piece_bytes`, cut after whitespace where there is some and always on a character boundary,
so callers never see TEXT_TOO_LARGE. Offsets come back shifted into the whole text. Spans found
twice in an overlap are reported once; spans from neighbouring pieces may still overlap each other
(redaction takes the union).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

import grpc

from inference.detector.settings import GLINER_NAME
from inference.detector.token import service_token
from upsquad.ml.v1 import detector_pb2, detector_pb2_grpc

if TYPE_CHECKING:
    from context_engine.config import Settings

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "MAX_TEXT_BYTES",
    "PII_CLASSES",
    "DetectorError",
    "PiiClient",
    "PiiDetection",
    "PiiSpan",
    "split_utf8",
]

MAX_TEXT_BYTES = 65_536  # the contract's hard ceiling on DetectPIIRequest.text, in UTF-8 bytes
DEFAULT_TIMEOUT_SECONDS = 2.0
PII_CLASSES = frozenset({"person", "dob", "address"})  # the closed enum DetectPII may emit
# How much consecutive pieces of a long text share, so an entity cut by one piece's end is seen
# whole by the next; and how far back from a piece's end a whitespace cut is looked for.
PIECE_OVERLAP_BYTES = 1024
WHITESPACE_SEARCH_BYTES = 512
# While the detector is down every call fails fast (fail closed); once it is back, the channel should
# notice within seconds, not after gRPC's default reconnect backoff of up to two minutes.
_CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 500), ("grpc.max_reconnect_backoff_ms", 5_000)]


class DetectorError(Exception):
    """The detector could not be used: any gRPC failure or a response that breaks the contract."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class PiiSpan:
    """One span on UTF-8 byte offsets of the text given to `PiiClient.detect`, half-open."""

    pattern_class: str  # person | dob | address
    start: int
    end: int
    score: float


@dataclass(frozen=True, slots=True)
class PiiDetection:
    spans: tuple[PiiSpan, ...]  # sorted by (start, end)
    model_version: str  # e.g. "urchade/gliner_small-v2.1@<revision>"


class PiiClient:
    """`async with PiiClient(address) as client: detection = await client.detect(text)`."""

    def __init__(self, address: str, *, service_token: str | None = None,
                 timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS, tenant_id: str = "",
                 max_piece_bytes: int = MAX_TEXT_BYTES) -> None:
        if not 64 <= max_piece_bytes <= MAX_TEXT_BYTES:
            raise ValueError(f"max_piece_bytes must be within 64..{MAX_TEXT_BYTES}, got {max_piece_bytes}")
        if not timeout_seconds > 0:
            raise ValueError(f"timeout_seconds must be positive, got {timeout_seconds}")
        self.address = address
        self.timeout_seconds = timeout_seconds
        self.tenant_id = tenant_id  # sent for the sidecar's metric labels only
        self.max_piece_bytes = max_piece_bytes
        self._metadata = (("authorization", f"Bearer {service_token}"),) if service_token else None
        # Created on first use, inside the running event loop that will own it.
        self._channel: grpc.aio.Channel | None = None
        self._stub: detector_pb2_grpc.MLDetectorServiceStub | None = None

    @classmethod
    def from_settings(cls, settings: Settings, *, tenant_id: str = "",
                      timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> PiiClient:
        """A client for the engine's configured detector: its address, and the service token it
        requires (detector_service_token, else the home's token file: inference/detector/token.py)."""
        return cls(settings.detector_address, service_token=service_token(settings),
                   timeout_seconds=timeout_seconds, tenant_id=tenant_id)

    async def __aenter__(self) -> PiiClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel. Idempotent; a later `detect` opens a new one."""
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close()

    async def detect(self, text: str) -> PiiDetection:
        """The detector's spans for `text`, on byte offsets of `text.encode("utf-8")`."""
        data = text.encode("utf-8")
        spans: dict[tuple[str, int, int], PiiSpan] = {}  # one entry per span seen in two pieces
        versions: set[str] = set()
        for start, end in split_utf8(data, self.max_piece_bytes):
            piece = data[start:end]
            reply = await self._call(piece.decode("utf-8"))
            versions.add(reply.model_version)
            for s in self._checked_spans(reply, piece):
                key = (s.pattern_class, s.start + start, s.end + start)
                if key not in spans or spans[key].score < s.score:
                    spans[key] = PiiSpan(*key, s.score)
        if len(versions) > 1:
            raise DetectorError(f"DetectPII at {self.address} answered with several model versions "
                                f"{sorted(versions)} for one text")
        version = versions.pop() if versions else ""
        return PiiDetection(tuple(spans[key] for key in sorted(spans, key=lambda k: (k[1], k[2], k[0]))), version)

    async def _call(self, text: str) -> detector_pb2.DetectPIIResponse:
        request = detector_pb2.DetectPIIRequest(text=text, tenant_id=self.tenant_id, model_hint=GLINER_NAME)
        try:
            return await self._detector().DetectPII(request, timeout=self.timeout_seconds,
                                                    metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                # Dial afresh next time: a restarted sidecar is used at once, not after the
                # channel's reconnect backoff (a `pii rescan` right after a restart must see it).
                await self.close()
            raise DetectorError(f"DetectPII at {self.address} failed with {exc.code().name}: "
                                f"{exc.details()}") from exc
        except (grpc.RpcError, grpc.aio.BaseError) as exc:  # e.g. a call on a closed channel
            raise DetectorError(f"DetectPII at {self.address} failed: {type(exc).__name__}: {exc}") from exc

    def _detector(self) -> detector_pb2_grpc.MLDetectorServiceStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(self.address, options=_CHANNEL_OPTIONS)
            self._stub = detector_pb2_grpc.MLDetectorServiceStub(self._channel)
        return self._stub

    def _checked_spans(self, reply: detector_pb2.DetectPIIResponse, piece: bytes) -> Sequence[PiiSpan]:
        """The reply's spans, or DetectorError when the reply breaks the contract."""
        def malformed(why: str) -> DetectorError:
            return DetectorError(f"DetectPII at {self.address} returned a malformed response: {why}")

        # The service answers UNAVAILABLE rather than send this; fail closed if something does.
        if not reply.canary_healthy:
            raise malformed("canary_healthy is false")
        if not reply.model_version:
            raise malformed("model_version is empty")
        spans = []
        for s in reply.spans:
            if s.pattern_class not in PII_CLASSES:
                raise malformed(f"pattern_class {s.pattern_class!r} is outside {sorted(PII_CLASSES)}")
            if not 0 <= s.start < s.end <= len(piece):
                raise malformed(f"span {s.start}:{s.end} lies outside the {len(piece)}-byte text")
            if not (_on_boundary(piece, s.start) and _on_boundary(piece, s.end)):
                raise malformed(f"span {s.start}:{s.end} splits a UTF-8 character")
            if math.isnan(s.score) or not 0.0 <= s.score <= 1.0:
                raise malformed(f"score {s.score} is outside [0, 1]")
            spans.append(PiiSpan(s.pattern_class, s.start, s.end, s.score))
        return spans


def _on_boundary(data: bytes, offset: int) -> bool:
    return offset == len(data) or data[offset] & 0xC0 != 0x80  # not a continuation byte


def split_utf8(data: bytes, max_bytes: int, overlap: int = PIECE_OVERLAP_BYTES,
               whitespace_search: int = WHITESPACE_SEARCH_BYTES) -> list[tuple[int, int]]:
    """Half-open byte ranges covering `data`, each at most `max_bytes` long and on character
    boundaries. A range ends after the last whitespace in its final `whitespace_search` bytes when
    there is one; the next range starts up to `overlap` bytes earlier (at a word start if it can).
    An empty text is one empty range (the detector is still asked, so its health is still checked).
    """
    if max_bytes < 4:
        raise ValueError(f"max_bytes must hold any UTF-8 character (4 bytes), got {max_bytes}")
    if len(data) <= max_bytes:
        return [(0, len(data))]
    overlap = min(overlap, max_bytes // 4)  # every piece must make progress
    whitespace_search = min(whitespace_search, max_bytes // 4)
    ranges: list[tuple[int, int]] = []
    start = 0
    while True:
        end = start + max_bytes
        if end >= len(data):
            ranges.append((start, len(data)))
            return ranges
        while not _on_boundary(data, end):
            end -= 1
        cut = max(_last_whitespace(data, end - whitespace_search, end), start)
        if cut > start + overlap:
            end = cut
        ranges.append((start, end))
        following = _next_start(data, end, overlap)
        start = following if following > start else end  # a piece of wide characters: no overlap


_WHITESPACE = b" \t\r\n"


def _last_whitespace(data: bytes, lo: int, hi: int) -> int:
    """Offset just after the last ASCII whitespace in data[lo:hi], or -1."""
    found = max(data.rfind(c, max(lo, 0), hi) for c in _WHITESPACE)
    return found + 1 if found >= 0 else -1


def _next_start(data: bytes, end: int, overlap: int) -> int:
    start = end - overlap
    while not _on_boundary(data, start):
        start += 1
    hits = [i for i in (data.find(c, start, end) for c in _WHITESPACE) if i >= 0]
    after_space = min(hits) + 1 if hits else end
    return after_space if after_space < end else start
