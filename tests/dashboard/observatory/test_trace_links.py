"""TraceConversation: the conversation of each trace, which ingest looks up for a
batch's unnamed traces instead of reading the spans."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from dashboard.observatory.models import Conversation, Span, TraceConversation
from dashboard.observatory.services import retention_purge
from dashboard.observatory.trace_links import trace_conversations_find, trace_conversations_record
from tests.dashboard.observatory.test_migrations import migrate

NOW = datetime.now(timezone.utc)


def _span(project, trace_id: str, span_id: str, at: datetime, conversation=None) -> Span:
    return Span.objects.create(project=project, trace_id=trace_id, span_id=span_id, start_time=at,
                               end_time=at + timedelta(seconds=1), conversation=conversation)


@pytest.mark.django_db
def test_a_trace_keeps_the_conversation_recorded_first_and_lookups_stay_in_the_project(project, other_project):
    first = Conversation.objects.create(project=project, external_id="first")
    second = Conversation.objects.create(project=project, external_id="second")
    trace = "a" * 32
    trace_conversations_record(project_id=project.pk, links=[(trace, first.pk, NOW)])
    trace_conversations_record(project_id=project.pk, links=[(trace, second.pk, NOW), ("b" * 32, second.pk, NOW)])
    assert trace_conversations_find(project_id=project.pk, trace_ids=[trace, "b" * 32, "c" * 32]) == {
        trace: first.pk, "b" * 32: second.pk}
    assert trace_conversations_find(project_id=other_project.pk, trace_ids=[trace]) == {}


@pytest.mark.django_db
def test_a_batch_of_more_traces_than_one_statement_takes_is_recorded_whole(project):
    conversation = Conversation.objects.create(project=project, external_id="c")
    links = [(f"{n:032x}", conversation.pk, NOW) for n in range(450)]  # three statements of at most 200
    trace_conversations_record(project_id=project.pk, links=links)
    assert TraceConversation.objects.filter(project=project).count() == 450


@pytest.mark.django_db
def test_retention_removes_a_trace_s_row_with_its_spans(project):
    conversation = Conversation.objects.create(project=project, external_id="c", last_activity_at=NOW)
    trace_conversations_record(project_id=project.pk, links=[
        ("a" * 32, conversation.pk, NOW - timedelta(days=400)), ("b" * 32, conversation.pk, NOW - timedelta(hours=1))])
    retention_purge(project=project, now=NOW)
    assert list(TraceConversation.objects.values_list("trace_id", flat=True)) == ["b" * 32]


@pytest.mark.django_db
def test_deleting_a_conversation_removes_its_traces_rows(project):
    conversation = Conversation.objects.create(project=project, external_id="c")
    trace_conversations_record(project_id=project.pk, links=[("a" * 32, conversation.pk, NOW)])
    conversation.delete()
    assert not TraceConversation.objects.exists()


@pytest.mark.django_db(transaction=True)  # migrations change the schema
def test_the_migration_records_the_traces_of_the_spans_already_linked(project):
    """0017 fills the table from the spans stored before: per trace its lowest
    conversation id (one of them: a stored span's, as ingest found before) and the
    earliest start; a trace with no linked span gets no row."""
    try:
        migrate("0016_conversation_minutes")
        early = Conversation.objects.create(project=project, external_id="early")
        late = Conversation.objects.create(project=project, external_id="late")
        at = NOW - timedelta(hours=3)
        _span(project, "a" * 32, "1" * 16, at + timedelta(minutes=5), late)
        _span(project, "a" * 32, "2" * 16, at, early)
        _span(project, "a" * 32, "3" * 16, at - timedelta(minutes=1))  # unlinked: not its start
        _span(project, "b" * 32, "1" * 16, at)  # no conversation: no row
        migrate()
        (row,) = TraceConversation.objects.all()
        assert (row.trace_id, row.conversation_id, row.started_at) == ("a" * 32, min(early.pk, late.pk), at)
    finally:
        migrate()
