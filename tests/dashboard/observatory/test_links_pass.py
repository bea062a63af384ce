"""The links pass (derive/passes/links.py): whichever side of a tool call arrives second
makes the link, so the hourly sweep needs no walk of tool executions and looks back three
hours, not days."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from django.db import connection
from django.test.utils import CaptureQueriesContext

from dashboard.observatory.derive import schedule
from dashboard.observatory.derive.batch import Batch
from dashboard.observatory.derive.drain import passes_run
from dashboard.observatory.derive.passes import links
from dashboard.observatory.models import Conversation, Span, ToolExecution
from tests.dashboard.observatory.helpers import store


def tool_span(project, conversation, *, call: str, received_at: datetime, number: int = 1) -> Span:
    now = datetime.now(timezone.utc)
    return Span.objects.create(
        project=project, conversation=conversation, trace_id=f"{number:032x}", span_id=f"{number:016x}",
        name="execute_tool search", start_time=now, end_time=now, operation="execute_tool", tool_name="search",
        tool_call_id=call, received_at=received_at)


def test_a_spans_batch_links_the_record_stored_before_it_that_its_ingest_missed(project, records):
    """A record committed while the span's batch was being stored: the span's ingest did
    not see it, and the record's own pass ran before the span existed. The span's batch
    links it from the span's side (before, only the hourly walk of two days did)."""
    outcome = store(project, [records.tool_result(conversation="c", result={"tool_call_id": "call_1"})])
    long_ago = datetime.now(timezone.utc) - timedelta(minutes=10)
    ToolExecution.objects.update(received_at=long_ago)  # outside the span batch's window
    conversation = Conversation.objects.get(pk=next(iter(outcome.conversation_ids)))
    now = datetime.now(timezone.utc)
    linked = tool_span(project, conversation, call="call_1", received_at=now)

    passes_run(Batch(project_id=project.pk, conversation_ids={conversation.pk}, since=now - timedelta(seconds=1),
                     until=now + timedelta(seconds=1)))

    assert ToolExecution.objects.get().linked_span == linked
    assert Conversation.objects.get().tool_calls == 1  # the record's call, not the span's besides


def test_a_batch_leaves_the_executions_of_other_calls_alone(project, records):
    store(project, [records.tool_result(conversation="c", result={"tool_call_id": "call_1"}),
                    records.tool_result(conversation="c", result={"tool_call_id": "call_2"})])
    conversation = Conversation.objects.get()
    now = datetime.now(timezone.utc)
    tool_span(project, conversation, call="call_2", received_at=now)
    links.links_refresh(project_id=project.pk, conversation_ids=[conversation.pk],
                        since=now - timedelta(seconds=1), until=now + timedelta(seconds=1))
    assert dict(ToolExecution.objects.values_list("tool_call_id", "linked_span__tool_call_id")) == {
        "call_1": None, "call_2": "call_2"}


def test_the_hourly_sweep_reads_no_tool_execution_and_nothing_older_than_its_lookback(project, records):
    """Its cost follows the last hour's arrivals: days of unlinked tool executions (records
    whose agent sends no spans) and old unlinked spans are not read."""
    old = datetime.now(timezone.utc) - timedelta(days=1)
    store(project, [records.tool_result(conversation=f"c{n}", at=old, result={"tool_call_id": f"old_{n}"})
                    for n in range(20)])
    before = datetime.now(timezone.utc) - links.SWEEP_LOOKBACK - timedelta(minutes=5)
    recent = datetime.now(timezone.utc) - timedelta(minutes=5)
    for number, start in ((1, before), (2, recent)):
        Span.objects.create(project=project, trace_id=f"{number:032x}", span_id=f"{number:016x}", name="agent",
                            start_time=start, end_time=start, attributes={"gen_ai.conversation.id": f"s{number}"})

    with CaptureQueriesContext(connection) as captured:
        counts = schedule.links_sweep(project.pk)

    assert counts["spans"] == 1
    assert set(Span.objects.exclude(conversation=None).values_list("trace_id", flat=True)) == {f"{2:032x}"}
    by_project_and_time = [  # what the walk of two days was: executions of the project in a time range
        sql for sql in (q["sql"] for q in captured.captured_queries)
        if sql.startswith("SELECT") and '"observatory_toolexecution"."project_id" =' in sql
        and re.search(r'"observatory_toolexecution"\."(occurred|received)_at" >=', sql)]
    assert by_project_and_time == []
