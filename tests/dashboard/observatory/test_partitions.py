"""Spans partitioned by day on PostgreSQL (observatory.partitions, migration 0008):
days created ahead, a span of any time stored, retention by dropping whole days
(only those past every project's retention), retried batches still stored once,
and the conversion of a populated table. SQLite keeps row deletes (last test)."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

import pytest
from django.db import connection
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from dashboard.observatory import partitions, tasks
from dashboard.observatory.models import Conversation, Span, ToolExecution
from dashboard.tuning.models import RetentionPolicy

pytestmark = pytest.mark.django_db
postgres_only = pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="spans are partitioned on PostgreSQL only"
)



@pytest.fixture(autouse=True)
def _constraints_checked_at_once(db):
    """The test's one transaction would otherwise hold deferred foreign-key checks of
    the rows it inserted, and PostgreSQL alters or drops no table with checks pending
    (a real run has none: each ingest batch commits before a partition is touched)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


NOW = datetime.now(timezone.utc)
TODAY = NOW.date()


def at(day: date, hour: int = 12) -> datetime:
    return datetime(day.year, day.month, day.day, hour, tzinfo=timezone.utc)


def nanos(moment: datetime) -> int:
    return int(moment.timestamp()) * 1_000_000_000


def spans_request(moments: list[datetime], trace: bytes = b"\x01" * 16) -> bytes:
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for index, moment in enumerate(moments):
        span = scope.spans.add()
        span.trace_id = trace
        span.span_id = (index + 1).to_bytes(8, "big")
        span.name = f"step {index}"
        span.start_time_unix_nano = nanos(moment)
        span.end_time_unix_nano = nanos(moment) + 5_000_000
    return request.SerializeToString()


def post(client, auth, body: bytes):
    return client.post("/v1/traces", data=body, content_type="application/x-protobuf", **auth)


def partition_of(span_id: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM observatory_span WHERE span_id = %s", [span_id])
        return cursor.fetchone()[0]


def span(project, index: int, moment: datetime, **fields) -> Span:
    return Span.objects.create(project=project, trace_id=f"{index:032x}", span_id=f"{index:016x}",
                               start_time=moment, end_time=moment, **fields)


@postgres_only
def test_it_creates_the_days_ahead_once(project):
    later = NOW + timedelta(days=40)
    created = partitions.spans_partitions_ensure(now=later)
    days = [later.date() + timedelta(days=n) for n in range(-1, partitions.DAYS_AHEAD + 1)]
    assert created == [partitions.partition_name(day) for day in days]
    assert set(days) <= set(partitions.span_day_partitions())
    assert partitions.spans_partitions_ensure(now=later) == []
    assert tasks.spans_partitions_maintain() == []  # today's week is there since the migration


@postgres_only
def test_it_stores_a_span_of_any_time_and_a_day_created_later_takes_its_rows(client, project, auth):
    odd = [datetime(1990, 1, 2, tzinfo=timezone.utc), at(TODAY + timedelta(days=60)), at(TODAY)]
    assert post(client, auth, spans_request(odd)).status_code == 200
    assert Span.objects.count() == 3
    assert partition_of(f"{1:016x}") == partitions.DEFAULT_PARTITION
    assert partition_of(f"{2:016x}") == partitions.DEFAULT_PARTITION
    assert partition_of(f"{3:016x}") == partitions.partition_name(TODAY)

    partitions.spans_partitions_ensure(now=odd[1], days_ahead=0, days_back=0)
    assert partition_of(f"{2:016x}") == partitions.partition_name(odd[1].date())
    assert partition_of(f"{1:016x}") == partitions.DEFAULT_PARTITION
    assert Span.objects.count() == 3


@postgres_only
def test_it_stores_a_retried_batch_once_across_days_and_after_its_day_is_created(client, project, auth):
    moments = [at(TODAY - timedelta(days=2)), at(TODAY), at(TODAY + timedelta(days=1), 23),
               at(TODAY + timedelta(days=30))]
    body = spans_request(moments)
    assert post(client, auth, body).status_code == 200
    assert post(client, auth, body).status_code == 200
    assert Span.objects.count() == 4
    partitions.spans_partitions_ensure(now=moments[-1], days_ahead=0, days_back=0)  # out of the default one
    assert post(client, auth, body).status_code == 200
    assert Span.objects.count() == 4
    assert len({partition_of(f"{n:016x}") for n in range(1, 5)}) == 4


@postgres_only
def test_it_drops_only_the_days_past_the_longest_retention(project, other_project):
    RetentionPolicy.objects.create(project=project, span_days=3)
    RetentionPolicy.objects.create(project=other_project, span_days=10)
    partitions.spans_partitions_ensure(now=NOW - timedelta(days=13), days_back=3)  # days 16..6 ago
    ages = [16, 15, 11, 10, 9, 5, 2, 0]
    for age in ages:
        for owner, offset in ((project, 0), (other_project, 100)):
            span(owner, age + offset, at(TODAY - timedelta(days=age), 1))
    conversation = Conversation.objects.create(project=project, external_id="c")
    linked = ToolExecution.objects.create(
        project=project, conversation=conversation, record_id="00000000-0000-0000-0000-000000000001",
        occurred_at=NOW, tool_name="t", tool_call_id="call", output_level="brief", success=True,
        linked_span=Span.objects.get(project=project, span_id=f"{15:016x}"),
    )

    with connection.cursor() as cursor:  # a drop interrupted after its detach: the next one finishes it
        cursor.execute(f"ALTER TABLE observatory_span DETACH PARTITION {partitions.partition_name(TODAY - timedelta(days=16))}")

    outcome = tasks.purge_expired()
    gone = {partitions.partition_name(TODAY - timedelta(days=age)) for age in range(11, 17)}
    assert outcome["span_partitions"] == 6
    assert not gone & set(partitions.span_day_partitions().values())
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_class WHERE relname = ANY(%s)", [sorted(gone)])
        assert cursor.fetchone()[0] == 0
    assert partitions.partition_name(TODAY - timedelta(days=10)) in partitions.span_day_partitions().values()
    # the longer retention keeps whole days up to 10 ago; the shorter one deletes rows past 3 days
    assert sorted(Span.objects.filter(project=other_project).values_list("start_time__date", flat=True)) == [
        TODAY - timedelta(days=age) for age in (10, 9, 5, 2, 0)
    ]
    assert sorted(Span.objects.filter(project=project).values_list("start_time__date", flat=True)) == [
        TODAY - timedelta(days=age) for age in (2, 0)
    ]
    assert outcome["spans"] == 3  # the shorter retention's rows of 10, 9 and 5 days ago
    # The link keeps the id of a span that is gone (clearing it would cost an update
    # per link); no span has that id, so nothing links to the wrong one.
    linked.refresh_from_db()
    assert linked.linked_span_id is not None and not Span.objects.filter(pk=linked.linked_span_id).exists()
    assert tasks.purge_expired()["span_partitions"] == 0


@postgres_only
def test_it_drops_nothing_a_project_without_a_policy_still_keeps(project, other_project, settings):
    settings.OBSERVATORY_RETENTION_SPAN_DAYS = 30
    RetentionPolicy.objects.create(project=project, span_days=3)
    partitions.spans_partitions_ensure(now=NOW - timedelta(days=20), days_back=1)
    span(other_project, 1, at(TODAY - timedelta(days=20)))
    assert partitions.spans_partitions_drop() == []
    assert Span.objects.count() == 1


@postgres_only
def test_it_converts_a_populated_table_and_back(client, project, auth, member_client, settings):
    from tests.dashboard.observatory.test_migrations import migrate

    conversation = Conversation.objects.create(project=project, external_id="conv")
    moments = [at(TODAY - timedelta(days=n % 20), n % 24) for n in range(60)] + [datetime(2001, 1, 1, tzinfo=timezone.utc)]
    migrate("0007_spans_conventions")
    assert not partitions.spans_partitioned()
    Span.objects.bulk_create([
        Span(project=project, trace_id="ab" * 16, span_id=f"{n:016x}", parent_span_id="" if n == 0 else f"{0:016x}",
             start_time=moment, end_time=moment + timedelta(seconds=1), conversation=conversation if n % 2 else None,
             tool_call_id=f"call_{n}" if n % 5 == 0 else "", attributes={"n": n})
        for n, moment in enumerate(moments)
    ])
    before = sorted(Span.objects.values_list("id", "span_id", "start_time", "conversation_id", "attributes"))
    last_id = max(row[0] for row in before)

    migrate("0008_spans_partitioned")
    assert partitions.spans_partitioned()
    assert sorted(Span.objects.values_list("id", "span_id", "start_time", "conversation_id", "attributes")) == before
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM ONLY observatory_span_default")
        # no day of their own: 2001, and the days before the longest retention (the purge takes them)
        first_day = partitions.day_start(TODAY - timedelta(days=settings.OBSERVATORY_RETENTION_SPAN_DAYS))
        assert cursor.fetchone()[0] == sum(moment < first_day for moment in moments) > 1
        constraints = connection.introspection.get_constraints(cursor, "observatory_span")
    assert constraints["observatory_span_pkey"]["columns"] == ["id", "start_time"]
    assert constraints["span_unique"]["columns"] == ["project_id", "trace_id", "span_id", "start_time"]
    assert {"span_project_time", "span_conversation_time", "span_project_tool_call", "span_project_roots",
            "span_tool_time"} <= set(constraints)
    # ingest and the pages work on the converted table (with the migrations after it:
    # today's code reads their tables); ids go on from the old sequence
    migrate(None)
    assert post(client, auth, spans_request([NOW], trace=b"\x02" * 16)).status_code == 200
    assert Span.objects.get(trace_id="02" * 16).pk > last_id
    assert member_client.get(f"/p/{project.slug}/traces/{'ab' * 16}/").status_code == 200
    assert member_client.get(f"/p/{project.slug}/traces/").status_code == 200
    assert member_client.get(f"/p/{project.slug}/conversations/{conversation.pk}/").status_code == 200

    migrate("0007_spans_conventions")  # and back, one row per (project, trace, span)
    assert not partitions.spans_partitioned()
    assert Span.objects.count() == len(before) + 1
    migrate(None)
    assert Span.objects.count() == len(before) + 1


@pytest.mark.skipif("connection.vendor != 'sqlite'", reason="the SQLite path")
def test_it_keeps_row_deletes_on_sqlite(project):
    span(project, 1, NOW - timedelta(days=20))
    span(project, 2, NOW)
    assert not partitions.spans_partitioned()
    assert partitions.spans_partitions_ensure() == [] and partitions.spans_partitions_drop() == []
    assert tasks.purge_expired()["spans"] == 1
    assert list(Span.objects.values_list("span_id", flat=True)) == [f"{2:016x}"]
