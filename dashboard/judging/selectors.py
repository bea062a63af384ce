"""Reads of scores: the filters the API and the pages share."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Optional

from django.db.models import Count, Q, QuerySet

from dashboard.accounts.models import Project
from dashboard.observatory.models import Conversation

from .models import Score, ScoreTarget

# A score whose target is found (the same rule as Score.linked).
LINKED = (
    Q(conversation__isnull=False)
    & ~(Q(target=ScoreTarget.TOOL_CALL) & Q(tool_execution__isnull=True))
    & ~(Q(target=ScoreTarget.ROUND) & Q(round__isnull=True))
)


@dataclass(frozen=True)
class ScoreFilters:
    name: Optional[str] = None
    source: Optional[str] = None
    target: Optional[str] = None
    conversation_id: Optional[str] = None  # the agent's id (as sent, or of the conversation found)
    trace_id: Optional[str] = None
    span_id: Optional[str] = None
    tool_call_id: Optional[str] = None
    label: Optional[str] = None
    min_value: Optional[float] = None
    max_value: Optional[float] = None
    negative: Optional[bool] = None
    linked: Optional[bool] = None
    since: Optional[datetime] = None
    until: Optional[datetime] = None


def scores_filtered(project: Project, filters: ScoreFilters) -> QuerySet[Score]:
    """The project's scores that pass every filter given, with ``edit_count``."""
    rows = Score.objects.filter(project=project)
    exact = {name: getattr(filters, name) for name in ("name", "source", "target", "trace_id", "span_id", "label")}
    rows = rows.filter(**{name: value for name, value in exact.items() if value is not None})
    if filters.conversation_id is not None:
        found = Conversation.objects.filter(project=project, external_id=filters.conversation_id).first()
        rows = rows.filter(Q(conversation_key=filters.conversation_id) | Q(conversation=found) if found
                           else Q(conversation_key=filters.conversation_id))
    if filters.tool_call_id is not None:
        rows = rows.filter(Q(tool_call_id=filters.tool_call_id)
                           | Q(tool_execution__tool_call_id=filters.tool_call_id))
    if filters.min_value is not None:
        rows = rows.filter(value__gte=filters.min_value)
    if filters.max_value is not None:
        rows = rows.filter(value__lte=filters.max_value)
    if filters.negative is not None:
        rows = rows.filter(negative=filters.negative)
    if filters.linked is not None:
        rows = rows.filter(LINKED) if filters.linked else rows.exclude(LINKED)
    if filters.since is not None:
        rows = rows.filter(occurred_at__gte=filters.since)
    if filters.until is not None:
        rows = rows.filter(occurred_at__lt=filters.until)
    return rows.annotate(edit_count=Count("edits"))
