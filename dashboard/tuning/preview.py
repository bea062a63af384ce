"""Preview a compression config on a stored conversation before saving it.

Runs the pipeline's own AdvancedContextManager.compress, the code agents run, on
the conversation's stored messages, so the diff the admin shows is the one the
agents would produce with that config.
"""

from __future__ import annotations

from typing import Any, Optional

from dashboard.observatory.models import Conversation, Message, Round, ToolExecution
from pipeline import AdvancedContextManager, CompressionResult, ContextCompressionConfig

PREVIEW_MESSAGE_LIMIT = 2_000  # a preview on the first messages of a very long conversation
DEFAULT_MODEL = "claude-3-sonnet"


def conversation_messages(conversation: Conversation, *, limit: int = PREVIEW_MESSAGE_LIMIT) -> list[dict[str, Any]]:
    """The conversation as the message dicts compression reads.

    From the stored message records when the agent sent them; otherwise rebuilt
    from its rounds (user message, thoughts, tool calls and results, final answer).
    """
    rows = list(
        Message.objects.filter(conversation=conversation)
        .order_by("index", "id")
        .values("role", "content", "name", "tool_calls", "tool_call_id")[:limit]
    )
    if rows:
        return [_message(row) for row in rows]
    return _from_rounds(conversation, limit)


def _message(row: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": row["role"], "content": row["content"] or ""}
    if row.get("name"):
        message["name"] = row["name"]
    if row.get("tool_calls"):
        message["tool_calls"] = row["tool_calls"]
    if row.get("tool_call_id"):
        message["tool_call_id"] = row["tool_call_id"]
    return message


def _from_rounds(conversation: Conversation, limit: int) -> list[dict[str, Any]]:
    tools_by_round: dict[str, list[dict[str, Any]]] = {}
    for execution in (
        ToolExecution.objects.filter(conversation=conversation)
        .order_by("occurred_at", "id")
        .values("round_id", "tool_call_id", "tool_name", "parameters", "observation", "success")[:limit]
    ):
        tools_by_round.setdefault(execution["round_id"], []).append(execution)
    messages: list[dict[str, Any]] = []
    for round_ in Round.objects.filter(conversation=conversation).order_by("index", "id").values(
        "round_id", "user_message", "thoughts", "final_answer"
    )[:limit]:
        if round_["user_message"]:
            messages.append({"role": "user", "content": round_["user_message"]})
        thoughts = [t for t in round_["thoughts"] or [] if isinstance(t, str)]
        calls = tools_by_round.get(round_["round_id"], [])
        if calls:
            messages.append({
                "role": "assistant",
                "content": "\n".join(thoughts),
                "tool_calls": [
                    {"id": c["tool_call_id"], "name": c["tool_name"], "args": c["parameters"]} for c in calls
                ],
            })
            for c in calls:
                message = {"role": "tool", "content": c["observation"], "tool_call_id": c["tool_call_id"]}
                if not c["success"]:
                    message["status"] = "error"
                messages.append(message)
        elif thoughts:
            messages.append({"role": "assistant", "content": "\n".join(thoughts)})
        if round_["final_answer"]:
            messages.append({"role": "assistant", "content": round_["final_answer"]})
        if len(messages) >= limit:
            break
    return messages[:limit]


def compression_preview(
    config: ContextCompressionConfig,
    conversation: Conversation,
    *,
    target_tokens: Optional[int] = None,
) -> tuple[CompressionResult, int]:
    """What compressing the conversation with ``config`` does now: the result and
    how many messages it was run on. Raises ValueError (ConfigError included) for a
    bad config or target."""
    messages = conversation_messages(conversation)
    manager = AdvancedContextManager(config, model=conversation.model or DEFAULT_MODEL)
    _, result = manager.compress_with_result(messages, target_tokens=target_tokens)
    return result, len(messages)
