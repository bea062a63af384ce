from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from dashboard.accounts.models import Project

from ..access import project_page
from ..forms import RANGES, RangeForm
from ..selectors.overview import daily_trend, overview_totals
from ..selectors.tools import range_start, recent_failures


@project_page
def overview(request: HttpRequest, project: Project) -> HttpResponse:
    form = RangeForm(request.GET)
    since = range_start(form.hours())
    return render(
        request,
        "web/overview.html",
        {
            "project": project,
            "nav_section": "overview",
            "range": form.label(),
            "ranges": list(RANGES),
            "since": since,
            "totals": overview_totals(project, since=since),
            "trend": daily_trend(project, since=since),
            "failures": recent_failures(project, limit=10),
        },
    )
