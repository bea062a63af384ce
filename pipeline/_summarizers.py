"""Summarisers for SUMMARIZE compression: they turn the text of the oldest messages
into one short summary.

A summariser sees plain text, one string per message, already rendered by the
context manager as ``"<label>: <content>"`` (``user: ...``, ``assistant: ...``,
``tool result sql_query: ...``, ``tool error sql_query: ...``), with every tool call
on its own line starting ``[tool call]``. It never sees message objects, so any
summariser works for dict and LangChain conversations alike.

Two are provided:

- ``ExtractiveSummarizer``: no LLM, free, deterministic. Keeps the first sentence of
  each message plus its tool-call and error lines. The default when LLM summaries
  are off (see ``ContextCompressionConfig.enable_llm_summarization``).
- ``LLMSummarizer``: asks a model (a plain ``prompt -> str`` callable, or any object
  with ``invoke`` such as a LangChain chat model) and estimates the cost.

A summariser may be slow or fail: the context manager runs it in a background thread
with a time bound and falls back to EXTRACT on a timeout, an exception or an empty
answer, so summarisers simply raise on trouble.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Optional, Protocol, runtime_checkable

__all__ = ["ExtractiveSummarizer", "LLMSummarizer", "Summarizer"]

TextCounter = Callable[[str], int]


@runtime_checkable
class Summarizer(Protocol):
    """What the context manager needs from a summariser."""

    name: str  # shown on the compression diff ("extractive", "llm:claude-3-haiku")

    def summarize(self, messages_text: list[str], max_tokens: int) -> str:
        """One summary of all the messages, at most about ``max_tokens`` tokens."""
        ...

    def estimate_cost_usd(self, input_tokens: int, output_tokens: int) -> float:
        """What one call would cost; 0.0 for summarisers that call no paid model."""
        ...


def estimate_tokens(text: str) -> int:
    """A deliberately generous estimate (UTF-8 bytes / 3) used when no real counter
    is given: about 1 token per CJK character and 1 per 3 ASCII characters, so a
    text cut to it rarely exceeds its budget under a real tokenizer."""
    return math.ceil(len(text.encode("utf-8")) / 3)


def cut_to_tokens(text: str, max_tokens: int, count: TextCounter, marker: str = " …") -> str:
    """The longest head of ``text`` (plus ``marker`` when cut) that ``count`` says fits
    in ``max_tokens``. Binary search on characters: log2(len) counts, not len."""
    if count(text) <= max_tokens:
        return text
    low, high = 0, len(text)
    while low < high:  # largest n with count(text[:n] + marker) <= max_tokens
        mid = (low + high + 1) // 2
        if count(text[:mid] + marker) <= max_tokens:
            low = mid
        else:
            high = mid - 1
    if low == 0:
        return "" if count(marker) > max_tokens else marker.strip()
    return text[:low] + marker


# Errors in English and Chinese, the two languages the agent works in.
_ERROR_LINE = re.compile(
    r"(?i)\b(error|errors|failed|failure|exception|traceback|timed out|timeout)\b"
    r"|operation failed|错误|失败|异常|超时"
)
# A sentence ends at . ! ? followed by a space or the end, or at a CJK full stop.
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)|[。！？]")


def first_sentence(line: str, max_chars: int) -> str:
    """The first sentence of ``line``, cut to ``max_chars`` characters."""
    match = _SENTENCE_END.search(line)
    sentence = line[: match.end()] if match else line
    sentence = sentence.strip()
    if len(sentence) > max_chars:
        sentence = sentence[: max_chars - 1].rstrip() + "…"
    return sentence


class ExtractiveSummarizer:
    """Summary without an LLM: one bullet per message (its first sentence, which
    carries the ``user:`` / ``tool error sql_query:`` label) followed by the lines
    that name tool calls or report errors. Deterministic: the same texts give the
    same summary, so the summary cache and the tests can rely on it.

    When the bullets exceed ``max_tokens`` it first drops the detail lines, then
    keeps bullets from both ends of the span (the first request and the latest
    findings matter most) and says how many were left out.
    """

    name = "extractive"

    def __init__(
        self,
        count_tokens: Optional[TextCounter] = None,
        *,
        max_head_chars: int = 200,
        max_detail_chars: int = 160,
        max_details_per_message: int = 3,
    ) -> None:
        self._count = count_tokens or estimate_tokens
        self.max_head_chars = max_head_chars
        self.max_detail_chars = max_detail_chars
        self.max_details_per_message = max_details_per_message

    def estimate_cost_usd(self, input_tokens: int, output_tokens: int) -> float:
        return 0.0

    def summarize(self, messages_text: list[str], max_tokens: int) -> str:
        if max_tokens <= 0:
            raise ValueError("max_tokens must be positive")
        header = f"Summary of {len(messages_text)} earlier messages:"
        bullets = [self._bullet(text) for text in messages_text if text.strip()]
        full = "\n".join([header, *(b for bullet in bullets for b in bullet)])
        if self._count(full) <= max_tokens:
            return full
        heads = [bullet[0] for bullet in bullets]
        brief = "\n".join([header, *heads])
        if self._count(brief) <= max_tokens:
            return brief
        return self._fit_heads(header, heads, max_tokens)

    def _bullet(self, text: str) -> list[str]:
        """The lines kept for one message: its head, then tool-call and error lines."""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        head = "- " + first_sentence(lines[0], self.max_head_chars)
        details = []
        for line in lines[1:]:
            if len(details) == self.max_details_per_message:
                break
            if line.startswith("[tool call]") or _ERROR_LINE.search(line):
                details.append("  " + first_sentence(line, self.max_detail_chars))
        return [head, *details]

    def _fit_heads(self, header: str, heads: list[str], max_tokens: int) -> str:
        # Counted one by one (roughly additive), then checked and cut as a whole.
        budget = max_tokens - self._count(header) - 8  # room for the "omitted" line
        costs = [self._count(head) + 1 for head in heads]
        front: list[int] = []
        back: list[int] = []
        low, high = 0, len(heads) - 1
        take_front = True
        while low <= high:
            index = low if take_front else high
            if costs[index] > budget:
                break
            budget -= costs[index]
            if take_front:
                front.append(index)
                low += 1
            else:
                back.append(index)
                high -= 1
            take_front = not take_front
        chosen = front + list(reversed(back))
        omitted = len(heads) - len(chosen)
        lines = [header, *(heads[i] for i in front)]
        if omitted:
            lines.append(f"- … {omitted} messages omitted …")
        lines.extend(heads[i] for i in reversed(back))
        return cut_to_tokens("\n".join(lines), max_tokens, self._count)


_PROMPT = """Summarise the earlier part of an agent conversation so the agent can go on \
without it. Write at most {max_tokens} tokens, in the language the conversation uses.
Keep: what the user asked for, which tools were called with what result, every error \
and how it was handled, decisions taken, numbers and names that later steps need, and \
the conclusions reached. Leave out pleasantries and repeated output.

Conversation ({count} messages):
{body}

Summary:"""


class LLMSummarizer:
    """Summary written by a model.

    ``llm`` is either a callable ``prompt -> str`` or an object with ``invoke``
    (a LangChain chat model: its reply's ``content`` is used, text blocks joined).
    Costs are USD per 1,000 tokens; the defaults are Claude 3 Haiku's list prices,
    the small fast model the seeds pick for summaries.
    """

    def __init__(
        self,
        llm: Any,
        cost_per_1k_input: float = 0.00025,
        cost_per_1k_output: float = 0.00125,
        *,
        name: Optional[str] = None,
        max_chars_per_message: int = 1_500,
        max_prompt_chars: int = 60_000,
    ) -> None:
        if not (callable(llm) or callable(getattr(llm, "invoke", None))):
            raise TypeError("llm must be a callable prompt -> str or have an invoke() method")
        for field, value in (("cost_per_1k_input", cost_per_1k_input), ("cost_per_1k_output", cost_per_1k_output)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{field} must be a finite number >= 0")
        self._llm = llm
        self.cost_per_1k_input = float(cost_per_1k_input)
        self.cost_per_1k_output = float(cost_per_1k_output)
        self.max_chars_per_message = max_chars_per_message
        self.max_prompt_chars = max_prompt_chars
        model_name = getattr(llm, "model_name", None) or getattr(llm, "model", None)
        self.name = name or (f"llm:{model_name}" if isinstance(model_name, str) else "llm")

    def estimate_cost_usd(self, input_tokens: int, output_tokens: int) -> float:
        return (max(input_tokens, 0) * self.cost_per_1k_input + max(output_tokens, 0) * self.cost_per_1k_output) / 1000

    def build_prompt(self, messages_text: list[str], max_tokens: int) -> str:
        """The prompt; every message cut to a bound, and the middle of a very long
        span left out (the start and the latest messages are kept)."""
        parts = [self._clip(text) for text in messages_text]
        budget = self.max_prompt_chars
        if sum(len(p) + 1 for p in parts) > budget:
            front, back, used = [], [], 0
            low, high, take_front = 0, len(parts) - 1, True
            while low <= high and used + len(parts[low if take_front else high]) + 1 <= budget:
                if take_front:
                    front.append(parts[low])
                    used += len(parts[low]) + 1
                    low += 1
                else:
                    back.append(parts[high])
                    used += len(parts[high]) + 1
                    high -= 1
                take_front = not take_front
            omitted = len(parts) - len(front) - len(back)
            parts = [*front, f"[… {omitted} messages omitted …]", *reversed(back)]
        return _PROMPT.format(max_tokens=max_tokens, count=len(messages_text), body="\n".join(parts))

    def summarize(self, messages_text: list[str], max_tokens: int) -> str:
        if max_tokens <= 0:
            raise ValueError("max_tokens must be positive")
        prompt = self.build_prompt(messages_text, max_tokens)
        invoke = getattr(self._llm, "invoke", None)
        reply = invoke(prompt) if callable(invoke) else self._llm(prompt)
        text = _reply_text(reply).strip()
        if not text:
            raise ValueError("the model returned an empty summary")
        return text

    def _clip(self, text: str) -> str:
        if len(text) <= self.max_chars_per_message:
            return text
        return text[: self.max_chars_per_message] + " …"


def _reply_text(reply: Any) -> str:
    """The text of a model reply: a string, or a message whose content is a string
    or a list of blocks (text blocks joined)."""
    if isinstance(reply, str):
        return reply
    content = getattr(reply, "content", None)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            block if isinstance(block, str) else block.get("text", "")
            for block in content
            if isinstance(block, str) or (isinstance(block, dict) and block.get("type") == "text")
        ]
        return "".join(t for t in texts if isinstance(t, str))
    raise TypeError(f"the model returned {type(reply).__name__}, not text")
