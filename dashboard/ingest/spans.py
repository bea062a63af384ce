"""Store decoded OTLP spans and link them to conversations and tool executions.

This is the hot write path of ``POST /v1/traces``, so it is built for throughput:
the rows are plain tuples (no model instance per span), JSON columns are encoded
once (a resource once per resource, not once per span), and the whole batch goes
in one transaction (shared with the other batches the process stores at that
moment: ``group_commit``; those of the same project are stored as one batch) as
one bulk insert that ignores rows already stored, so a retried batch stores no
duplicate:

- SQLite: ``executemany`` of ``INSERT ... ON CONFLICT DO NOTHING``;
- PostgreSQL: ``COPY`` straight into the table, and only when that meets a
  stored span (a retried batch) ``COPY`` into a temp staging table then one
  ``INSERT ... SELECT ... ON CONFLICT DO NOTHING``
  (``insert_values_ignoring_conflicts``, shared with the records path).

The number of queries is constant in the batch size: one for the traces no span
names, at most three for conversations (find, create the missing ones in bulk,
read their ids), one for tool executions when spans name a tool call, the insert,
one recording the traces linked, and two more only when a tool execution gets
linked (per 500 distinct ids, to stay under parameter limits).

Linking, from span attributes read through the conventions table
(``observatory.conventions``: GenAI semantic conventions, OpenInference, OpenLLMetry;
span attributes first, then resource attributes): the conversation key names the
conversation (created when it does not exist yet); a span without one takes the
conversation of the tool execution with its tool call id, else of another span of
its trace in the batch, else the conversation recorded for its trace
(``TraceConversation``, written by every batch and derivation that links a span).
Tool name, tool call id and operation are copied to columns,
and a ToolExecution already stored with that tool_call_id gets this span (the
record-arrives-later order is the link task's job). Spans still unlinked, and the
traces that a span of this batch just linked, go into the derivation note as trace
ids: the outbox links the rest of each trace as soon as one of its spans names the
conversation, in whichever order the batches come (BatchSpanProcessor exports
children before their parent). The same note makes the derivation turn model-call
and tool spans into rounds, messages and tool executions (observatory.derive.passes.span_rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Sequence

from django.db import IntegrityError, connection
from django.utils import timezone as dj_timezone

from dashboard.accounts.models import Project
from dashboard.observatory.conventions import KEYS as CONVENTION_KEYS
from dashboard.observatory.conventions import is_genai, link_facts
from dashboard.observatory.models import Conversation, Span, ToolExecution
from dashboard.observatory.derive.notes import derivations_enqueue
from dashboard.observatory.rows import (
    conversations_get_or_create,
    insert_values_ignoring_conflicts,
    json_text,
    read_together,
)
from dashboard.observatory.trace_links import trace_conversations_find, trace_conversations_record, trace_conversations_sql

from .common import IngestError, KeyCheck, key_check_outcome, key_checks_sql
from .group_commit import Pending, Together, Unmerged, first_try, pending_store
from .otlp import TRUNCATION_MARKER, SpanRow

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
    "operation",
    "links",
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
_OPERATION_MAX = _max_length(Span, "operation")


@dataclass(frozen=True, slots=True)
class StoredSpans:
    """What one batch did: rows inserted, rows already stored (a retried batch)."""

    inserted: int
    duplicates: int
    conversation_ids: tuple[int, ...]
    linked_tool_executions: int


def spans_store(*, project: Project, spans: Sequence[SpanRow]) -> StoredSpans:
    """Store one decoded batch for ``project`` in one (group) transaction.

    Returns after the commit, so an acknowledged span is never lost. The caller
    wraps it in ``database_errors_refused`` to answer 503 when the database is
    busy (500 when it is broken); nothing is half-stored then (the transaction
    rolls back).
    """
    return pending_store(spans_prepare(project=project, spans=spans))


def spans_prepare(*, project: Project, spans: Sequence[SpanRow], key_check: KeyCheck | None = None
                  ) -> Pending[StoredSpans]:
    """What ``spans_store`` does before its transaction: the rows and the links; the
    write itself is left to run in a group transaction (``pending_store``, or
    ``pending_store_all`` with other requests), as one with the group's other span
    batches of the project (``Together``). ``key_check``: the sender's key, checked
    by the write before it stores anything (``authenticate_deferred``)."""
    if not spans:
        return Pending(None, 0, StoredSpans(0, 0, (), 0))
    resource_keys: dict[int, bool] = {}  # id(resource) -> holds a key of the conventions table
    links = [_links(span, resource_keys) for span in spans]
    # Built before the transaction: on SQLite it holds the write lock, so the
    # JSON encoding should not happen while the other workers wait for it.
    received_at = dj_timezone.now()
    part = _Batch(project, spans, links, _rows(project.pk, spans, links, received_at), received_at, key_check)
    return Pending(lambda: _spans_write([part])[0], len(part.rows), StoredSpans(0, 0, (), 0),
                   Together(("spans", project.pk), part, _spans_write))


@dataclass(frozen=True, slots=True)
class _Batch:
    """One request's spans, prepared: their links and rows (but the conversation)."""

    project: Project
    spans: Sequence[SpanRow]
    links: list[tuple[str, str, str, str]]
    rows: list[tuple[Any, ...]]
    received_at: datetime
    key_check: KeyCheck | None


def _spans_write(batches: list[_Batch]) -> list[StoredSpans]:
    """The writes of one or more batches of one project, inside the (group)
    transaction, as one: one read of their keys and traces, one insert, one
    derivation note. May run twice (see ingest.group_commit); raises ``Unmerged``
    when some of several batches' spans were stored already (how many of each is
    not known) or a key failed its check (the batches run alone: that key's are
    refused, 401, the others stored); a lone batch whose key fails raises its 401."""
    project = batches[0].project
    spans = [span for batch in batches for span in batch.spans]
    links = [link for batch in batches for link in batch.links]
    rows = [row for batch in batches for row in batch.rows]
    checks = list({batch.key_check.key_id: batch.key_check for batch in batches if batch.key_check}.values())
    stored, refused = _keys_and_traces(project, spans, links, checks)
    if refused is not None:
        if len(batches) > 1:
            raise Unmerged from refused
        raise refused
    by_key = _conversations_for(project, spans, links)
    executions = _tool_executions_for(project, links)
    conversations = _conversation_per_span(spans, links, by_key, executions, stored)
    try:
        inserted = _insert([row + (conversation,) for row, conversation in zip(rows, conversations)])
    except IntegrityError:
        if first_try():
            raise Unmerged from None  # a span stored already: again, alone, the long way
        raise
    if inserted != len(rows) and len(batches) > 1:
        raise Unmerged
    _record_traces(project, spans, conversations, stored)
    linked = _link_tool_executions(project, spans, links, executions)
    tool_minutes = {_aware(span.start_time_unix_nano) for span, (_, tool, _, _) in zip(spans, links) if tool}
    results: list[StoredSpans] = []
    traces: set[str] = set()
    start = 0
    for batch in batches:
        end = start + len(batch.spans)
        mine = conversations[start:end]
        # Traces to finish linking from the outbox: those a key just linked (their
        # children may be stored already), and, in a batch with GenAI spans, those
        # with a span still unlinked (its naming span may be in a concurrent batch).
        # A batch of plain spans notes nothing: a trace already linked was found
        # above, and a later naming span's note links its stored spans.
        genai_batch = any(key or tool or call_id or operation for key, tool, call_id, operation in batch.links)
        traces.update(
            span.trace_id for span, conversation, (key, _, _, _) in zip(batch.spans, mine, batch.links)
            if key or (conversation is None and genai_batch)
        )
        results.append(StoredSpans(
            inserted if len(batches) == 1 else len(batch.rows),
            len(batch.spans) - inserted if len(batches) == 1 else 0,
            tuple(sorted({conversation for conversation in mine if conversation is not None})),
            sum(1 for _, _, call_id, _ in batch.links if call_id in linked),
        ))
        start = end
    touched = sorted({conversation for conversation in conversations if conversation is not None})
    if inserted and (tool_minutes or traces or touched or any(_has_genai(span) for span in spans)):
        # One note for the batches (after commit the drainer is told; robust there:
        # never a 500 for a committed batch).
        derivations_enqueue(project_id=project.pk, conversation_ids=touched, minutes=tool_minutes,
                            trace_ids=sorted(traces), rows_from=min(batch.received_at for batch in batches))
    return results


# --- attributes -> links ------------------------------------------------------------


def _links(span: SpanRow, resource_keys: dict[int, bool]) -> tuple[str, str, str, str]:
    """(conversation key, tool name, tool call id, operation) of one span; "" when absent."""
    resource = span.resource
    has_keys = resource_keys.get(id(resource))
    if has_keys is None:
        has_keys = resource_keys[id(resource)] = not CONVENTION_KEYS.isdisjoint(resource)
    conversation, tool_name, tool_call_id, operation = link_facts(span.attributes, resource, has_keys)
    return (
        conversation[:_CONVERSATION_KEY_MAX],
        tool_name[:_TOOL_NAME_MAX],
        tool_call_id[:_TOOL_CALL_ID_MAX],
        operation[:_OPERATION_MAX],
    )


def _has_genai(span: SpanRow) -> bool:
    return is_genai(span.attributes, span.resource)


# --- conversations ------------------------------------------------------------------


def _conversations_for(
    project: Project, spans: Sequence[SpanRow], links: Sequence[tuple[str, str, str, str]]
) -> dict[str, int]:
    """Conversation id per conversation key, creating the missing ones in bulk."""
    bounds: dict[str, tuple[int, int]] = {}
    for span, (key, _, _, _) in zip(spans, links):
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
    links: Sequence[tuple[str, str, str, str]],
    by_key: dict[str, int],
    executions: dict[str, tuple[int, int, int | None]],
    stored: dict[str, int],
) -> list[int | None]:
    """The conversation of each span: by its key, else by the tool execution of
    its tool_call_id, else by another span of the same trace in this batch, else
    by the conversation recorded for its trace."""
    conversations: list[int | None] = []
    by_trace: dict[str, int] = dict(stored)
    for span, (key, _, call_id, _) in zip(spans, links):
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


def _keys_and_traces(
    project: Project, spans: Sequence[SpanRow], links: Sequence[tuple[str, str, str, str]], checks: list[KeyCheck]
) -> tuple[dict[str, int], IngestError | None]:
    """The senders' keys checked (the first refusal, if any) and, for the batch's
    traces that no span of the batch names, the conversation recorded for each
    (``TraceConversation``: one probe of its unique key a trace, none when every
    trace is named). Not bounded by time: a batch of plain spans notes nothing for
    the outbox, so a trace named days before is found here or not at all. On
    PostgreSQL the key and the first 500 traces are one round trip (two statements
    sent as one query)."""
    named = {span.trace_id for span, (key, _, call_id, _) in zip(spans, links) if key or call_id}
    unnamed = sorted({span.trace_id for span in spans} - named)
    queries = [key_checks_sql(checks)] if checks else []
    if unnamed:
        queries.append(trace_conversations_sql(project_id=project.pk, trace_ids=unnamed[:_LOOKUP_CHUNK]))
    results = read_together(queries)
    refused = None
    if checks:
        found = {row[0]: row for row in results.pop(0)}
        for check in checks:  # each read: a failing key is forgotten, a good one's last use noted
            outcome = key_check_outcome(check, found.get(check.key_id), in_write=True)
            refused = refused or outcome
    stored: dict[str, int] = dict(results.pop(0)) if unnamed else {}
    for start in range(_LOOKUP_CHUNK, len(unnamed), _LOOKUP_CHUNK):
        stored.update(trace_conversations_find(project_id=project.pk, trace_ids=unnamed[start:start + _LOOKUP_CHUNK]))
    return stored, refused


def _record_traces(
    project: Project, spans: Sequence[SpanRow], conversations: Sequence[int | None], stored: dict[str, int]
) -> None:
    """Record the conversation of each trace this batch linked a span of (but those
    found recorded), for the later batches of plain spans of the trace."""
    trace_conversations_record(project_id=project.pk, links=(
        (span.trace_id, conversation, _aware(span.start_time_unix_nano))
        for span, conversation in zip(spans, conversations)
        if conversation is not None and span.trace_id not in stored
    ))


# --- rows ---------------------------------------------------------------------------


def _aware(unix_nano: int) -> datetime:
    return _EPOCH + timedelta(microseconds=unix_nano // 1000)


def _sqlite_time(unix_nano: int) -> str:
    # What Django's SQLite backend stores for an aware datetime: naive UTC text.
    return str(_EPOCH_NAIVE + timedelta(microseconds=unix_nano // 1000))


_dumps = json_text


def _rows(
    project_id: int,
    spans: Sequence[SpanRow],
    links: Sequence[tuple[str, str, str, str]],
    received_at: datetime,
) -> list[tuple[Any, ...]]:
    """The row of each span, in ``_FIELDS`` order but for the conversation column
    (last), which is only known inside the transaction."""
    time = _sqlite_time if connection.vendor == "sqlite" else _aware
    received = time(int(received_at.timestamp() * 1_000_000) * 1000)
    resource_json: dict[int, str] = {}  # id(resource dict) -> its JSON, once per resource
    rows = []
    for span, (conversation_key, tool_name, tool_call_id, operation) in zip(spans, links):
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
                operation,
                _dumps(span.links) if span.links else "[]",
                received,
                truncated,
            )
        )
    return rows


def _insert(rows: list[tuple[Any, ...]]) -> int:
    """Insert the rows, skipping (project, trace_id, span_id) already stored (on a
    group's first try, failing instead on PostgreSQL: ``first_try``)."""
    columns = [Span._meta.get_field(name).column for name in _FIELDS]
    return insert_values_ignoring_conflicts(Span, columns, rows, optimistic=first_try())


# --- tool executions ----------------------------------------------------------------


def _tool_executions_for(
    project: Project, links: Sequence[tuple[str, str, str, str]]
) -> dict[str, tuple[int, int, int | None]]:
    """tool_call_id -> (tool execution id, its conversation id, its linked span id)."""
    call_ids = sorted({call_id for _, _, call_id, _ in links if call_id})
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
    links: Sequence[tuple[str, str, str, str]],
    executions: dict[str, tuple[int, int, int | None]],
) -> set[str]:
    """Point the tool executions not linked yet at their span (just inserted); the
    tool call ids linked."""
    waiting = {call_id: execution[0] for call_id, execution in executions.items() if execution[2] is None}
    if not waiting:
        return set()
    wanted: dict[str, tuple[str, str]] = {}
    for span, (_, _, call_id, _) in zip(spans, links):
        if call_id in waiting:
            wanted.setdefault(call_id, (span.trace_id, span.span_id))
    trace_ids = sorted({trace_id for trace_id, _ in wanted.values()})
    # The spans were just inserted: their start times bound the query (on PostgreSQL,
    # to the day partitions that hold them).
    wanted_spans = set(wanted.values())
    starts = [_aware(span.start_time_unix_nano) for span in spans if (span.trace_id, span.span_id) in wanted_spans]
    span_pks: dict[tuple[str, str], int] = {}
    for start in range(0, len(trace_ids), _LOOKUP_CHUNK):
        span_pks.update(
            ((trace_id, span_id), pk)
            for pk, trace_id, span_id in Span.objects.filter(
                project=project, trace_id__in=trace_ids[start : start + _LOOKUP_CHUNK],
                start_time__gte=min(starts), start_time__lte=max(starts),
            ).values_list("id", "trace_id", "span_id")
        )
    span_attname = ToolExecution._meta.get_field("linked_span").attname
    updates = {}
    for call_id, ids in wanted.items():
        pk = span_pks.get(ids)
        if pk is not None:
            execution = ToolExecution(id=waiting[call_id])
            setattr(execution, span_attname, pk)
            updates[call_id] = execution
    ToolExecution.objects.bulk_update(list(updates.values()), ["linked_span"])
    return set(updates)
