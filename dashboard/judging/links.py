"""Scores linked to the rows they judge: at store time, and by a pass when those
rows arrive later.

``targets_resolve`` finds, for a list of scores of one project, the conversation,
round and tool execution each one names, in a constant number of queries per 500
keys (spans by trace and span id; tool executions by call id and by linked span;
rounds by key, by trace and by span; conversations by external id and by trace).
A span is resolved to the tool execution of its call, else to the round of its model
call, else to the only round of its trace; a model response (``gen_ai.response.id``)
to its span first. What is not found stays as sent: a score of a span that never
arrives is still listed under its trace id.

``PASS`` runs after the derivations' own passes (registered by the app:
``observatory.derive.extra``) over what their batch brought: the traces, tool calls
and conversations new rows name; the scores waiting for one of those are resolved
again. Derived rounds and tool executions that a record replaces leave their scores
SET_NULL; the record's batch names the same trace or call, so they are found again.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any, Iterable, Sequence

from django.db.models import Q

from dashboard.observatory.conventions import CHAT
from dashboard.observatory.derive.batch import Batch, Pass, received_window
from dashboard.observatory.models import Conversation, Round, Source, Span, ToolExecution, TraceConversation

from .models import Score, ScoreTarget

CHUNK = 500  # keys per IN (...) query
# A response id with no trace: its model-call span is looked for from this long
# before the score to a little after (an evaluator scores what was answered before).
RESPONSE_LOOKBACK = timedelta(days=1)
RESPONSE_SLACK = timedelta(hours=1)
RESPONSE_ATTRIBUTE = "gen_ai.response.id"

# Scores some of whose rows may still be found.
WAITING = Q(conversation__isnull=True) | (
    ~Q(target=ScoreTarget.CONVERSATION) & Q(round__isnull=True) & Q(tool_execution__isnull=True)
)


def _chunks(values: Iterable[Any]) -> Iterable[list[Any]]:
    items = sorted(set(values))
    for start in range(0, len(items), CHUNK):
        yield items[start:start + CHUNK]


def targets_resolve(project_id: int, scores: Sequence[Score]) -> list[Score]:
    """Set ``conversation``, ``round`` and ``tool_execution`` (and, for a response,
    ``trace_id``/``span_id``) on the scores whose rows are found; returns the scores
    changed (not saved)."""
    if not scores:
        return []
    _responses_resolve(project_id, [s for s in scores if s.target == ScoreTarget.RESPONSE and not s.span_id])
    spans = _spans(project_id, {(s.trace_id, s.span_id) for s in scores if s.span_id})
    calls = {s.tool_call_id for s in scores if s.tool_call_id} | {span[2] for span in spans.values() if span[2]}
    by_call, by_span = _tool_executions(project_id, calls, {span[0] for span in spans.values()})
    traces = {s.trace_id for s in scores if s.trace_id}
    rounds_of_trace = _rounds_of_traces(project_id, traces)
    keys = {s.conversation_key for s in scores if s.conversation_key}
    conversation_by_key = _conversations(project_id, keys)
    trace_conversations = _trace_conversations(project_id, traces)
    wanted_rounds = {(s.conversation_key, s.round_key) for s in scores if s.round_key}
    for execution in [e for executions in by_call.values() for e in executions] + list(by_span.values()):
        if execution["round_id"]:
            wanted_rounds.add((execution["conversation_id"], execution["round_id"]))
    round_by_key = _rounds_by_key(project_id, wanted_rounds, conversation_by_key)

    changed = []
    for score in scores:
        before = (score.conversation_id, score.round_id, score.tool_execution_id, score.trace_id, score.span_id)
        conversation = conversation_by_key.get(score.conversation_key)
        execution = round_ = None
        span = spans.get((score.trace_id, score.span_id)) if score.span_id else None
        if score.target == ScoreTarget.TOOL_CALL:
            execution = _pick(by_call.get(score.tool_call_id, []), conversation)
        elif score.target == ScoreTarget.ROUND:
            round_ = round_by_key.get((conversation, score.round_key)) if conversation else None
        elif score.target in (ScoreTarget.SPAN, ScoreTarget.RESPONSE) and span is not None:
            span_pk, span_conversation, span_call = span
            execution = by_span.get(span_pk) or _pick(by_call.get(span_call, []), span_conversation)
            if execution is None:
                in_trace = rounds_of_trace.get(score.trace_id, [])
                round_ = next((r for r in in_trace if r["span_id"] == score.span_id), None) or _only(in_trace)
            conversation = conversation or span_conversation
        elif score.target == ScoreTarget.TRACE:
            round_ = _only(rounds_of_trace.get(score.trace_id, []))
        if execution is not None:
            conversation = execution["conversation_id"]
            round_ = round_ or (round_by_key.get((conversation, execution["round_id"])) if execution["round_id"]
                                else None)
        if round_ is not None:
            conversation = round_["conversation_id"]
        if conversation is None and score.trace_id:
            conversation = trace_conversations.get(score.trace_id)
        score.conversation_id = conversation
        score.round_id = round_["pk"] if round_ is not None else None
        score.tool_execution_id = execution["pk"] if execution is not None else None
        if (score.conversation_id, score.round_id, score.tool_execution_id, score.trace_id, score.span_id) != before:
            changed.append(score)
    return changed


def _pick(executions: list[dict[str, Any]], conversation: int | None) -> dict[str, Any] | None:
    """The execution of a call id: in the named conversation when one is, a record's before a derived one."""
    if conversation is not None:
        executions = [e for e in executions if e["conversation_id"] == conversation] or executions
    if not executions:
        return None
    return min(executions, key=lambda e: (e["source"] != Source.RECORD, -e["pk"]))


def _only(rounds: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The round of a trace when there is one (a record's round wins over derived ones)."""
    records = [r for r in rounds if r["source"] == Source.RECORD]
    candidates = records or rounds
    return candidates[0] if len(candidates) == 1 else None


def _spans(project_id: int, keys: set[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, int | None, str]]:
    """(trace, span) -> (span pk, its conversation, its tool call id)."""
    found: dict[tuple[str, str], tuple[int, int | None, str]] = {}
    by_trace: dict[str, set[str]] = defaultdict(set)
    for trace_id, span_id in keys:
        by_trace[trace_id].add(span_id)
    for traces in _chunks(by_trace):
        span_ids = {span_id for trace in traces for span_id in by_trace[trace]}
        rows = Span.objects.filter(project_id=project_id, trace_id__in=traces, span_id__in=sorted(span_ids))
        for pk, trace_id, span_id, conversation, call in rows.values_list(
                "pk", "trace_id", "span_id", "conversation_id", "tool_call_id"):
            if (trace_id, span_id) in keys:
                found[(trace_id, span_id)] = (pk, conversation, call)
    return found


def _responses_resolve(project_id: int, scores: list[Score]) -> None:
    """Give each response-scored score the trace and span of its model call, when stored."""
    for score in scores:
        spans = Span.objects.filter(project_id=project_id, **{f"attributes__{RESPONSE_ATTRIBUTE}": score.response_id})
        if score.trace_id:
            spans = spans.filter(trace_id=score.trace_id)
        else:
            spans = spans.filter(operation=CHAT, start_time__gte=score.occurred_at - RESPONSE_LOOKBACK,
                                 start_time__lte=score.occurred_at + RESPONSE_SLACK)
        found = spans.values_list("trace_id", "span_id").first()
        if found is not None:
            score.trace_id, score.span_id = found


_EXECUTION_FIELDS = ("pk", "tool_call_id", "conversation_id", "round_id", "source", "linked_span_id")


def _tool_executions(project_id: int, calls: set[str], span_pks: set[int]
                     ) -> tuple[dict[str, list[dict[str, Any]]], dict[int, dict[str, Any]]]:
    by_call: dict[str, list[dict[str, Any]]] = defaultdict(list)
    by_span: dict[int, dict[str, Any]] = {}
    for chunk in _chunks(calls):
        for row in ToolExecution.objects.filter(project_id=project_id, tool_call_id__in=chunk).values(*_EXECUTION_FIELDS):
            by_call[row["tool_call_id"]].append(row)
    for chunk in _chunks(span_pks):
        for row in ToolExecution.objects.filter(linked_span_id__in=chunk).values(*_EXECUTION_FIELDS):
            by_span[row["linked_span_id"]] = row
    return by_call, by_span


_ROUND_FIELDS = ("pk", "trace_id", "span_id", "conversation_id", "round_id", "source")


def _rounds_of_traces(project_id: int, traces: set[str]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for chunk in _chunks(traces):
        for row in Round.objects.filter(project_id=project_id, trace_id__in=chunk).values(*_ROUND_FIELDS):
            found[row["trace_id"]].append(row)
    return found


def _rounds_by_key(project_id: int, wanted: set[tuple[Any, str]], conversation_by_key: dict[str, int]
                   ) -> dict[tuple[int, str], dict[str, Any]]:
    """(conversation pk, round id) -> round; ``wanted`` names conversations by key or pk."""
    pairs = {(conversation_by_key.get(c) if isinstance(c, str) else c, r) for c, r in wanted}
    pairs = {(c, r) for c, r in pairs if c is not None}
    found: dict[tuple[int, str], dict[str, Any]] = {}
    by_conversation: dict[int, set[str]] = defaultdict(set)
    for conversation, round_key in pairs:
        by_conversation[conversation].add(round_key)
    for chunk in _chunks(by_conversation):
        round_keys = sorted({key for conversation in chunk for key in by_conversation[conversation]})
        for row in Round.objects.filter(conversation_id__in=chunk, round_id__in=round_keys).values(*_ROUND_FIELDS):
            key = (row["conversation_id"], row["round_id"])
            if key in pairs and (key not in found or row["source"] == Source.RECORD):
                found[key] = row
    return found


def _conversations(project_id: int, keys: set[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for chunk in _chunks(keys):
        found.update(Conversation.objects.filter(project_id=project_id, external_id__in=chunk)
                     .values_list("external_id", "pk"))
    return found


def _trace_conversations(project_id: int, traces: set[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for chunk in _chunks(traces):
        found.update(TraceConversation.objects.filter(project_id=project_id, trace_id__in=chunk)
                     .values_list("trace_id", "conversation_id"))
    return found


# --- the pass -------------------------------------------------------------------------


def scores_link(batch: Batch) -> None:
    """Resolve again the scores waiting for a trace, tool call or conversation that
    the batch's rows name."""
    project_id = batch.project_id
    if not Score.objects.filter(project_id=project_id).exists():
        # (score_project_time: one probe) a project nobody judges has no score to
        # wait for; reading what the batch names cost 6 % of the drainer in the soak
        return
    window = received_window(batch.since, batch.until) or {}
    traces = set(batch.trace_ids) | set(batch.linked_traces)
    calls: set[str] = set()
    keys: set[str] = set()
    conversations = sorted(batch.conversation_ids)
    for chunk in _chunks(conversations):
        keys.update(Conversation.objects.filter(pk__in=chunk).values_list("external_id", flat=True))
        traces.update(Round.objects.filter(conversation_id__in=chunk, **window).exclude(trace_id="")
                      .values_list("trace_id", flat=True))
        traces.update(Span.objects.filter(conversation_id__in=chunk, **window).exclude(operation="")
                      .values_list("trace_id", flat=True).distinct())
        for trace_id, call in ToolExecution.objects.filter(conversation_id__in=chunk, **window).values_list(
                "trace_id", "tool_call_id"):
            traces.add(trace_id)
            calls.add(call)
    traces.discard("")
    calls.discard("")
    scores = Score.objects.filter(project_id=project_id)
    # Each lookup says its partial index's condition, so the index serves it.
    lookups = (
        (traces, lambda chunk: scores.filter(trace_id__in=chunk).exclude(trace_id="")),
        (calls, lambda chunk: scores.filter(tool_call_id__in=chunk).exclude(tool_call_id="")),
        (keys, lambda chunk: scores.filter(conversation__isnull=True, conversation_key__in=chunk)
         .exclude(conversation_key="")),
        (conversations, lambda chunk: scores.filter(conversation_id__in=chunk)),
    )
    found: dict[int, Score] = {}
    for values, lookup in lookups:
        for chunk in _chunks(values):
            for score in lookup(chunk).filter(WAITING):
                found[score.pk] = score
    changed = targets_resolve(project_id, list(found.values()))
    if changed:
        Score.objects.bulk_update(changed, ["conversation", "round", "tool_execution", "trace_id", "span_id"])


PASS = Pass(
    name="scores_link",
    reads=("Conversation", "Round", "Span", "ToolExecution", "TraceConversation", "Score"),
    writes=("Score",),
    run=scores_link,
)
