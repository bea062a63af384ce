"""Two conversations of the project side by side. Deep-linkable as
``compare/?a=<id>&b=<id>``; the conversation list's "Compare selected" sends the
two ticked rows as ``c`` and is redirected there."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from dashboard.accounts.models import Project
from dashboard.judging.selectors import scores_compared

from ..access import project_page
from ..selectors.compare import compare
from ..selectors.timeline import conversation_for
from .timeline import _page_number as page_number  # one parse of ?page= for the paged pages


def _pk(text: str) -> int | None:
    return int(text) if text.isdigit() and len(text) <= 18 else None


@project_page
def compare_conversations(request: HttpRequest, project: Project) -> HttpResponse:
    picked = request.GET.getlist("c")
    if picked:
        ids = [_pk(text) for text in picked]
        if len(ids) != 2 or None in ids or ids[0] == ids[1]:
            return _refuse(request, project, "Tick exactly two different conversations to compare.")
        return redirect(reverse("web:compare", args=[project.slug]) + f"?a={ids[0]}&b={ids[1]}")
    a, b = _pk(request.GET.get("a", "")), _pk(request.GET.get("b", ""))
    if a is None or b is None:
        return _refuse(request, project, "Name two conversations: ?a=<id>&b=<id>.")
    # Another project's conversation (or none) is a 404, as on its own page.
    first, second = conversation_for(project, a), conversation_for(project, b)
    if a == b:  # as the list refuses one row ticked twice: a conversation equals itself
        return _refuse(request, project, "Name two different conversations: a and b are the same one.")
    comparison = compare(first, second, page=page_number(request))
    if comparison.page > 1 and not comparison.rows:
        raise Http404("no such page of rounds")
    return render(request, "web/compare.html", {
        "project": project, "nav_section": "conversations", "cmp": comparison,
        "scores": scores_compared(first, second),
    })


def _refuse(request: HttpRequest, project: Project, problem: str) -> HttpResponse:
    return render(request, "web/compare.html", {"project": project, "nav_section": "conversations",
                                                "problem": problem}, status=400)
