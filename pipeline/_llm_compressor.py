"""The v2.0 compression helpers, as the design documents name them
("Compression Strategy Selection"): ``ContextCompressionStrategy`` (the v2.1
``CompressionMode`` under its v2.0 name), ``CompressionCostEstimate`` and
``LLMCompressor``, the async summariser with its extractive fallback.

The managers summarise through a ``Summarizer`` (``_summarizers``); ``LLMCompressor``
is the design's standalone form of the same job, for code that calls it directly.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Optional

from ._compression_types import CompressionMode
from ._summarizers import _reply_text

logger = logging.getLogger(__name__)

#: v2.0's name for the three modes; the very same enum as v2.1's CompressionMode.
ContextCompressionStrategy = CompressionMode

MAX_PROMPT_MESSAGES = 20  # the design sends the latest 20 messages
MAX_MESSAGE_CHARS = 200  # and at most 200 characters of each


class CompressionCostEstimate:
    """The design's rough cost of compressing, in USD per 1,000 input tokens."""

    TRUNCATE_COST = 0.0
    EXTRACT_COST = 0.001
    SUMMARIZE_COST = 0.003  # a small model

    @classmethod
    def estimate_cost(cls, strategy: CompressionMode, input_tokens: int) -> float:
        """USD to compress ``input_tokens`` with ``strategy``."""
        per_1k = {
            CompressionMode.TRUNCATE: cls.TRUNCATE_COST,
            CompressionMode.EXTRACT: cls.EXTRACT_COST,
            CompressionMode.SUMMARIZE: cls.SUMMARIZE_COST,
        }[CompressionMode(strategy)]
        return input_tokens / 1000 * per_1k


class LLMCompressor:
    """Summarises a message list with a small model; on any failure (or with no
    model) it falls back to the key facts (first request, final answer), as the
    design does. Never raises for the model's trouble.

    ``llm`` is a LangChain chat model (``invoke``) or a callable ``prompt -> str``.
    The design created an Anthropic client itself; the library never imports a
    provider SDK, so pass the model (e.g. LangChain's ``ChatAnthropic`` for
    ``claude-3-haiku``). ``model`` names it in logs.
    """

    def __init__(
        self,
        model: str = "claude-3-haiku",
        max_summary_tokens: int = 500,
        timeout_ms: int = 10000,
        *,
        llm: Any = None,
    ) -> None:
        if llm is not None and not (callable(llm) or callable(getattr(llm, "invoke", None))):
            raise TypeError("llm must be a callable prompt -> str or have an invoke() method")
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or timeout_ms <= 0:
            raise ValueError("timeout_ms must be a positive number")
        if isinstance(max_summary_tokens, bool) or not isinstance(max_summary_tokens, int) or max_summary_tokens <= 0:
            raise ValueError("max_summary_tokens must be a positive integer")
        self.model = model
        self.max_summary_tokens = max_summary_tokens
        self.timeout_ms = timeout_ms
        self.llm = llm

    async def summarize_messages(self, messages: list[dict[str, Any]], focus_areas: Optional[list[str]] = None) -> str:
        """The summary of ``messages`` (dicts with role and content)."""
        prompt = self._build_summary_prompt(messages, focus_areas)
        if self.llm is None:
            return self._extract_key_info(messages)
        try:
            text = await asyncio.wait_for(self._ask_in_thread(prompt), timeout=self.timeout_ms / 1000)
        except Exception as exc:  # the model is an edge: fall back, never raise
            logger.error("LLM summarization failed (%s): %s", self.model, type(exc).__name__)
            return self._extract_key_info(messages)
        return text

    def _ask_in_thread(self, prompt: str) -> "asyncio.Future[str]":
        """The model call on a daemon thread of its own (not the loop's executor), so
        a timed-out call never holds up the loop or ``asyncio.run``'s shutdown."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()

        def settle(text: Optional[str], error: Optional[BaseException]) -> None:
            if future.done():  # timed out meanwhile
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(text)  # type: ignore[arg-type]

        def work() -> None:
            try:
                text, error = self._ask(prompt), None
            except Exception as exc:  # reported through the future
                text, error = None, exc
            try:
                loop.call_soon_threadsafe(settle, text, error)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

        threading.Thread(target=work, name="pipeline-llm-compressor", daemon=True).start()
        return future

    def _ask(self, prompt: str) -> str:
        invoke = getattr(self.llm, "invoke", None)
        reply = invoke(prompt) if callable(invoke) else self.llm(prompt)
        text = _reply_text(reply).strip()
        if not text:
            raise ValueError("the model returned an empty summary")
        return text

    def _build_summary_prompt(self, messages: list[dict[str, Any]], focus_areas: Optional[list[str]] = None) -> str:
        parts = ["请将以下对话历史总结为简洁的摘要（最多 300 字）：\n\n"]
        if focus_areas:
            parts.append(f"重点关注：{', '.join(focus_areas)}\n")
        for msg in messages[-MAX_PROMPT_MESSAGES:]:
            role = msg.get("role", "")
            content = msg.get("content", "")
            if isinstance(content, list):
                content_str = self._format_content_blocks(content)
            else:
                content_str = str(content)[:MAX_MESSAGE_CHARS]
            parts.append(f"{role}: {content_str}\n")
        parts.append("\n摘要应包括：")
        parts.append("- 用户的主要请求")
        parts.append("- 执行的工具调用和结果")
        parts.append("- 重要的决策和发现")
        parts.append("- 最终结论")
        return "\n".join(parts)

    def _format_content_blocks(self, blocks: list[Any]) -> str:
        formatted = []
        for block in blocks:
            if not isinstance(block, dict):
                continue
            block_type = block.get("type", "")
            if block_type == "text":
                formatted.append(str(block.get("text", ""))[:MAX_MESSAGE_CHARS])
            elif block_type == "tool_use":
                formatted.append(f"[调用工具: {block.get('name', '')}]")
            elif block_type == "tool_result":
                formatted.append("[工具结果]")
            elif block_type == "thinking":
                formatted.append("[思考过程]")
        return " ".join(formatted)

    def _extract_key_info(self, messages: list[dict[str, Any]]) -> str:
        """The fallback: the first user request, how many tool calls, the final answer."""
        key_info = []
        for msg in messages:
            if msg.get("role") == "user":
                key_info.append(f"用户: {str(msg.get('content', ''))[:MAX_MESSAGE_CHARS]}...")
                break
        tool_calls = sum(1 for msg in messages if "tool_use" in str(msg.get("content", "")) or msg.get("tool_calls"))
        if tool_calls:
            key_info.append(f"[工具调用 x{tool_calls}]")
        for msg in reversed(messages):
            if msg.get("role") == "assistant":
                content = str(msg.get("content", ""))[:MAX_MESSAGE_CHARS]
                if "tool" not in content.lower():
                    key_info.append(f"助手: {content}...")
                break
        return "\n".join(key_info) if key_info else "[对话摘要不可用]"
