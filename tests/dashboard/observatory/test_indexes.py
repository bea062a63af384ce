"""The span and tool execution indexes: few, several of them partial, and every
query that needs one can use it (a partial index serves only a query whose WHERE
implies its condition). Checked on the plan the database makes, on SQLite and on
PostgreSQL (with sequential scans discouraged, since the test tables are tiny)."""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dashboard.observatory.derive.passes import links, rollups, totals
from dashboard.observatory.models import SPAN_TOOL_FAILURE, Conversation, Span, ToolExecution
from dashboard.observatory.services import records_store
from dashboard.web.selectors.traces import waterfall
from pipeline import parse_record

pytestmark = pytest.mark.django_db

NOW = datetime.now(timezone.utc) - timedelta(minutes=5)
# More ids than PostgreSQL expands when it proves a partial index's condition from
# an IN list (100): the query must state the condition itself.
MANY = 150


def span(project, index: int, **fields) -> Span:
    return Span.objects.create(
        project=project, trace_id=fields.pop("trace_id", f"{index:032x}"), span_id=f"{index:016x}",
        start_time=NOW, end_time=NOW + timedelta(milliseconds=5), **fields,
    )


def plan_lines(sql: str, params=()) -> list[str]:
    """One line per access to a table: 'SEARCH <table> USING … (<condition>)' or
    'SCAN …' on SQLite; on PostgreSQL the same shape, built from the JSON plan.

    PostgreSQL's spans are partitioned by day (observatory.partitions): a partition
    and its indexes are named by their parents, and the empty partitions (the days
    ahead and behind, where the planner's pick reads nothing) are left out."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
            return [row[-1] for row in cursor.fetchall()]
        cursor.execute("ANALYZE observatory_span, observatory_toolexecution, observatory_traceconversation")  # the test rows' statistics
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        document = cursor.fetchone()[0]
        cursor.execute("SET LOCAL enable_seqscan = on")
        cursor.execute(
            "SELECT c.relname, p.relname FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent"
        )
        parents = dict(cursor.fetchall())
        cursor.execute(
            "SELECT t.relname, ic.relname FROM pg_inherits i JOIN pg_class t ON t.oid = i.inhrelid "
            "JOIN pg_index x ON x.indrelid = t.oid JOIN pg_class ic ON ic.oid = x.indexrelid "
            "WHERE t.relkind = 'r' AND t.reltuples <= 0"
        )
        rows = cursor.fetchall()
        empty, empty_indexes = {table for table, _ in rows}, {index for _, index in rows}
    lines: list[str] = []

    def walk(node: dict) -> None:
        kind = node["Node Type"]
        if "Relation Name" in node or kind == "Bitmap Index Scan":
            table = node.get("Relation Name", "")
            index = parents.get(node.get("Index Name", ""), node.get("Index Name", ""))
            if table in empty or (kind == "Bitmap Index Scan" and node["Index Name"] in empty_indexes):
                pass
            elif kind in ("Index Scan", "Index Only Scan", "Bitmap Index Scan") and node.get("Index Cond"):
                lines.append(f"SEARCH {parents.get(table, table)} USING INDEX {index} ({node['Index Cond']})")
            elif kind != "Bitmap Heap Scan":
                lines.append(f"SCAN {parents.get(table, table)} {index}")
        for child in node.get("Plans", []):
            walk(child)

    walk((json.loads(document) if isinstance(document, str) else document)[0]["Plan"])
    return lines


def plan_of(queryset) -> str:
    sql, params = queryset.query.sql_with_params()
    return "\n".join(plan_lines(sql, params))


def index_used(queryset, index: str) -> bool:
    if index == "span_unique" and connection.vendor == "sqlite":
        index = "sqlite_autoindex_observatory_span_1"  # SQLite's name for the unique constraint
    return re.search(rf"SEARCH \S*\s*USING (COVERING )?INDEX {index}\b", plan_of(queryset)) is not None


def test_it_serves_the_timeline_and_activity_times_from_the_partial_conversation_indexes(project):
    conversation = Conversation.objects.create(project=project, external_id="c")
    span(project, 1, conversation=conversation)
    span(project, 2)
    timeline = Span.objects.filter(conversation=conversation).order_by("start_time")
    latest_end = Span.objects.filter(conversation=conversation).order_by("-end_time").values("end_time")[:1]
    released = Span.objects.filter(conversation_id__in=list(range(1, MANY))).values("conversation_id")  # SET_NULL
    assert index_used(timeline, "span_conversation_time")  # also the first start
    assert index_used(latest_end, "span_conversation_end")  # the last activity: one entry, not every span
    assert index_used(released, "span_conversation_time") or index_used(released, "span_conversation_end")
    assert list(timeline.values_list("span_id", flat=True)) == [f"{1:016x}"]


def test_a_totals_pass_counts_a_conversations_tool_calls_in_its_minutes_through_the_index(project, records):
    outcome = records_store(project=project, records=[parse_record(records.tool_result(at=NOW))])
    (pk,) = outcome.conversation_ids
    others = [Conversation.objects.create(project=project, external_id=f"other-{n}") for n in range(30)]
    ToolExecution.objects.bulk_create(  # enough rows that the statistics tell the indexes apart
        ToolExecution(project=project, conversation=others[n % 30], record_id=uuid.uuid4(), tool_name="t",
                      success=True, occurred_at=NOW - timedelta(seconds=n * 7))
        for n in range(3000))
    totals.conversation_totals_refresh(conversation_ids=[pk])
    with CaptureQueriesContext(connection) as queries:
        totals.conversation_totals_refresh(conversation_ids=[pk], minutes=[NOW])
    counting = [q["sql"] for q in queries if 'FROM "observatory_toolexecution"' in q["sql"] and "COUNT(" in q["sql"]]
    assert counting
    for sql in counting:
        plan = "\n".join(plan_lines(sql))
        assert re.search(r"SEARCH \S*\s*USING (COVERING )?INDEX toolexec_conversation_time \(.*occurred_at", plan), plan


def test_it_serves_tool_span_hours_from_the_partial_tool_index(project):
    span(project, 1, tool_name="search")
    span(project, 2)
    hour = NOW.replace(minute=0, second=0, microsecond=0)
    tool_spans = Span.objects.filter(
        project=project, start_time__gte=hour, start_time__lt=hour + timedelta(hours=1)
    ).exclude(tool_name="")
    assert index_used(tool_spans, "span_tool_time")
    assert list(tool_spans.values_list("tool_name", flat=True)) == ["search"]
    assert rollups.hours_with_rows(project_id=project.pk, since=hour) == {hour}


def test_it_finds_a_tools_failed_span_only_calls_through_their_partial_index(project):
    from dashboard.observatory.selectors import recent_span_failures

    span(project, 1, tool_name="search", status_code=2)
    span(project, 2, tool_name="search", attributes={"error.type": "timeout"})
    span(project, 3, tool_name="search")
    Span.objects.bulk_create([  # successful calls the query must not walk
        Span(project=project, trace_id=f"{1000 + i:032x}", span_id=f"{i:016x}", start_time=NOW, end_time=NOW,
             tool_name="search")
        for i in range(300)
    ])
    failures = Span.objects.filter(SPAN_TOOL_FAILURE, project=project, tool_name="search").order_by("-start_time")
    if connection.vendor == "postgresql":  # SQLite cannot prove the OR of the condition: span_tool_time there
        assert index_used(failures, "span_tool_failures"), plan_of(failures)
    assert {s.span_id for s in recent_span_failures(project, tool_name="search")} == {f"{1:016x}", f"{2:016x}"}


def test_it_finds_spans_by_many_tool_call_ids_through_the_partial_index(project):
    span(project, 1, tool_call_id="call_1")
    span(project, 2)
    Span.objects.bulk_create([  # enough other spans that an index on the project alone is not as good
        Span(project=project, trace_id=f"{1000 + i:032x}", span_id=f"{i:016x}", start_time=NOW, end_time=NOW)
        for i in range(300)
    ])
    calls = {f"call_{i}" for i in range(MANY)}
    by_call, by_trace = links._spans_by_calls_or_traces(Span.objects.filter(project=project), calls, {"f" * 32})
    assert index_used(by_call, "span_project_tool_call")
    # By trace: the unique index leads with (project, trace_id); on a tiny table
    # PostgreSQL may as well pick another index whose condition has trace_id.
    assert index_used(by_trace, "span_unique") or re.search(r"USING INDEX \S+ \(.*trace_id", plan_of(by_trace))
    assert [s.tool_call_id for s in by_call] == ["call_1"]


def test_it_serves_the_trace_view_and_the_purge_from_full_indexes(project):
    span(project, 1, trace_id="a" * 32)
    Span.objects.bulk_create([
        Span(project=project, trace_id=f"{1000 + i:032x}", span_id=f"{i:016x}",
             start_time=NOW - timedelta(hours=i), end_time=NOW - timedelta(hours=i))
        for i in range(300)
    ])
    expired = Span.objects.filter(project=project, start_time__lt=NOW - timedelta(hours=290))
    assert index_used(Span.objects.filter(project=project, trace_id="a" * 32), "span_unique")
    assert index_used(expired, "span_project_time"), plan_of(expired)
    assert waterfall(project, "a" * 32).rows


def test_it_finds_tool_executions_by_artifact_through_the_partial_index(project, records):
    records_store(project=project, records=[parse_record(records.tool_result(result={"artifact_id": "artifact_" + "1" * 16}))])
    named = ToolExecution.objects.filter(project=project, artifact_id__in=["artifact_" + "1" * 16]).exclude(artifact_id="")
    assert index_used(named, "toolexec_project_artifact")
    assert named.count() == 1


def test_it_links_a_batch_without_scanning_the_span_table(project, records):
    """After a records batch, every span query of the link task is an index search
    on more than the project: the work follows the batch, not the table."""
    Span.objects.bulk_create([  # spans the batch has nothing to do with
        Span(project=project, trace_id=f"{1000 + i:032x}", span_id=f"{i:016x}", start_time=NOW, end_time=NOW)
        for i in range(300)
    ])
    span(project, 1, trace_id="b" * 32, tool_call_id="call_a")
    span(project, 2, trace_id="b" * 32)
    outcome = records_store(project=project, records=[
        parse_record(records.tool_result(result={"tool_call_id": "call_a"})),
        parse_record(records.round(trace_id="c" * 32)),
    ])
    with CaptureQueriesContext(connection) as captured:
        counts = links.links_refresh(project_id=project.pk, conversation_ids=sorted(outcome.conversation_ids))
    assert counts["tool_executions"] == 1 and counts["spans"] == 2
    span_reads = [q["sql"] for q in captured.captured_queries
                  if q["sql"].startswith("SELECT") and "observatory_span" in q["sql"].split("WHERE")[0]
                  and not q["sql"].rstrip().endswith("LIMIT 1")]
    assert span_reads
    for sql in span_reads:
        for line in plan_lines(sql):
            # Span accesses only (a tool execution probed by the span it links to
            # names observatory_span in its condition, not as its table).
            if "observatory_span" not in line or "toolexecution" in line.split(" (")[0]:
                continue
            assert line.startswith("SEARCH"), (line, sql)
            condition = line[line.index("(") + 1:]
            assert re.search(r"trace_id|tool_call_id|conversation_id|start_time", condition), (line, sql)


def test_it_bounds_the_beat_pass_to_the_newest_unlinked_spans(project, monkeypatch):
    monkeypatch.setattr(links, "BEAT_SPAN_LIMIT", 2)
    for index in range(3):
        Span.objects.create(
            project=project, trace_id=f"{index:032x}", span_id=f"{index:016x}",
            start_time=NOW + timedelta(seconds=index), end_time=NOW + timedelta(seconds=index),
            attributes={"gen_ai.conversation.id": f"conv-{index}"},
        )
    counts = links.links_refresh(project_id=project.pk)
    assert counts["spans"] == 2
    linked = set(Span.objects.exclude(conversation=None).values_list("span_id", flat=True))
    assert linked == {f"{1:016x}", f"{2:016x}"}  # the newest two; the next pass takes the rest
    assert links.links_refresh(project_id=project.pk)["spans"] == 1


def test_it_keeps_the_span_table_to_few_indexes(project):
    """Each index costs every span insert: pk, unique, project+time, and nine
    partial ones that plain spans skip (the trace list's holds one span a trace,
    the failed spans' and the failed span-only tool calls' almost none, the
    underived tool spans' none of a conversation's tool calls, the two of a
    conversation's spans only those that name one)."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, Span._meta.db_table)
    indexed = {name for name, c in constraints.items() if c["index"] or c["unique"] or c["primary_key"]}
    assert len(indexed) <= 12, sorted(indexed)


def test_it_tests_each_trace_for_errors_through_the_partial_error_index(project):
    from dashboard.web.selectors.traces import trace_page, trace_roots

    span(project, 1, trace_id="a" * 32)  # a root whose child failed
    span(project, 2, trace_id="a" * 32, parent_span_id=f"{1:016x}", status_code=2)
    span(project, 3, trace_id="b" * 32)  # a root whose children all went well
    Span.objects.bulk_create([  # spans of the good trace the test must not read one by one
        Span(project=project, trace_id="b" * 32, span_id=f"{100 + i:016x}", parent_span_id=f"{3:016x}",
             start_time=NOW, end_time=NOW, status_code=1)
        for i in range(300)
    ])
    roots = trace_roots(project, has_errors=True)
    assert index_used(roots, "span_trace_errors"), plan_of(roots)
    assert [row.root.trace_id for row in trace_page(roots).rows] == ["a" * 32]


def test_it_finds_a_batchs_spans_to_derive_through_the_partial_received_index(project):
    """The span-row pass after a batch reads the spans received with its notes' batches,
    not every span of a long conversation (span_derivable_received, both ends)."""
    from dashboard.observatory.derive import batch
    from dashboard.observatory.derive.passes import span_rows

    conversation = Conversation.objects.create(project=project, external_id="c")
    span(project, 1, conversation=conversation, operation="execute_tool", tool_name="search")
    span(project, 2, conversation=conversation)
    received_at = datetime.now(timezone.utc)  # the spans' (their default)
    (received, *by_trace) = span_rows._candidate_queries(
        project.pk, list(range(conversation.pk, conversation.pk + MANY)), "execute_tool",
        batch.received_window(received_at - timedelta(minutes=1), received_at + timedelta(minutes=1)),
        ["a" * 32])
    assert index_used(received, "span_derivable_received"), plan_of(received)
    assert list(received.values_list("span_id", flat=True)) == [f"{1:016x}"]
    assert len(by_trace) == 1


def test_it_reads_an_hours_span_only_calls_through_the_underived_index(project):
    """The rollup's span-only calls are looked for among the tool spans no span-row
    pass derives, not among every tool span of the hour."""
    conversation = Conversation.objects.create(project=project, external_id="c")
    span(project, 1, tool_name="search")  # outside any conversation: span-only
    span(project, 2, tool_name="search", conversation=conversation, operation="execute_tool")  # derived
    span(project, 3, tool_name="search", conversation=conversation)  # a tool name, not a tool call's span
    Span.objects.bulk_create([  # derived tool spans the query must not walk
        Span(project=project, trace_id=f"{1000 + i:032x}", span_id=f"{i:016x}", start_time=NOW, end_time=NOW,
             tool_name="search", conversation=conversation, operation="execute_tool")
        for i in range(300)
    ])
    hour = NOW.replace(minute=0, second=0, microsecond=0)
    calls = rollups.span_only_calls(project.pk, hour, hour + timedelta(hours=1))
    assert index_used(calls, "span_tool_underived"), plan_of(calls)
    assert sorted(calls.values_list("span_id", flat=True)) == [f"{1:016x}", f"{3:016x}"]


def test_it_finds_the_calls_a_conversation_holds_through_the_call_id_index(project, records):
    """The span-row pass asks which calls its conversations already hold: through the
    project's call-id index, never by reading each conversation's tool executions."""
    from dashboard.observatory.derive.passes import span_rows

    records_store(project=project, records=[
        parse_record(records.tool_result(conversation="c", result={"tool_call_id": f"call_{i}"})) for i in range(300)
    ])
    conversation = Conversation.objects.get(project=project)
    held = span_rows.calls_held(project.pk, [conversation.pk, *range(10_000, 10_000 + MANY)], ["call_7", "call_x"])
    assert index_used(held, "toolexec_project_tool_call"), plan_of(held)
    assert list(held.values_list("tool_call_id", flat=True)) == ["call_7"]


def test_ingest_finds_a_batch_s_traces_by_the_trace_table_s_unique_key(project):
    """One probe a trace (observatory.trace_links), where reading the spans planned
    every day partition on PostgreSQL: about 1 ms of its CPU for each small batch."""
    from dashboard.observatory.trace_links import _trace_query, trace_conversations_record

    conversation = Conversation.objects.create(project=project, external_id="c")
    trace_conversations_record(project_id=project.pk, links=[
        (f"{n:032x}", conversation.pk, NOW - timedelta(minutes=n)) for n in range(200)])
    plan = "\n".join(plan_lines(_trace_query(2), [project.pk, "a" * 32, "b" * 32]))
    # SQLite names the unique constraint's index itself
    index = "sqlite_autoindex_observatory_traceconversation_1" if connection.vendor == "sqlite" else "trace_conversation_unique"
    assert re.search(rf"SEARCH \S*\s*USING (COVERING )?INDEX {index} \(.*trace_id", plan), plan


def test_a_batchs_rounds_are_found_through_the_received_index_not_the_conversations_history(project):
    """The totals pass after batches derives the rounds they brought: found by when
    they were received (round_conversation_received), not by reading every round of
    each conversation (round_conversation_index) and filtering: that cost a long
    conversation its history on every batch."""
    import uuid as uuid_module

    from dashboard.observatory.derive.batch import received_window
    from dashboard.observatory.models import Round

    conversation = Conversation.objects.create(project=project, external_id="c")
    earlier = NOW - timedelta(hours=1)

    def round_(index: int, received) -> Round:
        return Round(project=project, conversation=conversation, record_id=uuid_module.uuid4(), occurred_at=received,
                     received_at=received, round_id=f"r{index}", index=index)

    Round.objects.bulk_create([round_(i, earlier) for i in range(300)])  # the history
    new = Round.objects.create(project=project, conversation=conversation, record_id=uuid_module.uuid4(),
                               occurred_at=NOW, received_at=NOW, round_id="r300", index=300)
    scope = totals.Scope(received=received_window(NOW - timedelta(seconds=1), NOW + timedelta(seconds=1)))
    with CaptureQueriesContext(connection) as captured:
        found = totals._scoped_rounds([conversation.pk], {project.pk}, scope)
    assert found == {conversation.pk: {new.pk}}
    reads = [q["sql"] for q in captured.captured_queries if 'FROM "observatory_round"' in q["sql"]]
    assert reads
    for sql in reads:
        assert any(re.search(r"USING (COVERING )?INDEX round_conversation_received\b", line)
                   for line in plan_lines(sql)), (plan_lines(sql), sql)


def test_a_batchs_rounds_tool_calls_are_counted_through_the_partial_round_index(project, records):
    """Counted per (conversation, round id) from a VALUES list: each probe must use the
    partial toolexec_conversation_round, never a conversation's calls by time (its
    history: the returning conversations of bench_burst paid for it)."""
    outcome = records_store(project=project, records=[
        parse_record(records.tool_result(result={"tool_call_id": "call_a"})),
    ])
    (conversation_id,) = sorted(outcome.conversation_ids)
    ToolExecution.objects.bulk_create([  # a history the counts must not read
        ToolExecution(project=project, conversation_id=conversation_id, record_id=uuid.uuid4(), occurred_at=NOW,
                      tool_name="search", round_id=f"old-{i}", tool_call_id=f"old-{i}", success=True)
        for i in range(300)
    ])
    with CaptureQueriesContext(connection) as captured:
        totals._rounds_tool_counts([(conversation_id, "old-1"), (conversation_id, "r-none")])
    (sql,) = [q["sql"] for q in captured.captured_queries]
    lines = plan_lines(sql)
    assert any(re.search(r"USING (COVERING )?INDEX toolexec_conversation_round\b", line) for line in lines), lines
