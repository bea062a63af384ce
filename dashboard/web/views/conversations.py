from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render

from dashboard.accounts.models import Project
from dashboard.observatory.selectors import conversations_for_project

from ..access import project_page
from ..forms import CONVERSATION_SORTS, ConversationFilterForm
from ..selectors.conversations import SEARCH_WINDOW, BadCursor, conversation_page


def _list_context(request: HttpRequest, project: Project) -> tuple[dict, int]:
    form = ConversationFilterForm(request.GET)
    context = {"project": project, "form": form, "nav_section": "conversations", "page": None}
    if not form.is_valid():
        return context, 400
    data = form.cleaned_data
    qs = conversations_for_project(
        project,
        user_id=data["user"].strip(),
        model=data["model"].strip(),
        status=data["status"],
        has_errors=True if data["has_errors"] else None,  # an unticked box filters nothing
        tool=data["tool"].strip(),
        since=form.since_datetime(),
        until=form.until_datetime(),
    )
    try:
        page = conversation_page(
            qs, sort=data["sort"] or "-last_activity_at", after=data["after"], before=data["before"],
            q=data["q"].strip(),
        )
    except BadCursor:
        form.add_error(None, "That page link is not valid any more; start from the first page.")
        return context, 400
    filters = request.GET.copy()
    for key in ("after", "before"):
        filters.pop(key, None)
    context.update(page=page, filters=filters.urlencode(), sorts=CONVERSATION_SORTS,
                   search_window=SEARCH_WINDOW)
    return context, 200


@project_page
def conversation_list(request: HttpRequest, project: Project) -> HttpResponse:
    context, status = _list_context(request, project)
    return render(request, "web/conversations.html", context, status=status)


@project_page
def conversation_rows(request: HttpRequest, project: Project) -> HttpResponse:
    """The htmx partial: the table and pager only (polled on the first page)."""
    context, status = _list_context(request, project)
    if status != 200:
        return HttpResponseBadRequest("bad filter")
    return render(request, "web/partials/conversation_rows.html", context)
