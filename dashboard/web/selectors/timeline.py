"""The conversation page's own reads: the token budget chart's series and the
JSON export. The timeline itself (rounds with their tool calls, skill activations
and compressions) is the domain's ``observatory.selectors.conversation_timeline``.
"""

from __future__ import annotations

from typing import Any, Iterator

from django.shortcuts import get_object_or_404

from dashboard.accounts.models import Project
from dashboard.observatory.models import (
    CompressionEvent,
    Conversation,
    Message,
    Round,
    SkillActivation,
    ToolExecution,
)


def round_number(index: Any) -> Any:
    """A round's number as people count: the stored index counts from 0, the pages
    (headings, anchors, the token budget's axis, compare) from 1."""
    try:
        return int(index) + 1
    except (TypeError, ValueError):
        return index


def conversation_for(project: Project, conversation_pk: int) -> Conversation:
    """The pages address a conversation by its row id (the API by the agent's id)."""
    return get_object_or_404(Conversation, project=project, pk=conversation_pk)


def token_budget(conversation: Conversation) -> dict[str, list[Any]]:
    """The chart's series, one point per round: context tokens (the derived value, or
    the reported one before the totals task ran), the model's window, the threshold
    (window x configured ratio) and the context size where compression fired. A
    round of no known context (a failed model call reports no usage) is a null point,
    a gap in the line: never a drop to 0."""
    rows = list(
        Round.objects.filter(conversation=conversation)
        .order_by("index", "id")
        .values_list("round_id", "index", "context_tokens", "derived_context_tokens",
                     "context_window", "compression_threshold")
    )
    fired = dict(
        CompressionEvent.objects.filter(conversation=conversation)
        .order_by("occurred_at")
        .values_list("round_id", "tokens_before")
    )
    labels, context, window, threshold, compressions = [], [], [], [], []
    for round_id, index, reported, derived, model_window, ratio in rows:
        tokens = derived or reported
        labels.append(round_number(index))
        context.append(tokens or None)
        window.append(model_window)
        threshold.append(int(model_window * ratio) if model_window and ratio else None)
        compressions.append(fired[round_id] if round_id in fired else None)
    return {
        "labels": labels,
        "context": context,
        "window": window,
        "threshold": threshold,
        "compressions": compressions,
    }


EXPORT_SECTIONS: dict[str, tuple[type, tuple[str, ...]]] = {
    "rounds": (Round, (
        "record_id", "source", "round_id", "index", "occurred_at", "trace_id", "span_id", "model", "user_id",
        "user_message", "thoughts", "final_answer", "status", "context_tokens", "context_window",
        "compression_threshold", "input_tokens", "output_tokens", "started_at", "ended_at",
    )),
    "messages": (Message, (
        "record_id", "source", "round_id", "index", "occurred_at", "role", "content", "name", "tool_calls",
        "tool_call_id", "is_meta", "tokens",
    )),
    "tool_executions": (ToolExecution, (
        "record_id", "source", "round_id", "occurred_at", "trace_id", "span_id", "tool_name", "tool_version",
        "parameters", "model", "tool_call_id", "observation", "output_level", "artifact_id",
        "data_size_bytes", "data_hash", "data_summary", "retry_count", "last_error", "success",
        "error_code", "error_type", "error_message", "duration_ms", "observation_tokens",
        "cache_hit", "brief_observation", "brief_tokens", "standard_observation",
        "standard_tokens", "full_observation", "full_tokens",
    )),
    "compressions": (CompressionEvent, (
        "record_id", "round_id", "occurred_at", "trace_id", "span_id", "result",
    )),
    "skill_activations": (SkillActivation, (
        "record_id", "round_id", "occurred_at", "trace_id", "span_id", "skill_name",
        "activation_id", "load_level", "depth", "chain", "tokens_loaded", "resources", "success",
        "error", "duration_ms",
    )),
}


def export_rows(conversation: Conversation, section: str) -> Iterator[dict[str, Any]]:
    model, fields = EXPORT_SECTIONS[section]
    order = ("index", "id") if section in ("rounds", "messages") else ("occurred_at", "id")
    qs = model.objects.filter(conversation=conversation).order_by(*order).values(*fields)
    yield from qs.iterator(chunk_size=500)
