"""Migrations that move derived data: what was derived before is derived again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from dashboard.observatory import tasks
from dashboard.observatory.derive import drain
from dashboard.observatory.models import DerivationNote, ToolExecution, ToolHourlyRollup, ToolMinuteRollup, hour_of
from dashboard.observatory.services import records_store
from pipeline import parse_record


def migrate(target: str | None = None) -> None:
    """Observatory to ``target``, or every app to its latest migration (where every test
    after this one runs: the apps whose migrations depend on observatory's, which going
    back unapplied, included)."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes() if target is None else [("observatory", target)])


@pytest.mark.django_db(transaction=True)  # migrations change the schema
def test_the_hours_rolled_up_before_minute_slices_are_recomputed_into_slices(project, records):
    """0015: an hour's rollup becomes the sum of its minute slices. The hours rolled up
    before have none, so each gets a note to recompute it whole; a minute recomputed
    before that note is drained leaves the hour with that minute alone until it is."""
    hours = [hour_of(records.now) - timedelta(hours=n) for n in (30, 2)]
    records_store(project=project, records=[
        parse_record(records.tool_result(tool="search", at=hour + timedelta(minutes=minute)))
        for hour in hours for minute in (1, 15, 59)
    ])
    try:
        migrate("0014_span_tool_underived")
        # the rollups of before (the model as it was then): the hour's calls, no slices
        rollups_then = MigrationExecutor(connection).loader.project_state(
            ("observatory", "0014_span_tool_underived")).apps.get_model("observatory", "ToolHourlyRollup")
        for hour in hours:
            rollups_then.objects.create(project_id=project.pk, tool_name="search", hour=hour, calls=3, successes=3)
        migrate()  # 0015 and what came after
    finally:
        migrate()
    (note,) = DerivationNote.objects.all()
    assert note.hours == [hour.isoformat() for hour in hours] and not ToolMinuteRollup.objects.exists()
    tasks.tool_rollups_refresh(project.pk, [], [(hours[1] + timedelta(minutes=15)).isoformat()])  # a batch's pass
    assert ToolHourlyRollup.objects.get(hour=hours[1]).calls == 1  # for now: the hour's note puts the rest back
    drain.outbox_drain_all()
    assert dict(ToolHourlyRollup.objects.values_list("hour", "calls")) == {hour: 3 for hour in hours}
    assert ToolMinuteRollup.objects.filter(tool_name="search").count() == 6  # and a mark per minute recomputed
    assert ToolExecution.objects.count() == 6


def _span_project_constraints() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname FROM pg_constraint WHERE contype = 'f' AND conrelid = 'observatory_span'::regclass "
            "AND confrelid = 'accounts_project'::regclass"
        )
        return [name for (name,) in cursor.fetchall()]


@pytest.mark.django_db(transaction=True)
def test_spans_have_no_project_constraint_on_postgresql_and_it_comes_back_when_migrated_back(project):
    """0018: the constraint checked at every span's insert is dropped; migrating back adds it again."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only: SQLite keeps its table as it is")
    assert _span_project_constraints() == []
    try:
        migrate("0017_trace_conversations")
        assert len(_span_project_constraints()) == 1
    finally:
        migrate()
    assert _span_project_constraints() == []


@pytest.mark.django_db(transaction=True)  # migrations change the schema
def test_span_derived_calls_counted_as_0_before_become_unknown_and_their_hours_recomputed(project, records):
    """0021: a tool execution derived from a span before was never counted (its 0
    meant "unknown"): it becomes null, and its hour gets a note to recompute its rollups."""
    from dashboard.observatory.models import Conversation

    records_store(project=project, records=[parse_record(records.tool_result(tool="search"))])
    conversation = Conversation.objects.get()
    try:
        migrate("0020_toolexec_conversation_round")
        executions_then = MigrationExecutor(connection).loader.project_state(
            ("observatory", "0020_toolexec_conversation_round")).apps.get_model("observatory", "ToolExecution")
        executions_then.objects.create(
            project_id=project.pk, conversation_id=conversation.pk, record_id="6f1d1c2e-5b0a-4c1e-9d3c-7a7f0e6b5a11",
            occurred_at=records.now, source="span", tool_name="search", tool_call_id="call_s", output_level="",
            success=True, observation_tokens=0)
        DerivationNote.objects.all().delete()
        migrate()
    finally:
        migrate()
    assert dict(ToolExecution.objects.values_list("source", "observation_tokens")) == {"record": 0, "span": None}
    (note,) = DerivationNote.objects.all()
    assert note.hours == [hour_of(records.now).isoformat()]
    drain.outbox_drain_all()
    assert ToolHourlyRollup.objects.get(tool_name="search").unknown_token_calls == 1
