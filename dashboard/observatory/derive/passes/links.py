"""The links pass: what arrived joined to what it belongs to.

- traces whose spans wait for a conversation get the conversation another span of
  the trace (or a round record of it) has (``traces_link``: spans exported before
  the span that names their conversation);
- tool executions to their spans, spans to their conversations (creating a
  conversation a span names first), artifacts to the tool execution that names them
  (``links_refresh``); log records to their span's conversation (``log_records_link``).

Only links are added, never changed, so running it twice changes nothing. The
conversations that gained spans and the traces linked late widen the batch for the
span-row and totals passes after it.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any, Callable, ContextManager, Iterable

from django.db.models import Exists, OuterRef
from django.utils import timezone

from dashboard.accounts.models import Project
from dashboard.priority import yield_to_pages
from dashboard.observatory import conventions
from dashboard.observatory.conventions import EXECUTE_TOOL
from dashboard.observatory.models import Artifact, Conversation, LogRecord, Round, Span, ToolExecution
from dashboard.observatory.paging import keyset_pages
from dashboard.observatory.rows import conversations_get_or_create, update_rows
from dashboard.observatory.trace_links import trace_conversations_record

from ..batch import Batch, Pass, received_window


LINK_WINDOW = timedelta(days=2)  # how far back a batch's pass without a time looks for its rows
# How far back the hourly sweep looks for unlinked spans, artifacts and log records: the
# hours whose tool rollups it recomputes too (derive.schedule). What arrives is linked by
# its batch's pass; the sweep only catches what a race left, so its cost follows the last
# hours' arrivals, never the days of history.
SWEEP_LOOKBACK = timedelta(hours=3)
BEAT_SPAN_LIMIT = 5_000  # unlinked spans one beat pass loads, the newest first (bounds its memory too)
LINK_CHUNK = 2_000  # tool executions one step of the link pass reads at once


# --- links between spans and records ---------------------------------------------------

def links_refresh(
    *,
    project_id: int,
    conversation_ids: Iterable[int] | None = None,
    artifact_ids: Iterable[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    step: Callable[[], ContextManager[Any]] = nullcontext,
) -> dict[str, Any]:
    """Link what arrived recently and is still unlinked:

    - a tool execution to its span (by trace_id + span_id, else by tool_call_id),
      filling its trace/span ids when the record had none;
    - a span to its conversation: by gen_ai.conversation.id / session.id (creating
      the conversation when no record named it yet), else by the tool execution
      with its tool_call_id, else by another span of the same trace, else by a
      round record of the trace;
    - an artifact to the tool execution that names it, and its conversation.

    Scope: with ``conversation_ids`` (after a records batch) only the rows of those
    conversations received from ``since`` to ``until`` (the outbox passes the times
    of its notes' batches, so a pass reads what its batches brought, not the
    conversations' history nor the batches of later notes) and the spans that
    share their tool calls or traces, and the unlinked tool executions their tool
    spans name (a record stored before its span); with ``artifact_ids`` (after an
    upload) only those artifacts. Every query is then bounded by those ids and served
    by an index, so the work after a batch is proportional to the batch, not to the
    database. With neither (the hourly sweep): the unlinked spans started and the
    artifacts stored since ``since`` (default SWEEP_LOOKBACK), at most BEAT_SPAN_LIMIT
    spans, the newest; no tool execution (both sides of a call link at arrival).

    Tool executions are read LINK_CHUNK at a time (``keyset_pages``), so memory is
    bounded by the chunk whatever the scope holds. Each page's links, and the spans'
    and artifacts' at the end, are written inside ``step()`` (the sweep: on SQLite the
    drain lock, so the outbox drains between steps).

    Only links are added, never changed, so running it again changes nothing.
    Returns counts, the ids of conversations that gained spans (their totals
    and activity times need a refresh) and the traces of those spans (where the
    spans to derive rows from are, whenever they were received).
    """
    since = since or timezone.now() - (LINK_WINDOW if conversation_ids is not None or artifact_ids is not None
                                       else SWEEP_LOOKBACK)
    counts: dict[str, Any] = {"tool_executions": 0, "spans": 0, "artifacts": 0, "conversations_created": 0}
    gained: set[int] = set()
    linked_traces: set[str] = set()  # of the spans linked to a conversation here
    scoped = conversation_ids is not None or artifact_ids is not None
    conversation_list = sorted(set(conversation_ids or ()))
    project_has_spans = Span.objects.filter(project_id=project_id).exists()
    unlinked_spans = Span.objects.filter(project_id=project_id, conversation__isnull=True)

    received = received_window(since, until)
    # toolexec_project_received: the rows these batches brought, not the conversations' history.
    # The sweep reads no tool executions: a batch links its executions to the spans stored
    # before it, and its spans to the executions stored before them (below), so whichever
    # arrives second makes the link. It walked every unlinked execution of two days before:
    # 6.7M rows an hour into the soak, and more each hour.
    executions_in_scope = ToolExecution.objects.filter(
        project_id=project_id, conversation_id__in=conversation_list, **received)
    pages = keyset_pages(executions_in_scope, "received_at", EXECUTION_FIELDS, LINK_CHUNK) if conversation_list else ()
    for in_scope in pages:
        with step():
            if project_has_spans:
                learned_traces = _executions_link(project_id, in_scope, counts)
                traces = {row[2] for row in in_scope if row[2]} | learned_traces
                _spans_link(project_id, _spans_by_calls_or_traces(
                    unlinked_spans, {row[1] for row in in_scope}, traces), counts, gained, linked_traces)
            if artifact_ids is None:
                named = {row[5] for row in in_scope if row[5]}
                if named:
                    _artifacts_link(project_id, Artifact.objects.filter(
                        project_id=project_id, tool_execution__isnull=True, artifact_id__in=named), counts)
        yield_to_pages()

    with step():
        # Spans -> conversations, by what is not a tool execution.
        if project_has_spans and conversation_list:
            # Traces a round record of these conversations describes (received in scope too).
            round_traces = set(
                Round.objects.filter(project_id=project_id, conversation_id__in=conversation_list, **received)
                .exclude(trace_id="").values_list("trace_id", flat=True)
            )
            _spans_link(project_id, _spans_by_calls_or_traces(unlinked_spans, set(), round_traces), counts, gained,
                        linked_traces)
        elif project_has_spans and not scoped:
            # span_project_time, newest first, back to SWEEP_LOOKBACK at most
            _spans_link(project_id, [unlinked_spans.filter(start_time__gte=since).order_by("-start_time")[:BEAT_SPAN_LIMIT]],
                        counts, gained, linked_traces)
        if project_has_spans and (conversation_list or linked_traces):
            # Tool executions stored before their span and not linked by the span's ingest (a
            # record committed while the span's batch was being stored): from the spans' side.
            _executions_link(project_id, _executions_awaiting(
                project_id, sorted(set(conversation_list) | gained) if conversation_list else [], received,
                linked_traces), counts)

        # Artifacts -> tool executions (after a records batch: those its executions name, above).
        if artifact_ids is not None:
            _artifacts_link(project_id, Artifact.objects.filter(
                project_id=project_id, tool_execution__isnull=True, artifact_id__in=set(artifact_ids)), counts)
        elif not scoped:
            _artifacts_link(project_id, Artifact.objects.filter(
                project_id=project_id, tool_execution__isnull=True, created_at__gte=since), counts)
    counts["conversation_ids"] = sorted(gained)
    counts["trace_ids"] = sorted(linked_traces)
    return counts


EXECUTION_FIELDS = ("id", "tool_call_id", "trace_id", "span_id", "linked_span_id", "artifact_id")


def _executions_awaiting(project_id: int, conversation_ids: list[int], received: dict[str, datetime] | None,
                         traces: set[str]) -> list[tuple]:
    """The unlinked tool executions that a tool span of these conversations (received
    in ``received``), or any span of ``traces`` (linked late), names by its tool call id.
    Index lookups: span_derivable_received and span_unique for the spans,
    toolexec_project_tool_call for the executions."""
    queries = [Span.objects.filter(conversation_id__in=conversation_ids, operation=EXECUTE_TOOL, **(received or {}))
               .exclude(operation="")] if conversation_ids else []
    if traces:  # span_unique; a planner given tool_call_id <> '' too took the project's spans with a call id
        queries.append(Span.objects.filter(project_id=project_id, trace_id__in=sorted(traces)))
    calls = sorted({call for query in queries for call in query.values_list("tool_call_id", flat=True) if call})
    rows: list[tuple] = []
    for start in range(0, len(calls), LINK_CHUNK):
        rows += ToolExecution.objects.filter(
            project_id=project_id, tool_call_id__in=calls[start:start + LINK_CHUNK], linked_span__isnull=True,
        ).values_list(*EXECUTION_FIELDS)
    return rows


def _executions_link(project_id: int, in_scope: list[tuple], counts: dict[str, Any]) -> set[str]:
    """Tool executions -> spans; returns the traces of the executions linked."""
    executions = [row for row in in_scope if row[4] is None]
    if not executions:
        return set()
    by_call: dict[str, tuple[int, str, str]] = {}
    by_ids: dict[tuple[str, str], int] = {}
    for query in _spans_by_calls_or_traces(
        Span.objects.filter(project_id=project_id),
        {row[1] for row in executions}, {row[2] for row in executions if row[2]},
    ):
        for span in query.values_list("id", "trace_id", "span_id", "tool_call_id"):
            by_ids[(span[1], span[2])] = span[0]
            if span[3]:
                by_call[span[3]] = (span[0], span[1], span[2])
    changed = []
    for pk, tool_call_id, trace_id, span_id, _, _ in executions:
        span_pk = by_ids.get((trace_id, span_id))
        if span_pk is None and tool_call_id in by_call:
            span_pk, found_trace, found_span = by_call[tool_call_id]
            trace_id, span_id = trace_id or found_trace, span_id or found_span
        if span_pk is not None:
            changed.append(ToolExecution(pk=pk, linked_span_id=span_pk, trace_id=trace_id, span_id=span_id))
    update_rows(ToolExecution, changed, ["linked_span", "trace_id", "span_id"])
    counts["tool_executions"] += len(changed)
    return {execution.trace_id for execution in changed}


def _spans_link(project_id: int, queries: list[Any], counts: dict[str, Any], gained: set[int],
                linked_traces: set[str]) -> None:
    """Spans -> conversations, for the unlinked spans these queries find; adds the
    conversations to ``gained`` and the spans' traces to ``linked_traces``."""
    fields = ("id", "trace_id", "conversation_key", "tool_call_id", "attributes", "start_time", "end_time")
    spans = list({span.pk: span for query in queries for span in query.only(*fields)}.values())
    if not spans:
        return
    for span in spans:
        if not span.conversation_key:
            span.conversation_key = _conversation_key(span.attributes)
    keys = {span.conversation_key for span in spans if span.conversation_key}
    conversation_by_key = dict(
        Conversation.objects.filter(project_id=project_id, external_id__in=keys).values_list("external_id", "pk")
    )
    missing = keys - set(conversation_by_key)
    if missing:
        first_seen: dict[str, tuple[datetime, datetime]] = {}
        for span in spans:
            if span.conversation_key in missing:
                seen = first_seen.get(span.conversation_key, (span.start_time, span.end_time))
                first_seen[span.conversation_key] = (min(seen[0], span.start_time), max(seen[1], span.end_time))
        project = Project.objects.get(pk=project_id)
        conversation_by_key.update(conversations_get_or_create(project=project, first_seen=first_seen))
        counts["conversations_created"] += len(missing)
    conversation_by_call = dict(
        ToolExecution.objects.filter(
            project_id=project_id, tool_call_id__in={s.tool_call_id for s in spans if s.tool_call_id}
        ).values_list("tool_call_id", "conversation_id")
    )
    traces = {span.trace_id for span in spans}
    conversation_by_trace = dict(
        Span.objects.filter(project_id=project_id, trace_id__in=traces, conversation__isnull=False)
        .values_list("trace_id", "conversation_id")
    )
    for trace_id, conversation_id in Round.objects.filter(
        project_id=project_id, trace_id__in=traces
    ).values_list("trace_id", "conversation_id"):
        conversation_by_trace.setdefault(trace_id, conversation_id)
    for span in spans:
        conversation_id = (
            conversation_by_key.get(span.conversation_key)
            or conversation_by_call.get(span.tool_call_id)
        )
        if conversation_id is not None:
            conversation_by_trace.setdefault(span.trace_id, conversation_id)
    changed = []
    for span in spans:
        conversation_id = (
            conversation_by_key.get(span.conversation_key)
            or conversation_by_call.get(span.tool_call_id)
            or conversation_by_trace.get(span.trace_id)
        )
        if conversation_id is not None:
            span.conversation_id = conversation_id
            changed.append(span)
    update_rows(Span, changed, ["conversation", "conversation_key"])
    trace_conversations_record(  # for the plain spans still to come
        project_id=project_id, links=((span.trace_id, span.conversation_id, span.start_time) for span in changed))
    counts["spans"] += len(changed)
    gained.update(span.conversation_id for span in changed)
    linked_traces.update(span.trace_id for span in changed)


def _artifacts_link(project_id: int, unlinked_artifacts: Any, counts: dict[str, Any]) -> None:
    """Artifacts -> the tool execution that produced them (the first that names
    them: a tool that reads one back, file_reader, names it too, content-addressed),
    and its conversation."""
    artifacts = list(unlinked_artifacts.only("id", "artifact_id"))
    if not artifacts:
        return
    named: dict[str, tuple[int, int]] = {}
    for artifact_id, pk, conversation_id in ToolExecution.objects.filter(
        project_id=project_id, artifact_id__in={a.artifact_id for a in artifacts}
    ).exclude(artifact_id="").order_by("occurred_at", "id").values_list(  # (implies the partial index's condition)
            "artifact_id", "id", "conversation_id"):
        named.setdefault(artifact_id, (pk, conversation_id))
    changed = []
    for artifact in artifacts:
        if artifact.artifact_id in named:
            artifact.tool_execution_id, artifact.conversation_id = named[artifact.artifact_id]
            changed.append(artifact)
    update_rows(Artifact, changed, ["tool_execution", "conversation"])
    counts["artifacts"] += len(changed)


def _spans_by_calls_or_traces(spans: Any, calls: set[str], traces: set[str]) -> list[Any]:
    """Queries for the spans with one of these tool call ids, and for those in one
    of these traces (a span may be in both; callers merge by id).

    Two queries rather than one with OR, so that each is an index lookup on any
    planner: the tool call one repeats the partial index's condition
    (tool_call_id <> ''), which a planner cannot infer from a long IN list; the
    trace one leads the unique (project, trace_id, span_id) index.
    """
    calls = {call for call in calls if call}
    traces = {trace for trace in traces if trace}
    queries = []
    if calls:
        queries.append(spans.filter(tool_call_id__in=calls).exclude(tool_call_id=""))
    if traces:
        queries.append(spans.filter(trace_id__in=traces))
    return queries


def _conversation_key(attributes: Any) -> str:
    if not isinstance(attributes, dict):
        return ""
    value = conventions.value_of("conversation", attributes)
    if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
        return str(value).strip()[:200]
    return ""


def traces_link(*, project_id: int, trace_ids: Iterable[str], linked_traces: set[str] | None = None) -> list[int]:
    """Link the unlinked spans of these traces to the conversation another span of
    the trace (or a round record of it) belongs to: the late-span pass, run from the
    outbox after each batch that stored unlinked spans or linked a trace. Only index
    lookups on (project, trace_id), and first only for the traces that have a span
    waiting (usually none: a batch links its own traces at ingest), so a pass of
    thousands of noted traces reads no more than that. Returns the conversations
    that gained spans (the note names those its batch linked at ingest itself), and
    adds the traces whose spans it linked to ``linked_traces`` when given."""
    traces = sorted({trace for trace in trace_ids if trace})
    touched: set[int] = set()
    for start in range(0, len(traces), 500):
        chunk = traces[start:start + 500]
        waiting = sorted(set(
            Span.objects.filter(project_id=project_id, trace_id__in=chunk, conversation__isnull=True)
            .values_list("trace_id", flat=True).distinct()
        ))
        if not waiting:
            continue
        by_trace: dict[str, int] = {}
        for trace_id, conversation_id in (
            Span.objects.filter(project_id=project_id, trace_id__in=waiting, conversation__isnull=False)
            .order_by("start_time").values_list("trace_id", "conversation_id")
        ):
            by_trace.setdefault(trace_id, conversation_id)
        for trace_id, conversation_id in Round.objects.filter(
            project_id=project_id, trace_id__in=waiting
        ).values_list("trace_id", "conversation_id"):
            by_trace.setdefault(trace_id, conversation_id)
        recorded: list[tuple[str, int, datetime]] = []
        for trace_id in waiting:  # one UPDATE per trace that has unlinked spans and a conversation
            conversation_id = by_trace.get(trace_id)
            if conversation_id is not None and Span.objects.filter(
                project_id=project_id, trace_id=trace_id, conversation__isnull=True
            ).update(conversation_id=conversation_id):
                touched.add(conversation_id)
                recorded.append((trace_id, conversation_id, timezone.now()))
                if linked_traces is not None:
                    linked_traces.add(trace_id)
        trace_conversations_record(project_id=project_id, links=recorded)  # (a round's trace may have none yet)
    return sorted(touched)


# --- log records ----------------------------------------------------------------------

def log_records_link(*, project_id: int, conversation_ids: Iterable[int] | None = None,
                     since: datetime | None = None) -> int:
    """Give the log records that still have no conversation the conversation of
    their span (by trace_id + span_id), else of another span of their trace.

    With ``conversation_ids`` (after a batch linked spans to them) only records of
    those conversations' traces; without (the beat's pass) the records received
    since ``since`` (default LINK_WINDOW), at most BEAT_SPAN_LIMIT. Only links are
    added, so running it again changes nothing. Returns the records linked.
    """
    waiting = LogRecord.objects.filter(
        project_id=project_id, conversation__isnull=True, received_at__gte=since or timezone.now() - LINK_WINDOW
    ).exclude(trace_id="")
    if conversation_ids is not None:
        # The database tests each waiting record's trace (span_unique), so the cost
        # follows the records waiting, not the conversations' spans (millions).
        ids = sorted(set(conversation_ids))
        if not ids:
            return 0
        waiting = waiting.filter(Exists(Span.objects.filter(
            project_id=project_id, trace_id=OuterRef("trace_id"), conversation_id__in=ids)))
    rows = list(waiting.values_list("id", "trace_id", "span_id")[:BEAT_SPAN_LIMIT])
    if not rows:
        return 0
    by_span: dict[tuple[str, str], int] = {}
    by_trace: dict[str, int] = {}
    for trace_id, span_id, conversation_id in Span.objects.filter(
        project_id=project_id, trace_id__in=sorted({row[1] for row in rows}), conversation__isnull=False
    ).values_list("trace_id", "span_id", "conversation_id"):
        by_span[(trace_id, span_id)] = conversation_id
        by_trace.setdefault(trace_id, conversation_id)
    ids_by_conversation: dict[int, list[int]] = defaultdict(list)
    for pk, trace_id, span_id in rows:
        conversation_id = by_span.get((trace_id, span_id)) or by_trace.get(trace_id)
        if conversation_id is not None:
            ids_by_conversation[conversation_id].append(pk)
    linked = 0
    for conversation_id, ids in ids_by_conversation.items():
        linked += LogRecord.objects.filter(id__in=ids, conversation__isnull=True).update(conversation_id=conversation_id)
    return linked


def run(batch: Batch) -> None:
    project_id = batch.project_id
    if batch.trace_ids:
        batch.conversation_ids |= set(traces_link(project_id=project_id, trace_ids=batch.trace_ids,
                                                  linked_traces=batch.linked_traces))
    if batch.conversation_ids:
        counts = links_refresh(project_id=project_id, conversation_ids=batch.conversation_ids, since=batch.since,
                               until=batch.until)
        batch.conversation_ids |= set(counts["conversation_ids"])
        batch.linked_traces |= set(counts["trace_ids"])
        # Log records that arrived before their span get the span's conversation.
        log_records_link(project_id=project_id, conversation_ids=batch.conversation_ids)
    if batch.artifact_ids:
        links_refresh(project_id=project_id, artifact_ids=batch.artifact_ids)


PASS = Pass(
    name="links",
    reads=("Span", "ToolExecution", "Round", "Artifact", "LogRecord", "Conversation"),
    writes=("Span.conversation", "ToolExecution.linked_span", "Artifact.tool_execution", "LogRecord.conversation",
            "TraceConversation", "Conversation (named by a span first)"),
    run=run,
)
