from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from dashboard.accounts.models import Project
from dashboard.observatory.selectors import recent_failures

from ..access import project_page
from ..selectors.overview import cost_totals, first_activity, overview_totals
from ..selectors.series import time_series, url_time
from .ranges import fitted_range


@project_page
def overview(request: HttpRequest, project: Project) -> HttpResponse:
    window = fitted_range(request, lambda since: first_activity(project, since=since))
    conversations = reverse("web:conversations", args=[project.slug])

    def bucket_link(start: datetime, end: datetime) -> str:
        return f"{conversations}?since={url_time(start)}&until={url_time(end)}"

    return render(
        request,
        "web/overview.html",
        {
            "project": project,
            "nav_section": "overview",
            **window.context(),
            "totals": overview_totals(project, since=window.since),
            "costs": cost_totals(project, since=window.since),
            "series": time_series(project, since=window.since, link=bucket_link),
            "failures": recent_failures(project, limit=10),
        },
    )
