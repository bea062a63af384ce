"""Reads of the stored conversation data, always scoped to one project (the caller
got the project through ``accounts.selectors.project_for_user``).

One implementation for both readers: the pages (``dashboard.web``) and the JSON
read API (``observatory.api``). What only concerns how a page shows these rows
(keyset paging, chart series, labels) stays in ``dashboard.web.selectors``. Every
query is bounded (a page, a range or a LIMIT) and rides an index named in models.py.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Optional

from django.db import connection
from django.db.models import Exists, IntegerField, OuterRef, Q, QuerySet, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.http import Http404

from dashboard.accounts.models import Project

from . import histogram
from .models import (
    SPAN_TOOL_FAILURE,
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

LEVELS = ("brief", "standard", "full")

# --- conversations -----------------------------------------------------------

# The list's orders: a column, descending with '-'. Ties go by id in the same
# direction, so every order is total: offset and keyset paging both rely on it.
CONVERSATION_ORDERS = (
    "-last_activity_at", "last_activity_at", "-started_at", "started_at", "-input_tokens", "-errors",
)


def conversations_for_project(
    project: Project,
    *,
    user_id: str = "",
    model: str = "",
    status: str = "",
    has_errors: Optional[bool] = None,
    tool: str = "",
    since: Optional[datetime] = None,
    until: Optional[datetime] = None,
) -> QuerySet[Conversation]:
    """The conversation list with its filters (unordered; see ``ordered_conversations``).
    Each equality filter has an index that starts with the project; ``since`` /
    ``until`` bound started_at (until exclusive)."""
    qs = Conversation.objects.filter(project=project)
    if user_id:
        qs = qs.filter(user_id=user_id)
    if model:
        qs = qs.filter(model=model)
    if status:
        qs = qs.filter(status=status)
    if has_errors is not None:
        qs = qs.filter(has_errors=has_errors)
    if since:
        qs = qs.filter(started_at__gte=since)
    if until:
        qs = qs.filter(started_at__lt=until)
    if tool:
        # Checked per candidate row on the (conversation, ...) index while the list
        # index is walked, so it stops once a page is full.
        qs = qs.filter(Exists(ToolExecution.objects.filter(conversation=OuterRef("pk"), tool_name=tool)))
    return qs


# What a text search reads by default: what the user and the model said. A system
# prompt or a skill's injected instructions (meta messages) are the same in every
# conversation of an agent, so a word in them would match them all; tool results
# are data, not the conversation. ``all_text`` adds both.
SEARCHED_ROLES = ("user", "assistant")


def conversation_text_match(q: str, *, all_text: bool = False) -> Q:
    """Conversations whose title, id, round texts (user message, final answer) or
    user and assistant messages contain q; with ``all_text`` also system, tool and
    meta messages.

    Costs a look at every candidate's texts: callers bound the candidates (the
    pages search a window of the list at a time)."""
    messages = Message.objects.filter(conversation=OuterRef("pk"), content__icontains=q)
    if not all_text:
        messages = messages.filter(role__in=SEARCHED_ROLES, is_meta=False)
    return (
        Q(title__icontains=q)
        | Q(external_id=q)
        | Exists(
            Round.objects.filter(conversation=OuterRef("pk")).filter(
                Q(user_message__icontains=q) | Q(final_answer__icontains=q)
            )
        )
        | Exists(messages)
    )


def ordered_conversations(qs: QuerySet[Conversation], sort: str) -> QuerySet[Conversation]:
    """``qs`` in one of CONVERSATION_ORDERS, ties by id. ValueError for any other."""
    if sort not in CONVERSATION_ORDERS:
        raise ValueError(f"unknown conversation order {sort!r}")
    return qs.order_by(sort, "-id" if sort.startswith("-") else "id")


def conversation_for_project(project: Project, external_id: str) -> Conversation:
    conversation = Conversation.objects.filter(project=project, external_id=external_id).first()
    if conversation is None:
        raise Http404("no such conversation")
    return conversation


# --- the timeline of one conversation ----------------------------------------

ROUNDS_PER_PAGE = 100
# Rows that name no round (or a round the agent never reported) are shown apart.
UNASSIGNED_LIMIT = 200
# Observations are loaded when a tool call is opened, not with the timeline.
HEAVY_TOOL_FIELDS = ("observation", "brief_observation", "standard_observation", "full_observation",
                     "data_summary", "last_error")


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
    unassigned: Optional[RoundView]  # only on page 1
    page: int
    has_next: bool
    total_rounds: int

    def groups(self) -> list[RoundView]:
        return self.rounds + ([self.unassigned] if self.unassigned else [])


def conversation_timeline(conversation: Conversation, *, page: int = 1) -> Timeline:
    """One page of rounds (by index), each with what happened in it; page 1 also
    holds the rows outside any reported round. A constant number of queries
    whatever the conversation's size: one per kind of row, grouped in Python.
    Http404 for a page past the end."""
    total_rounds = Round.objects.filter(conversation=conversation).count()
    start = (page - 1) * ROUNDS_PER_PAGE
    rounds = list(
        Round.objects.filter(conversation=conversation).order_by("index", "id")[start : start + ROUNDS_PER_PAGE + 1]
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

    tools, tool_orphans = grouped(ToolExecution.objects.filter(conversation=conversation).defer(*HEAVY_TOOL_FIELDS))
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
            round=None, tool_executions=tool_orphans, skill_activations=skill_orphans,
            compressions=compression_orphans,
        )
    return Timeline(
        rounds=[views[r.round_id] for r in rounds], unassigned=unassigned, page=page, has_next=has_next,
        total_rounds=total_rounds,
    )


# --- tool statistics -----------------------------------------------------------

# Summed column by column from the hourly rollups.
ROLLUP_SUM_FIELDS = (
    "calls", "successes", "errors", "retries", "timeouts", "cache_hits", "duration_sum_ms",
    "brief_tokens", "brief_count", "standard_tokens", "standard_count", "full_tokens", "full_count",
    "cost_pico_usd", "priced_calls", "unknown_token_calls", "unleveled_tokens",
)
RECENT_FAILURES = 20


@dataclass
class ToolStats:
    """One tool's figures over a range. Counts and sums are exact (the rollups are
    recomputed whole from the rows); percentiles are bucket upper bounds of the
    merged latency histogram (a floor in the overflow bucket, see is_floor)."""

    tool_name: str
    calls: int = 0
    successes: int = 0
    errors: int = 0
    retries: int = 0
    timeouts: int = 0
    cache_hits: int = 0
    duration_sum_ms: float = 0.0
    brief_tokens: int = 0
    brief_count: int = 0
    standard_tokens: int = 0
    standard_count: int = 0
    full_tokens: int = 0
    full_count: int = 0
    cost_pico_usd: int = 0  # observation tokens at the input price (observatory.costs)
    priced_calls: int = 0
    unknown_token_calls: int = 0  # calls whose observation tokens are unknown: in no sum, no cost
    unleveled_tokens: int = 0  # known observation tokens of the calls with no output level
    latency_histogram: list[int] = field(default_factory=histogram.empty_histogram)
    error_types: Counter = field(default_factory=Counter)

    def _per_call(self, value: float) -> Optional[float]:
        return value / self.calls if self.calls else None

    @property
    def success_rate(self) -> Optional[float]:
        return self._per_call(self.successes)

    @property
    def error_rate(self) -> Optional[float]:
        return self._per_call(self.errors)

    @property
    def retry_rate(self) -> Optional[float]:
        return self._per_call(self.retries)

    @property
    def cache_hit_rate(self) -> Optional[float]:
        return self._per_call(self.cache_hits)

    @property
    def mean_duration_ms(self) -> Optional[float]:
        return self._per_call(self.duration_sum_ms)

    def mean_tokens(self, level: str) -> Optional[float]:
        """Mean observation tokens of the calls seen at ``level``."""
        count = getattr(self, f"{level}_count")
        return getattr(self, f"{level}_tokens") / count if count else None

    @property
    def mean_brief_tokens(self) -> Optional[float]:
        return self.mean_tokens("brief")

    @property
    def mean_standard_tokens(self) -> Optional[float]:
        return self.mean_tokens("standard")

    @property
    def mean_full_tokens(self) -> Optional[float]:
        return self.mean_tokens("full")

    @property
    def tokens_by_level(self) -> dict[str, dict[str, int]]:
        return {
            level: {"tokens": getattr(self, f"{level}_tokens"), "count": getattr(self, f"{level}_count")}
            for level in LEVELS
        }

    def percentile(self, q: float) -> Optional[float]:
        return histogram.percentile(self.latency_histogram, q)

    @property
    def p50(self) -> Optional[float]:
        return self.percentile(0.50)

    @property
    def p95(self) -> Optional[float]:
        return self.percentile(0.95)

    @property
    def p99(self) -> Optional[float]:
        return self.percentile(0.99)

    def is_floor(self, q: float) -> bool:
        """The q-quantile lies in the overflow bucket: the value is a floor, not a bound."""
        total = sum(self.latency_histogram)
        rank = max(1, math.ceil(q * total))
        return total > 0 and total - self.latency_histogram[-1] < rank

    # How a page writes the bound before the value: "≤ 50 ms", "> 500 s".
    @property
    def p50_op(self) -> str:
        return ">" if self.is_floor(0.50) else "≤"

    @property
    def p95_op(self) -> str:
        return ">" if self.is_floor(0.95) else "≤"

    @property
    def p99_op(self) -> str:
        return ">" if self.is_floor(0.99) else "≤"

    @property
    def cost(self) -> Optional[int]:
        """pico-USD of the priced calls; None when no call had a price."""
        return self.cost_pico_usd if self.priced_calls else None

    @property
    def unpriced_calls(self) -> int:
        """Calls with known tokens whose model has no price (those with unknown tokens
        are left out of the cost too, and counted apart)."""
        return self.calls - self.priced_calls - self.unknown_token_calls

    @property
    def top_error_types(self) -> list[tuple[str, int]]:
        return self.error_types.most_common(3)


def tool_stats(
    project: Project,
    *,
    since: Optional[datetime] = None,
    until: Optional[datetime] = None,
    tool_name: str = "",
) -> list[ToolStats]:
    """One ToolStats per tool with rollups in [since, until), busiest first.

    Two queries: the rollups of the range summed per tool by the database (counts,
    sums and each latency histogram bucket: one row a tool, read through the
    cursor, no histogram decoded in Python), and the error types of the rollup
    rows that have errors, merged in Python (their keys are the agents' own).
    """
    qs = ToolHourlyRollup.objects.filter(project=project)
    if since is not None:
        qs = qs.filter(hour__gte=since)
    if until is not None:
        qs = qs.filter(hour__lt=until)
    if tool_name:
        qs = qs.filter(tool_name=tool_name)
    sums = {f"s_{name}": Sum(name) for name in ROLLUP_SUM_FIELDS} | histogram_bucket_sums()
    rows = cursor_rows(qs.values("tool_name").order_by().annotate(**sums).values_list("tool_name", *sums))
    stats: dict[str, ToolStats] = {}
    for name, *values in rows:
        entry = stats[name] = ToolStats(tool_name=name)
        for field_name, value in zip(ROLLUP_SUM_FIELDS, values):
            value = value or 0
            setattr(entry, field_name, float(value) if field_name == "duration_sum_ms" else int(value))
        entry.latency_histogram = [int(count or 0) for count in values[len(ROLLUP_SUM_FIELDS):]]
    for name, error_types in qs.filter(errors__gt=0).values_list("tool_name", "error_types").iterator(chunk_size=2000):
        if name in stats and isinstance(error_types, dict):
            for error_type, count in error_types.items():
                stats[name].error_types[str(error_type)] += int(count)
    return sorted(stats.values(), key=lambda s: (-s.calls, s.tool_name))


def cursor_rows(queryset: QuerySet) -> list[tuple]:
    """The rows of a values_list queryset read through the cursor: Django's
    per-value converters cost more than many sums they would convert."""
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def histogram_bucket_sums(field: str = "latency_histogram") -> dict[str, Sum]:
    """Aggregates summing a JSON histogram list bucket by bucket (``h0`` …), so the
    database merges the histograms of many rollup rows (histogram.merge's rule)."""
    return {f"h{b}": Sum(Cast(KT(f"{field}__{b}"), IntegerField())) for b in range(histogram.BUCKET_COUNT)}


def level_token_sums() -> dict[str, Sum]:
    """Aggregates summing each output level's token column, keyed by level (the
    rollups and the tool executions name these columns alike)."""
    return {level: Sum(f"{level}_tokens") for level in LEVELS}


def recent_failures(
    project: Project, *, tool_name: str = "", limit: int = RECENT_FAILURES,
    since: Optional[datetime] = None, until: Optional[datetime] = None,
) -> list[ToolExecution]:
    """The newest failed tool executions, with their conversation (the partial
    failures index), optionally within [since, until)."""
    qs = ToolExecution.objects.filter(project=project, success=False)
    if tool_name:
        qs = qs.filter(tool_name=tool_name)
    if since is not None:
        qs = qs.filter(occurred_at__gte=since)
    if until is not None:
        qs = qs.filter(occurred_at__lt=until)
    return list(
        qs.select_related("conversation")
        .only(
            "id", "tool_name", "tool_call_id", "occurred_at", "error_type", "error_code", "trace_id", "span_id",
            "error_message", "retry_count", "duration_ms", "output_level", "conversation__id",
            "conversation__external_id", "conversation__title", "conversation__project_id",
        )
        .order_by("-occurred_at")[:limit]
    )


def recent_span_failures(
    project: Project, *, tool_name: str, limit: int = RECENT_FAILURES,
    since: Optional[datetime] = None, until: Optional[datetime] = None,
) -> list[Span]:
    """Failed tool spans outside any conversation (no tool execution describes
    them, so ``recent_failures`` cannot list them), newest first, on the
    partial span_tool_failures index. Failed: status ERROR or an error type."""
    qs = Span.objects.filter(SPAN_TOOL_FAILURE, project=project, tool_name=tool_name)  # span_tool_failures
    if since is not None:
        qs = qs.filter(start_time__gte=since)
    if until is not None:
        qs = qs.filter(start_time__lt=until)
    return list(qs.only("id", "trace_id", "span_id", "name", "start_time", "duration_ms", "status_message",
                        "tool_name", "tool_call_id").order_by("-start_time")[:limit])


# --- traces ----------------------------------------------------------------------


def trace_spans(project: Project, trace_id: str, *, limit: int, with_details: bool = True) -> list[Span]:
    """Up to ``limit`` spans of a trace in start order (the unique constraint's
    index). Without details the heavy JSON columns stay in the database."""
    qs = Span.objects.filter(project=project, trace_id=trace_id).order_by("start_time", "id")
    if not with_details:
        qs = qs.defer("attributes", "events", "resource")
    return list(qs[:limit])


# --- artifacts -------------------------------------------------------------------

# A plain "type/subtype" with an optional charset, nothing else.
_SAFE_TYPE = re.compile(r"^[a-z0-9][a-z0-9.+-]*/[a-z0-9][a-z0-9.+-]*(; ?charset=[a-z0-9_-]+)?$")
_EXTENSIONS = {
    "application/json": ".json",
    "text/csv": ".csv",
    "text/plain": ".txt",
    "text/markdown": ".md",
    "application/x-ndjson": ".jsonl",
}


def artifacts_for_project(project: Project) -> QuerySet[Artifact]:
    return Artifact.objects.filter(project=project)


def artifact_for_project(project: Project, artifact_id: str) -> Artifact:
    artifact = artifacts_for_project(project).filter(artifact_id=artifact_id).first()
    if artifact is None:
        raise Http404("no such artifact")
    return artifact


def download_type(artifact: Artifact) -> str:
    """The stored content type when it is a well-formed one, else octet-stream:
    what an agent sent never reaches a header unchecked."""
    value = (artifact.content_type or "").strip().lower()
    return value if _SAFE_TYPE.match(value) else "application/octet-stream"


def download_name(artifact: Artifact) -> str:
    """artifact_<hex> plus an extension from the type: never a stored file name."""
    base_type = download_type(artifact).split(";")[0]
    return artifact.artifact_id + _EXTENSIONS.get(base_type, ".txt" if base_type.startswith("text/") else ".bin")
