"""The dashboard's read API under /api/v1/projects/{slug}/... (session auth).

A project the user does not belong to is a 404, exactly like one that does not
exist. Thin views: find the project, call a selector, shape the answer.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Optional

from django.http import FileResponse, HttpRequest
from ninja import Field, Query, Router, Schema
from ninja.security import django_auth

from dashboard.accounts.selectors import project_for_user

from . import selectors

router = Router(tags=["dashboard"], auth=django_auth)
PAGE_SIZE = 50


class ConversationFilters(Schema):
    status: Optional[Literal["ok", "error"]] = None
    model: Optional[str] = Field(default=None, max_length=200)
    user_id: Optional[str] = Field(default=None, max_length=200)
    has_errors: Optional[bool] = None
    q: Optional[str] = Field(default=None, max_length=200)
    order: Literal["recent", "oldest", "started", "tokens", "errors"] = "recent"
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
    observation_tokens: int
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


class ConversationDetail(Schema):
    conversation: ConversationOut
    rounds: list[RoundOut]
    tool_executions: list[ToolExecutionOut]
    compressions: list[CompressionOut]
    span_count: int


class ToolStatsOut(Schema):
    tool_name: str
    calls: int
    successes: int
    errors: int
    error_rate: float
    retries: int
    retry_rate: float
    timeouts: int
    cache_hits: int
    mean_ms: Optional[float]
    p50_ms: Optional[float]
    p95_ms: Optional[float]
    p99_ms: Optional[float]
    latency_histogram: list[int]
    tokens_by_level: dict[str, dict[str, int]]
    error_types: dict[str, int]


class ToolRange(Schema):
    since: Optional[datetime] = None
    until: Optional[datetime] = None


@router.get("/projects/{slug}/conversations", response=ConversationPage)
def list_conversations(request: HttpRequest, slug: str, filters: Query[ConversationFilters]) -> dict[str, Any]:
    project = project_for_user(request.user, slug)
    queryset = selectors.conversations_for_project(
        project, status=filters.status, model=filters.model, user_id=filters.user_id,
        has_errors=filters.has_errors, search=filters.q, order=filters.order,
    )
    start = (filters.page - 1) * PAGE_SIZE
    rows = list(queryset[start : start + PAGE_SIZE + 1])  # one extra row says whether a next page exists
    return {"page": filters.page, "has_next": len(rows) > PAGE_SIZE, "items": rows[:PAGE_SIZE]}


@router.get("/projects/{slug}/conversations/{external_id}", response=ConversationDetail)
def conversation_detail(request: HttpRequest, slug: str, external_id: str) -> dict[str, Any]:
    project = project_for_user(request.user, slug)
    timeline = selectors.conversation_timeline(selectors.conversation_for_project(project, external_id))
    return {
        "conversation": timeline.conversation,
        "rounds": timeline.rounds,
        "tool_executions": timeline.tool_executions,
        "compressions": timeline.compressions,
        "span_count": len(timeline.spans),
    }


@router.get("/projects/{slug}/tools", response=list[ToolStatsOut])
def tool_statistics(request: HttpRequest, slug: str, window: Query[ToolRange]) -> list[dict[str, Any]]:
    project = project_for_user(request.user, slug)
    return [selectors.summary_row(s) for s in selectors.tool_stats(project, since=window.since, until=window.until)]


@router.get("/projects/{slug}/artifacts/{artifact_id:artifact_id}/download")
def download_artifact(request: HttpRequest, slug: str, artifact_id: str) -> FileResponse:
    project = project_for_user(request.user, slug)
    artifact = selectors.artifact_for_project(project, artifact_id)
    response = FileResponse(
        artifact.file.open("rb"), as_attachment=True, filename=f"{artifact.artifact_id}",
        content_type=artifact.content_type,
    )
    response["Content-Length"] = str(artifact.size)
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "sandbox"
    return response
