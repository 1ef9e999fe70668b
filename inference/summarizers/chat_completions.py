"""The LLM summarizer: ``POST {base_url}/chat/completions`` of any OpenAI-compatible API.

Configured by URL, model and key (settings COMPACTION_LLM_URL / _MODEL / _API_KEY); a request has
a total timeout and is retried on 429, 5xx, timeouts and connection errors
(inference/openai_http.py); any other answer, an empty completion or a malformed body is a
SummarizerError naming the URL and the model. Temperature 0: the same turns should give the
same summary where the server allows it (the score, not the text, decides).

The transcript numbers its turns (`[3] user: ...`) and the model is asked to start each line
with the number of the turn it keeps, so each line of the summary stands for a turn (its time
and place in a prompt). A line without a number continues the line before it, from the first
turn when it opens the answer; a number that names no turn is a SummarizerError.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import orjson

from inference.openai_http import Retryable, RetryPolicy, json_session, post_json
from inference.summarizers import SummarizerError, Summary, SummaryLine, Turn, one_line

INSTRUCTIONS = (
    "You compact the older part of a conversation into a shorter record that replaces it. "
    "Keep every fact: every name of a person, place or organisation, every number, quantity, price, "
    "date and time, every id, URL and quoted string, written as in the conversation. "
    "Drop greetings, thanks, small talk and repetition. When a later turn corrects or negates an "
    "earlier one, keep what was said last. Keep who said what: one line per turn you keep, in the "
    "original order, written as '[n] role: text' where [n] is the turn's number in the conversation. "
    "Answer with the record only."
)
_NUMBERED = re.compile(r"\s*\[(\d{1,9})\]\s*(.*)")


class ChatCompletionsSummarizer:
    name = "chat_completions"

    def __init__(self, *, base_url: str, model: str, api_key: str | None = None, timeout_s: float = 30.0,
                 retry: RetryPolicy | None = None, max_output_tokens: int = 2048) -> None:
        if not base_url:
            raise ValueError("base_url is required")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._api_key = api_key
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self.max_output_tokens = max_output_tokens

    def __repr__(self) -> str:
        return f"ChatCompletionsSummarizer(base_url={self.base_url!r}, model={self.model!r})"

    async def summarize(self, turns: Sequence[Turn]) -> Summary:
        url = f"{self.base_url}/chat/completions"
        transcript = "\n".join(f"[{i}] {t.role or 'note'}: {t.content}" for i, t in enumerate(turns))
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": transcript}],
            "temperature": 0,
            "max_tokens": self.max_output_tokens,
        }

        def exhausted(exc: Retryable) -> Exception:
            return SummarizerError(f"summarizer {url} (model {self.model!r}) still failing after "
                                   f"{self.retry.max_attempts} attempts: {exc}")

        def rejected(status: int, detail: str) -> Exception:
            return SummarizerError(f"summarizer {url} (model {self.model!r}) rejected the request: "
                                   f"HTTP {status}: {detail}")

        async with json_session(self._api_key, self.timeout_s) as session:
            body = await post_json(session, url, payload, self.retry, exhausted=exhausted, rejected=rejected)
        return self._lines(self._completion(body, url), len(turns), url)

    def _lines(self, completion: str, turns: int, url: str) -> Summary:
        lines: list[SummaryLine] = []
        for raw in completion.splitlines():
            if not raw.strip():
                continue
            if m := _NUMBERED.fullmatch(raw):
                turn = int(m.group(1))
                if turn >= turns:
                    raise SummarizerError(f"summarizer {url} (model {self.model!r}) wrote a line for turn {turn}; "
                                          f"the conversation has {turns} turns")
                if text := one_line(m.group(2)):
                    lines.append(SummaryLine(turn, text))
            elif lines:
                lines[-1] = SummaryLine(lines[-1].turn, f"{lines[-1].text} {one_line(raw)}")
            else:
                lines.append(SummaryLine(0, one_line(raw)))
        return Summary(tuple(lines))

    def _completion(self, body: bytes, url: str) -> str:
        try:
            doc = orjson.loads(body)
            content = doc["choices"][0]["message"]["content"]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            raise SummarizerError(f"summarizer {url} (model {self.model!r}) sent a malformed completion: "
                                  f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(content, str) or not content.strip():
            raise SummarizerError(f"summarizer {url} (model {self.model!r}) sent an empty completion")
        return content.strip()
