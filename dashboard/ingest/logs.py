"""Store decoded OTLP log records and link them to their conversation.

The logs twin of ``spans.spans_store``: one transaction (shared with the other
requests the process stores at that moment: ``group_commit``), one bulk insert that
skips what is already stored (a retried batch: (project, trace_id, span_id,
record_hash) is unique, the hash taken over the record's content), acknowledged
only after the commit.

A record's conversation is, in order: its own ``gen_ai.conversation.id`` /
``session.id`` (attribute, else resource; created when new, as for spans); the
conversation of its span when that span is stored; else of another span of its
trace. A record whose span arrives later is linked by the link derivation
(``derivations.log_records_link``), which the span's batch enqueues through the
outbox like every other link.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Sequence

from django.utils import timezone as dj_timezone

from dashboard.accounts.models import Project
from dashboard.observatory.conventions import MESSAGE_EVENTS, text_of
from dashboard.observatory.derive.notes import derivations_enqueue
from dashboard.observatory.models import LogRecord, Span
from dashboard.observatory.rows import conversations_get_or_create, insert_ignoring_conflicts

from .group_commit import Pending, pending_store
from .otlp_logs import LogRow
from .spans import _CONVERSATION_KEY_MAX, _LOOKUP_CHUNK, _aware

_EVENT_NAME_MAX = LogRecord._meta.get_field("event_name").max_length
_SERVICE_MAX = LogRecord._meta.get_field("service_name").max_length


@dataclass(frozen=True, slots=True)
class StoredLogs:
    inserted: int
    duplicates: int
    linked: int  # records stored with a conversation


def record_hash(log: LogRow) -> str:
    """What makes a record the same record when a batch is sent again."""
    content = json.dumps(
        [log.time_unix_nano, log.observed_time_unix_nano, log.severity_number, log.severity_text,
         log.event_name, log.body, log.attributes, log.service_name],
        sort_keys=True, ensure_ascii=False, default=str,
    )
    return hashlib.sha256(content.encode("utf-8", "replace")).hexdigest()[:32]


def _time(unix_nano: int) -> datetime | None:
    return _aware(unix_nano) if unix_nano > 0 else None


def logs_store(*, project: Project, logs: Sequence[LogRow]) -> StoredLogs:
    """Store one decoded batch for ``project`` in one (group) transaction."""
    return pending_store(logs_prepare(project=project, logs=logs))


def logs_prepare(*, project: Project, logs: Sequence[LogRow]) -> Pending[StoredLogs]:
    """What ``logs_store`` does before its transaction (see ``spans.spans_prepare``)."""
    if not logs:
        return Pending(None, 0, StoredLogs(0, 0, 0))
    # The conversation a log names itself, by the same conventions table as spans.
    keys = [text_of("conversation", log.attributes, log.resource)[:_CONVERSATION_KEY_MAX] for log in logs]
    received_at = dj_timezone.now()
    rows = [
        {
            "project_id": project.pk,
            "trace_id": log.trace_id,
            "span_id": log.span_id,
            "record_hash": record_hash(log),
            "time": _time(log.time_unix_nano) or _time(log.observed_time_unix_nano),
            "observed_time": _time(log.observed_time_unix_nano),
            "severity_number": log.severity_number,
            "severity_text": log.severity_text,
            "event_name": log.event_name[:_EVENT_NAME_MAX],
            "body": log.body,
            "attributes": log.attributes,
            "resource": log.resource,
            "service_name": log.service_name[:_SERVICE_MAX],
            "conversation_key": key,
            "received_at": received_at,
            "truncated": log.truncated,
        }
        for log, key in zip(logs, keys)
    ]
    return Pending(lambda: _logs_write(project, logs, keys, rows), len(rows), StoredLogs(0, 0, 0))


def _logs_write(project: Project, logs: Sequence[LogRow], keys: Sequence[str], rows: list[dict[str, Any]]) -> StoredLogs:
    """The batch's writes, inside the (group) transaction: may run twice (see ingest.group_commit)."""
    by_key = _conversations_for(project, logs, keys)
    by_span, by_trace = _span_conversations(project, {log.trace_id for log in logs if log.trace_id})
    linked = 0
    for row, log, key in zip(rows, logs, keys):
        conversation = (
            by_key.get(key) if key else None
        ) or by_span.get((log.trace_id, log.span_id)) or by_trace.get(log.trace_id)
        row["conversation_id"] = conversation
        linked += conversation is not None
    inserted = insert_ignoring_conflicts(LogRecord, rows)
    # Message events (conventions.EVENT_RULES) of a conversation: its rounds take their
    # messages (derive.passes.log_messages), whichever of the span and the events came first.
    with_messages = {row["conversation_id"] for row in rows
                     if row["conversation_id"] is not None and row["event_name"] in MESSAGE_EVENTS and row["span_id"]}
    if with_messages:
        derivations_enqueue(project_id=project.pk, conversation_ids=with_messages, rows_from=rows[0]["received_at"])
    return StoredLogs(inserted, len(rows) - inserted, linked)


def _conversations_for(project: Project, logs: Sequence[LogRow], keys: Sequence[str]) -> dict[str, int]:
    seen: dict[str, tuple[datetime, datetime]] = {}
    for log, key in zip(logs, keys):
        if key:
            moment = _time(log.time_unix_nano) or _time(log.observed_time_unix_nano) or dj_timezone.now()
            low, high = seen.get(key, (moment, moment))
            seen[key] = (min(low, moment), max(high, moment))
    return conversations_get_or_create(project=project, first_seen=seen) if seen else {}


def _span_conversations(project: Project, trace_ids: set[str]) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
    """The conversation of each stored span of these traces that has one, and one
    conversation per trace (a record of the trace with no span of its own takes it)."""
    by_span: dict[tuple[str, str], int] = {}
    by_trace: dict[str, int] = {}
    traces = sorted(trace_ids)
    for start in range(0, len(traces), _LOOKUP_CHUNK):
        for trace_id, span_id, conversation_id in Span.objects.filter(
            project=project, trace_id__in=traces[start : start + _LOOKUP_CHUNK], conversation__isnull=False
        ).values_list("trace_id", "span_id", "conversation_id"):
            by_span[(trace_id, span_id)] = conversation_id
            by_trace.setdefault(trace_id, conversation_id)
    return by_span, by_trace

