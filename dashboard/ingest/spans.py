"""Store decoded OTLP spans and link them to conversations and tool executions.

This is the hot write path of ``POST /v1/traces``, so it is built for throughput:
the rows are plain tuples (no model instance per span), JSON columns are encoded
once (a resource once per resource, not once per span), and the whole batch goes
in one transaction as one bulk insert that ignores rows already stored, so a
retried batch stores no duplicate:

- SQLite: ``executemany`` of ``INSERT ... ON CONFLICT DO NOTHING``;
- PostgreSQL: ``COPY`` straight into the table, and only when that meets a
  stored span (a retried batch) ``COPY`` into a temp staging table then one
  ``INSERT ... SELECT ... ON CONFLICT DO NOTHING``
  (``insert_values_ignoring_conflicts``, shared with the records path).

The number of queries is constant in the batch size: at most three for
conversations (find, create the missing ones in bulk, read their ids), one for
tool executions when spans name a tool call, the insert, and two more only when a
tool execution gets linked (per 500 distinct ids, to stay under parameter limits).

Linking, from span attributes (falling back to resource attributes):
``gen_ai.conversation.id`` or OpenInference ``session.id`` name the conversation
(created when it does not exist yet); a span without one takes the conversation
of the tool execution with its ``gen_ai.tool.call.id``, else of another span of
its trace in the batch. ``gen_ai.tool.name`` / ``gen_ai.tool.call.id`` are copied
to columns, and a ToolExecution already stored with that tool_call_id gets this
span (the record-arrives-later order is the link task's job: it finds spans by the
stored ``tool_call_id``). Token and model attributes feed the conversation totals:
``derivations_enqueue`` once per batch, only when the batch had GenAI spans.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Sequence

from django.db import connection, transaction
from django.utils import timezone as dj_timezone

from dashboard.accounts.models import Project
from dashboard.priority import yield_to_pages
from dashboard.observatory.models import Conversation, Span, ToolExecution
from dashboard.observatory.services import (
    conversations_get_or_create,
    derivations_enqueue,
    insert_values_ignoring_conflicts,
    json_text,
)

from .otlp import TRUNCATION_MARKER, SpanRow

CONVERSATION_KEYS = ("gen_ai.conversation.id", "session.id")
TOOL_NAME_KEY = "gen_ai.tool.name"
TOOL_CALL_ID_KEY = "gen_ai.tool.call.id"
# Attributes that make a span count for the derived conversation totals.
GENAI_KEYS = frozenset(
    {
        *CONVERSATION_KEYS,
        "gen_ai.request.model",
        "gen_ai.response.model",
        "llm.model_name",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "llm.token_count.prompt",
        "llm.token_count.completion",
        "llm.token_count.total",
    }
)
_LOOKUP_CHUNK = 500  # ids per IN (...) query; stays under every backend's limit

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_EPOCH_NAIVE = datetime(1970, 1, 1)

# Columns written, in order; the tuples built below follow it.
_FIELDS = (
    "project",
    "trace_id",
    "span_id",
    "parent_span_id",
    "name",
    "kind",
    "start_time",
    "end_time",
    "duration_ms",
    "status_code",
    "status_message",
    "service_name",
    "attributes",
    "events",
    "resource",
    "conversation_key",
    "tool_name",
    "tool_call_id",
    "received_at",
    "truncated",
    "conversation",
)


def _max_length(model: Any, name: str) -> int:
    return model._meta.get_field(name).max_length


_NAME_MAX = _max_length(Span, "name")
_SERVICE_MAX = _max_length(Span, "service_name")
_CONVERSATION_KEY_MAX = min(_max_length(Span, "conversation_key"), _max_length(Conversation, "external_id"))
_TOOL_NAME_MAX = _max_length(Span, "tool_name")
_TOOL_CALL_ID_MAX = _max_length(Span, "tool_call_id")


@dataclass(frozen=True, slots=True)
class StoredSpans:
    """What one batch did: rows inserted, rows already stored (a retried batch)."""

    inserted: int
    duplicates: int
    conversation_ids: tuple[int, ...]
    linked_tool_executions: int


def spans_store(*, project: Project, spans: Sequence[SpanRow]) -> StoredSpans:
    """Store one decoded batch for ``project`` in one transaction.

    Returns after the commit, so an acknowledged span is never lost. The caller
    wraps it in ``database_errors_as_busy`` to answer 503 when the database is
    locked; nothing is half-stored then (the transaction rolls back).
    """
    if not spans:
        return StoredSpans(0, 0, (), 0)
    links = [_links(span) for span in spans]
    # Built before the transaction: on SQLite it holds the write lock, so the
    # JSON encoding should not happen while the other workers wait for it.
    rows = _rows(project.pk, spans, links, dj_timezone.now())
    yield_to_pages()  # not inside the transaction: on SQLite it holds the write lock
    with transaction.atomic():
        by_key = _conversations_for(project, spans, links)
        executions = _tool_executions_for(project, links)
        conversations = _conversation_per_span(spans, links, by_key, executions)
        inserted = _insert([row + (conversation,) for row, conversation in zip(rows, conversations)])
        linked = _link_tool_executions(project, spans, links, executions)
        touched = tuple(sorted({conversation for conversation in conversations if conversation is not None}))
        tool_hours = sorted({_hour(span.start_time_unix_nano) for span, (_, tool, _) in zip(spans, links) if tool})
        if inserted and (tool_hours or any(_has_genai(span) for span in spans)):
            # Once per batch, after commit (robust there: never a 500 for a committed batch).
            derivations_enqueue(project_id=project.pk, conversation_ids=touched, hours=tool_hours)
    return StoredSpans(inserted, len(spans) - inserted, touched, linked)


# --- attributes -> links ------------------------------------------------------------


def _attribute(span: SpanRow, keys: Iterable[str]) -> Any:
    for source in (span.attributes, span.resource):
        for key in keys:
            value = source.get(key)
            if value not in (None, ""):
                return value
    return None


def _as_text(value: Any, limit: int) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value)
    return text[:limit]


def _links(span: SpanRow) -> tuple[str, str, str]:
    """(conversation key, tool name, tool call id) of one span; "" when absent."""
    return (
        _as_text(_attribute(span, CONVERSATION_KEYS), _CONVERSATION_KEY_MAX),
        _as_text(span.attributes.get(TOOL_NAME_KEY), _TOOL_NAME_MAX),
        _as_text(span.attributes.get(TOOL_CALL_ID_KEY), _TOOL_CALL_ID_MAX),
    )


def _has_genai(span: SpanRow) -> bool:
    return not GENAI_KEYS.isdisjoint(span.attributes) or not GENAI_KEYS.isdisjoint(span.resource)


# --- conversations ------------------------------------------------------------------


def _conversations_for(
    project: Project, spans: Sequence[SpanRow], links: Sequence[tuple[str, str, str]]
) -> dict[str, int]:
    """Conversation id per conversation key, creating the missing ones in bulk."""
    bounds: dict[str, tuple[int, int]] = {}
    for span, (key, _, _) in zip(spans, links):
        if key:
            low, high = bounds.get(key, (span.start_time_unix_nano, span.end_time_unix_nano))
            bounds[key] = (min(low, span.start_time_unix_nano), max(high, span.end_time_unix_nano))
    found: dict[str, int] = {}
    keys = list(bounds)
    for start in range(0, len(keys), _LOOKUP_CHUNK):
        found.update(
            conversations_get_or_create(
                project=project,
                first_seen={
                    key: (_aware(bounds[key][0]), _aware(max(bounds[key]))) for key in keys[start : start + _LOOKUP_CHUNK]
                },
            )
        )
    return found


def _conversation_per_span(
    spans: Sequence[SpanRow],
    links: Sequence[tuple[str, str, str]],
    by_key: dict[str, int],
    executions: dict[str, tuple[int, int, int | None]],
) -> list[int | None]:
    """The conversation of each span: by its key, else by the tool execution of
    its tool_call_id, else by another span of the same trace in this batch."""
    conversations: list[int | None] = []
    by_trace: dict[str, int] = {}
    for span, (key, _, call_id) in zip(spans, links):
        conversation = by_key.get(key) if key else None
        if conversation is None and call_id in executions:
            conversation = executions[call_id][1]
        if conversation is not None:
            by_trace.setdefault(span.trace_id, conversation)
        conversations.append(conversation)
    if by_trace:
        conversations = [
            by_trace.get(span.trace_id) if conversation is None else conversation
            for span, conversation in zip(spans, conversations)
        ]
    return conversations


# --- rows ---------------------------------------------------------------------------


def _aware(unix_nano: int) -> datetime:
    return _EPOCH + timedelta(microseconds=unix_nano // 1000)


def _hour(unix_nano: int) -> datetime:
    return _aware(unix_nano).replace(minute=0, second=0, microsecond=0)


def _sqlite_time(unix_nano: int) -> str:
    # What Django's SQLite backend stores for an aware datetime: naive UTC text.
    return str(_EPOCH_NAIVE + timedelta(microseconds=unix_nano // 1000))


_dumps = json_text


def _rows(
    project_id: int,
    spans: Sequence[SpanRow],
    links: Sequence[tuple[str, str, str]],
    received_at: datetime,
) -> list[tuple[Any, ...]]:
    """The row of each span, in ``_FIELDS`` order but for the conversation column
    (last), which is only known inside the transaction."""
    time = _sqlite_time if connection.vendor == "sqlite" else _aware
    received = time(int(received_at.timestamp() * 1_000_000) * 1000)
    resource_json: dict[int, str] = {}  # id(resource dict) -> its JSON, once per resource
    rows = []
    for span, (conversation_key, tool_name, tool_call_id) in zip(spans, links):
        resource = span.resource
        encoded_resource = resource_json.get(id(resource))
        if encoded_resource is None:
            encoded_resource = resource_json[id(resource)] = _dumps(resource)
        name = span.name
        truncated = span.truncated
        if len(name) > _NAME_MAX:
            name = name[: _NAME_MAX - len(TRUNCATION_MARKER)] + TRUNCATION_MARKER
            truncated = True
        start, end = span.start_time_unix_nano, span.end_time_unix_nano
        rows.append(
            (
                project_id,
                span.trace_id,
                span.span_id,
                span.parent_span_id,
                name,
                span.kind,
                time(start),
                time(end),
                max(end - start, 0) / 1e6,
                span.status_code,
                span.status_message,
                span.service_name[:_SERVICE_MAX],
                _dumps(span.attributes),
                _dumps(span.events) if span.events else "[]",
                encoded_resource,
                conversation_key,
                tool_name,
                tool_call_id,
                received,
                truncated,
            )
        )
    return rows


def _insert(rows: list[tuple[Any, ...]]) -> int:
    """Insert the rows, skipping (project, trace_id, span_id) already stored."""
    columns = [Span._meta.get_field(name).column for name in _FIELDS]
    return insert_values_ignoring_conflicts(Span, columns, rows)


# --- tool executions ----------------------------------------------------------------


def _tool_executions_for(
    project: Project, links: Sequence[tuple[str, str, str]]
) -> dict[str, tuple[int, int, int | None]]:
    """tool_call_id -> (tool execution id, its conversation id, its linked span id)."""
    call_ids = sorted({call_id for _, _, call_id in links if call_id})
    found: dict[str, tuple[int, int, int | None]] = {}
    for start in range(0, len(call_ids), _LOOKUP_CHUNK):
        for execution_id, call_id, conversation_id, span_pk in ToolExecution.objects.filter(
            project=project, tool_call_id__in=call_ids[start : start + _LOOKUP_CHUNK]
        ).values_list("id", "tool_call_id", "conversation_id", "linked_span_id"):
            found[call_id] = (execution_id, conversation_id, span_pk)
    return found


def _link_tool_executions(
    project: Project,
    spans: Sequence[SpanRow],
    links: Sequence[tuple[str, str, str]],
    executions: dict[str, tuple[int, int, int | None]],
) -> int:
    """Point the tool executions not linked yet at their span (just inserted)."""
    waiting = {call_id: execution[0] for call_id, execution in executions.items() if execution[2] is None}
    if not waiting:
        return 0
    wanted = {call_id: (span.trace_id, span.span_id) for span, (_, _, call_id) in zip(spans, links) if call_id in waiting}
    trace_ids = sorted({trace_id for trace_id, _ in wanted.values()})
    span_pks: dict[tuple[str, str], int] = {}
    for start in range(0, len(trace_ids), _LOOKUP_CHUNK):
        span_pks.update(
            ((trace_id, span_id), pk)
            for pk, trace_id, span_id in Span.objects.filter(
                project=project, trace_id__in=trace_ids[start : start + _LOOKUP_CHUNK]
            ).values_list("id", "trace_id", "span_id")
        )
    span_attname = ToolExecution._meta.get_field("linked_span").attname
    updates = []
    for call_id, ids in wanted.items():
        pk = span_pks.get(ids)
        if pk is not None:
            execution = ToolExecution(id=waiting[call_id])
            setattr(execution, span_attname, pk)
            updates.append(execution)
    ToolExecution.objects.bulk_update(updates, ["linked_span"])
    return len(updates)
