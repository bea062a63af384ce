"""Reads of the stored conversation data, always scoped to one project (the caller
got the project through ``accounts.selectors.project_for_user``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet
from django.http import Http404

from dashboard.accounts.models import Project

from .histogram import merge, percentile
from .models import (
    Artifact,
    CompressionEvent,
    Conversation,
    Message,
    Round,
    SkillActivation,
    Span,
    ToolExecution,
    ToolHourlyRollup,
)

CONVERSATION_ORDERS = {
    "recent": ("-last_activity_at", "-id"),
    "oldest": ("last_activity_at", "id"),
    "started": ("-started_at", "-id"),
    "tokens": ("-input_tokens", "-id"),
    "errors": ("-errors", "-last_activity_at"),
}


def conversations_for_project(
    project: Project,
    *,
    status: str | None = None,
    model: str | None = None,
    user_id: str | None = None,
    has_errors: bool | None = None,
    search: str | None = None,
    order: str = "recent",
) -> QuerySet[Conversation]:
    """The conversation list with its filters; every filter has an index that starts
    with the project (see the model)."""
    queryset = Conversation.objects.filter(project=project)
    if status:
        queryset = queryset.filter(status=status)
    if model:
        queryset = queryset.filter(model=model)
    if user_id:
        queryset = queryset.filter(user_id=user_id)
    if has_errors is not None:
        queryset = queryset.filter(has_errors=has_errors)
    if search:
        queryset = queryset.filter(Q(title__icontains=search) | Q(external_id__icontains=search))
    return queryset.order_by(*CONVERSATION_ORDERS.get(order, CONVERSATION_ORDERS["recent"]))


def conversation_for_project(project: Project, external_id: str) -> Conversation:
    conversation = Conversation.objects.filter(project=project, external_id=external_id).first()
    if conversation is None:
        raise Http404("no such conversation")
    return conversation


@dataclass
class ConversationTimeline:
    conversation: Conversation
    rounds: list[Round] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    tool_executions: list[ToolExecution] = field(default_factory=list)
    compressions: list[CompressionEvent] = field(default_factory=list)
    skill_activations: list[SkillActivation] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)


def conversation_timeline(conversation: Conversation, *, limit: int = 2000) -> ConversationTimeline:
    """Everything of one conversation, in order (one query per kind of row)."""
    return ConversationTimeline(
        conversation=conversation,
        rounds=list(Round.objects.filter(conversation=conversation).order_by("index", "occurred_at")[:limit]),
        messages=list(Message.objects.filter(conversation=conversation).order_by("index", "occurred_at")[:limit]),
        tool_executions=list(
            ToolExecution.objects.filter(conversation=conversation).order_by("occurred_at")[:limit]
        ),
        compressions=list(CompressionEvent.objects.filter(conversation=conversation).order_by("occurred_at")[:limit]),
        skill_activations=list(
            SkillActivation.objects.filter(conversation=conversation).order_by("occurred_at")[:limit]
        ),
        spans=list(Span.objects.filter(conversation=conversation).order_by("start_time")[:limit]),
    )


@dataclass
class ToolStats:
    tool_name: str
    calls: int = 0
    successes: int = 0
    errors: int = 0
    retries: int = 0
    timeouts: int = 0
    cache_hits: int = 0
    duration_sum_ms: float = 0.0
    latency_histogram: list[int] = field(default_factory=list)
    tokens_by_level: dict[str, dict[str, int]] = field(default_factory=dict)
    error_types: dict[str, int] = field(default_factory=dict)

    @property
    def error_rate(self) -> float:
        return self.errors / self.calls if self.calls else 0.0

    @property
    def retry_rate(self) -> float:
        return self.retries / self.calls if self.calls else 0.0

    @property
    def mean_ms(self) -> float | None:
        return self.duration_sum_ms / self.calls if self.calls else None

    def p(self, q: float) -> float | None:
        return percentile(self.latency_histogram, q)


def tool_stats(
    project: Project, *, since: datetime | None = None, until: datetime | None = None, tool_name: str | None = None
) -> list[ToolStats]:
    """Per-tool statistics over a time range, summed from the hourly rollups (one
    query). Percentiles come from the merged latency histograms."""
    rollups = ToolHourlyRollup.objects.filter(project=project)
    if since is not None:
        rollups = rollups.filter(hour__gte=since)
    if until is not None:
        rollups = rollups.filter(hour__lt=until)
    if tool_name is not None:
        rollups = rollups.filter(tool_name=tool_name)
    by_tool: dict[str, ToolStats] = {}
    histograms: dict[str, list[list[int]]] = {}
    for rollup in rollups.order_by("tool_name", "hour"):
        stats = by_tool.setdefault(rollup.tool_name, ToolStats(rollup.tool_name))
        for name in ("calls", "successes", "errors", "retries", "timeouts", "cache_hits", "duration_sum_ms"):
            setattr(stats, name, getattr(stats, name) + getattr(rollup, name))
        histograms.setdefault(rollup.tool_name, []).append(rollup.latency_histogram)
        for level in ("brief", "standard", "full"):
            entry = stats.tokens_by_level.setdefault(level, {"tokens": 0, "count": 0})
            entry["tokens"] += getattr(rollup, f"{level}_tokens")
            entry["count"] += getattr(rollup, f"{level}_count")
        for error_type, count in (rollup.error_types or {}).items():
            stats.error_types[error_type] = stats.error_types.get(error_type, 0) + int(count)
    for name, stats in by_tool.items():
        stats.latency_histogram = merge(histograms[name])
    return sorted(by_tool.values(), key=lambda s: (-s.calls, s.tool_name))


def tool_failures(project: Project, *, tool_name: str | None = None, limit: int = 50) -> QuerySet[ToolExecution]:
    """Recent failed tool executions (the partial failures index)."""
    queryset = ToolExecution.objects.filter(project=project, success=False)
    if tool_name:
        queryset = queryset.filter(tool_name=tool_name)
    return queryset.order_by("-occurred_at")[:limit]


def trace_spans(project: Project, trace_id: str) -> list[Span]:
    return list(Span.objects.filter(project=project, trace_id=trace_id).order_by("start_time"))


def artifacts_for_project(project: Project) -> QuerySet[Artifact]:
    return Artifact.objects.filter(project=project).order_by("-created_at")


def artifact_for_project(project: Project, artifact_id: str) -> Artifact:
    artifact = Artifact.objects.filter(project=project, artifact_id=artifact_id).first()
    if artifact is None:
        raise Http404("no such artifact")
    return artifact


def summary_row(stats: ToolStats) -> dict[str, Any]:
    """A tool's statistics as plain values (API and pages)."""
    return {
        "tool_name": stats.tool_name,
        "calls": stats.calls,
        "successes": stats.successes,
        "errors": stats.errors,
        "error_rate": round(stats.error_rate, 4),
        "retries": stats.retries,
        "retry_rate": round(stats.retry_rate, 4),
        "timeouts": stats.timeouts,
        "cache_hits": stats.cache_hits,
        "mean_ms": None if stats.mean_ms is None else round(stats.mean_ms, 3),
        "p50_ms": stats.p(0.50),
        "p95_ms": stats.p(0.95),
        "p99_ms": stats.p(0.99),
        "latency_histogram": stats.latency_histogram,
        "tokens_by_level": stats.tokens_by_level,
        "error_types": stats.error_types,
    }
