from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from dashboard.accounts.models import Project
from dashboard.observatory.models import Conversation

from ..access import project_page
from ..selectors.logs import trace_logs
from ..selectors.traces import waterfall


@project_page
def trace_detail(request: HttpRequest, project: Project, trace_id: str) -> HttpResponse:
    view = waterfall(project, trace_id)
    if view is None:
        raise Http404("no such trace")
    conversation_ids = {row.span.conversation_id for row in view.rows if row.span.conversation_id}
    conversations = list(
        Conversation.objects.filter(project=project, pk__in=conversation_ids).only("id", "title", "external_id")[:5]
    )
    logs = trace_logs(project, trace_id, {row.span.span_id for row in view.rows})
    for row in view.rows:
        row.span.logs = logs.by_span.get(row.span.span_id, ())
    return render(
        request,
        "web/trace.html",
        {"project": project, "nav_section": "conversations", "waterfall": view, "conversations": conversations,
         "trace_logs": logs},
    )
