"""The design documents' conversation model ("Multi-Round Conversation Flow"):
``ConversationRound`` (one ReAct loop: request, thoughts, tool calls and their
observations, answer) and ``MultiRoundConversation`` (the rounds, when to compress,
the compressed history).

Built on the library's token counter (a round's ``tokens_used`` is counted when not
given) and its compression (``compress_history`` runs the history through an
``AdvancedContextManager``). ``get_compressed_history`` is the design's own
round-level strategy: the last five rounds complete, older ones as one-line summaries.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal, Mapping, Optional

from pydantic import BaseModel, Field, field_validator

from ._compression_types import CompressionMode
from ._context_state import CompressedMessages
from ._models import ToolInvocationRequest
from ._skill_activation import ContextModifier, SkillActivationResult
from ._tokens import DEFAULT_MODEL, get_token_counter

#: Rounds ``get_compressed_history`` keeps complete (the design's "last 5").
KEEP_RECENT_ROUNDS = 5
SUMMARY_CHARS = 100


def _new_id() -> str:
    return str(uuid.uuid4())


def _cut(text: str, limit: int = SUMMARY_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class ConversationRound(BaseModel):
    """One round of a conversation (a ReAct loop), v2.1 fields first, then v2.0's.

    ``tool_calls`` are ``ToolInvocationRequest``s (v2.1); a LangChain tool call dict
    (``{"id", "name", "args"}``) is read as one too.
    """

    round_id: str = Field(default_factory=_new_id, min_length=1, max_length=200)
    user_message: str
    thoughts: list[str] = Field(default_factory=list)
    tool_calls: list[ToolInvocationRequest] = Field(default_factory=list)
    tool_observations: list[str] = Field(default_factory=list)
    final_answer: Optional[str] = None
    tokens_used: int = Field(default=0, ge=0)
    # v2.0
    conversation_id: Optional[str] = None
    skill_activations: list[SkillActivationResult] = Field(default_factory=list)
    latency_ms: float = Field(default=0.0, ge=0)
    status: Literal["pending", "in_progress", "completed", "error"] = "pending"

    @field_validator("tool_calls", mode="before")
    @classmethod
    def _langchain_tool_calls(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        return [
            ToolInvocationRequest.from_tool_call(item)
            if isinstance(item, Mapping) and "id" in item and "name" in item and "tool_call_id" not in item
            else item
            for item in value
        ]


class MultiRoundConversation(BaseModel):
    """The rounds of one conversation and its context budget (v2.0)."""

    conversation_id: str = Field(default_factory=_new_id, min_length=1, max_length=200)
    user_id: str
    rounds: list[ConversationRound] = Field(default_factory=list)
    active_skill_context: dict[str, Any] = Field(default_factory=dict)
    context_modifiers: list[ContextModifier] = Field(default_factory=list)
    context_window_limit: int = Field(default=200_000, gt=0)  # tokens
    compression_threshold: float = Field(default=0.8, gt=0, le=1)

    # -- the design's calls

    def should_compress_context(self) -> bool:
        """True once the rounds' tokens pass ``context_window_limit * compression_threshold``."""
        return self.total_tokens() > self.context_window_limit * self.compression_threshold

    def get_compressed_history(self) -> list[dict[str, Any]]:
        """The history as messages: all of it while under the threshold; past it,
        the last five rounds complete and each older round as a system message
        summarising it (request, tools used, answer)."""
        if not self.should_compress_context():
            return self._get_full_history()
        compressed: list[dict[str, Any]] = []
        for i, round_data in enumerate(self.rounds):
            if i < len(self.rounds) - KEEP_RECENT_ROUNDS:
                compressed.append({"role": "system", "content": self._create_round_summary(round_data)})
            else:
                compressed.extend(self._round_to_messages(round_data))
        return compressed

    # -- the library's additions

    def add_round(self, round_data: ConversationRound, model: str = DEFAULT_MODEL, token_counter: Any = None) -> ConversationRound:
        """Append a round; if its ``tokens_used`` is 0, count its messages (the
        library's token counter, margin included) and set it."""
        if not isinstance(round_data, ConversationRound):
            raise TypeError("round_data must be a ConversationRound")
        if round_data.conversation_id is None:
            round_data.conversation_id = self.conversation_id
        if round_data.tokens_used == 0:
            counter = token_counter if token_counter is not None else get_token_counter()
            round_data.tokens_used = counter.count_conversation_tokens(self._round_to_messages(round_data), model)
        self.rounds.append(round_data)
        return round_data

    def total_tokens(self) -> int:
        return sum(r.tokens_used for r in self.rounds)

    def compress_history(
        self,
        context_manager: Any = None,
        target_tokens: Optional[int] = None,
        mode: Optional[CompressionMode] = None,
    ) -> CompressedMessages:
        """The full history compressed by the library's compression (message level,
        by priority, with a ``.result`` diff), to ``target_tokens`` (default half the
        window)."""
        if context_manager is None:
            from ._compression import AdvancedContextManager

            context_manager = AdvancedContextManager(max_tokens=self.context_window_limit)
        target = target_tokens if target_tokens is not None else max(1, self.context_window_limit // 2)
        return context_manager.compress(self._get_full_history(), target_tokens=target, mode=mode)

    # -- the design's helpers

    def _get_full_history(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        for round_data in self.rounds:
            messages.extend(self._round_to_messages(round_data))
        return messages

    def _create_round_summary(self, round_data: ConversationRound) -> str:
        parts = [
            f"Round {round_data.round_id}:",
            f"  Request: {_cut(round_data.user_message)}",
            f"  Tools: {[tc.tool_name for tc in round_data.tool_calls]}",
        ]
        if round_data.final_answer:
            parts.append(f"  Answer: {_cut(round_data.final_answer)}")
        return "\n".join(parts)

    def _round_to_messages(self, round_data: ConversationRound) -> list[dict[str, Any]]:
        """A round as Claude-format messages: the request, each tool_use with its
        tool_result, the answer."""
        messages: list[dict[str, Any]] = [{"role": "user", "content": round_data.user_message}]
        for tool_call, observation in zip(round_data.tool_calls, round_data.tool_observations):
            messages.append(
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": tool_call.tool_call_id,
                            "name": tool_call.tool_name,
                            "input": tool_call.parameters,
                        }
                    ],
                }
            )
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": tool_call.tool_call_id,
                            "content": observation,
                            "is_error": False,
                        }
                    ],
                }
            )
        if round_data.final_answer:
            messages.append({"role": "assistant", "content": round_data.final_answer})
        return messages
