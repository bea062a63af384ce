"""One conversation as a timeline: its rounds in order, each with what happened in
it (tool calls, skill activations, compression events), the token budget series
and the JSON export.

A constant number of queries whatever the conversation's size: one per kind of
row, bounded to a page of rounds, grouped by round_id in Python.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from django.db.models import QuerySet
from django.http import Http404
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

ROUNDS_PER_PAGE = 100
# Rows that name no round (or a round the agent never reported) are shown apart.
UNASSIGNED_LIMIT = 200
# Observations are loaded when a tool call is opened, not with the timeline.
HEAVY_TOOL_FIELDS = ("observation", "brief_observation", "standard_observation", "full_observation",
                     "data_summary", "last_error")


def conversation_for(project: Project, conversation_pk: int) -> Conversation:
    return get_object_or_404(Conversation, project=project, pk=conversation_pk)


@dataclass
class RoundView:
    round: Optional[Round]  # None for the "outside any round" group
    tool_executions: list[ToolExecution] = field(default_factory=list)
    skill_activations: list[SkillActivation] = field(default_factory=list)
    compressions: list[CompressionEvent] = field(default_factory=list)

    @property
    def events(self) -> list[tuple[str, Any]]:
        """Tool calls, skill activations and compressions in the order they happened."""
        tagged: list[tuple[Any, str, Any]] = (
            [(e.occurred_at, "tool", e) for e in self.tool_executions]
            + [(s.occurred_at, "skill", s) for s in self.skill_activations]
            + [(c.occurred_at, "compression", c) for c in self.compressions]
        )
        tagged.sort(key=lambda item: item[0])
        return [(kind, obj) for _, kind, obj in tagged]


@dataclass
class Timeline:
    rounds: list[RoundView]
    unassigned: Optional[RoundView]
    page: int
    has_next: bool
    total_rounds: int


def timeline(conversation: Conversation, *, page: int = 1) -> Timeline:
    total_rounds = Round.objects.filter(conversation=conversation).count()
    start = (page - 1) * ROUNDS_PER_PAGE
    rounds = list(
        Round.objects.filter(conversation=conversation).order_by("index", "id")[
            start : start + ROUNDS_PER_PAGE + 1
        ]
    )
    if page > 1 and not rounds:
        raise Http404("no such page of rounds")
    has_next = len(rounds) > ROUNDS_PER_PAGE
    rounds = rounds[:ROUNDS_PER_PAGE]
    round_ids = [r.round_id for r in rounds]
    views = {r.round_id: RoundView(round=r) for r in rounds}
    reported_round_ids = Round.objects.filter(conversation=conversation).values("round_id")

    def grouped(qs: QuerySet[Any]) -> tuple[dict[str, list[Any]], list[Any]]:
        by_round: dict[str, list[Any]] = defaultdict(list)
        for row in qs.filter(round_id__in=round_ids).order_by("occurred_at", "id"):
            by_round[row.round_id].append(row)
        orphans: list[Any] = []
        if page == 1:
            # Rows with no round_id or one that matches no reported round.
            orphan_qs = qs.exclude(round_id__in=reported_round_ids).order_by("occurred_at", "id")
            orphans = list(orphan_qs[:UNASSIGNED_LIMIT])
        return by_round, orphans

    tools, tool_orphans = grouped(
        ToolExecution.objects.filter(conversation=conversation).defer(*HEAVY_TOOL_FIELDS)
    )
    skills, skill_orphans = grouped(SkillActivation.objects.filter(conversation=conversation))
    compressions, compression_orphans = grouped(
        CompressionEvent.objects.filter(conversation=conversation).defer("result")
    )
    for round_id, view in views.items():
        view.tool_executions = tools.get(round_id, [])
        view.skill_activations = skills.get(round_id, [])
        view.compressions = compressions.get(round_id, [])

    unassigned = None
    if tool_orphans or skill_orphans or compression_orphans:
        unassigned = RoundView(
            round=None,
            tool_executions=tool_orphans,
            skill_activations=skill_orphans,
            compressions=compression_orphans,
        )
    return Timeline(
        rounds=[views[r.round_id] for r in rounds],
        unassigned=unassigned,
        page=page,
        has_next=has_next,
        total_rounds=total_rounds,
    )


def token_budget(conversation: Conversation) -> dict[str, list[Any]]:
    """The chart's series, one point per round: context tokens (the derived value, or
    the reported one before the totals task ran), the model's window, the threshold
    (window x configured ratio) and the context size where compression fired."""
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
        labels.append(index)
        context.append(tokens)
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
        "record_id", "round_id", "index", "occurred_at", "trace_id", "model", "user_id",
        "user_message", "thoughts", "final_answer", "status", "context_tokens", "context_window",
        "compression_threshold", "input_tokens", "output_tokens", "started_at", "ended_at",
    )),
    "messages": (Message, (
        "record_id", "round_id", "index", "occurred_at", "role", "content", "name", "tool_calls",
        "tool_call_id", "is_meta", "tokens",
    )),
    "tool_executions": (ToolExecution, (
        "record_id", "round_id", "occurred_at", "trace_id", "span_id", "tool_name", "tool_version",
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
