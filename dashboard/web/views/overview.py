from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from dashboard.accounts.models import Project
from dashboard.metrics.selectors import metric_figures
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

    costs = cost_totals(project, since=window.since)
    metrics = metric_figures(project, since=window.since)
    derived = {m.model: (m.input_tokens, m.output_tokens) for m in costs.by_model}
    for model in metrics.by_model:
        model.derived = derived.get(model.model)
    return render(
        request,
        "web/overview.html",
        {
            "project": project,
            "nav_section": "overview",
            **window.context(),
            "totals": overview_totals(project, since=window.since),
            "costs": costs,
            "series": time_series(project, since=window.since, link=bucket_link),
            "failures": recent_failures(project, limit=10),
            "metrics": metrics,
        },
    )
