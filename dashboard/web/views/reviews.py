"""Review queues: made from the conversation list's filters, worked through one
conversation at a time.

A queue keeps the filters as the user gave them ("has errors, started in the last
24h": relative stays relative) and shows them in words with the time it was last
filled; its items are a snapshot of what matched then. "Add what the filters match
now" reads the same filters again as of now and adds the new matches after the others.

A reviewer asks for the next item (POST: it is claimed for them, so two reviewers
are never given the same one), scores it in place as on the timeline, and marks it
reviewed (or skipped) with one key, which hands them the next. The queue page shows
what is done, in review and left, and by whom. Another project's queue or item is a
404; viewers see the queues and their progress but do not review.
"""

from __future__ import annotations

from datetime import datetime

from django import forms
from django.contrib import messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from dashboard.accounts.models import Project
from dashboard.judging.models import ReviewItem, ReviewQueue, ReviewStatus
from dashboard.judging.selectors import queue_progress, scores_of_conversation
from dashboard.judging.services import (
    ReviewError,
    review_item_claim,
    review_item_finish,
    review_queue_create,
    review_queue_fill,
)
from dashboard.observatory import selectors as observatory
from dashboard.observatory.models import Conversation

from ..access import project_page
from ..forms import ConversationFilterForm
from ..selectors.scores import scores_attach
from ..services import saved_view_query
from .conversations import filtered_conversations
from .scores import may_judge, named_create, require_judge, widget_urls

ITEMS_SHOWN = 200


class QueueForm(forms.Form):
    name = forms.CharField(max_length=100, strip=True)
    description = forms.CharField(max_length=2000, required=False)
    query = forms.CharField(max_length=2000, required=False, strip=False)

    def clean(self) -> dict:
        data = super().clean()
        filters = ConversationFilterForm(QueryDict(data.get("query", "")))
        if not filters.is_valid():
            raise forms.ValidationError("These filters are not valid; fix them on the list first.")
        data["filters"] = filters
        data["query"] = saved_view_query(filters.data)
        if len(data["query"]) > ReviewQueue._meta.get_field("query").max_length:
            raise forms.ValidationError("These filters are too long to keep.")
        return data


def filters_described(query: str) -> str:
    """A queue's filters in words, as the user gave them (relative stays relative)."""
    filters = ConversationFilterForm(QueryDict(query))
    if not filters.is_valid():
        return "filters no longer valid"
    return ", ".join(filters.described()) or "all conversations"


def _queue(project: Project, pk: int) -> ReviewQueue:
    return get_object_or_404(ReviewQueue, project=project, pk=pk)


@project_page
def review_queue_list(request: HttpRequest, project: Project) -> HttpResponse:
    def create(data: dict) -> HttpResponse:
        now = timezone.now()
        queue = review_queue_create(project=project, name=data["name"], query=data["query"],
                                    description=data["description"], user=request.user,
                                    conversations=_listed(project, data["filters"], now), now=now)
        messages.success(request, f"Made the queue “{queue.name}”.")
        return redirect("web:review_queue", project_slug=project.slug, pk=queue.pk)

    form, status, made = named_create(request, project, QueueForm, create, ReviewError)
    if made is not None:
        return made
    queues = list(ReviewQueue.objects.filter(project=project)[:200])
    for queue in queues:
        queue.filters = filters_described(queue.query)  # type: ignore[attr-defined]
    return render(request, "web/review_queues.html", {
        "project": project, "nav_section": "review", "progress": queue_progress(queues), "form": form,
        "may_review": may_judge(request.user, project),
    }, status=status)


def _listed(project: Project, filters: ConversationFilterForm, now: datetime) -> QuerySet[Conversation]:
    """The list's conversations for these filters as of ``now``, in its order."""
    rows = filtered_conversations(filters, project, now)
    return observatory.ordered_conversations(rows, filters.cleaned_data["sort"] or "-last_activity_at")


@project_page
def review_queue(request: HttpRequest, project: Project, pk: int) -> HttpResponse:
    queue = _queue(project, pk)
    (progress,) = queue_progress([queue])
    items = list(ReviewItem.objects.filter(queue=queue).select_related("conversation", "done_by", "claimed_by")
                 .only("id", "position", "status", "claimed_until", "done_at", "conversation__id",
                       "conversation__title", "conversation__external_id", "done_by__username",
                       "claimed_by__username").order_by("position")[:ITEMS_SHOWN])
    queue.filters = filters_described(queue.query)  # type: ignore[attr-defined]
    list_url = reverse("web:conversations", args=[project.slug]) + (f"?{queue.query}" if queue.query else "")
    return render(request, "web/review_queue.html", {
        "project": project, "nav_section": "review", "queue": queue, "progress": progress, "items": items,
        "more": progress.total > len(items), "list_url": list_url, "now": timezone.now(), "may_review": may_judge(request.user, project),
    })


@require_POST
@project_page
def review_queue_refill(request: HttpRequest, project: Project, pk: int) -> HttpResponse:
    require_judge(request, project)
    queue = _queue(project, pk)
    filters = ConversationFilterForm(QueryDict(queue.query))
    if not filters.is_valid():
        messages.error(request, "This queue's filters are not valid any more.")
    else:
        now = timezone.now()
        added = review_queue_fill(queue=queue, conversations=_listed(project, filters, now), now=now)
        messages.success(request, f"Added {added} conversation{'s' if added != 1 else ''}.")
    return redirect("web:review_queue", project_slug=project.slug, pk=queue.pk)


@require_POST
@project_page
def review_next(request: HttpRequest, project: Project, pk: int) -> HttpResponse:
    require_judge(request, project)
    return _to_next(request, project, _queue(project, pk))


def _to_next(request: HttpRequest, project: Project, queue: ReviewQueue) -> HttpResponse:
    item = review_item_claim(queue=queue, user=request.user)
    if item is None:
        messages.success(request, f"Nothing left to review in “{queue.name}”.")
        return redirect("web:review_queue", project_slug=project.slug, pk=queue.pk)
    return redirect("web:review_item", project_slug=project.slug, pk=queue.pk, item_pk=item.pk)


@project_page
def review_item(request: HttpRequest, project: Project, pk: int, item_pk: int) -> HttpResponse:
    queue = _queue(project, pk)
    item = get_object_or_404(ReviewItem.objects.select_related("conversation", "claimed_by", "done_by"),
                             queue=queue, pk=item_pk)
    conversation = item.conversation
    view = observatory.conversation_timeline(conversation)
    conversation_scores = scores_attach(view, scores_of_conversation(conversation))
    (progress,) = queue_progress([queue])
    may = may_judge(request.user, project)
    return render(request, "web/review_item.html", {
        "project": project, "nav_section": "review", "queue": queue, "item": item, "progress": progress,
        "conversation": conversation, "timeline": view, "conversation_scores": conversation_scores,
        "may_judge": may, **widget_urls(project),
        "held_by_other": item.claimed_by_id not in (None, request.user.pk) and item.status == ReviewStatus.PENDING
        and item.claimed_until is not None and item.claimed_until > timezone.now(),
    })


@require_POST
@project_page
def review_item_done(request: HttpRequest, project: Project, pk: int, item_pk: int) -> HttpResponse:
    require_judge(request, project)
    queue = _queue(project, pk)
    item = get_object_or_404(ReviewItem, queue=queue, pk=item_pk)
    status = request.POST.get("status", ReviewStatus.DONE)
    try:
        review_item_finish(item=item, user=request.user, status=status)
    except ReviewError as exc:
        messages.error(request, str(exc))
    return _to_next(request, project, queue)
