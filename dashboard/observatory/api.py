"""The dashboard's read API under /api/v1/projects/{slug}/... (session auth).

A project the user does not belong to is a 404, exactly like one that does not
exist. Thin views: find the project, call a selector, shape the answer.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Optional

from django.http import FileResponse, Http404, HttpRequest
from ninja import Field, Query, Router, Schema
from ninja.security import django_auth

from dashboard import converters  # noqa: F401  (registers artifact_id)
from dashboard.accounts.selectors import project_for_user

from . import selectors

router = Router(tags=["dashboard"], auth=django_auth)
PAGE_SIZE = 50


# The API's order names for the domain's conversation sorts (ties go by id).
ORDERS = {
    "recent": "-last_activity_at",
    "oldest": "last_activity_at",
    "started": "-started_at",
    "tokens": "-input_tokens",
    "errors": "-errors",
}


class ConversationFilters(Schema):
    status: Optional[Literal["ok", "error"]] = None
    model: Optional[str] = Field(default=None, max_length=200)
    user_id: Optional[str] = Field(default=None, max_length=200)
    has_errors: Optional[bool] = None
    tool: Optional[str] = Field(default=None, max_length=200)
    q: Optional[str] = Field(default=None, max_length=200)
    all_text: bool = False  # q also in system, tool and meta messages, not only user and assistant text
    order: Literal["recent", "oldest", "started", "tokens", "errors"] = "recent"
    page: int = Field(default=1, ge=1, le=100_000)


class RoundsPage(Schema):
    page: int = Field(default=1, ge=1, le=100_000)


class ConversationOut(Schema):
    external_id: str
    title: str
    user_id: str
    model: str
    status: str
    started_at: datetime
    last_activity_at: datetime
    rounds: int
    messages: int
    tool_calls: int
    errors: int
    retries: int
    input_tokens: int
    output_tokens: int
    max_context_tokens: int
    compressions: int
    has_errors: bool


class ConversationPage(Schema):
    page: int
    has_next: bool
    items: list[ConversationOut]


class RoundOut(Schema):
    round_id: str
    index: int
    status: str
    model: str
    user_message: str
    final_answer: Optional[str]
    context_tokens: int
    derived_context_tokens: int
    context_window: Optional[int]
    compression_threshold: Optional[float]
    input_tokens: int
    output_tokens: int
    tool_call_count: int
    error_count: int
    occurred_at: datetime


class ToolExecutionOut(Schema):
    tool_call_id: str
    tool_name: str
    round_id: str
    success: bool
    output_level: str
    duration_ms: float
    retry_count: int
    error_type: str
    error_message: str
    observation_tokens: Optional[int]  # null: unknown (a span-only call without its whole result)
    cache_hit: bool
    artifact_id: str
    trace_id: str
    span_id: str
    occurred_at: datetime


class CompressionOut(Schema):
    record_id: Any
    mode: str
    tokens_before: int
    tokens_after: int
    messages_before: int
    messages_after: int
    kept_count: int
    dropped_count: int
    truncated_count: int
    summarized_count: int
    target_met: bool
    occurred_at: datetime


class SkillActivationOut(Schema):
    skill_name: str
    activation_id: str
    round_id: str
    load_level: int
    depth: int
    chain: list[Any]
    tokens_loaded: int
    success: bool
    error: Optional[str]
    duration_ms: float
    occurred_at: datetime


class ConversationDetail(Schema):
    """One page of the conversation's rounds (by index) with the tool calls, skill
    activations and compressions of those rounds; page 1 adds the ones outside any
    reported round (as on the timeline page)."""

    conversation: ConversationOut
    page: int
    has_next: bool
    total_rounds: int
    rounds: list[RoundOut]
    tool_executions: list[ToolExecutionOut]
    skill_activations: list[SkillActivationOut]
    compressions: list[CompressionOut]
    span_count: int


class ToolStatsOut(Schema):
    tool_name: str
    calls: int
    successes: int
    errors: int
    error_rate: Optional[float]  # None when the range holds no call
    retries: int
    retry_rate: Optional[float]
    timeouts: int
    cache_hits: int
    mean_ms: Optional[float]
    p50_ms: Optional[float]
    p95_ms: Optional[float]
    p99_ms: Optional[float]
    latency_histogram: list[int]
    tokens_by_level: dict[str, dict[str, int]]
    unknown_token_calls: int  # calls whose observation tokens are unknown: in no level's count or tokens
    error_types: dict[str, int]


class ToolRange(Schema):
    since: Optional[datetime] = None
    until: Optional[datetime] = None


@router.get("/projects/{slug}/conversations", response=ConversationPage)
def list_conversations(request: HttpRequest, slug: str, filters: Query[ConversationFilters]) -> dict[str, Any]:
    project = project_for_user(request.user, slug)
    queryset = selectors.conversations_for_project(
        project, status=filters.status or "", model=filters.model or "", user_id=filters.user_id or "",
        has_errors=filters.has_errors, tool=filters.tool or "",
    )
    if filters.q:
        # The pages search a bounded window per keyset page; with offset paging a
        # rare term makes this look through all of the project's conversations.
        queryset = queryset.filter(selectors.conversation_text_match(filters.q, all_text=filters.all_text))
    queryset = selectors.ordered_conversations(queryset, ORDERS[filters.order])
    start = (filters.page - 1) * PAGE_SIZE
    rows = list(queryset[start : start + PAGE_SIZE + 1])  # one extra row says whether a next page exists
    return {"page": filters.page, "has_next": len(rows) > PAGE_SIZE, "items": rows[:PAGE_SIZE]}


@router.get("/projects/{slug}/conversations/{path:external_id}", response=ConversationDetail)
def conversation_detail(
    request: HttpRequest, slug: str, external_id: str, rounds: Query[RoundsPage]
) -> dict[str, Any]:
    project = project_for_user(request.user, slug)
    conversation = selectors.conversation_for_project(project, external_id)
    timeline = selectors.conversation_timeline(conversation, page=rounds.page)
    groups = timeline.groups()
    return {
        "conversation": conversation,
        "page": timeline.page,
        "has_next": timeline.has_next,
        "total_rounds": timeline.total_rounds,
        "rounds": [group.round for group in timeline.rounds],
        "tool_executions": sorted((e for g in groups for e in g.tool_executions), key=_in_time_order),
        "skill_activations": sorted((a for g in groups for a in g.skill_activations), key=_in_time_order),
        "compressions": sorted((c for g in groups for c in g.compressions), key=_in_time_order),
        "span_count": conversation.spans.count(),
    }


def _in_time_order(row: Any) -> tuple[datetime, int]:
    return (row.occurred_at, row.id)


@router.get("/projects/{slug}/tools", response=list[ToolStatsOut])
def tool_statistics(request: HttpRequest, slug: str, window: Query[ToolRange]) -> list[dict[str, Any]]:
    project = project_for_user(request.user, slug)
    return [_tool_stats_row(s) for s in selectors.tool_stats(project, since=window.since, until=window.until)]


def _tool_stats_row(stats: selectors.ToolStats) -> dict[str, Any]:
    def rounded(value: Optional[float], digits: int) -> Optional[float]:
        return None if value is None else round(value, digits)

    return {
        "tool_name": stats.tool_name,
        "calls": stats.calls,
        "successes": stats.successes,
        "errors": stats.errors,
        "error_rate": rounded(stats.error_rate, 4),
        "retries": stats.retries,
        "retry_rate": rounded(stats.retry_rate, 4),
        "timeouts": stats.timeouts,
        "cache_hits": stats.cache_hits,
        "mean_ms": rounded(stats.mean_duration_ms, 3),
        "p50_ms": stats.p50,
        "p95_ms": stats.p95,
        "p99_ms": stats.p99,
        "latency_histogram": stats.latency_histogram,
        "tokens_by_level": stats.tokens_by_level,
        "unknown_token_calls": stats.unknown_token_calls,
        "error_types": dict(stats.error_types),
    }


@router.get("/projects/{slug}/artifacts/{artifact_id:artifact_id}/download")
def download_artifact(request: HttpRequest, slug: str, artifact_id: str) -> FileResponse:
    """The bytes as an attachment, typed and named like the pages' download."""
    project = project_for_user(request.user, slug)
    artifact = selectors.artifact_for_project(project, artifact_id)
    try:
        handle = artifact.file.open("rb")
    except OSError:
        raise Http404("artifact file missing") from None  # the row outlived its file
    response = FileResponse(
        handle, as_attachment=True, filename=selectors.download_name(artifact),
        content_type=selectors.download_type(artifact),
    )
    response["Content-Length"] = str(artifact.size)
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "sandbox"
    return response
