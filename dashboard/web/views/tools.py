from __future__ import annotations

from datetime import datetime
from typing import Any

from django import forms
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from dashboard.accounts.models import Project
from dashboard.observatory.models import Conversation, ToolExecution
from dashboard.observatory.selectors import recent_failures, recent_span_failures, tool_stats

from ..access import project_page
from ..costs import usd_plain
from ..csv_export import CHUNK_ROWS, csv_response
from ..forms import DayOrTimeField, start_of
from ..selectors.series import time_series, url_time
from ..selectors.timeline import conversation_for
from ..selectors.tools import exact_or_bucket_percentiles, histogram_chart, level_costs
from .ranges import chosen_range


class BucketForm(forms.Form):
    """The failures of one chart bucket: ?since=…&until=… (UTC)."""

    since = DayOrTimeField()
    until = DayOrTimeField()

    def bounds(self) -> tuple[datetime | None, datetime | None]:
        if not self.is_valid():
            return None, None
        return start_of(self.cleaned_data["since"]), start_of(self.cleaned_data["until"])


@project_page
def tool_list(request: HttpRequest, project: Project) -> HttpResponse:
    window = chosen_range(request)
    return render(
        request,
        "web/tools.html",
        {
            "project": project,
            "nav_section": "tools",
            **window.context(),
            "stats": tool_stats(project, since=window.since),
        },
    )


@project_page
def tool_detail(request: HttpRequest, project: Project, tool_name: str) -> HttpResponse:
    if len(tool_name) > 200:
        raise Http404("no such tool")
    window = chosen_range(request)
    since = window.since
    found = tool_stats(project, since=since, tool_name=tool_name)
    stats = found[0] if found else None
    bucket = BucketForm(request.GET)
    failures_since, failures_until = bucket.bounds()
    failures = recent_failures(project, tool_name=tool_name, since=failures_since, until=failures_until)
    span_failures = recent_span_failures(project, tool_name=tool_name, since=failures_since or since,
                                         until=failures_until)
    if stats is None and not failures and not span_failures:
        # Unknown here in this range: still a page (the range may be too short),
        # unless the project never ran the tool at all.
        if not project.tool_rollups.filter(tool_name=tool_name).exists():
            raise Http404("no such tool")
    page = reverse("web:tool", args=[project.slug, tool_name])

    def bucket_link(start: datetime, end: datetime) -> str:
        return f"{page}?range={window.label}&since={url_time(start)}&until={url_time(end)}#failures"

    return render(
        request,
        "web/tool.html",
        {
            "project": project,
            "nav_section": "tools",
            "tool_name": tool_name,
            **window.context(),
            "stats": stats,
            "percentiles": exact_or_bucket_percentiles(project, tool_name, since=since, stats=stats),
            "histogram": histogram_chart(stats.latency_histogram) if stats else None,
            "series": time_series(project, since=since, tool_name=tool_name, link=bucket_link),
            "error_types": stats.error_types.most_common() if stats else [],
            "failures": failures,
            "span_failures": span_failures,
            "failures_since": failures_since,
            "failures_until": failures_until,
            "costs": level_costs(project, tool_name, since=since),
        },
    )


TOOL_STATS_COLUMNS = (
    "tool", "calls", "successes", "success_rate", "errors", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "retries",
    "timeouts", "cache_hits", "cache_hit_rate", "mean_tokens_brief", "mean_tokens_standard", "mean_tokens_full",
    "observation_cost_usd", "unpriced_calls", "unknown_token_calls",
)


@project_page
def tool_stats_export(request: HttpRequest, project: Project) -> HttpResponse:
    """The tools table of the range as CSV: the same statistics (percentiles are
    the table's bucket bounds; rates as ratios 0..1)."""
    window = chosen_range(request)
    rows = (
        (s.tool_name, s.calls, s.successes, s.success_rate, s.errors, s.p50, s.p95, s.p99, s.mean_duration_ms,
         s.retries, s.timeouts, s.cache_hits, s.cache_hit_rate, s.mean_brief_tokens, s.mean_standard_tokens,
         s.mean_full_tokens, usd_plain(s.cost), s.unpriced_calls, s.unknown_token_calls)
        for s in tool_stats(project, since=window.since)
    )
    return csv_response(f"tools-{project.slug}-{window.label}.csv", TOOL_STATS_COLUMNS, rows)


TOOL_CALL_COLUMNS = (
    "id", "occurred_at", "round_id", "tool_name", "tool_call_id", "success", "error_type", "error_code",
    "error_message", "retry_count", "duration_ms", "output_level", "observation_tokens", "cache_hit",
    "model", "artifact_id", "parameters",
)


@project_page
def tool_call_export(request: HttpRequest, project: Project, pk: int) -> HttpResponse:
    """A conversation's tool calls as CSV, in the order they happened, with each
    observation's cost at its model's input price (both blank when the tokens are
    unknown, as for no price)."""
    from dashboard.observatory.costs import observation_cost
    from dashboard.tuning.pricing import PriceTable

    conversation: Conversation = conversation_for(project, pk)
    table = PriceTable.load()
    executions = (
        ToolExecution.objects.filter(conversation=conversation).order_by("occurred_at", "id")
        .only(*TOOL_CALL_COLUMNS, "conversation_id")
    )

    def rows() -> Any:
        for e in executions.iterator(chunk_size=CHUNK_ROWS):
            cost = observation_cost(e, table, fallback_model=conversation.model)
            yield tuple(getattr(e, name) for name in TOOL_CALL_COLUMNS) + (usd_plain(cost),)

    header = TOOL_CALL_COLUMNS + ("observation_cost_usd",)
    return csv_response(f"conversation-{conversation.pk}-tool-calls.csv", header, rows())
