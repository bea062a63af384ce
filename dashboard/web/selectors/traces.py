"""Traces: the list (one row per trace, its root span, keyset paged) and a trace
as a waterfall: its spans ordered as a tree (parent before children, siblings by
start time), each with its offset and width in percent of the trace."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Optional

from django.db.models import BooleanField, Case, Count, Exists, OuterRef, Q, QuerySet, Value, When

from dashboard.accounts.models import Project
from dashboard.judging.selectors import ScoreMatch, traces_scored
from dashboard.observatory.models import Conversation, Span
from dashboard.observatory.selectors import trace_spans

from .conversations import Cursor, _beyond

TRACE_PAGE_SIZE = 50
TRACE_SKEW = timedelta(hours=1)  # a span of a trace may start this long before its root
TRACE_SPAN_LIMIT = timedelta(days=1)  # ... and this long after (the trace filters look no further)
SPAN_KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
STATUS_CODES = {"unset": 0, "ok": 1, "error": 2}
ROOT_FIELDS = ("id", "project", "trace_id", "span_id", "name", "kind", "start_time", "duration_ms", "status_code",
               "service_name", "conversation_id", "operation")


@dataclass
class TraceRow:
    root: Span
    spans: int = 0
    errors: int = 0
    conversation: Optional[Conversation] = None


@dataclass
class TracePage:
    rows: list[TraceRow] = field(default_factory=list)
    next_cursor: Optional[str] = None
    prev_cursor: Optional[str] = None
    is_first: bool = True


def trace_roots(
    project: Project, *, service: str = "", status: str = "", has_errors: bool = False,
    min_ms: Optional[float] = None, max_ms: Optional[float] = None, since: Optional[datetime] = None,
    until: Optional[datetime] = None, q: str = "", conversation_id: Optional[int] = None,
    scored: Optional[ScoreMatch] = None,
) -> QuerySet[Span]:
    """The root spans (one per trace) of the project matching the filters, unordered.
    Filters on the root ride the partial span_project_roots index; ``has_errors``
    looks for a failed span of each candidate trace in the partial span_trace_errors
    index (failed spans only), and ``q`` at every span of it through the unique
    (project, trace_id, …) index, per candidate, while the list walks the roots."""
    qs = Span.objects.filter(project=project, parent_span_id="")
    if service:
        qs = qs.filter(service_name=service)
    if status:
        qs = qs.filter(status_code=STATUS_CODES[status])
    if min_ms is not None:
        qs = qs.filter(duration_ms__gt=min_ms)
    if max_ms is not None:
        qs = qs.filter(duration_ms__lt=max_ms)
    if since is not None:
        qs = qs.filter(start_time__gte=since)
    if until is not None:
        qs = qs.filter(start_time__lt=until)
    # A trace's spans start within its root's run, give or take clock skew: looking only
    # from an hour before the root to a day after lets PostgreSQL's partitioned spans be
    # searched in the root's day or two, not in every day. Each test stays a per-root
    # subquery (CASE WHEN EXISTS): as a semi-join PostgreSQL would read every span of
    # the project first, where the list needs a few hundred roots checked in order.
    same_trace = Span.objects.filter(
        project=project, trace_id=OuterRef("trace_id"),
        start_time__gte=OuterRef("start_time") - TRACE_SKEW, start_time__lt=OuterRef("start_time") + TRACE_SPAN_LIMIT,
    )
    if has_errors:
        qs = qs.filter(_per_root(same_trace.filter(status_code=2)))
    if q:
        qs = qs.filter(_per_root(same_trace.filter(name__icontains=q)))
    if scored:
        qs = qs.filter(_per_root(*traces_scored(project, scored)))
    if conversation_id is not None:
        # The conversation's traces (span_conversation_time), whichever span names it, read
        # first: as a subquery PostgreSQL would walk every root of the project testing each.
        qs = qs.filter(trace_id__in=sorted(set(
            Span.objects.filter(conversation_id=conversation_id).values_list("trace_id", flat=True)
        )))
    return qs


def _per_root(*rows: QuerySet[Any]) -> Case:
    """True when one of the subqueries finds a row (each tested per root, in order)."""
    return Case(*(When(Exists(found), then=Value(True)) for found in rows), default=Value(False),
                output_field=BooleanField())


def trace_page(qs: QuerySet[Span], *, after: str = "", before: str = "",
               page_size: Optional[int] = None) -> TracePage:
    """One page of traces, newest root first, after or before a cursor (BadCursor
    for one we did not make); three queries whatever the page holds."""
    page_size = page_size or TRACE_PAGE_SIZE
    qs = qs.only(*ROOT_FIELDS)
    order = ("-start_time", "-id")
    if before:
        rows = list(qs.filter(_beyond("start_time", Cursor.decode(before), forward=True))
                    .order_by("start_time", "id")[: page_size + 1])
        more_before = len(rows) > page_size
        rows = list(reversed(rows[:page_size]))
        page = TracePage(next_cursor=_cursor(rows[-1]) if rows else None,
                         prev_cursor=_cursor(rows[0]) if rows and more_before else None, is_first=not more_before)
    else:
        if after:
            qs = qs.filter(_beyond("start_time", Cursor.decode(after), forward=False))
        rows = list(qs.order_by(*order)[: page_size + 1])
        more = len(rows) > page_size
        rows = rows[:page_size]
        page = TracePage(next_cursor=_cursor(rows[-1]) if rows and more else None,
                         prev_cursor=_cursor(rows[0]) if rows and after else None, is_first=not after)
    page.rows = [TraceRow(root=root) for root in rows]
    if rows:
        project_id = rows[0].project_id
        counts = {
            row["trace_id"]: row
            for row in Span.objects.filter(project_id=project_id, trace_id__in={r.trace_id for r in rows})
            .values("trace_id").order_by().annotate(n=Count("id"), errors=Count("id", filter=Q(status_code=2)))
        }
        conversations = Conversation.objects.filter(
            project_id=project_id, pk__in={r.conversation_id for r in rows if r.conversation_id}
        ).only("id", "title", "external_id").in_bulk()
        for row in page.rows:
            found = counts.get(row.root.trace_id, {})
            row.spans, row.errors = found.get("n", 0), found.get("errors", 0)
            row.conversation = conversations.get(row.root.conversation_id)
    return page


def _cursor(span: Span) -> str:
    return Cursor(span.start_time, span.id).encode()


def kind_name(kind: Any) -> str:
    return SPAN_KINDS.get(kind, "unspecified")

SPAN_LIMIT = 1000
MAX_INDENT = 5  # deeper spans are drawn at this indent (the depth is still shown)


@dataclass
class WaterfallRow:
    span: Span
    depth: int
    offset_pct: float
    width_pct: float

    @property
    def indent(self) -> int:
        return min(self.depth, MAX_INDENT)

    @property
    def is_error(self) -> bool:
        return self.span.status_code == 2


@dataclass
class Waterfall:
    trace_id: str
    rows: list[WaterfallRow]
    duration_ms: float
    truncated: bool  # more than SPAN_LIMIT spans: only the first ones are drawn


def waterfall(project: Project, trace_id: str, *, with_details: bool = True) -> Optional[Waterfall]:
    """None when the project has no span of that trace."""
    spans = trace_spans(project, trace_id, limit=SPAN_LIMIT + 1, with_details=with_details)
    if not spans:
        return None
    truncated = len(spans) > SPAN_LIMIT
    spans = spans[:SPAN_LIMIT]
    start = min(s.start_time for s in spans)
    end = max(s.end_time for s in spans)
    total_ms = max((end - start).total_seconds() * 1000.0, 0.0)

    by_id = {s.span_id: s for s in spans}
    children: dict[str, list[Span]] = {}
    roots: list[Span] = []
    for s in spans:
        # A span whose parent is missing (not sent, or beyond the limit) is a root.
        if s.parent_span_id and s.parent_span_id in by_id and s.parent_span_id != s.span_id:
            children.setdefault(s.parent_span_id, []).append(s)
        else:
            roots.append(s)

    rows: list[WaterfallRow] = []
    seen: set[str] = set()

    def walk(root: Span) -> None:
        stack: list[tuple[Span, int]] = [(root, 0)]
        while stack:
            span, depth = stack.pop()
            if span.span_id in seen:  # a duplicate id or a parent cycle in hostile data
                continue
            seen.add(span.span_id)
            offset = ((span.start_time - start).total_seconds() * 1000.0 / total_ms * 100) if total_ms else 0.0
            offset = max(0.0, min(offset, 100.0))
            width = (span.duration_ms / total_ms * 100) if total_ms else 100.0
            rows.append(WaterfallRow(span, depth, offset, max(0.0, min(width, 100.0 - offset))))
            for child in reversed(children.get(span.span_id, [])):
                stack.append((child, depth + 1))

    for root in roots:
        walk(root)
    for span in spans:  # spans only reachable through a parent cycle: shown as roots
        if span.span_id not in seen:
            walk(span)
    return Waterfall(trace_id=trace_id, rows=rows, duration_ms=total_ms, truncated=truncated)
