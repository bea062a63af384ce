from __future__ import annotations

import re

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from dashboard.accounts.models import Project

from ..access import project_page
from ..selectors.logs import logs_page

_TRACE_ID = re.compile(r"[0-9a-f]{32}")


@project_page
def log_list(request: HttpRequest, project: Project) -> HttpResponse:
    """The project's OTLP log records, newest first; ``?trace=`` keeps one trace's
    (also those whose span never arrived)."""
    before = request.GET.get("before", "")
    trace_id = request.GET.get("trace", "").lower()
    if trace_id and not _TRACE_ID.fullmatch(trace_id):
        raise Http404("bad trace id")
    try:
        before_id = int(before) if before else None
    except ValueError:
        raise Http404("bad page") from None
    rows, next_before = logs_page(project, before_id=before_id, trace_id=trace_id)
    return render(
        request,
        "web/logs.html",
        {"project": project, "nav_section": "logs", "logs": rows, "next_before": next_before,
         "trace_id": trace_id, "is_first": before_id is None,
         "otlp_endpoint": request.build_absolute_uri("/").rstrip("/")},
    )
