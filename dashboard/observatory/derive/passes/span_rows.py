"""The span-row pass: rounds, messages and tool executions derived from spans, so a conversation that
arrives only as spans (OpenInference, OpenLLMetry, the GenAI semantic conventions)
is a conversation like a record-fed one: every page reads the same rows.

- a model-call span (operation ``chat``) becomes a Round (one per call, numbered in
  start order), with its new input messages and its output messages as Messages;
- a tool span (operation ``execute_tool``) becomes a ToolExecution linked to its
  span and to the round whose output asked for it.

Derived rows say ``source="span"`` and carry a deterministic record id (uuid5 of
project, trace, span and what), so a second pass inserts nothing twice. A pipeline
record describing the same call wins: no round is derived in a trace that has a
record round, no tool execution for a call id a record holds, and a derived row
that a record arrives for later is deleted (the record takes over its span link),
so nothing is counted twice.

Incremental: a pass after batches asks the database for the model-call and tool
spans (the ``operation`` column, set at ingest) received with its notes' batches, and those
of the traces linked late, that no row derives from yet, and loads the attributes
of only those, in chunks; what it reads besides (derived rows a record received
with them describes, call ids already held) is limited to what those name.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import uuid
from collections import defaultdict, namedtuple
from datetime import datetime
from types import SimpleNamespace
from typing import Any, Iterable, Iterator

from django.db import transaction
from django.db.models import Count, Exists, Max, OuterRef, Q

from dashboard.priority import yield_to_pages

from dashboard.observatory import conventions
from dashboard.observatory.conventions import CHAT, EXECUTE_TOOL, MessageFact, span_facts
from dashboard.observatory.models import Conversation, Message, Round, Source, Span, ToolExecution, minute_of
from dashboard.observatory.paging import keyset_pages
from dashboard.observatory.rows import insert_ignoring_conflicts, update_rows, values_joined
from pipeline import count_tokens

from ..batch import Batch, Pass, received_window
from ..notes import note_write

NAMESPACE = uuid.UUID("6f1d1c2e-5b0a-4c1e-9d3c-7a7f0e6b5a10")
_NAMESPACE_BYTES = NAMESPACE.bytes
CHUNK = 500
# Conversations derived together: each group's candidates are one walk of the batch's
# spans and its linked traces; by 500 a batch of 3,000 conversations walked them six times
# (bench_span_rows --conversations 3000). An IN list of this many is one index probe each.
CONVERSATIONS = 5_000
MESSAGES_PER_ROUND = 1000  # a derived message's index is round index x this + its position
ERROR = 2
_ID_MAX = 200


def record_id(project_id: int, trace_id: str, span_id: str, what: str) -> uuid.UUID:
    """uuid5(NAMESPACE, "project/trace/span/what"), without uuid5's checks (a tenth of
    reading a span in the pass): the same ids as every row stored before."""
    digest = hashlib.sha1(_NAMESPACE_BYTES + f"{project_id}/{trace_id}/{span_id}/{what}".encode()).digest()
    return uuid.UUID(bytes=digest[:16], version=5)


def span_rows_derive(
    *, project_id: int, conversation_ids: Iterable[int], since: datetime | None = None,
    trace_ids: Iterable[str] = (), until: datetime | None = None,
) -> set[datetime]:
    """Derive what is new in these conversations; returns the minutes whose tool
    rollups changed (new or removed tool executions).

    With ``since`` and ``until`` (after batches: when the outbox's notes' batches were
    received) the candidates are the conversations' spans received between them and
    their spans in ``trace_ids`` (spans linked late, whenever received), and only
    records received between them can take over derived rows: the work is what the batches brought,
    never a long conversation's history. Without it (a rebuild, the hourly beat)
    every span of the conversations that no row derives from yet.

    Candidates are read CANDIDATES at a time in start order, so memory is bounded
    by that whatever a backlog holds."""
    ids = sorted(set(conversation_ids))
    traces = sorted({trace for trace in trace_ids if trace})
    minutes: set[datetime] = set()
    received = received_window(since, until)
    for start in range(0, len(ids), CONVERSATIONS):
        minutes |= _conversations(project_id, ids[start:start + CONVERSATIONS], received, traces)
    return minutes


CANDIDATES = 1_000  # candidate spans read, and derived in one transaction, at a time


def _candidate_queries(project_id: int, ids: list[int], operation: str, received: dict[str, datetime] | None,
                       traces: list[str]) -> list[Any]:
    """Queries for the spans of this operation that no row derives from yet: the
    database leaves out a tool span that a tool execution (derived, or a record's)
    links to and a model-call span that has its round."""
    if operation == CHAT:
        # Found through round_project_trace (a trace holds a few rounds): by the
        # conversation's index it read each of the conversation's rounds per span, and
        # with conversations that keep coming back that was a quarter of a pass.
        has_round = Round.objects.filter(project_id=OuterRef("project_id"), trace_id=OuterRef("trace_id"),
                                         span_id=OuterRef("span_id"), source=Source.SPAN)
        pending = Span.objects.filter(conversation_id__in=ids, operation=CHAT).exclude(Exists(has_round))
    else:
        has_tool_row = ToolExecution.objects.filter(linked_span_id=OuterRef("pk"))
        pending = Span.objects.filter(conversation_id__in=ids, operation=EXECUTE_TOOL).exclude(Exists(has_tool_row))
    if received is None:
        return [pending]
    # span_derivable_received (its condition repeated so that any planner uses it),
    # and the unique (project, trace_id, …) index for the linked traces.
    queries = [pending.filter(**received).exclude(operation="")]
    for start in range(0, len(traces), CHUNK):
        queries.append(pending.filter(project_id=project_id, trace_id__in=traces[start:start + CHUNK]))
    return queries


def _candidate_chunks(project_id: int, ids: list[int], operation: str, received: dict[str, datetime] | None,
                      traces: list[str]) -> Iterator[list[Any]]:
    """The candidates as span rows (_SpanRow), at most CANDIDATES a list, each query
    walked in (start_time, id) order past the last one read: read once, outside the
    transaction that derives from them (on SQLite it holds the write lock). A span
    several queries find comes once per query: deriving it twice inserts nothing twice."""
    for query in _candidate_queries(project_id, ids, operation, received, traces):
        for page in keyset_pages(query, "start_time", _SPAN_FIELDS, CANDIDATES):
            yield [_SpanRow(*row) for row in page]


def _conversations(project_id: int, ids: list[int], received: dict[str, datetime] | None,
                   traces: list[str]) -> set[datetime]:
    minutes: set[datetime] = set()
    with transaction.atomic():
        _records_win(project_id, ids, minutes, received)
    # Candidates are read before each transaction (on SQLite it holds the write lock),
    # at most CANDIDATES of each operation; each transaction is whole: the rounds it
    # adds are numbered in it and its tool executions get their rounds in it (a later
    # page's round is given to the executions waiting for it by _assign_rounds there).
    for chats, tools in _paired(_candidate_chunks(project_id, ids, CHAT, received, traces),
                                _candidate_chunks(project_id, ids, EXECUTE_TOOL, received, traces)):
        record_traces = set(
            Round.objects.filter(project_id=project_id, trace_id__in={span.trace_id for span in chats},
                                 source=Source.RECORD).values_list("trace_id", flat=True)
        ) if chats else set()
        calls = {span.tool_call_id for span in tools if span.tool_call_id}
        record_calls = set(
            ToolExecution.objects.filter(project_id=project_id, source=Source.RECORD, tool_call_id__in=calls)
            .values_list("tool_call_id", flat=True)
        ) if calls else set()
        new_rounds = [span for span in chats if span.trace_id not in record_traces]
        # (a span a record links to is no candidate)
        new_tools = _tools_read([span for span in tools if span.tool_call_id not in record_calls], chats)
        yield_to_pages()  # a pass of many pages shares its process with the pages
        with transaction.atomic():
            renumber: set[int] = set()
            for start in range(0, len(new_rounds), CHUNK):
                renumber |= _rounds_from(project_id, new_rounds[start:start + CHUNK])
            _renumber(sorted(renumber), since=min((span.start_time for span in new_rounds), default=None))
            # what the derived rounds of the page's traces asked for (after the numbering)
            calls_by = _calls_by_round(project_id, ids, {span.trace_id for span in chats + tools})
            for start in range(0, len(new_tools), CHUNK):
                minutes |= _tools_from(project_id, new_tools[start:start + CHUNK], calls_by)
            _assign_rounds(project_id, ids, calls_by)
    with transaction.atomic():
        _user_from_naming_spans(ids)
    return minutes


def _paired(chats: Iterator[list[tuple]], tools: Iterator[list[tuple]]) -> Iterator[tuple[list[tuple], list[tuple]]]:
    """Pages of both operations side by side, read one pair at a time; one empty pair
    when there are none (waiting tool executions may still get their rounds)."""
    empty = True
    for pair in itertools.zip_longest(chats, tools, fillvalue=[]):
        empty = False
        yield pair
    if empty:
        yield [], []


USER_SPANS = 20  # naming spans read for the user per conversation that has none, at most


def _user_from_naming_spans(ids: list[int]) -> None:
    """The user, when no round says it: from the spans that name the conversation
    (an agent's root span often carries user and session, its model calls neither)."""
    missing = list(Conversation.objects.filter(pk__in=ids, user_id="").values_list("pk", flat=True))
    if not missing:
        return
    found: dict[int, str] = {}
    for conversation_id, attributes, resource in (
        Span.objects.filter(conversation_id__in=missing).exclude(conversation_key="")
        .order_by("conversation_id", "start_time")
        .values_list("conversation_id", "attributes", "resource")[:USER_SPANS * len(missing)]
    ):
        if conversation_id not in found:
            user = span_facts(attributes, resource).user
            if user:
                found[conversation_id] = user[:_ID_MAX]
    for conversation_id, user in found.items():
        Conversation.objects.filter(pk=conversation_id, user_id="").update(user_id=user)


# --- a pipeline record wins -------------------------------------------------------------

def _records_win(project_id: int, ids: list[int], minutes: set[datetime],
                 received: dict[str, datetime] | None) -> None:
    """Derived rounds of a trace a round record now describes, and derived tool
    executions of a call a record now holds, give way to the records. With
    ``received`` only records received in that window are looked at (a record received
    before a span is derived keeps the row from being made at all)."""
    record_rounds = Round.objects.filter(project_id=project_id, source=Source.RECORD)
    records = ToolExecution.objects.filter(project_id=project_id, source=Source.RECORD)
    spans_rounds = Round.objects.filter(conversation_id__in=ids, source=Source.SPAN).exclude(trace_id="")
    if received is None:
        # Found by the database: only those, never all of a conversation's rounds.
        derived = ToolExecution.objects.filter(conversation_id__in=ids, source=Source.SPAN).exclude(tool_call_id="")
        doomed = [spans_rounds.filter(Exists(record_rounds.filter(trace_id=OuterRef("trace_id"))))]
        described = [derived.filter(Exists(records.filter(tool_call_id=OuterRef("tool_call_id"))))]
    else:
        # The records these batches brought (toolexec_project_received), then the
        # derived rows they name, CHUNK names a query.
        fresh = {"conversation_id__in": ids, **received}
        traces = sorted(set(record_rounds.filter(**fresh).exclude(trace_id="").values_list("trace_id", flat=True)))
        calls = sorted(set(records.filter(**fresh).exclude(tool_call_id="").values_list("tool_call_id", flat=True)))
        doomed = [spans_rounds.filter(trace_id__in=traces[i:i + CHUNK]) for i in range(0, len(traces), CHUNK)]
        described = [calls_held(project_id, ids, calls[i:i + CHUNK]).filter(source=Source.SPAN)
                     for i in range(0, len(calls), CHUNK)]
    gone = [row for query in doomed for row in query.values_list("pk", "conversation_id", "round_id")]
    if gone:
        for conversation_id in {c for _, c, _ in gone}:
            Message.objects.filter(conversation_id=conversation_id, source=Source.SPAN,
                                   round_id__in=[r for _, c, r in gone if c == conversation_id]).delete()
        Round.objects.filter(pk__in=[pk for pk, _, _ in gone]).delete()
    derived_calls = {
        call: (pk, span_pk, occurred, conversation_id)
        for query in described
        for pk, call, span_pk, occurred, conversation_id in query.values_list(
            "id", "tool_call_id", "linked_span_id", "occurred_at", "conversation_id")
    }
    if not derived_calls:
        return
    records = list(records.filter(tool_call_id__in=list(derived_calls)).values_list(
        "id", "tool_call_id", "linked_span_id"))
    touched = set()
    for record_pk, call, linked in records:
        pk, span_pk, occurred, conversation_id = derived_calls[call]
        touched.add(conversation_id)
        if linked is None and span_pk is not None:
            ToolExecution.objects.filter(pk=record_pk).update(linked_span_id=span_pk)
        ToolExecution.objects.filter(pk=pk).delete()
        minutes.add(minute_of(occurred))
    # the rounds that held the derived calls count them no more: summed whole next time
    _rounds_whole_later(project_id, touched)


# --- rounds and messages ------------------------------------------------------------------

_SPAN_FIELDS = ("id", "conversation_id", "trace_id", "span_id", "start_time", "end_time", "duration_ms", "status_code",
                "status_message", "attributes", "events", "resource", "tool_name", "tool_call_id", "received_at",
                "truncated")


# A span as the passes read it: a model instance a span cost more than deriving from it.
_SpanRow = namedtuple("_SpanRow", _SPAN_FIELDS)


def _round_id(span_id: str) -> str:
    return f"span-{span_id}"


def _new_turn(inputs: list[MessageFact]) -> list[MessageFact]:
    """The input messages after the last assistant message: what is new since the
    previous model call (the whole input for the first one)."""
    last = max((i for i, message in enumerate(inputs) if message.role == "assistant"), default=-1)
    return inputs[last + 1:]


def _args(arguments: Any) -> dict[str, Any]:
    """A call's arguments as an object: JSON text of one (as the GenAI conventions
    send ``gen_ai.tool.call.arguments``) parsed, bounded (conventions.json_or_text);
    anything else kept under "input" (text as text, clipped to TEXT_LIMIT)."""
    arguments = conventions.json_or_text(arguments)
    if isinstance(arguments, dict):
        return arguments
    if arguments in (None, ""):
        return {}
    if isinstance(arguments, str):
        return {"input": arguments[: conventions.TEXT_LIMIT]}
    return {"input": arguments}


def _tool_calls(message: MessageFact) -> list[dict[str, Any]]:
    return [{"id": call.id[:_ID_MAX], "name": call.name[:_ID_MAX], "args": _args(call.arguments)}
            for call in message.tool_calls]


def round_texts(inputs: list[MessageFact], outputs: list[MessageFact]) -> tuple[dict[str, Any],
                                                                                list[tuple[str, MessageFact]]]:
    """What a model call's input and output messages give its round (user message,
    thoughts, final answer) and the messages it adds, in order: the new turn ("in"),
    then the outputs ("out"), at most MESSAGES_PER_ROUND. Shared by the messages a span
    carries and those its log events carry (passes.log_messages)."""
    turn = _new_turn(inputs)
    answer = next((m for m in outputs if m.role in ("assistant", "")), None)
    calls = answer is not None and bool(answer.tool_calls)
    texts = dict(
        user_message=next((m.content for m in reversed(turn) if m.role == "user" and m.content), ""),
        thoughts=[answer.content] if calls and answer.content else [],
        final_answer=answer.content if answer is not None and not calls and answer.content else None,
    )
    return texts, ([("in", m) for m in turn] + [("out", m) for m in outputs])[:MESSAGES_PER_ROUND]


def message_row(common: dict[str, Any], trace_id: str, span_id: str, round_id: str, position: int, direction: str,
                message: MessageFact, what: str = "") -> dict[str, Any]:
    """A derived Message row (``common``: project, conversation, occurred/received, source);
    ``what`` sets its record id apart from the span's own messages'."""
    return dict(
        **common, record_id=record_id(common["project_id"], trace_id, span_id, f"{what}{direction}{position}"),
        round_id=round_id, index=position, role=message.role or "assistant", content=message.content,
        name=message.name, tool_calls=_tool_calls(message), tool_call_id=message.tool_call_id[:_ID_MAX],
    )


def _rounds_from(project_id: int, spans: list[Any]) -> set[int]:
    """Rounds and messages of these model-call spans (_SpanRow); returns their conversations."""
    rounds, messages, conversations = [], [], set()
    for span in spans:
        conversation_id = span.conversation_id
        conversations.add(conversation_id)
        facts = span_facts(span.attributes, span.resource, span.events)
        texts, ordered = round_texts(conventions.messages_of("input_messages", span.attributes),
                                     conventions.messages_of("output_messages", span.attributes))
        round_id = _round_id(span.span_id)
        # received when its span was: the totals pass finds what a batch brought by that
        common = dict(project_id=project_id, conversation_id=conversation_id, occurred_at=span.start_time,
                      source=Source.SPAN, received_at=span.received_at)
        context = facts.input_tokens or 0
        rounds.append(dict(
            **common, record_id=record_id(project_id, span.trace_id, span.span_id, "round"),
            round_id=round_id, index=0, trace_id=span.trace_id, span_id=span.span_id,
            model=facts.model[:_ID_MAX], user_id=facts.user[:_ID_MAX], **texts,
            status="error" if _failed(span, facts) else "ok",
            context_tokens=context, derived_context_tokens=context, context_window=facts.context_window,
            input_tokens=facts.input_tokens or 0, output_tokens=facts.output_tokens or 0,
            started_at=span.start_time, ended_at=span.end_time,
        ))
        messages += [message_row(common, span.trace_id, span.span_id, round_id, position, direction, message)
                     for position, (direction, message) in enumerate(ordered)]
    insert_ignoring_conflicts(Round, rounds)
    insert_ignoring_conflicts(Message, messages)
    return conversations


def _renumber(conversation_ids: list[int], since: datetime | None = None) -> None:
    """Number the derived rounds of these conversations in start order (after any
    record rounds), and their messages with them. With ``since`` (the earliest start
    of the rounds just added) the rounds that start before it keep their numbers and
    are only counted, not read: a pass costs what it added, not the conversations'
    history (unless a record round is there, whose arrival may have moved them all)."""
    if not conversation_ids:
        return
    offsets = dict(
        Round.objects.filter(conversation_id__in=conversation_ids, source=Source.RECORD)
        .values("conversation_id").order_by().annotate(last=Max("index")).values_list("conversation_id", "last")
    )
    changed, moved = [], {}
    spans: dict[int, tuple[int, int]] = {}  # per conversation, the lowest and highest old index moved
    position: dict[int, int] = defaultdict(int)
    derived = Round.objects.filter(conversation_id__in=conversation_ids, source=Source.SPAN)
    if since is not None and not offsets:
        position.update(derived.filter(started_at__lt=since).values("conversation_id").order_by()
                        .annotate(before=Count("id")).values_list("conversation_id", "before"))
        derived = derived.filter(started_at__gte=since)
    for pk, conversation_id, old_index, round_id in derived.order_by("conversation_id", "started_at", "id").values_list(
            "id", "conversation_id", "index", "round_id"):
        index = offsets.get(conversation_id, -1) + 1 + position[conversation_id]
        position[conversation_id] += 1
        if old_index != index:
            moved[(conversation_id, round_id)] = index
            low, high = spans.get(conversation_id, (old_index, old_index))
            spans[conversation_id] = (min(low, old_index), max(high, old_index))
            changed.append(SimpleNamespace(pk=pk, index=index))
    update_rows(Round, changed, ["index"])
    if moved:
        # their messages, through message_conversation_index from the first moved round's
        # (new rounds were stored at 0) to the last's: not the conversations' history
        changed_messages = []
        for pk, conversation_id, old_index, round_id in values_joined(
            Message, [(pk, low * MESSAGES_PER_ROUND, (high + 1) * MESSAGES_PER_ROUND)
                      for pk, (low, high) in sorted(spans.items())],
            on=[("conversation_id", "="), ("index", ">="), ("index", "<")],
            select='t.id, t.conversation_id, t."index", t.round_id', where="t.source = %s", params=[Source.SPAN],
        ):
            index = moved.get((conversation_id, round_id))
            if index is not None:
                changed_messages.append(SimpleNamespace(
                    pk=pk, index=index * MESSAGES_PER_ROUND + old_index % MESSAGES_PER_ROUND))
        update_rows(Message, changed_messages, ["index"])


# --- tool executions -----------------------------------------------------------------------

def _calls_by_round(project_id: int, conversation_ids: list[int], traces: set[str]) -> dict[str, Any]:
    """What the derived rounds of these traces asked for: (conversation, call id) ->
    (round id, name, args), and per (conversation, trace) the rounds in start order
    (for tool spans that name no call id). A tool span's round is in its own trace, so
    a page reads the rounds of its traces (round_project_trace) and their assistant
    messages from the earliest one's on (message_conversation_index: a derived
    message's index follows its round's), never a conversation's history."""
    rounds_by_trace: dict[tuple[int, str], list[tuple[datetime, str]]] = defaultdict(list)
    models: dict[tuple[int, str], str] = {}  # (conversation, round id) -> the round's model
    first: dict[int, int] = {}
    round_ids: set[tuple[int, str]] = set()
    wanted = set(conversation_ids)
    ordered = sorted(trace for trace in traces if trace)
    found = []
    for start in range(0, len(ordered), CHUNK):
        found += Round.objects.filter(project_id=project_id, trace_id__in=ordered[start:start + CHUNK],
                                      source=Source.SPAN).values_list(
            "conversation_id", "trace_id", "started_at", "round_id", "index", "model")
    for conversation_id, trace_id, started_at, round_id, index, model in sorted(
            found, key=lambda row: (row[2] is None, row[2])):
        if conversation_id not in wanted:
            continue
        rounds_by_trace[(conversation_id, trace_id)].append((started_at, round_id))
        models[(conversation_id, round_id)] = model
        first[conversation_id] = min(index, first.get(conversation_id, index))
        round_ids.add((conversation_id, round_id))
    by_call: dict[tuple[int, str], tuple[str, str, dict[str, Any]]] = {}
    for conversation_id, round_id, tool_calls in values_joined(
        Message, [(pk, index * MESSAGES_PER_ROUND) for pk, index in sorted(first.items())],
        on=[("conversation_id", "="), ("index", ">=")], select="t.conversation_id, t.round_id, t.tool_calls",
        where="t.source = %s AND t.role = %s AND t.tool_calls <> '[]'", params=[Source.SPAN, "assistant"],
    ):
        if (conversation_id, round_id) not in round_ids:
            continue
        tool_calls = json.loads(tool_calls) if isinstance(tool_calls, (str, bytes)) else tool_calls
        for call in tool_calls if isinstance(tool_calls, list) else []:
            if isinstance(call, dict) and call.get("id"):
                by_call.setdefault((conversation_id, call["id"]),
                                   (round_id, call.get("name", ""), call.get("args") or {}))
    return {"by_call": by_call, "by_trace": rounds_by_trace, "models": models}


def _round_before(calls: dict[str, Any], conversation_id: int, trace_id: str, moment: datetime) -> str:
    found = ""
    for started_at, round_id in calls["by_trace"].get((conversation_id, trace_id), []):
        if started_at is not None and started_at <= moment:
            found = round_id
    return found


def _langchain_tool_message(value: Any) -> tuple[Any, str]:
    """LangChain instrumentations put a serialised ToolMessage in the result; its
    content and tool_call_id are what the tool returned and which call it answered."""
    document = value
    if isinstance(value, str):
        try:
            document = json.loads(value)
        except ValueError:
            return value, ""
    if isinstance(document, dict):
        for path in (("data",), ("kwargs",), ("output", "kwargs"), ("output",)):
            node: Any = document
            for step in path:
                node = node.get(step) if isinstance(node, dict) else None
            if isinstance(node, dict) and "content" in node and ("tool_call_id" in node or node.get("type") == "tool"):
                return node.get("content"), str(node.get("tool_call_id") or "")
    return value, ""


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


# A tool span as _tools_from reads it: what the conventions say, the call it answers,
# its result as text, and that text's tokens counted for the model it was guessed for.
_ToolRead = namedtuple("_ToolRead", "span facts call_id observation counted")


def _tools_read(spans: list[Any], chats: list[Any]) -> list[_ToolRead]:
    """These tool spans read, and their results' tokens counted, before the write
    transaction (on SQLite it holds the write lock, and encoding a 16 KiB result
    takes ~6 ms): for the model the span names, else that of the page's last model
    call of its trace that began before it, else the default. _tools_from counts
    again, in the transaction, only a result whose round names another model."""
    models: dict[tuple[int, str], list[tuple[Any, str]]] | None = None
    read = []
    for span in spans:
        facts = span_facts(span.attributes, span.resource, span.events)
        result, answered = _langchain_tool_message(facts.tool_result)
        observation = _text(result)
        counted = None
        if _countable(span, facts.tool_result):
            model = facts.model
            if not model:
                if models is None:
                    models = defaultdict(list)
                    for chat in sorted(chats, key=lambda chat: chat.start_time):
                        models[(chat.conversation_id, chat.trace_id)].append(
                            (chat.start_time, span_facts(chat.attributes, chat.resource).model))
                model = next((named for began, named in reversed(models.get((span.conversation_id, span.trace_id), []))
                              if named and began <= span.start_time), "")
            counted = (model, count_tokens(observation, model) if model else count_tokens(observation))
        read.append(_ToolRead(span, facts, facts.tool_call_id or answered, observation, counted))
    return read


def _tools_from(project_id: int, read: list[_ToolRead], calls: dict[str, Any]) -> set[datetime]:
    """Tool executions of these tool spans (read by _tools_read, in start order);
    returns the minutes they fall in."""
    rows, minutes = [], set()
    by_call = calls["by_call"]
    used = _used_calls(project_id, {item.span.conversation_id for item in read},
                       {item.call_id for item in read if item.call_id} | _open_calls(calls))
    # Spans that name their call first: a guess by name must not take a call that
    # another span of the batch answers.
    read = sorted(read, key=lambda item: (not item.call_id, item.span.start_time, item.span.id))
    for span, facts, call_id, observation, counted in read:
        conversation_id = span.conversation_id
        name = facts.tool_name or span.tool_name
        if call_id and (conversation_id, call_id) in by_call:
            round_id = by_call[(conversation_id, call_id)][0]
        else:
            round_id = _round_before(calls, conversation_id, span.trace_id, span.start_time)
            if not call_id:
                call_id = _only_open_call(calls, used, conversation_id, round_id, name)
        if call_id and (conversation_id, call_id) in used:
            continue  # a record or another span already holds this call
        if call_id:
            used.add((conversation_id, call_id))
        found = by_call.get((conversation_id, call_id))
        arguments = found[2] if found and found[2] else _args(facts.tool_arguments)  # the model's, else the span's
        failed = _failed(span, facts)
        attributes = span.attributes if isinstance(span.attributes, dict) else {}
        level = attributes.get("ba.output_level")
        # the model that reads the result: its round's, else the one the span names
        model = calls["models"].get((conversation_id, round_id)) or facts.model
        rows.append(dict(
            project_id=project_id, conversation_id=conversation_id, occurred_at=span.start_time,
            received_at=span.received_at,
            source=Source.SPAN, record_id=record_id(project_id, span.trace_id, span.span_id, "tool"),
            round_id=round_id, trace_id=span.trace_id, span_id=span.span_id, linked_span_id=span.id,
            tool_name=(name or "unknown")[:_ID_MAX], parameters=arguments if isinstance(arguments, dict) else {},
            model=model[:_ID_MAX], tool_call_id=call_id[:256], observation=observation[: conventions.TEXT_LIMIT],
            output_level=level if level in ("brief", "standard", "full") else "",
            retry_count=_count(attributes.get("ba.retry_count")),
            cache_hit=attributes.get("ba.cache_hit") in (True, 1, "true"),
            observation_tokens=_observation_tokens(span, attributes, facts.tool_result, observation, model, counted),
            success=not failed, error_type=(facts.error_type or ("error" if failed else ""))[:200],
            error_message=_error_message(span) if failed else "", duration_ms=span.duration_ms,
        ))
        minutes.add(minute_of(span.start_time))
    insert_ignoring_conflicts(ToolExecution, rows)
    return minutes


def _used_calls(project_id: int, conversation_ids: Iterable[int], call_ids: set[str]) -> set[tuple[int, str]]:
    """Which of these call ids a tool execution of these conversations already holds
    (only the ones asked about: a conversation can hold many thousands)."""
    used: set[tuple[int, str]] = set()
    calls = sorted(call_ids)
    for start in range(0, len(calls), CHUNK):
        used.update(calls_held(project_id, conversation_ids, calls[start:start + CHUNK])
                    .values_list("conversation_id", "tool_call_id"))
    return used


def calls_held(project_id: int, conversation_ids: Iterable[int], call_ids: list[str]) -> Any:
    """The tool executions of these conversations that hold these call ids, found
    through the project's call-id index (toolexec_project_tool_call): by the
    conversations' index, SQLite read every tool execution of them, and 15 minutes
    into the hour-long soak (conversations of ~10,000 calls) that was a third of a pass."""
    return ToolExecution.objects.filter(project_id=project_id, conversation_id__in=list(conversation_ids),
                                        tool_call_id__in=call_ids)


def _open_calls(calls: dict[str, Any]) -> set[str]:
    return {call for (_, call) in calls["by_call"]}


def _only_open_call(calls: dict[str, Any], used: set[tuple[int, str]], conversation_id: int, round_id: str,
                    name: str) -> str:
    """The round's one call of this tool that nothing answers yet; "" when there
    are none or several (two parallel calls of a tool: wait until the other one's
    span names its call)."""
    if not round_id:
        return ""
    open_calls = [call for (conversation, call), (found_round, found_name, _) in calls["by_call"].items()
                  if conversation == conversation_id and found_round == round_id and found_name == name
                  and (conversation_id, call) not in used]
    return open_calls[0] if len(open_calls) == 1 else ""


ERROR_MESSAGE_LIMIT = 2000


def _error_message(span: Any) -> str:
    """The exception event's message, else the status message's first line: what
    went wrong, not the stack trace some instrumentations append to the status."""
    for event in span.events if isinstance(span.events, list) else []:
        if isinstance(event, dict) and event.get("name") == "exception":
            attributes = event.get("attributes")
            message = attributes.get("exception.message") if isinstance(attributes, dict) else None
            if isinstance(message, str) and message.strip():
                return message.strip()[:ERROR_MESSAGE_LIMIT]
    return (span.status_message or "").strip().split("\n", 1)[0][:ERROR_MESSAGE_LIMIT]


def _failed(span: Any, facts: Any) -> bool:
    """Status ERROR, or an error type (the GenAI conventions set error.type on failure)."""
    return span.status_code == ERROR or bool(facts.error_type)


def _countable(span: Any, raw: Any) -> bool:
    """Whether a tool span's result is counted: it holds no count of the pipeline's
    own and the whole result (one ingest cut to its limits is not)."""
    attributes = span.attributes if isinstance(span.attributes, dict) else {}
    if conventions.token_count_of(attributes.get("ba.observation_tokens")) is not None or raw is None:
        return False
    return not (raw.endswith(conventions.TRUNCATION_MARKER) if isinstance(raw, str) else span.truncated)


def _observation_tokens(span: Any, attributes: dict[str, Any], raw: Any, observation: str,
                        model: str, counted: tuple[str, int] | None = None) -> int | None:
    """The pipeline's own count when the span carries one (``ba.observation_tokens``);
    else the result's tokens by the model's encoder, as the pipeline counts a record's
    (pipeline.count_tokens), when the span holds the whole result; else None, unknown:
    no result on the span, or one ingest cut to its limits. ``counted``: (model, tokens)
    counted before the transaction, taken when for this model."""
    own = conventions.token_count_of(attributes.get("ba.observation_tokens"))
    if own is not None:
        return own
    if not _countable(span, raw):
        return None
    if counted is not None and counted[0] == model:
        return counted[1]
    return count_tokens(observation, model) if model else count_tokens(observation)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _assign_rounds(project_id: int, conversation_ids: list[int], calls: dict[str, Any]) -> None:
    """Derived tool executions stored before their round, or whose call was not
    known yet (batches come in any order), get them now, with the arguments the
    model's call gave."""
    # Only where a derived round could take them: a conversation's traces that have
    # rounds (a tool span of a trace with no model-call span waits for nothing).
    traces = {trace for (_, trace) in calls["by_trace"]}
    if not traces:
        return
    # Found from the traces' tool spans (span_unique) through toolexec_linked_span: what a
    # trace holds, never a conversation's calls, and no index of its own to keep up (an
    # agent that sends only tool spans has every call waiting for a round).
    ordered = sorted(traces)
    tool_spans = Q()
    for start in range(0, len(ordered), CHUNK):
        tool_spans |= Q(linked_span_id__in=Span.objects.filter(
            project_id=project_id, trace_id__in=ordered[start:start + CHUNK], operation=EXECUTE_TOOL).values("id"))
    # (the conversations are tested here: in the query they would lead the planner to
    # their index, and all their calls)
    wanted = set(conversation_ids)
    waiting = [
        execution for execution in
        ToolExecution.objects.filter(tool_spans, source=Source.SPAN)
        .filter(Q(round_id="") | Q(tool_call_id="")).order_by("occurred_at", "id")
        .only("id", "conversation_id", "tool_call_id", "tool_name", "trace_id", "occurred_at", "round_id",
              "parameters")
        if execution.conversation_id in wanted and (execution.conversation_id, execution.trace_id) in calls["by_trace"]
    ]
    if not waiting:
        return
    used = _used_calls(project_id, {execution.conversation_id for execution in waiting},
                       {execution.tool_call_id for execution in waiting if execution.tool_call_id} | _open_calls(calls))
    changed = []
    for execution in waiting:
        conversation_id = execution.conversation_id
        found = calls["by_call"].get((conversation_id, execution.tool_call_id))
        round_id = execution.round_id or (found[0] if found else _round_before(
            calls, conversation_id, execution.trace_id, execution.occurred_at))
        call_id = execution.tool_call_id or _only_open_call(calls, used, conversation_id, round_id,
                                                            execution.tool_name)
        if (round_id, call_id) == (execution.round_id, execution.tool_call_id):
            continue
        execution.round_id, execution.tool_call_id = round_id, call_id
        used.add((conversation_id, call_id))
        found = calls["by_call"].get((conversation_id, call_id))
        if found and isinstance(found[2], dict):
            execution.parameters = found[2]
        changed.append(execution)
    # (the rounds they get were derived in this transaction, from the batch: the totals pass counts them)
    update_rows(ToolExecution, changed, ["round_id", "tool_call_id", "parameters"])


def _rounds_whole_later(project_id: int, conversation_ids: set[int]) -> None:
    """A note (in this transaction) for conversations whose older rounds this pass
    changed: the totals pass after batches derives only the rounds a batch brought,
    and a note no ingest wrote is derived whole."""
    if conversation_ids:
        note_write(project_id=project_id, conversation_ids=sorted(conversation_ids), hours=[], artifact_ids=[])


def run(batch: Batch) -> None:
    """The batch's conversations (noted, and those the links pass gave spans): the
    spans received with its notes' batches and those of the traces linked late."""
    if batch.conversation_ids:
        batch.minutes |= span_rows_derive(
            project_id=batch.project_id, conversation_ids=batch.conversation_ids, since=batch.since,
            until=batch.until, trace_ids=batch.linked_traces)


PASS = Pass(
    name="span_rows",
    reads=("Span", "Round", "ToolExecution", "Conversation"),
    writes=("Round", "Message", "ToolExecution", "Conversation.user_id"),
    run=run,
)
