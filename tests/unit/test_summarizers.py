"""inference/summarizers: the extractive backend keeps every fact and drops chit-chat and
repetition; the chat-completions backend against a local HTTP server (request, retries, clear
errors)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from inference.facts import extract, retention
from inference.openai_http import RetryPolicy
from inference.summarizers import SummarizerError, SummaryLine, Turn
from inference.summarizers.chat_completions import ChatCompletionsSummarizer
from inference.summarizers.extractive import ExtractiveSummarizer, sentences, summarize, summary_lines
from tests.fixtures.json_server import FakeChatServer

DIALOGUE = [
    Turn("user", "Hey Mel! Good to see you. I went to the LGBTQ support group on 7 May 2023."),
    Turn("assistant", "Wow, that is awesome! How was it?"),
    Turn("user", "It was great. Caroline was there too. Caroline was there too! We paid $40 for 2 tickets."),
    Turn("assistant", "Thanks for sharing. My order id is INV-2041, see https://example.com/o/2041."),
    Turn("user", "haha ok"),
]


def test_the_extractive_summary_keeps_every_fact_of_the_turns() -> None:
    summary = summarize(DIALOGUE)
    r = retention([t.content for t in DIALOGUE], summary)
    assert r.total > 0 and r.missing == () and r.score == 1.0


def test_the_extractive_summary_drops_chit_chat_and_repetition() -> None:
    summary = summarize(DIALOGUE)
    assert "How was it?" not in summary and "haha ok" not in summary and "It was great." not in summary
    assert summary.count("Caroline was there too") == 1
    assert len(summary) < sum(len(t.content) for t in DIALOGUE)


def test_a_sentence_without_a_fact_is_kept_for_what_it_tells() -> None:
    """No name, number or date, but an event: its new search terms keep it."""
    turns = [Turn("Melanie", "Yeah, I painted that lake sunrise last year!"), Turn("Caroline", "Wow, so cool!")]
    assert not extract(turns[0].content)
    assert summarize(turns) == "Melanie: Yeah, I painted that lake sunrise last year!"


def test_a_sentence_that_repeats_what_was_kept_is_dropped() -> None:
    turns = [Turn("a", "I painted that lake sunrise."), Turn("b", "You painted that lake sunrise?")]
    assert summarize(turns) == "a: I painted that lake sunrise."


def test_the_extractive_summary_keeps_speakers_and_order() -> None:
    lines = summarize(DIALOGUE).splitlines()
    assert [line.split(":", 1)[0] for line in lines] == ["user", "user", "assistant"]
    assert lines[0].startswith("user: Hey Mel!")


def test_a_fact_only_the_whole_turn_shows_is_kept_with_its_sentences() -> None:
    """The quoted string spans two sentences: no sentence alone holds it, so the turn's
    sentences are kept together."""
    turns = [Turn("user", 'She said "Stop. Now." and left.'), Turn("user", "ok")]
    assert not any(f.kind == "quoted" for s in sentences(turns[0].content) for f in extract(s))
    summary = summarize(turns)
    assert retention([t.content for t in turns], summary).missing == ()
    assert summary == 'user: She said "Stop. Now." and left.'


def test_turns_without_facts_summarise_to_nothing() -> None:
    assert summarize([Turn("user", "thanks!"), Turn("assistant", "you are welcome")]) == ""


@pytest.mark.parametrize("content", ["", "\x00\x00", "a" * 50_000, "\n\n\n", "😀" * 500, "1. 2. 3."])
def test_hostile_turns_summarise_without_losing_a_fact(content: str) -> None:
    turns = [Turn("user", content), Turn("", "Bob paid 5 dollars.")]
    summary = summarize(turns)
    assert retention([t.content for t in turns], summary).missing == ()


def test_sentences_split_on_end_marks_and_lines() -> None:
    assert sentences("One. Two!  Three?\nFour… five") == ["One.", "Two!", "Three?", "Four…", "five"]


async def test_the_extractive_backend_is_a_summarizer() -> None:
    backend = ExtractiveSummarizer()
    assert backend.name == "extractive"
    summary = await backend.summarize(DIALOGUE)
    assert summary.text == summarize(DIALOGUE)
    assert [line.turn for line in summary.lines] == [0, 2, 3]  # each line stands for the turn it keeps


def test_each_speaker_of_a_turn_without_a_role_stands_for_that_turn() -> None:
    turns = [Turn("", "Caroline: I moved to Boston.\nMelanie: I paid $40 for it."),
             Turn("user", "We met on 7 May 2023.")]
    assert summary_lines(turns) == [SummaryLine(0, "Caroline: I moved to Boston."),
                                    SummaryLine(0, "Melanie: I paid $40 for it."),
                                    SummaryLine(1, "user: We met on 7 May 2023.")]


@pytest.fixture
def chat() -> Iterator[FakeChatServer]:
    with FakeChatServer() as srv:
        yield srv


def _backend(chat: FakeChatServer, **kw: object) -> ChatCompletionsSummarizer:
    opts: dict = {"base_url": chat.base_url, "model": "gemini-2.5-flash-lite", "api_key": "sk-test",
                  "timeout_s": 5.0, "retry": RetryPolicy(3, 0.01, 0.05)}
    opts.update(kw)
    return ChatCompletionsSummarizer(**opts)


async def test_chat_completions_sends_the_transcript_and_returns_the_completion(chat: FakeChatServer) -> None:
    summary = await _backend(chat).summarize(DIALOGUE[:2])
    assert summary.text == FakeChatServer.answer and summary.lines[0].turn == 0
    [request] = chat.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == "Bearer sk-test"
    body = request["body"]
    assert body["model"] == "gemini-2.5-flash-lite" and body["temperature"] == 0
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][1]["content"] == ("[0] user: " + DIALOGUE[0].content
                                              + "\n[1] assistant: " + DIALOGUE[1].content)


async def test_chat_completions_lines_stand_for_the_turns_they_number(chat: FakeChatServer) -> None:
    chat.answer = ("[2] user: We paid $40 for 2 tickets.\n\n  and Caroline was there\n"
                   "[3]   assistant: order INV-2041\n[0] user: support group on 7 May 2023")
    summary = await _backend(chat).summarize(DIALOGUE)
    assert summary.lines == (SummaryLine(2, "user: We paid $40 for 2 tickets. and Caroline was there"),
                             SummaryLine(3, "assistant: order INV-2041"),
                             SummaryLine(0, "user: support group on 7 May 2023"))


async def test_chat_completions_unnumbered_answers_stand_for_the_first_turn(chat: FakeChatServer) -> None:
    chat.answer = "user: support group on 7 May 2023\nassistant: INV-2041"
    summary = await _backend(chat).summarize(DIALOGUE)
    assert summary.lines == (SummaryLine(0, "user: support group on 7 May 2023 assistant: INV-2041"),)


async def test_chat_completions_a_line_for_a_turn_that_does_not_exist_is_an_error(chat: FakeChatServer) -> None:
    chat.answer = "[5] user: support group"
    with pytest.raises(SummarizerError, match="turn 5; the conversation has 5 turns"):
        await _backend(chat).summarize(DIALOGUE)


async def test_chat_completions_retries_429_and_500_then_succeeds(chat: FakeChatServer) -> None:
    chat.script = [(429, {"error": {"message": "slow down"}}, {"Retry-After": "0"}),
                   (500, {"error": {"message": "boom"}}, {})]
    assert (await _backend(chat).summarize(DIALOGUE)).text == FakeChatServer.answer
    assert len(chat.requests) == 3


async def test_chat_completions_gives_up_with_a_clear_error(chat: FakeChatServer) -> None:
    chat.script = [(503, {"error": {"message": "overloaded"}}, {})] * 3
    with pytest.raises(SummarizerError, match=r"still failing after 3 attempts: HTTP 503: overloaded") as e:
        await _backend(chat).summarize(DIALOGUE)
    assert chat.base_url in str(e.value) and "gemini-2.5-flash-lite" in str(e.value)


async def test_chat_completions_400_is_not_retried(chat: FakeChatServer) -> None:
    chat.script = [(400, {"error": {"message": "bad model"}}, {})]
    with pytest.raises(SummarizerError, match=r"rejected the request: HTTP 400: bad model"):
        await _backend(chat).summarize(DIALOGUE)
    assert len(chat.requests) == 1


@pytest.mark.parametrize("payload", [{}, {"choices": []}, {"choices": [{"message": {"content": "  "}}]},
                                     {"choices": [{"message": {"content": 7}}]}])
async def test_chat_completions_malformed_or_empty_answers_are_errors(chat: FakeChatServer, payload: dict) -> None:
    chat.script = [(200, payload, {})]
    with pytest.raises(SummarizerError, match="malformed|empty"):
        await _backend(chat).summarize(DIALOGUE)


async def test_chat_completions_unreachable_server_is_an_error() -> None:
    with FakeChatServer() as srv:
        url = srv.base_url
    backend = ChatCompletionsSummarizer(base_url=url, model="m", timeout_s=1.0, retry=RetryPolicy(2, 0.01, 0.02))
    with pytest.raises(SummarizerError, match="still failing after 2 attempts"):
        await backend.summarize(DIALOGUE)


def test_chat_completions_needs_a_url() -> None:
    with pytest.raises(ValueError, match="base_url"):
        ChatCompletionsSummarizer(base_url="", model="m")


def test_the_settings_choose_the_summarizer() -> None:
    from context_engine.config import Settings
    from inference.summarizers.configured import summarizer_from_settings

    assert isinstance(summarizer_from_settings(Settings()), ExtractiveSummarizer)
    llm = summarizer_from_settings(Settings(compaction_summarizer="chat_completions",
                                            compaction_llm_url="http://127.0.0.1:9/v1/", compaction_llm_api_key="k",
                                            compaction_llm_max_attempts=2))
    assert isinstance(llm, ChatCompletionsSummarizer)
    assert (llm.base_url, llm.model, llm.retry.max_attempts) == ("http://127.0.0.1:9/v1", "gemini-2.5-flash-lite", 2)


def test_an_llm_summarizer_without_an_url_is_refused_at_start() -> None:
    from pydantic import ValidationError

    from context_engine.config import Settings

    with pytest.raises(ValidationError, match="COMPACTION_LLM_URL"):
        Settings(compaction_summarizer="chat_completions")


def test_a_turn_stored_with_its_speaker_keeps_the_speaker_on_its_line() -> None:
    turns = [Turn("", "Caroline: Hey! I went to the support group on 7 May 2023."),
             Turn("", "Melanie: Wow, great! Did you meet anyone from Boston there?"),
             Turn("", "ok: cool")]
    lines = summarize(turns).splitlines()
    assert lines[0] == "Caroline: I went to the support group on 7 May 2023."
    assert lines[1].startswith("Melanie: ") and "Boston" in lines[1] and "Wow" not in lines[1]
    assert retention([t.content for t in turns], "\n".join(lines)).score == 1.0


def test_a_summary_summarised_again_keeps_a_line_per_speaker_turn() -> None:
    first = summarize([Turn("user", "My order INV-2041 ships to Lisbon."), Turn("assistant", "Noted, on 7 May 2023."),
                       Turn("user", "And 3 lamps to Porto.")])
    again = summarize([Turn("", first), Turn("user", "Also a desk for Faro.")])
    assert first.splitlines() == ["user: My order INV-2041 ships to Lisbon.", "assistant: Noted, on 7 May 2023.",
                                  "user: And 3 lamps to Porto."]
    assert again.splitlines() == [*first.splitlines(), "user: Also a desk for Faro."]


@pytest.mark.parametrize("sentence", [
    "The parcel weighs 30.5 kg and costs $30.50.", "It costs €4.99 now.", "We owe 1,200.50 in all.",
    "Prices rose 12.5 % this year.", "The flight took 3.5 hours.", "We run v2.1 in production.",
    "Dr. Smith arrives at 9 a.m. on 7 May 2023.", "It raised $2.5 million or 30.0k euros."])
def test_numbers_of_every_form_survive_the_summary(sentence: str) -> None:
    """A sentence split at the dot of "30.5" came back as "30. 5": the gate refused the summary."""
    turns = [Turn("user", f"{sentence} Thanks a lot!"), Turn("assistant", "ok")]
    summary = summarize(turns)
    r = retention([t.content for t in turns], summary)
    assert sentence in summary
    assert r.score == 1.0 and r.passes


def test_sentences_do_not_split_decimals_versions_or_abbreviations() -> None:
    assert sentences("It costs $30.50. Dr. Smith runs v2.1 today! Bye") == [
        "It costs $30.50.", "Dr. Smith runs v2.1 today!", "Bye"]


def test_a_correction_is_kept_and_the_summary_passes_the_gate() -> None:
    """It repeats every fact of the statement it corrects: only its bindings are new."""
    turns = [Turn("user", "Send 40 boxes to Lyon and 12 to Porto."), Turn("assistant", "Sure."),
             Turn("user", "12 boxes to Lyon and 40 to Porto, sorry.")]
    summary = summarize(turns)
    assert summary.splitlines()[-1] == "user: 12 boxes to Lyon and 40 to Porto, sorry."
    assert retention([t.content for t in turns], summary).passes


def test_a_negation_is_kept_and_the_summary_passes_the_gate() -> None:
    turns = [Turn("user", "The delivery is on 2024-06-10."), Turn("assistant", "ok"),
             Turn("user", "Oh, the delivery is not on 2024-06-10.")]
    summary = summarize(turns)
    assert summary.splitlines()[-1] == "user: Oh, the delivery is not on 2024-06-10."
    assert retention([t.content for t in turns], summary).passes


def test_a_statement_made_again_after_its_correction_is_kept_last() -> None:
    """The third turn states nothing new, but without it the summary would end on 12."""
    turns = [Turn("user", "Send 40 boxes to Lyon."), Turn("user", "Make that 12 boxes to Lyon."),
             Turn("user", "Oh, 40 boxes to Lyon after all.")]
    summary = summarize(turns)
    assert summary.splitlines() == ["user: Send 40 boxes to Lyon.", "user: Make that 12 boxes to Lyon.",
                                    "user: Oh, 40 boxes to Lyon after all."]
    assert retention([t.content for t in turns], summary).passes


def test_sentences_that_ended_at_a_line_break_stay_apart_on_the_summary_line() -> None:
    """Joined as "Lyon gets 40 Porto gets 12", Lyon would be bound to 12 and Porto to 40."""
    turns = [Turn("user", "Lyon gets 40\nPorto gets 12"), Turn("assistant", "ok")]
    summary = summarize(turns)
    assert summary == "user: Lyon gets 40. Porto gets 12"
    assert retention([t.content for t in turns], summary).passes


@pytest.mark.parametrize("content", ["." * 50_000 + "x", "a. " * 10_000, "Lyon 1 " * 5000, "not " * 10_000 + "Lyon 5",
                                     "1. 2. 3.", "Send 40 boxes to Lyon.\n" * 2000])
def test_hostile_turns_summarise_to_a_summary_that_passes(content: str) -> None:
    turns = [Turn("user", content), Turn("", "Bob paid 5 dollars."), Turn("user", content[::-1])]
    assert retention([t.content for t in turns], summarize(turns)).passes
