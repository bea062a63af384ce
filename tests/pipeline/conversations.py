"""Shared by the compression and message-reading tests: the real token counter, a
manager built on it, and sample conversations (not a test module)."""

from __future__ import annotations

from typing import Any

from pipeline import AdvancedContextManager, ContextCompressionConfig
from pipeline._tokens import DynamicTokenCounter

MODEL = "claude-3-sonnet"
COUNTER = DynamicTokenCounter()


def tokens(messages: list[Any]) -> int:
    return sum(COUNTER.count_message_tokens(m, MODEL) for m in messages)


def manager(**config: Any) -> AdvancedContextManager:
    extra = {k: config.pop(k) for k in ("summarizer", "clock", "summary_cache") if k in config}
    return AdvancedContextManager(ContextCompressionConfig(**config), token_counter=COUNTER, model=MODEL, **extra)


def call(call_id: str, name: str = "sql_query") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": '{"q": "select 1"}'}}


def conversation(rounds: int = 12, words: int = 40, start: int = 0) -> list[dict]:
    """system, then per round: user, AI tool call, tool result, AI answer."""
    messages: list[dict] = [{"role": "system", "content": "You are a business-analysis agent."}]
    for r in range(start, start + rounds):
        messages.append({"role": "user", "content": f"Question {r}: " + "sales by region please " * (words // 4)})
        messages.append({"role": "assistant", "content": None, "tool_calls": [call(f"c{r}")]})
        messages.append({"role": "tool", "tool_call_id": f"c{r}", "name": "sql_query", "content": f"| region {r} | 100 |\n" * words})
        messages.append({"role": "assistant", "content": f"Answer {r}. " + "Revenue grew steadily. " * (words // 4)})
    return messages
