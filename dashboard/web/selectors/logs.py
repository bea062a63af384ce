"""OTLP log records for the pages: under their span on the trace page, the GenAI
messages in the conversation timeline, and the project's logs list (keyset paged).
Every query is scoped to the project (or its conversation) and bounded."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Exists, OuterRef, Q

from dashboard.accounts.models import Project
from dashboard.observatory.conventions import MESSAGE_EVENTS
from dashboard.observatory.models import Conversation, LogRecord, Round, Source

TRACE_LOG_LIMIT = 500
CONVERSATION_LOG_LIMIT = 200
PAGE_SIZE = 50
# The GenAI events whose body (or messages attributes) is what the model saw or said.
MESSAGE_ATTRIBUTES = ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions")
_COLUMNS = ("id", "trace_id", "span_id", "time", "severity_number", "severity_text", "event_name", "body",
            "attributes", "service_name", "truncated", "conversation_id")


@dataclass
class TraceLogs:
    by_span: dict[str, list[LogRecord]] = field(default_factory=dict)
    unattached: list[LogRecord] = field(default_factory=list)  # no span, or a span not shown
    truncated: bool = False


def trace_logs(project: Project, trace_id: str, span_ids: set[str]) -> TraceLogs:
    """The trace's log records by span id (one query, the unique index's prefix)."""
    rows = list(
        LogRecord.objects.filter(project=project, trace_id=trace_id).only(*_COLUMNS).order_by("time", "id")[
            : TRACE_LOG_LIMIT + 1
        ]
    )
    view = TraceLogs(truncated=len(rows) > TRACE_LOG_LIMIT)
    by_span: dict[str, list[LogRecord]] = defaultdict(list)
    for row in rows[:TRACE_LOG_LIMIT]:
        row.content = log_content(row)
        if row.span_id in span_ids:
            by_span[row.span_id].append(row)
        else:
            view.unattached.append(row)
    view.by_span = dict(by_span)
    return view


def log_content(row: LogRecord) -> Any:
    """What a log record says: its body, else its GenAI messages attributes."""
    if row.body not in (None, "", {}, []):
        return row.body
    messages = {key: row.attributes[key] for key in MESSAGE_ATTRIBUTES if key in (row.attributes or {})}
    return messages or None


def conversation_messages(conversation: Conversation) -> tuple[list[LogRecord], bool, int]:
    """The conversation's GenAI log events (gen_ai.*), oldest first, bounded, but those
    the rounds show: a message event (``conventions.EVENT_RULES``) of a span that has its
    round is that round's messages (the log_messages pass) and would say its text twice.
    Also returns whether there are more, and how many the rounds show."""
    events = LogRecord.objects.filter(conversation=conversation, event_name__startswith="gen_ai.")
    in_rounds = Q(event_name__in=sorted(MESSAGE_EVENTS)) & ~Q(span_id="") & Q(Exists(
        Round.objects.filter(project_id=OuterRef("project_id"), trace_id=OuterRef("trace_id"),
                             span_id=OuterRef("span_id"), source=Source.SPAN)))  # round_project_trace
    rows = list(events.exclude(in_rounds).only(*_COLUMNS).order_by("time", "id")[: CONVERSATION_LOG_LIMIT + 1])
    for row in rows:
        row.content = log_content(row)
    return rows[:CONVERSATION_LOG_LIMIT], len(rows) > CONVERSATION_LOG_LIMIT, events.filter(in_rounds).count()


def logs_page(project: Project, *, before_id: int | None = None, trace_id: str = "") -> tuple[list[LogRecord], int | None]:
    """One page of the project's log records, newest first (keyset on id)."""
    rows = LogRecord.objects.filter(project=project)
    if trace_id:
        rows = rows.filter(trace_id=trace_id)
    if before_id is not None:
        rows = rows.filter(id__lt=before_id)
    page = list(rows.only(*_COLUMNS).order_by("-id")[: PAGE_SIZE + 1])
    for row in page:
        row.content = log_content(row)
    next_before = page[PAGE_SIZE - 1].id if len(page) > PAGE_SIZE else None
    return page[:PAGE_SIZE], next_before
