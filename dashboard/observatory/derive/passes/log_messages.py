"""The log-message pass: the messages a model call sent as log events become its round's.

Some instrumentations put a model call's messages in log records tied to its span
rather than in the span's attributes (``conventions.EVENT_RULES``: openai-v2's
``gen_ai.user.message`` … ``gen_ai.choice`` with content capture in EVENT_ONLY mode, the
current ``gen_ai.client.inference.operation.details``). Here the round derived from that
span (``span_rows``) gets them: its user message, thoughts and final answer, and its
messages, read by the same rules (``span_rows.round_texts``), so the title, search and
the JSON export see them as they see a span's own.

Either order converges. Events before their span: the span's batch derives its round,
and this pass, run after ``span_rows``, finds the round received in the batch's window
(or in a trace linked late) and reads the span's events. Events after the span: log ingest
writes a note for the conversation its message events were linked to, and this pass finds
the events received in the window. Each time the round's log-born messages are made
again from all the span's events (``what="log-"`` record ids), so a late event takes its
place in time order and running it twice changes nothing. A span whose own attributes
carry messages keeps them (its events are not read).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from types import SimpleNamespace
from typing import Any, Iterable

from django.db import transaction
from django.db.models import Exists, OuterRef, Q

from dashboard.observatory import conventions
from dashboard.observatory.conventions import MESSAGE_EVENTS, MessageFact, event_messages
from dashboard.observatory.models import LogRecord, Message, Round, Source, Span
from dashboard.observatory.rows import insert_ignoring_conflicts, update_rows

from ..batch import Batch, Pass, received_window
from .span_rows import CHUNK, MESSAGES_PER_ROUND, message_row, round_texts

_EVENTS = sorted(MESSAGE_EVENTS)
_TEXT_FIELDS = ["user_message", "thoughts", "final_answer"]


def log_messages_derive(*, project_id: int, conversation_ids: Iterable[int], since: datetime | None = None,
                        until: datetime | None = None, trace_ids: Iterable[str] = ()) -> int:
    """Fill the derived rounds of these conversations whose spans' log events carry
    messages: those the window (``since``..``until``) brought, as rounds or as events,
    and those of ``trace_ids`` (linked late); without ``since``, every such round of
    the conversations (a rebuild). Returns the rounds written."""
    ids = sorted(set(conversation_ids))
    received = received_window(since, until)
    keys: set[tuple[str, str]] = set()
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start:start + CHUNK]
        # (the project too: with a window, logrecord_project_received finds what it brought,
        # not a long conversation's history of events)
        events = LogRecord.objects.filter(project_id=project_id, conversation_id__in=chunk,
                                          event_name__in=_EVENTS).exclude(span_id="")
        # the rounds whose span has message events (logrecord_unique): most spans have none
        rounds = Round.objects.filter(conversation_id__in=chunk, source=Source.SPAN).exclude(span_id="").filter(
            Exists(LogRecord.objects.filter(project_id=OuterRef("project_id"), trace_id=OuterRef("trace_id"),
                                            span_id=OuterRef("span_id"), event_name__in=_EVENTS)))
        if received is not None:
            events, rounds = events.filter(**received), rounds.filter(**received)
        keys |= set(events.values_list("trace_id", "span_id"))
        keys |= set(rounds.values_list("trace_id", "span_id"))
    traces = sorted({trace for trace in trace_ids if trace})
    for start in range(0, len(traces), CHUNK):
        keys |= set(Round.objects.filter(project_id=project_id, trace_id__in=traces[start:start + CHUNK],
                                         source=Source.SPAN, conversation_id__in=ids).filter(
            Exists(LogRecord.objects.filter(project_id=project_id, trace_id=OuterRef("trace_id"),
                                            span_id=OuterRef("span_id"), event_name__in=_EVENTS)))
            .values_list("trace_id", "span_id"))
    ordered = sorted(keys)
    written = 0
    for start in range(0, len(ordered), CHUNK):
        written += _fill(project_id, set(ordered[start:start + CHUNK]))
    return written


def _fill(project_id: int, keys: set[tuple[str, str]]) -> int:
    traces = sorted({trace for trace, _ in keys})
    events: dict[tuple[str, str], list[tuple[str, Any, Any]]] = defaultdict(list)
    for trace_id, span_id, name, body, attributes in (
        LogRecord.objects.filter(project_id=project_id, trace_id__in=traces, event_name__in=_EVENTS)
        .order_by("time", "id").values_list("trace_id", "span_id", "event_name", "body", "attributes")
    ):
        if (trace_id, span_id) in keys:
            events[(trace_id, span_id)].append((name, body, attributes))
    if not events:
        return 0
    spans = sorted({span for _, span in events})
    # A span that carries its messages itself keeps them.
    own = {
        (trace_id, span_id) for trace_id, span_id, attributes in Span.objects.filter(
            project_id=project_id, trace_id__in=sorted({trace for trace, _ in events}), span_id__in=spans
        ).values_list("trace_id", "span_id", "attributes")
        if conventions.messages_of("input_messages", attributes) or conventions.messages_of("output_messages", attributes)
    }
    rounds = [
        row for row in Round.objects.filter(project_id=project_id, source=Source.SPAN, trace_id__in=traces,
                                            span_id__in=spans)
        .values("id", "conversation_id", "trace_id", "span_id", "round_id", "index", "occurred_at", "received_at",
                *_TEXT_FIELDS)
        if (row["trace_id"], row["span_id"]) in events and (row["trace_id"], row["span_id"]) not in own
    ]
    if not rounds:
        return 0
    changed, messages, emptied = [], [], Q()
    for row in rounds:
        inputs: list[MessageFact] = []
        outputs: list[MessageFact] = []
        for name, body, attributes in events[(row["trace_id"], row["span_id"])]:
            found_in, found_out = event_messages(name, body, attributes)
            inputs += found_in
            outputs += found_out
        texts, ordered = round_texts(inputs, outputs)
        if any(texts[name] != row[name] for name in _TEXT_FIELDS):
            changed.append(SimpleNamespace(pk=row["id"], **texts))
        common = dict(project_id=project_id, conversation_id=row["conversation_id"], occurred_at=row["occurred_at"],
                      source=Source.SPAN, received_at=row["received_at"])
        for position, (direction, message) in enumerate(ordered):
            message_values = message_row(common, row["trace_id"], row["span_id"], row["round_id"], position, direction,
                                         message, what="log-")
            # numbered after the round, as span_rows' renumbering leaves its own
            message_values["index"] = row["index"] * MESSAGES_PER_ROUND + position
            messages.append(message_values)
        emptied |= Q(conversation_id=row["conversation_id"], round_id=row["round_id"])
    with transaction.atomic():
        # made again whole from all the span's events (a late event takes its place in time order)
        Message.objects.filter(emptied, source=Source.SPAN).delete()
        insert_ignoring_conflicts(Message, messages)
        update_rows(Round, changed, _TEXT_FIELDS)
    return len(rounds)


def run(batch: Batch) -> None:
    if batch.conversation_ids:
        log_messages_derive(project_id=batch.project_id, conversation_ids=batch.conversation_ids, since=batch.since,
                            until=batch.until, trace_ids=batch.linked_traces)


PASS = Pass(
    name="log_messages",
    reads=("LogRecord", "Round", "Span"),
    writes=("Message (source=span, from log events)", "Round (user message, thoughts, final answer)"),
    run=run,
)
