"""The conversation of each trace: what ingest looks up for a batch's unnamed
traces (``TraceConversation``), recorded by whatever links a span (ingest, the
link derivations)."""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Iterable, Sequence

from django.db import connections, router

from .models import TraceConversation

_TRACE_ROWS_PER_INSERT = 200  # 4 parameters a row: under SQLite's 999


def trace_conversations_record(*, project_id: int, links: Iterable[tuple[str, int, datetime]]) -> None:
    """Record, for each trace among ``links`` ((trace_id, conversation id, start of
    a span of the trace linked to it)), the first conversation given and the
    earliest start, unless the trace is recorded already (it keeps its
    conversation). In the caller's transaction (with the span links it records)."""
    traces: dict[str, tuple[int, datetime]] = {}
    for trace_id, conversation_id, started_at in links:
        first = traces.get(trace_id)
        if first is None or started_at < first[1]:
            traces[trace_id] = (first[0] if first else conversation_id, started_at)
    if not traces:
        return
    connection = connections[router.db_for_write(TraceConversation)]
    adapt = connection.ops.adapt_datetimefield_value
    rows = sorted(traces.items())
    with connection.cursor() as cursor:
        for start in range(0, len(rows), _TRACE_ROWS_PER_INSERT):
            chunk = rows[start:start + _TRACE_ROWS_PER_INSERT]
            cursor.execute(_trace_insert(len(chunk)), [
                value for trace_id, (conversation_id, started_at) in chunk
                for value in (project_id, trace_id, conversation_id, adapt(started_at))
            ])


def trace_conversations_find(*, project_id: int, trace_ids: Sequence[str]) -> dict[str, int]:
    """trace_id -> conversation id of the recorded ones among ``trace_ids`` (at most
    500: one probe of the unique key each)."""
    if not trace_ids:
        return {}
    connection = connections[router.db_for_read(TraceConversation)]
    with connection.cursor() as cursor:
        cursor.execute(*trace_conversations_sql(project_id=project_id, trace_ids=trace_ids))
        return dict(cursor.fetchall())


def trace_conversations_sql(*, project_id: int, trace_ids: Sequence[str]) -> tuple[str, list[object]]:
    """The query of ``trace_conversations_find`` (rows: trace_id, conversation id), to
    send with others (``rows.read_together``)."""
    return _trace_query(len(trace_ids)), [project_id, *trace_ids]


@functools.lru_cache(maxsize=64)
def _trace_insert(count: int) -> str:
    # Hand-written, as the span insert: run for every batch that links spans.
    return (
        f"INSERT INTO {TraceConversation._meta.db_table} (project_id, trace_id, conversation_id, started_at) "
        f"VALUES {', '.join(['(%s, %s, %s, %s)'] * count)} ON CONFLICT (project_id, trace_id) DO NOTHING"
    )


@functools.lru_cache(maxsize=64)
def _trace_query(count: int) -> str:
    return (
        f"SELECT trace_id, conversation_id FROM {TraceConversation._meta.db_table} "
        f"WHERE project_id = %s AND trace_id IN ({', '.join(['%s'] * count)})"
    )
