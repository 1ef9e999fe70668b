"""The PII redaction seam end to end: PushContext through gRPC, the PII scan as a job on the log,
the REAL detector service over gRPC (its model replaced by a stub at the model seam, since no
GLiNER weights exist here), PullContext and Search.

Healthy detector -> the memory comes back redacted (natid in the engine + DetectPII) and is
searchable; detector down -> regex fallback and quarantine (kept, not searchable); `context-engine
pii rescan` with the detector back clears it."""

from __future__ import annotations

import orjson
import pytest

from entrypoints.embedded.process import free_port
from tests.fixtures.calls import wait_embedded
from tests.fixtures.detector_stub import StubDetector
from tests.fixtures.engine import running_engine, unique
from upsquad.context.v1 import context_pb2 as pb

pytestmark = pytest.mark.integration

NAME, BIRTH, ADDRESS, PPSN = "Aoife Ní Bhriain", "4 March 1987", "78 Rue de Rivoli, Paris", "1234567TW"
NOTE = f"My name is {NAME}, born {BIRTH}, living at {ADDRESS}. My PPSN is {PPSN}. Favourite tea: oolong."


@pytest.fixture
async def detector(tmp_path):
    d = StubDetector(free_port(), tmp_path / "models", {NAME: "person", BIRTH: "date of birth", ADDRESS: "address"})
    await d.start()
    yield d
    await d.stop()


@pytest.fixture
async def engine_with_detector(postgres_url, kafka_bootstrap, tmp_path, detector):
    env = {"CONTEXT_ENGINE_DETECTOR_PORT": str(detector.port)}
    async with running_engine(postgres_url, kafka_bootstrap, tmp_path, extra_env=env) as engine:
        yield engine


async def push_and_pull(caller, session: str, content: bytes) -> pb.PullContextResponse:
    await caller("PushContext", pb.PushContextRequest(session_id=session, memory_type="semantic", content=content))
    return await caller("PullContext", pb.PullContextRequest(agent_id="bot", session_id=session))


def assert_no_pii(text: str) -> None:
    for secret in (NAME, "Aoife", "Bhriain", BIRTH, "1987", "Rivoli", PPSN):
        assert secret not in text, (secret, text)


async def search_contents(caller, query: str) -> str:
    reply = await caller("Search", pb.SearchRequest(query=query, min_score=1e-6, top_k=50))
    return " ".join(r.content for r in reply.results)


async def search_with_trailer(caller, query: str) -> tuple[pb.SearchResponse, dict[str, str]]:
    request = pb.SearchRequest(scope=caller.scope, query=query, min_score=1e-6, top_k=50)
    call = caller.stub.Search(request, metadata=caller.metadata())
    reply = await call
    return reply, dict(await call.trailing_metadata())


async def test_redacted_when_healthy_quarantined_when_down_cleared_by_rescan(engine_with_detector, detector):
    engine = engine_with_detector
    org = unique("org")
    caller = engine.caller(org, "p", "t", "bot", clearance=1)

    # Healthy: every string leaf of JSON is scrubbed; keys and numbers are untouched.
    pulled = await push_and_pull(caller, "s1", orjson.dumps({"note": NOTE, "visits": 3}))
    assert dict(pulled.metadata).get("engine.pii_status") is None
    redacted = orjson.loads(pulled.content)
    assert redacted["visits"] == 3 and "oolong" in redacted["note"]
    assert_no_pii(redacted["note"])
    for marker in ("[REDACTED:PERSON]", "[REDACTED:DOB]", "[REDACTED:ADDRESS]", "[REDACTED:NATIONAL_ID]"):
        assert marker in redacted["note"], redacted["note"]
    await wait_embedded(engine, org)
    found = await search_contents(caller, "favourite tea oolong")
    assert "oolong" in found
    assert_no_pii(found)

    # Detector down: regex fallback, quarantined, absent from Search.
    await detector.stop()
    text = f"My name is Siobhán Ó Briain. My PPSN is {PPSN}. Codeword: marmalade."
    pulled = await push_and_pull(caller, "s2", text.encode())
    assert dict(pulled.metadata)["engine.pii_status"] == "quarantined"
    assert PPSN not in pulled.content.decode() and "Siobhán" not in pulled.content.decode()
    assert "marmalade" not in await search_contents(caller, "codeword marmalade")

    # Detector back: rescan clears it, and it becomes searchable (redacted).
    await detector.start()
    code, out = await engine.cli("pii", "rescan", "--org", org, "--timeout", "60s")
    assert code == 0, out + engine.worker.log_tail(30)
    assert "cleared 1, still quarantined 0" in out
    pulled = await caller("PullContext", pb.PullContextRequest(agent_id="bot", session_id="s2"))
    assert dict(pulled.metadata).get("engine.pii_status") is None
    assert PPSN not in pulled.content.decode()
    await wait_embedded(engine, org)
    found = await search_contents(caller, "codeword marmalade")
    assert "marmalade" in found and PPSN not in found
    assert (await search_with_trailer(caller, "codeword marmalade"))[1]["engine.quarantined_matches"] == "0"


async def test_search_and_assembly_say_what_the_pii_scan_holds_back(engine_with_detector, detector):
    engine = engine_with_detector
    org = unique("org")
    caller = engine.caller(org, "p", "t", "bot", clearance=1)
    await detector.stop()  # no healthy detector: every push is quarantined
    pulled = await push_and_pull(caller, "s1", b"Codeword: marmalade. My PPSN is 1234567TW.")
    assert dict(pulled.metadata)["engine.pii_status"] == "quarantined"
    # Search's outcome stays the searchable corpus's (empty), and it says what it holds back, and why.
    reply, trailer = await search_with_trailer(caller, "codeword marmalade")
    assert not reply.results and reply.outcome == pb.RETRIEVAL_OUTCOME_NO_RESULTS
    assert trailer["engine.quarantined_matches"] == "1", trailer
    reason = trailer["engine.quarantine_reason"]
    assert reason.startswith("1 matching item quarantined by the PII scan (") and "UNAVAILABLE" in reason, reason
    assert "pii rescan" in reason
    assert (await search_with_trailer(caller, "oolong"))[1] == {"engine.quarantined_matches": "0"}  # no term matches
    call = caller.stub.AssembleContext(pb.AssembleContextRequest(
        scope=caller.scope, session_id="s1", task_description="codeword marmalade", token_budget=500),
        metadata=caller.metadata())
    assembled = await call
    assert assembled.quality.fallback_used
    assert assembled.quality.fallback_reason.startswith("no_results; 1 matching item quarantined"), \
        assembled.quality.fallback_reason
    assert dict(await call.trailing_metadata())["engine.quarantined_matches"] == "1"
    # Another org, a sibling agent and a sibling team of the same org are told of none of it.
    for other in (engine.caller(unique("org"), "p", "t", "bot", clearance=1), engine.caller(org, "p", "t", "bot2"),
                  engine.caller(org, "p", "t2", "bot")):
        assert (await search_with_trailer(other, "codeword marmalade"))[1]["engine.quarantined_matches"] == "0"
    await detector.start()
