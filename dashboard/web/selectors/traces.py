"""A trace as a waterfall: its spans ordered as a tree (parent before children,
siblings by start time), each with its offset and width in percent of the trace."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from dashboard.accounts.models import Project
from dashboard.observatory.models import Span
from dashboard.observatory.selectors import trace_spans

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
