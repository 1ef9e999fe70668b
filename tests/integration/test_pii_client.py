"""PiiClient against the real detector gRPC server on 127.0.0.1.

Servers: the tiny random GLiNER the fixtures build (real loading and inference; it fails the
anti-collapse canary, so DetectPII is UNAVAILABLE), an empty models directory, and GLiNER replaced
by test_detector's StubModel at the model seam (the healthy path: spans and byte offsets).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import pytest

from context_engine.config import Settings
from entrypoints.detector.server import build_detector_server, start_detector
from inference.detector.service import DetectorServicer
from inference.detector.settings import DetectorSettings
from inference.pii_client import MAX_TEXT_BYTES, DetectorError, PiiClient, PiiSpan
from inference.pii_scrub import scrub_content
from tests.fixtures.detector_models import TinyModels, detector_models  # noqa: F401  (fixture)
from tests.fixtures.detector_stub import AOIFE, StubModel
from upsquad.ml.v1 import detector_pb2, detector_pb2_grpc

TOKEN = "s3cret"


async def _serve(settings: DetectorSettings, servicer: DetectorServicer | None = None,
                 engine_settings: Settings | None = None, address: str = "127.0.0.1:0") -> AsyncIterator[str]:
    """The detector process's own server (a free port by default); yields its address."""
    hosted, servicer = build_detector_server(engine_settings or Settings(detector_service_token=TOKEN), settings,
                                             address=address,
                                             servicer=servicer)
    await start_detector(hosted, servicer)
    try:
        yield f"127.0.0.1:{hosted.port}"
    finally:
        await hosted.stop(0)
        servicer.close()


@pytest.fixture(scope="module")
async def tiny_address(detector_models: TinyModels) -> AsyncIterator[str]:  # noqa: F811
    async for address in _serve(DetectorSettings(models_dir=detector_models.models_dir)):
        yield address


@pytest.fixture(scope="module")
async def empty_address(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    async for address in _serve(DetectorSettings(models_dir=tmp_path_factory.mktemp("no-models") / "models")):
        yield address


@pytest.fixture(scope="module")
async def stubbed_address(tmp_path_factory: pytest.TempPathFactory,
                          stub_model: StubModel) -> AsyncIterator[str]:  # noqa: F811
    settings = DetectorSettings(models_dir=tmp_path_factory.mktemp("stub") / "models")
    servicer = DetectorServicer(settings, pii_model=stub_model, pii_version="stub@1")
    async for address in _serve(settings, servicer):
        yield address


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _texts(text: str, spans: tuple[PiiSpan, ...]) -> list[tuple[str, str]]:
    data = text.encode()
    return [(s.pattern_class, data[s.start:s.end].decode()) for s in spans]


# --- failures --------------------------------------------------------------------------------------


async def test_inert_tiny_gliner_raises_unavailable(tiny_address: str) -> None:
    async with PiiClient(tiny_address, service_token=TOKEN, tenant_id="t") as client:
        for text in (AOIFE, "nothing here"):
            with pytest.raises(DetectorError) as caught:
                await client.detect(text)
            assert "UNAVAILABLE" in caught.value.message and tiny_address in caught.value.message
            assert "canary" in caught.value.message


async def test_no_weights_raises_unavailable_naming_the_import(empty_address: str) -> None:
    async with PiiClient(empty_address, service_token=TOKEN) as client:
        with pytest.raises(DetectorError) as caught:
            await client.detect(AOIFE)
    assert "UNAVAILABLE" in str(caught.value) and empty_address in str(caught.value)
    assert "models import gliner" in str(caught.value)


async def test_nothing_listening_fails_within_the_timeout() -> None:
    address = f"127.0.0.1:{_free_port()}"
    async with PiiClient(address, timeout_seconds=1.0) as client:
        started = time.monotonic()
        with pytest.raises(DetectorError) as caught:
            await client.detect(AOIFE)
    assert time.monotonic() - started < 1.5
    assert address in caught.value.message
    assert "UNAVAILABLE" in caught.value.message or "DEADLINE_EXCEEDED" in caught.value.message


async def test_the_client_recovers_soon_after_the_detector_comes_back(
        tmp_path, stub_model: StubModel) -> None:  # noqa: F811
    address = f"127.0.0.1:{_free_port()}"
    async with PiiClient(address, service_token=TOKEN, timeout_seconds=1.0) as client:
        with pytest.raises(DetectorError):
            await client.detect("hello")
        settings = DetectorSettings(models_dir=tmp_path / "models")
        servicer = DetectorServicer(settings, pii_model=stub_model, pii_version="stub@1")
        async for _ in _serve(settings, servicer, address=address):
            started = time.monotonic()
            while True:
                try:
                    detection = await client.detect("hello")
                    break
                except DetectorError:
                    assert time.monotonic() - started < 10, "still failing 10 s after the detector came back"
                    await asyncio.sleep(0.2)
            assert detection.model_version == "stub@1"


async def test_a_silent_peer_hits_the_deadline() -> None:
    """A socket that accepts and never speaks HTTP/2: only the per-call deadline ends the call."""
    peers: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with PiiClient(address, timeout_seconds=0.5) as client:
            started = time.monotonic()
            with pytest.raises(DetectorError) as caught:
                await client.detect("hello")
            assert time.monotonic() - started < 1.5
        assert "DEADLINE_EXCEEDED" in caught.value.message and address in caught.value.message
    finally:
        for writer in peers:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_service_token_is_sent_as_a_bearer_header(stubbed_address: str, tmp_path) -> None:
    async with PiiClient(stubbed_address) as client:
        with pytest.raises(DetectorError, match="UNAUTHENTICATED"):
            await client.detect("hello")
    async with PiiClient(stubbed_address, service_token="wrong") as client:
        with pytest.raises(DetectorError, match="UNAUTHENTICATED"):
            await client.detect("hello")
    settings = Settings(detector_host="127.0.0.1", detector_port=int(stubbed_address.rsplit(":", 1)[1]),
                        detector_service_token=TOKEN)
    async with PiiClient.from_settings(settings, tenant_id="t") as client:
        assert (await client.detect("hello")).spans == ()
    # Without a configured token, the client sends its home's token file: not this detector's.
    unset = Settings(home=tmp_path, detector_host="127.0.0.1", detector_port=settings.detector_port)
    async with PiiClient.from_settings(unset, tenant_id="t") as client:
        with pytest.raises(DetectorError, match="UNAUTHENTICATED"):
            await client.detect("hello")
    assert (tmp_path / "keys" / "detector-service.token").stat().st_mode & 0o777 == 0o600


class MalformedDetector(detector_pb2_grpc.MLDetectorServiceServicer):
    """Answers DetectPII with whatever response the test sets."""

    reply = detector_pb2.DetectPIIResponse()

    async def DetectPII(self, request, context) -> detector_pb2.DetectPIIResponse:
        return self.reply


@pytest.mark.parametrize(("reply", "complaint"), [
    (detector_pb2.DetectPIIResponse(model_version="m@1"), "canary_healthy is false"),
    (detector_pb2.DetectPIIResponse(canary_healthy=True), "model_version is empty"),
    (detector_pb2.DetectPIIResponse(canary_healthy=True, model_version="m@1", spans=[
        detector_pb2.PIISpan(pattern_class="natid", start=0, end=2, score=0.9)]), "pattern_class 'natid'"),
    (detector_pb2.DetectPIIResponse(canary_healthy=True, model_version="m@1", spans=[
        detector_pb2.PIISpan(pattern_class="person", start=0, end=99, score=0.9)]), "outside"),
    (detector_pb2.DetectPIIResponse(canary_healthy=True, model_version="m@1", spans=[
        detector_pb2.PIISpan(pattern_class="person", start=0, end=2, score=0.9)]), "splits a UTF-8 character"),
    (detector_pb2.DetectPIIResponse(canary_healthy=True, model_version="m@1", spans=[
        detector_pb2.PIISpan(pattern_class="person", start=0, end=1, score=1.5)]), "score"),
])
async def test_a_malformed_response_raises(reply: detector_pb2.DetectPIIResponse, complaint: str) -> None:
    servicer = MalformedDetector()
    servicer.reply = reply
    hosted, _ = build_detector_server(Settings(detector_service_token=TOKEN), address="127.0.0.1:0",
                                      servicer=servicer)  # type: ignore[arg-type]
    await hosted.start()
    try:
        async with PiiClient(f"127.0.0.1:{hosted.port}", service_token=TOKEN) as client:
            with pytest.raises(DetectorError, match="malformed") as caught:
                await client.detect("Ní")  # "N" is 1 byte, "í" is 2
        assert complaint in caught.value.message
    finally:
        await hosted.stop(0)


# --- the healthy path (GLiNER stubbed at the model seam) ---------------------------------------------


async def test_spans_come_back_on_utf8_byte_offsets(stubbed_address: str) -> None:
    text = "😀 " + AOIFE + " PPS 1234567T"
    async with PiiClient(stubbed_address, service_token=TOKEN, tenant_id="t") as client:
        detection = await client.detect(text)
    assert detection.model_version == "stub@1"
    assert _texts(text, detection.spans) == [
        ("person", "Aoife Ní Bhriain"), ("dob", "4 March 1987"), ("address", "78 Rue de Rivoli, Paris")]
    assert detection.spans[0].start == text.encode().index("Aoife".encode()) != text.index("Aoife")
    assert all(0.0 <= s.score <= 1.0 for s in detection.spans)


async def test_scrub_content_through_the_client(stubbed_address: str) -> None:
    ppsn = "1234567TW"
    content = f"{AOIFE} My PPSN is {ppsn}.".encode()
    async with PiiClient(stubbed_address, service_token=TOKEN) as client:
        result = await scrub_content(content, client.detect)
    assert result.status == "redacted" and result.detector_version == "natid-v1+stub@1"
    assert result.content.decode() == (
        "My name is [REDACTED:PERSON], born [REDACTED:DOB], living at [REDACTED:ADDRESS]. "
        "My PPSN is [REDACTED:NATIONAL_ID].")


async def test_long_text_is_split_and_offsets_are_shifted(stubbed_address: str) -> None:
    words = [f"wörd{i}" for i in range(200)]
    for at in (3, 40, 41, 120, 198):
        words[at:at + 2] = ["Needle", "Person"]
    text = " ".join(words)
    data = text.encode()
    expected = []
    at = data.find(b"Needle Person")
    while at >= 0:
        expected.append(("person", at, at + len(b"Needle Person")))
        at = data.find(b"Needle Person", at + 1)
    async with PiiClient(stubbed_address, service_token=TOKEN, max_piece_bytes=64) as client:
        detection = await client.detect(text)
    assert len(data) > 20 * 64
    assert [(s.pattern_class, s.start, s.end) for s in detection.spans] == expected


async def test_text_over_the_64_kib_limit_never_reaches_the_limit(stubbed_address: str) -> None:
    text = "é" * (MAX_TEXT_BYTES // 2) + " Needle Person"  # 65,550 bytes: over the service's limit
    assert len(text.encode()) > MAX_TEXT_BYTES
    async with PiiClient(stubbed_address, service_token=TOKEN) as client:
        detection = await client.detect(text)
    assert _texts(text, detection.spans) == [("person", "Needle Person")]


async def test_close_is_idempotent_and_a_closed_client_reconnects(stubbed_address: str) -> None:
    client = PiiClient(stubbed_address, service_token=TOKEN)
    await client.close()
    assert (await client.detect("hello")).model_version == "stub@1"
    await client.close()
    await client.close()
    assert (await client.detect("hello")).model_version == "stub@1"
    await client.close()
