"""Rows read a page at a time in the order of a column (``keyset_pages``): every row
once, ties on the column included, however the rows read change meanwhile."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dashboard.observatory.derive.passes import links
from dashboard.observatory.models import Conversation, Span, ToolExecution
from dashboard.observatory.paging import keyset_pages
from dashboard.observatory.services import records_store
from pipeline import parse_record

pytestmark = pytest.mark.django_db

AT = datetime.now(timezone.utc) - timedelta(hours=1)


def execution(project, seconds: int, **fields) -> ToolExecution:
    conversation, _ = Conversation.objects.get_or_create(project=project, external_id="c")
    return ToolExecution.objects.create(
        project=project, conversation=conversation, record_id=uuid.uuid4(), tool_name=fields.pop("tool_name", "t"), success=True,
        tool_call_id=f"call-{uuid.uuid4().hex[:8]}", output_level="standard",
        occurred_at=AT + timedelta(seconds=seconds), **fields)


def test_it_reads_every_row_once_in_order_ties_included_a_page_a_query(project):
    rows = [execution(project, seconds) for seconds in (5, 1, 3, 3, 3, 0, 9)]
    with CaptureQueriesContext(connection) as queries:
        pages = list(keyset_pages(ToolExecution.objects.all(), "occurred_at", ("id",), 2))
    assert [len(page) for page in pages] == [2, 2, 2, 1]
    expected = [row.pk for row in sorted(rows, key=lambda row: (row.occurred_at, row.pk))]
    assert [pk for page in pages for (pk,) in page] == expected
    assert len(queries) == 4


def test_rows_that_leave_the_query_while_it_is_read_skip_none_of_the_others(project):
    rows = [execution(project, seconds % 3) for seconds in range(9)]
    seen = []
    for page in keyset_pages(ToolExecution.objects.filter(tool_name="t"), "occurred_at", ("id",), 2):
        ids = [pk for (pk,) in page]
        seen += ids
        ToolExecution.objects.filter(pk__in=ids).update(tool_name="done")  # as linking takes rows out of the beat's query
    assert sorted(seen) == sorted(row.pk for row in rows) and len(seen) == len(set(seen))


def five_calls_to_link_two_a_page(project, records, monkeypatch) -> tuple[list[str], list[int]]:
    """Five tool executions unlinked, each with its span, and the link pass reading two
    a page; returns the calls and the records' conversations (the batch's)."""
    monkeypatch.setattr(links, "LINK_CHUNK", 2)
    calls = [f"call_{n}" for n in range(5)]
    outcome = records_store(project=project, records=[
        parse_record(records.tool_result(result={"tool_call_id": call})) for call in calls])
    now = datetime.now(timezone.utc)
    Span.objects.bulk_create([
        Span(project=project, trace_id=f"{n + 1:032x}", span_id=f"{n + 1:016x}", start_time=now, end_time=now,
             tool_call_id=call) for n, call in enumerate(calls)])
    return calls, sorted(outcome.conversation_ids)


def test_a_batchs_link_pass_links_executions_past_one_page(project, records, monkeypatch):
    calls, conversations = five_calls_to_link_two_a_page(project, records, monkeypatch)
    counts = links.links_refresh(project_id=project.pk, conversation_ids=conversations)
    assert counts["tool_executions"] == len(calls)
    assert not ToolExecution.objects.filter(linked_span=None).exists()


def test_the_link_pass_writes_a_page_at_a_time_inside_its_step_and_reads_outside(project, records, monkeypatch):
    """With ``step`` (the beat's: on SQLite the drain lock), each page's links are
    written inside one step and the next page is read outside any: the outbox drains
    between pages. Held for the whole pass, the hour-long soak's last notes waited
    while the beat read 6.7M tool executions."""
    import contextlib

    calls, conversations = five_calls_to_link_two_a_page(project, records, monkeypatch)
    held, steps, linked_inside = [], [], []

    @contextlib.contextmanager
    def step():
        assert not held, "a step began inside another"
        held.append(True)
        steps.append(1)
        try:
            yield
        finally:
            held.pop()

    real_pages, real_link = links.keyset_pages, links._executions_link

    def pages(*args):
        for page in real_pages(*args):
            assert not held, "a page was read inside a step"
            yield page

    def link(*args):
        linked_inside.append(bool(held))
        return real_link(*args)

    monkeypatch.setattr(links, "keyset_pages", pages)
    monkeypatch.setattr(links, "_executions_link", link)
    counts = links.links_refresh(project_id=project.pk, conversation_ids=conversations, step=step)
    assert counts["tool_executions"] == len(calls)
    assert linked_inside and all(linked_inside)
    assert len(steps) == 3 + 1  # 5 executions, 2 a page; then the spans' side and the artifacts


def test_values_read_gives_what_django_reads_column_by_column(project):
    """values_read converts by column type itself: the rows must equal the ORM's own, for
    every kind of column the passes read (datetimes with and without microseconds, JSON
    of every shape and null, booleans, annotations, a JSON key) and nothing found."""
    from django.db.models import Count, Exists, OuterRef
    from django.db.models.functions import Now

    from dashboard.observatory.dbfunctions import MinuteUTC
    from dashboard.observatory.paging import values_read

    conversation = Conversation.objects.create(project=project, external_id="c")
    shapes = [{}, {"a": [1, 2.5, None, True], "订单": "<b>", "n": {"x": ""}}, [], "text", 0, None]
    for index, attributes in enumerate(shapes):
        Span.objects.create(
            project=project, conversation=conversation if index % 2 else None, trace_id=f"{index:032x}",
            span_id=f"{index:016x}", name=f"span {index}", start_time=AT + timedelta(microseconds=index * 7),
            end_time=AT + timedelta(seconds=index), attributes=attributes if attributes is not None else {},
            events=[{"name": "e", "attributes": {"k": index}}] if index % 3 else [], resource={"service.name": "s"},
            truncated=bool(index % 2), status_code=index % 3)
    spans = Span.objects.filter(project=project)
    queries = [
        spans.order_by("start_time", "id").values_list(
            "id", "conversation_id", "trace_id", "start_time", "end_time", "duration_ms", "status_code",
            "attributes", "events", "resource", "truncated", "received_at"),
        spans.annotate(minute=MinuteUTC("start_time"), linked=Exists(ToolExecution.objects.filter(
            linked_span_id=OuterRef("pk"))), now=Now()).order_by("id").values_list("minute", "linked", "id"),
        spans.values("status_code").order_by("status_code").annotate(n=Count("id")).values_list("status_code", "n"),
        spans.order_by("id").values_list("attributes__a", "attributes__n", "id"),
        spans.filter(pk__in=[]).values_list("id"),
        spans.order_by("id").values_list("id", "start_time")[2:4],
    ]
    for query in queries:
        assert values_read(query) == list(query)
    assert values_read(queries[0])[1][7] == shapes[1]


def test_values_read_names_its_rows_as_values_list_does(project):
    from dashboard.observatory.paging import values_read

    execution(project, 3)
    query = ToolExecution.objects.values_list("id", "occurred_at", "success")
    assert values_read(query, named=True) == list(query.values_list("id", "occurred_at", "success", named=True))
    assert values_read(query, named=True)[0].occurred_at == AT + timedelta(seconds=3)
