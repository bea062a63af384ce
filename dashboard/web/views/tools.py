from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from dashboard.accounts.models import Project
from dashboard.observatory.selectors import recent_failures, tool_stats

from ..access import project_page
from ..selectors.tools import exact_or_bucket_percentiles, histogram_chart, level_costs
from .ranges import chosen_range


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
    failures = recent_failures(project, tool_name=tool_name)
    if stats is None and not failures:
        # Unknown here in this range: still a page (the range may be too short),
        # unless the project never ran the tool at all.
        if not project.tool_rollups.filter(tool_name=tool_name).exists():
            raise Http404("no such tool")
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
            "error_types": stats.error_types.most_common() if stats else [],
            "failures": failures,
            "costs": level_costs(project, tool_name, since=since),
        },
    )
