from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from dashboard.accounts.models import Project
from dashboard.observatory.models import CompressionEvent

from ..access import project_page
from ..selectors.compressions import UnreadableCompression, compression_diff


@project_page
def compression_detail(request: HttpRequest, project: Project, pk: int) -> HttpResponse:
    event = get_object_or_404(
        CompressionEvent.objects.select_related("conversation"), project=project, pk=pk
    )
    try:
        diff, problem = compression_diff(event.result), ""
    except UnreadableCompression as exc:
        diff, problem = None, str(exc)
    return render(
        request,
        "web/compression.html",
        {
            "project": project,
            "nav_section": "conversations",
            "event": event,
            "diff": diff,
            "problem": problem,
            "raw": event.result if diff is None else None,
        },
    )
