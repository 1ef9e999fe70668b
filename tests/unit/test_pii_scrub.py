"""PII scrubbing: span arithmetic, redaction, JSON leaves and the fail-closed fallback.

The ML detector is a stub `detect` callable that answers like DetectPII (UTF-8 byte offsets);
national IDs always come from the real natid code.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from inference.pii_client import DetectorError, PiiDetection, PiiSpan
from inference.pii_scrub import (
    REGEX_FALLBACK_VERSION,
    ScrubResult,
    Span,
    byte_to_char_offsets,
    merge_spans,
    ml_spans,
    natid_spans,
    redact,
    regex_spans,
    scrub_content,
)

PPSN = "1234567TW"  # passes the PPSN check (tests/unit/test_natid.py)
AOIFE = ("My name is Aoife Ní Bhriain, born 4 March 1987, living at 78 Rue de Rivoli, Paris. "
         f"My PPSN is {PPSN}.")
AOIFE_PII = {"Aoife Ní Bhriain": "person", "4 March 1987": "dob", "78 Rue de Rivoli, Paris": "address"}
AOIFE_REDACTED = ("My name is [REDACTED:PERSON], born [REDACTED:DOB], living at [REDACTED:ADDRESS]. "
                  "My PPSN is [REDACTED:NATIONAL_ID].")
SURVIVORS = ("Aoife", "Bhriain", "March", "1987", "Rivoli", PPSN)


class StubDetector:
    """Answers like DetectPII: every occurrence of a known substring, on UTF-8 byte offsets."""

    def __init__(self, entities: dict[str, str], version: str = "stub@1") -> None:
        self.entities = entities
        self.version = version
        self.calls: list[str] = []

    async def __call__(self, text: str) -> PiiDetection:
        self.calls.append(text)
        data = text.encode()
        spans = []
        for needle, cls in self.entities.items():
            raw = needle.encode()
            at = data.find(raw)
            while at >= 0:
                spans.append(PiiSpan(cls, at, at + len(raw), 0.9))
                at = data.find(raw, at + 1)
        return PiiDetection(tuple(sorted(spans, key=lambda s: s.start)), self.version)


def failing(error: Exception):
    async def detect(text: str) -> PiiDetection:
        raise error
    return detect


def assert_no_pii(content: bytes) -> None:
    text = content.decode()
    for piece in SURVIVORS:
        assert piece not in text, (piece, text)


# --- offsets -------------------------------------------------------------------------------------


def test_byte_offsets_become_character_offsets_after_multibyte_characters() -> None:
    text = "é Ní 😀 Aoife"
    data = text.encode()
    assert len(data) - len(text) == 1 + 1 + 3  # é, í: 2 bytes; the emoji: 4 bytes
    aoife = data.index(b"Aoife")
    assert byte_to_char_offsets(text, [aoife, len(data), 0, aoife]) == [text.index("Aoife"), len(text), 0,
                                                                        text.index("Aoife")]
    emoji = data.index("😀".encode())
    assert byte_to_char_offsets(text, [emoji, emoji + 4]) == [5, 6]
    assert byte_to_char_offsets(text, []) == []


@pytest.mark.parametrize("offset", [1, 5, 8, 9, 10])  # inside é, í and the emoji
def test_byte_offset_inside_a_character_is_refused(offset: int) -> None:
    text = "é Ní 😀"
    with pytest.raises(ValueError, match="splits a UTF-8 character"):
        byte_to_char_offsets(text, [offset])


def test_byte_offset_outside_the_text_is_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        byte_to_char_offsets("Ní", [4])
    with pytest.raises(ValueError, match="outside"):
        byte_to_char_offsets("Ní", [-1])


async def test_ml_spans_land_on_the_right_characters() -> None:
    text = "😀😀 Aoife Ní Bhriain lives at 78 Rue de Rivoli"
    detection = await StubDetector({"Aoife Ní Bhriain": "person", "78 Rue de Rivoli": "address"})(text)
    assert detection.spans[0].start != text.index("Aoife")  # byte and character offsets differ here
    spans = ml_spans(text, detection)
    assert [(s.cls, text[s.start:s.end], s.source) for s in spans] == [
        ("person", "Aoife Ní Bhriain", "ml"), ("address", "78 Rue de Rivoli", "ml")]


def test_natid_spans_are_national_id_with_the_kind_kept() -> None:
    text = f"Ní 😀 PPSN {PPSN}"
    [span] = natid_spans(text)
    assert (span.cls, text[span.start:span.end], span.source) == ("national_id", PPSN, "natid:ie_ppsn")


# --- merging and redaction -----------------------------------------------------------------------


def test_overlapping_spans_merge_into_one_placeholder_of_the_longest_class() -> None:
    text = "0123456789abcdef"
    spans = [Span("person", 0, 4, "ml"), Span("address", 2, 9, "ml"), Span("dob", 12, 14, "ml")]
    assert merge_spans(spans) == [Span("address", 0, 9, "ml"), Span("dob", 12, 14, "ml")]
    assert redact(text, spans) == "[REDACTED:ADDRESS]9ab[REDACTED:DOB]ef"


def test_touching_spans_merge_and_ties_go_to_the_earliest_then_first_given() -> None:
    text = "abcdefgh"
    assert redact(text, [Span("dob", 4, 8, "ml"), Span("person", 0, 4, "ml")]) == "[REDACTED:PERSON]"
    same = [Span("dob", 2, 5, "regex:dob"), Span("person", 2, 5, "ml")]
    assert merge_spans(same) == [Span("dob", 2, 5, "regex:dob")]
    assert merge_spans(list(reversed(same))) == [Span("person", 2, 5, "ml")]


def test_contained_span_and_empty_span_do_not_change_the_group() -> None:
    spans = [Span("person", 3, 5, "ml"), Span("national_id", 1, 9, "natid:ie_ppsn"), Span("dob", 11, 11, "ml")]
    assert merge_spans(spans) == [Span("national_id", 1, 9, "natid:ie_ppsn")]
    assert redact("abcdefghijkl", spans) == "a[REDACTED:NATIONAL_ID]jkl"
    assert redact("unchanged", []) == "unchanged"


# --- scrub_content: healthy detector -------------------------------------------------------------


async def test_the_aoife_sentence_loses_name_date_address_and_ppsn() -> None:
    detect = StubDetector(AOIFE_PII)
    result = await scrub_content(AOIFE.encode(), detect)
    assert result == ScrubResult(AOIFE_REDACTED.encode(), {"person": 1, "dob": 1, "address": 1, "national_id": 1},
                                 "redacted", "natid-v1+stub@1", "")
    assert_no_pii(result.content)
    assert detect.calls == [AOIFE]


async def test_clean_text_is_returned_byte_for_byte() -> None:
    for content in ("Nothing personal here: the build took 12 minutes. Café ☕".encode(),
                    b'{ "a" : [1, 2.50, true],\n  "b": "plain words" }',
                    b"\xff\xfe not utf-8 but clean"):
        result = await scrub_content(content, StubDetector(AOIFE_PII))
        assert result.content is content
        assert (result.status, result.spans_by_class, result.fallback_reason) == ("clean", {}, "")
        assert result.detector_version == "natid-v1+stub@1"


async def test_json_leaves_are_scrubbed_and_everything_else_is_kept() -> None:
    document = {
        "speaker": "user",
        "text": AOIFE,
        "Aoife Ní Bhriain": "keys are not scanned",
        "turn": 7,
        "score": 0.25,
        "pinned": True,
        "deleted": False,
        "ttl": None,
        "tags": ["profile", AOIFE, 42, [f"PPSN {PPSN}", {"deep": "4 March 1987"}]],
    }
    detect = StubDetector(AOIFE_PII)
    result = await scrub_content(orjson.dumps(document), detect)
    assert result.status == "redacted"
    out = orjson.loads(result.content)
    assert list(out) == list(document)  # keys and their order
    assert out["text"] == AOIFE_REDACTED and out["tags"][1] == AOIFE_REDACTED
    assert out["tags"][3] == ["PPSN [REDACTED:NATIONAL_ID]", {"deep": "[REDACTED:DOB]"}]
    for key in ("speaker", "Aoife Ní Bhriain", "turn", "score", "pinned", "deleted", "ttl"):
        assert out[key] == document[key] and type(out[key]) is type(document[key])
    assert out["tags"][0] == "profile" and out["tags"][2] == 42
    # AOIFE appears twice: each occurrence is counted; the detector saw each distinct leaf once
    assert result.spans_by_class == {"person": 2, "dob": 3, "address": 2, "national_id": 3}
    assert sorted(detect.calls) == sorted({v for v in _strings(document)})


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


async def test_nested_lists_at_the_top_level() -> None:
    content = orjson.dumps([[["deep", [AOIFE]], 1.5], [], [[[]]], "Aoife Ní Bhriain"])
    result = await scrub_content(content, StubDetector(AOIFE_PII))
    assert orjson.loads(result.content) == [[["deep", [AOIFE_REDACTED]], 1.5], [], [[[]]], "[REDACTED:PERSON]"]
    assert_no_pii(result.content)


async def test_blank_leaves_and_documents_without_text_skip_the_detector() -> None:
    detect = StubDetector(AOIFE_PII)
    result = await scrub_content(b'{"a": "", "b": "   ", "c": [1, 2], "d": {}}', detect)
    assert detect.calls == []
    assert (result.status, result.detector_version) == ("clean", "natid-v1")


async def test_json_scalars_and_lossy_numbers_are_scrubbed_as_one_text() -> None:
    scalar = orjson.dumps(AOIFE)  # a JSON string is not an object or array
    result = await scrub_content(scalar, StubDetector(AOIFE_PII))
    assert result.content == f'"{AOIFE_REDACTED}"'.encode()
    big = b'{"id": 123456789012345678901234567890, "who": "Aoife Ni Bhriain"}'  # orjson would make a float
    result = await scrub_content(big, StubDetector({"Aoife Ni Bhriain": "person"}))
    assert result.content == b'{"id": 123456789012345678901234567890, "who": "[REDACTED:PERSON]"}'


async def test_invalid_utf8_text_is_decoded_with_replacement() -> None:
    result = await scrub_content(b"\xff " + AOIFE.encode(), StubDetector(AOIFE_PII))
    assert result.content == ("\ufffd " + AOIFE_REDACTED).encode()


# --- scrub_content: the detector fails -----------------------------------------------------------


async def test_detector_error_quarantines_and_the_regex_fallback_still_redacts() -> None:
    message = "DetectPII at 127.0.0.1:50052 failed with UNAVAILABLE: the anti-collapse canary failed"
    result = await scrub_content(AOIFE.encode(), failing(DetectorError(message)))
    assert result.status == "quarantined"
    assert result.fallback_reason == message
    assert result.detector_version == REGEX_FALLBACK_VERSION == "regex-fallback-v1"
    assert_no_pii(result.content)
    assert result.content == AOIFE_REDACTED.encode()
    assert result.spans_by_class == {"person": 1, "dob": 1, "address": 1, "national_id": 1}


async def test_any_exception_from_detect_quarantines() -> None:
    result = await scrub_content(orjson.dumps({"t": AOIFE}), failing(RuntimeError("boom")))
    assert (result.status, result.fallback_reason) == ("quarantined", "RuntimeError: boom")
    assert_no_pii(result.content)


async def test_quarantined_even_when_the_fallback_finds_nothing() -> None:
    content = b'{"t": "nothing to see"}'
    result = await scrub_content(content, failing(DetectorError("down")))
    assert (result.content, result.status, result.spans_by_class) == (content, "quarantined", {})


async def test_a_failure_on_a_later_leaf_sends_the_whole_candidate_to_the_fallback() -> None:
    calls: list[str] = []

    async def detect(text: str) -> PiiDetection:
        calls.append(text)
        if len(calls) == 2:
            raise DetectorError("second call failed")
        # a model-only finding the regexes cannot reproduce
        return PiiDetection((PiiSpan("person", 0, len(text.encode()), 0.9),), "stub@1")

    result = await scrub_content(orjson.dumps(["lowercase words", AOIFE]), detect)
    assert result.status == "quarantined"
    assert orjson.loads(result.content) == ["lowercase words", AOIFE_REDACTED]  # regex on every leaf


async def test_a_malformed_detection_quarantines() -> None:
    async def splits_a_character(text: str) -> PiiDetection:
        start = text.encode().index("í".encode()) + 1
        return PiiDetection((PiiSpan("person", start, start + 2, 0.9),), "stub@1")

    result = await scrub_content(AOIFE.encode(), splits_a_character)
    assert result.status == "quarantined" and "splits a UTF-8 character" in result.fallback_reason
    assert_no_pii(result.content)


async def test_model_version_changing_within_a_candidate_quarantines() -> None:
    versions = iter(["stub@1", "stub@2"])

    async def detect(text: str) -> PiiDetection:
        return PiiDetection((), next(versions))

    result = await scrub_content(b'["one", "two"]', detect)
    assert result.status == "quarantined" and "stub@1" in result.fallback_reason


async def test_cancellation_is_not_swallowed() -> None:
    with pytest.raises(asyncio.CancelledError):
        await scrub_content(AOIFE.encode(), failing(asyncio.CancelledError()))


# --- the regex fallback --------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "cls", "found"), [
    ("I live at 221B Baker Street, London.", "address", "221B Baker Street, London"),
    ("Calle Mayor 5, Madrid", "address", "Calle Mayor 5, Madrid"),
    ("Via Roma, 10", "address", "Via Roma, 10"),
    ("wohnt in der Hauptstraße 5", "address", "Hauptstraße 5"),
    ("Berliner Straße 12, 10115 Berlin", "address", "Berliner Straße 12, 10115 Berlin"),
    ("Kalverstraat 1", "address", "Kalverstraat 1"),
    ("at 12 abbey road", "address", "12 abbey road"),
    ("mail aoife.ni-bhriain+x@example.ie.", "email", "aoife.ni-bhriain+x@example.ie"),
    ("ring +353 87 123 4567 today", "phone", "+353 87 123 4567"),
    ("or (020) 7946 0958", "phone", "(020) 7946 0958"),
    ("phone: 555-123-4567", "phone", "555-123-4567"),
    ("DOB: 1987-03-04", "dob", "1987-03-04"),
    ("née le 1er mars 1987", "dob", "1er mars 1987"),
    ("nacida el 4 de marzo de 1987", "dob", "4 de marzo de 1987"),
    ("born on March 4, 1987", "dob", "March 4, 1987"),
    ("I am Aoife Ní Bhriain.", "person", "Aoife Ní Bhriain"),
    ("name: Ludwig van Beethoven", "person", "Ludwig van Beethoven"),
    ("je m'appelle Élodie Lefèvre", "person", "Élodie Lefèvre"),
    ("ask Dr. Seán O'Brien", "person", "Seán O'Brien"),
])
def test_regex_fallback_finds(text: str, cls: str, found: str) -> None:
    assert (cls, found) in {(s.cls, text[s.start:s.end]) for s in regex_spans(text)}


@pytest.mark.parametrize("text", [
    "I am happy to help",
    "I have 2 days in a row",
    "order 1234567890 shipped",
    "2024-01-15 10:30:00 took 3 steps",
    "the meeting is on 4 March 1987",  # a date, but nothing says birth
    "version 1.2.3 on port 8080",
])
def test_regex_fallback_leaves_ordinary_text_alone(text: str) -> None:
    assert regex_spans(text) == []
