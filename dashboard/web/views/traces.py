from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from dashboard.accounts.models import Project
from dashboard.judging.selectors import scores_of_trace
from dashboard.observatory.models import Conversation

from ..access import project_page
from ..forms import TraceFilterForm
from ..selectors.conversations import BadCursor
from ..selectors.logs import trace_logs
from ..selectors.saved_views import saved_views_for
from ..selectors.traces import Waterfall, trace_page, trace_roots, waterfall


@project_page
def trace_list(request: HttpRequest, project: Project) -> HttpResponse:
    form = TraceFilterForm(request.GET)
    context = {"project": project, "form": form, "nav_section": "traces", "page": None,
               "saved_views": saved_views_for(request.user, project, page="traces")}
    if not form.is_valid():
        return render(request, "web/traces.html", context, status=400)
    data = form.cleaned_data
    conversation = None
    if data["conversation"] is not None:
        conversation = Conversation.objects.filter(project=project, pk=data["conversation"]).only(
            "id", "title", "external_id").first()
        if conversation is None:
            raise Http404("no such conversation")
    roots = trace_roots(
        project, service=data["service"].strip(), status=data["status"], has_errors=data["has_errors"],
        min_ms=data["min_ms"], max_ms=data["max_ms"], since=form.since_datetime(), until=form.until_datetime(),
        q=data["q"].strip(), conversation_id=conversation.pk if conversation else None,
        scored=form.score_match(),
    )
    try:
        page = trace_page(roots, after=data["after"], before=data["before"])
    except BadCursor:
        form.add_error(None, "That page link is not valid any more; start from the first page.")
        return render(request, "web/traces.html", context, status=400)
    filters = request.GET.copy()
    for key in ("after", "before"):
        filters.pop(key, None)
    context.update(page=page, filters=filters.urlencode(), conversation=conversation)
    return render(request, "web/traces.html", context)


@project_page
def trace_detail(request: HttpRequest, project: Project, trace_id: str) -> HttpResponse:
    view = waterfall(project, trace_id)
    scores = scores_of_trace(project, trace_id)
    if view is None:
        if not scores:
            raise Http404("no such trace")
        view = Waterfall(trace_id=trace_id, rows=[], duration_ms=0.0, truncated=False)  # scored, no span yet
    conversation_ids = {row.span.conversation_id for row in view.rows if row.span.conversation_id}
    conversations = list(
        Conversation.objects.filter(project=project, pk__in=conversation_ids).only("id", "title", "external_id")[:5]
    )
    resources = []  # the distinct resources of the trace's spans (usually one)
    for row in view.rows:
        if row.span.resource not in resources:
            resources.append(row.span.resource)
        if len(resources) >= 5:
            break
    logs = trace_logs(project, trace_id, {row.span.span_id for row in view.rows})
    for row in view.rows:
        row.span.logs = logs.by_span.get(row.span.span_id, ())
    return render(
        request,
        "web/trace.html",
        {"project": project, "nav_section": "traces", "waterfall": view, "conversations": conversations,
         "resources": resources, "trace_logs": logs, "trace_scores": scores},
    )
