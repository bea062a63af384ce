from __future__ import annotations

from datetime import datetime

from typing import Any, Iterator, Optional

from django.db.models import Case, Count, F, QuerySet, Sum, When
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render

from dashboard.accounts.models import Project
from dashboard.judging.selectors import conversations_scored, score_means_by_conversation
from dashboard.observatory.models import Conversation
from dashboard.observatory.selectors import conversation_text_match, conversations_for_project, ordered_conversations

from ..access import project_page
from ..forms import CONVERSATION_SORTS, ConversationFilterForm
from ..costs import usd_plain
from ..csv_export import CHUNK_ROWS, csv_response
from ..selectors.conversations import SEARCH_WINDOW, BadCursor, conversation_page
from ..selectors.saved_views import saved_views_for


def filtered_conversations(form: ConversationFilterForm, project: Project,
                           now: datetime | None = None) -> QuerySet[Conversation]:
    """The list's filters (a valid form) on the project's conversations: one
    reading for the page, its CSV export, a saved view and a review queue's fill
    (a relative start counted back from ``now``)."""
    data = form.cleaned_data
    listed = conversations_for_project(
        project,
        user_id=data["user"].strip(),
        model=data["model"].strip(),
        status=data["status"],
        has_errors=True if data["has_errors"] else None,  # an unticked box filters nothing
        tool=data["tool"].strip(),
        since=form.since_datetime(now),
        until=form.until_datetime(),
    )
    return conversations_scored(listed, form.score_match())


def _list_context(request: HttpRequest, project: Project) -> tuple[dict, int]:
    form = ConversationFilterForm(request.GET)
    context = {"project": project, "form": form, "nav_section": "conversations", "page": None,
               "saved_views": saved_views_for(request.user, project, page="conversations")}
    if not form.is_valid():
        return context, 400
    data = form.cleaned_data
    qs = filtered_conversations(form, project)
    try:
        page = conversation_page(
            qs, sort=data["sort"] or "-last_activity_at", after=data["after"], before=data["before"],
            q=data["q"].strip(), all_text=data["all_text"],
        )
    except BadCursor:
        form.add_error(None, "That page link is not valid any more; start from the first page.")
        return context, 400
    filters = request.GET.copy()
    for key in ("after", "before"):
        filters.pop(key, None)
    context.update(page=page, filters=filters.urlencode(), sorts=CONVERSATION_SORTS,
                   search_window=SEARCH_WINDOW, user_cost=_user_cost(qs, data["user"].strip()))
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


def _user_cost(qs: QuerySet[Conversation], user_id: str) -> Optional[dict[str, Any]]:
    """With a user filter, what that user's listed conversations cost: one
    aggregate over the (project, user_id) index (without one it would read the
    whole list, so the list shows none)."""
    if not user_id:
        return None
    totals = qs.aggregate(n=Count("id"), cost=Sum("cost_pico_usd"), priced=Count("cost_pico_usd"),
                          unpriced=Sum("unpriced_rounds"))
    return {"user": user_id, "conversations": totals["n"], "cost_pico_usd": totals["cost"] if totals["priced"] else None,
            "unpriced_rounds": totals["unpriced"] or 0}


def _chunks(rows: Iterator[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


EXPORT_COLUMNS = (
    "id", "external_id", "title", "user_id", "model", "status", "rounds", "tool_calls", "errors", "retries",
    "input_tokens", "output_tokens", "cost_pico_usd", "unpriced_rounds", "max_context_tokens", "compressions",
    "started_at", "last_activity_at",
)


@project_page
def conversation_export(request: HttpRequest, project: Project) -> HttpResponse:
    """The whole filtered list as CSV, in the list's order (not just a page); the
    text search looks through every listed conversation, not a window."""
    form = ConversationFilterForm(request.GET)
    if not form.is_valid():
        return HttpResponseBadRequest("bad filter")
    qs = filtered_conversations(form, project)
    q = form.cleaned_data["q"].strip()
    if q:
        qs = qs.filter(conversation_text_match(q, all_text=form.cleaned_data["all_text"]))
    # The title as the list shows it: a conversation known only from spans has no
    # first user message to take one from, and is shown by its external id.
    shown = qs.annotate(shown_title=Case(When(title="", then=F("external_id")), default=F("title")))
    columns = tuple("shown_title" if name == "title" else name for name in EXPORT_COLUMNS)
    rows = ordered_conversations(shown, form.cleaned_data["sort"] or "-last_activity_at").values_list(*columns)
    header = [("cost_usd" if name == "cost_pico_usd" else name) for name in EXPORT_COLUMNS] + ["scores"]
    cost_at = EXPORT_COLUMNS.index("cost_pico_usd")

    def lines() -> Any:
        for chunk in _chunks(rows.iterator(chunk_size=CHUNK_ROWS), CHUNK_ROWS):
            scores = score_means_by_conversation([row[0] for row in chunk])
            for row in chunk:
                yield row[:cost_at] + (usd_plain(row[cost_at]),) + row[cost_at + 1:] + (scores.get(row[0], ""),)

    return csv_response(f"conversations-{project.slug}.csv", header, lines())
