"""The design documents' stateful side of the context managers (v2.0 "增强的上下文压缩"):
``add_message`` one message at a time, compress when the stored context passes the
threshold, read it back with ``get_compressed_messages`` / ``total_tokens``.

It is built on the managers' own ``compress``: the stored list is compressed as a
whole and replaced by the result, so what the stateful form keeps, drops or
summarises is exactly what ``compress`` decides (the v2.1 priorities), and every
compression's ``CompressionResult`` stays readable (``last_compression``).

Also here: ``CompressedMessages``, the list ``compress`` returns (the design's
return shape) carrying the ``CompressionResult`` (the library's).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, Optional

from ._compression_types import CompressionResult


class CompressedMessages(list):
    """The compressed message list (what the design's ``compress`` returns), with the
    ``CompressionResult`` saying what happened to every original message on
    ``.result``. It is a plain ``list`` in every other way: store it, slice it, send
    it to the model."""

    __slots__ = ("result",)

    def __init__(self, messages: Any = (), result: Optional[CompressionResult] = None) -> None:
        super().__init__(messages)
        self.result = result

    def __reduce_ex__(self, protocol: Any) -> Any:  # pickles (checkpointers) as a plain list + result
        return (CompressedMessages, (list(self), self.result))


class MessageImportance(Enum):
    """The v2.0 importance scale given to ``add_message`` (1 = most important).

    Recorded on each ``MessageWrapper``; which message compression keeps is decided
    by the v2.1 ``MessagePriority`` of its content (the later document wins: v2.0 put
    system messages at LOW, v2.1 never drops them)."""

    CRITICAL = 1  # user messages, errors
    HIGH = 2  # tool observations
    MEDIUM = 3  # agent thoughts
    LOW = 4  # (v2.0: system messages)


@dataclass
class MessageWrapper:
    """A stored message with the design's metadata."""

    message: Any
    importance: MessageImportance
    timestamp: datetime
    tokens: int
    round_id: str
    is_compressed: bool = False
    compressed_content: Optional[str] = None


class StatefulContext:
    """Mixin for the context managers. The host provides ``max_tokens``,
    ``compression_threshold``, ``_count_one(message) -> int`` and
    ``_compress_stored(messages) -> CompressedMessages``, and calls
    ``_init_state()`` in its constructor."""

    max_tokens: int
    compression_threshold: float

    def _init_state(self) -> None:
        self._state_lock = threading.RLock()
        self._messages: list[MessageWrapper] = []
        self.last_compression: Optional[CompressionResult] = None

    # -- the design's calls

    def add_message(
        self, message: Any, importance: MessageImportance = MessageImportance.MEDIUM, round_id: str = ""
    ) -> None:
        """Store ``message`` (a dict or a LangChain message); compress the stored
        context when it passes ``max_tokens * compression_threshold`` (thread-safe).

        Raises ValueError for a malformed message, before anything is stored."""
        if not isinstance(importance, MessageImportance):
            importance = MessageImportance(importance)
        if not isinstance(round_id, str):
            raise TypeError("round_id must be a string")
        with self._state_lock:
            wrapper = MessageWrapper(
                message=message,
                importance=importance,
                timestamp=datetime.now(),
                tokens=self._count_one(message),
                round_id=round_id,
            )
            self._messages.append(wrapper)
            if self._over_threshold():
                self._compress_context()

    def get_messages(self) -> list[Any]:
        """The stored messages as they stand (a summary is its own message)."""
        with self._state_lock:
            return [w.message for w in self._messages]

    def get_compressed_messages(self) -> list[Any]:
        """The stored messages, a summary shown as the design shows one:
        ``{"role": "system", "content": ..., "compressed": True, "original_round_id": ...}``
        (dict conversations; a LangChain conversation gets its SystemMessage)."""
        with self._state_lock:
            out: list[Any] = []
            for wrapper in self._messages:
                if wrapper.is_compressed and wrapper.compressed_content and isinstance(wrapper.message, dict):
                    out.append(
                        {
                            "role": "system",
                            "content": wrapper.compressed_content,
                            "compressed": True,
                            "original_round_id": wrapper.round_id,
                        }
                    )
                else:
                    out.append(wrapper.message)
            return out

    @property
    def total_tokens(self) -> int:
        """Tokens of the stored context now."""
        with self._state_lock:
            return sum(w.tokens for w in self._messages)

    def get_token_usage(self) -> dict[str, Any]:
        """``total_tokens`` against the window and the threshold."""
        with self._state_lock:
            total = sum(w.tokens for w in self._messages)
            return {
                "total_tokens": total,
                "max_tokens": self.max_tokens,
                "threshold_tokens": int(self.max_tokens * self.compression_threshold),
                "usage_ratio": total / self.max_tokens if self.max_tokens else 0.0,
                "messages": len(self._messages),
            }

    def clear(self) -> None:
        """Forget the stored messages (a new conversation)."""
        with self._state_lock:
            self._messages.clear()
            self.last_compression = None

    # -- internals

    def _over_threshold(self) -> bool:
        return sum(w.tokens for w in self._messages) > self.max_tokens * self.compression_threshold

    def _compress_context(self) -> None:  # state lock held
        old = self._messages
        output = self._compress_stored([w.message for w in old])
        result = output.result
        assert result is not None
        new: list[Optional[MessageWrapper]] = [None] * len(output)
        for change in result.changes:
            if change.new_index is None:
                continue
            wrapper = old[change.index]
            message = output[change.new_index]
            if message is not wrapper.message:  # shortened
                wrapper = MessageWrapper(message, wrapper.importance, wrapper.timestamp, change.tokens_after, wrapper.round_id)
            else:
                wrapper.tokens = change.tokens_after
            new[change.new_index] = wrapper
        for summary in result.summaries:
            if summary.new_index is None:
                continue
            first = old[summary.replaced_indices[0]]
            new[summary.new_index] = MessageWrapper(
                message=output[summary.new_index],
                importance=MessageImportance.HIGH,
                timestamp=datetime.now(),
                tokens=summary.tokens,
                round_id=first.round_id,
                is_compressed=True,
                compressed_content=summary.text,
            )
        self._messages = [w for w in new if w is not None]
        self.last_compression = result
