"""The conversation list page: keyset paging and windowed text search over the
domain's filtered list (``observatory.selectors.conversations_for_project``).

Keyset paging (``after`` / ``before`` a (sort value, id) cursor) keeps every page as
fast as the first on 100k+ rows: the database walks the (project, sort column)
index from the cursor and stops at PAGE_SIZE + 1 rows. No OFFSET, no COUNT.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Optional

from django.db.models import Q, QuerySet

from dashboard.observatory.models import Conversation
from dashboard.observatory.selectors import conversation_text_match, ordered_conversations

PAGE_SIZE = 50
# Conversations a text search looks through per page (see _search_page).
SEARCH_WINDOW = 2_000
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
LIST_FIELDS = (
    "id", "external_id", "title", "user_id", "model", "status", "started_at", "last_activity_at",
    "rounds", "tool_calls", "errors", "retries", "input_tokens", "output_tokens",
    "max_context_tokens", "compressions", "has_errors", "cost_pico_usd", "unpriced_rounds",
)


class BadCursor(ValueError):
    """A cursor that this server did not make."""


@dataclass(frozen=True)
class Cursor:
    value: datetime
    id: int

    def encode(self) -> str:
        micros = (self.value - EPOCH) // timedelta(microseconds=1)  # exact, unlike float
        return f"{micros}.{self.id}"

    @classmethod
    def decode(cls, text: str) -> "Cursor":
        try:
            micros_text, id_text = text.split(".", 1)
            micros, row_id = int(micros_text), int(id_text)
            value = EPOCH + timedelta(microseconds=micros)
        except (ValueError, OverflowError, OSError):
            raise BadCursor("malformed cursor") from None
        if row_id < 0:
            raise BadCursor("malformed cursor")
        return cls(value, row_id)


@dataclass(frozen=True)
class ConversationPage:
    rows: list[Conversation]
    next_cursor: Optional[str]  # rows after the last one shown
    prev_cursor: Optional[str]  # rows before the first one shown
    is_first: bool
    # Text search scans a bounded window of conversations per page; when the window
    # ran out before the page filled, the search continues from here on request.
    searched_until: Optional[datetime] = None


def conversation_page(
    qs: QuerySet[Conversation],
    *,
    sort: str = "-last_activity_at",
    after: str = "",
    before: str = "",
    q: str = "",
    all_text: bool = False,
    page_size: int = PAGE_SIZE,
) -> ConversationPage:
    """One page of ``qs`` in ``sort`` order (one of the domain's CONVERSATION_ORDERS on
    a date column: the cursor holds a datetime), after or before a cursor,
    optionally searching text ``q`` (in user and assistant text; with ``all_text``
    also in system and tool text). Raises BadCursor for a cursor we did not make."""
    field = sort.lstrip("-")
    descending = sort.startswith("-")
    qs = qs.only(*LIST_FIELDS)
    if q:
        return _search_page(qs, q, field=field, sort=sort, descending=descending, after=after,
                            page_size=page_size, all_text=all_text)

    if before:
        cursor = Cursor.decode(before)
        # Walk backwards from the cursor, then flip to display order.
        qs = qs.filter(_beyond(field, cursor, forward=descending))
        reverse_sort = field if descending else f"-{field}"
        rows = list(ordered_conversations(qs, reverse_sort)[: page_size + 1])
        has_more_before = len(rows) > page_size
        rows = list(reversed(rows[:page_size]))
        return ConversationPage(
            rows=rows,
            next_cursor=_cursor_of(rows[-1], field) if rows else None,
            prev_cursor=_cursor_of(rows[0], field) if rows and has_more_before else None,
            is_first=not has_more_before,
        )

    if after:
        cursor = Cursor.decode(after)
        qs = qs.filter(_beyond(field, cursor, forward=not descending))
    rows = list(ordered_conversations(qs, sort)[: page_size + 1])
    has_more = len(rows) > page_size
    rows = rows[:page_size]
    return ConversationPage(
        rows=rows,
        next_cursor=_cursor_of(rows[-1], field) if rows and has_more else None,
        prev_cursor=_cursor_of(rows[0], field) if rows and after else None,
        is_first=not after,
    )


def _search_page(
    qs: QuerySet[Conversation], q: str, *, field: str, sort: str, descending: bool, after: str, page_size: int,
    all_text: bool = False,
) -> ConversationPage:
    """Text search over at most SEARCH_WINDOW conversations (in list order, from the
    cursor): a rare term costs one bounded scan per page instead of a scan of every
    conversation's texts. Paging forward only."""
    if after:
        qs = qs.filter(_beyond(field, Cursor.decode(after), forward=not descending))
    window = ordered_conversations(qs, sort)
    window_ids = window.values("id")[:SEARCH_WINDOW]
    matches = qs.filter(id__in=window_ids).filter(conversation_text_match(q, all_text=all_text))
    rows = list(ordered_conversations(matches, sort)[: page_size + 1])
    if len(rows) > page_size:
        rows = rows[:page_size]
        return ConversationPage(rows=rows, next_cursor=_cursor_of(rows[-1], field), prev_cursor=None,
                                is_first=not after)
    # The window may have ended before the page filled: continue after its last row.
    last = list(window.only("id", field)[SEARCH_WINDOW - 1: SEARCH_WINDOW])
    if last:
        return ConversationPage(rows=rows, next_cursor=_cursor_of(last[0], field), prev_cursor=None,
                                is_first=not after, searched_until=getattr(last[0], field))
    return ConversationPage(rows=rows, next_cursor=None, prev_cursor=None, is_first=not after)


def _beyond(field: str, cursor: Cursor, *, forward: bool) -> Q:
    """Rows strictly after the cursor in (field, id) order: ascending when forward.

    The leading bound (field >= / <= the cursor's value) says the same as the OR
    but is what an index on (project, field) can start its scan from: without it
    PostgreSQL reads the list from its first row and filters up to the cursor."""
    op = "gt" if forward else "lt"
    return Q(**{f"{field}__{op}e": cursor.value}) & (
        Q(**{f"{field}__{op}": cursor.value}) | Q(**{field: cursor.value, f"id__{op}": cursor.id})
    )


def _cursor_of(row: Any, field: str) -> str:
    return Cursor(getattr(row, field), row.id).encode()
