from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from dashboard.accounts.models import Project
from dashboard.observatory.selectors import recent_failures

from ..access import project_page
from ..selectors.overview import daily_trend, overview_totals
from .ranges import chosen_range


@project_page
def overview(request: HttpRequest, project: Project) -> HttpResponse:
    window = chosen_range(request)
    return render(
        request,
        "web/overview.html",
        {
            "project": project,
            "nav_section": "overview",
            **window.context(),
            "totals": overview_totals(project, since=window.since),
            "trend": daily_trend(project, since=window.since),
            "failures": recent_failures(project, limit=10),
        },
    )
