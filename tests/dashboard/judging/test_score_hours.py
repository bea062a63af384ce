"""The scores summary's hourly rows: the database marks the hour of every score
written, changed or deleted (a conversation's cascade included); a refresh recomputes
those hours from the rows; the summary equals a recomputation from the score rows
whether the hours were refreshed or not, and reads no score row when none changed."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from tests.dashboard.web.pages_factories import full_conversation

from dashboard.judging.models import Score, ScoreConfig, ScoreHour, ScoreHourChanged
from dashboard.judging.selectors import score_groups, score_summary
from dashboard.judging.services import Author, score_hours_refresh, scores_store
from dashboard.observatory.models import Conversation, ToolExecution
from pipeline import ScoreRecord

pytestmark = pytest.mark.django_db
HOUR = datetime(2026, 3, 2, 10, tzinfo=timezone.utc)
SINCE, UNTIL = HOUR - timedelta(days=1), HOUR + timedelta(days=1)


def store(project, *records):
    return scores_store(project=project, author=Author.of_key(None),
                        scores=[ScoreRecord(**{"conversation_id": "conv-1", **record}) for record in records])


def marked(project) -> set[datetime]:
    return set(ScoreHourChanged.objects.filter(project=project).values_list("hour", flat=True))


def recomputed(project) -> dict[str, tuple[int, float | None, int]]:
    """Per name from the rows: count, mean of the values, negatives."""
    found = {}
    for name in set(Score.objects.filter(project=project).values_list("name", flat=True)):
        rows = list(Score.objects.filter(project=project, name=name, occurred_at__gte=SINCE, occurred_at__lt=UNTIL))
        values = [row.value for row in rows if row.value is not None]
        found[name] = (len(rows), sum(values) / len(values) if values else None, sum(row.negative for row in rows))
    return {name: figures for name, figures in found.items() if figures[0]}


def summarised(project) -> dict[str, tuple[int, float | None, int]]:
    return {s.name: (s.count, s.mean, s.negatives)
            for s in score_summary(project, since=SINCE, until=UNTIL, bucket="hour")}


def test_the_database_marks_the_hour_of_each_write_update_and_delete(project):
    store(project, {"score_id": "a", "name": "n", "value": 1, "occurred_at": HOUR + timedelta(minutes=5)})
    assert marked(project) == {HOUR}
    ScoreHourChanged.objects.all().delete()
    Score.objects.filter(score_id="a").update(occurred_at=HOUR + timedelta(hours=2, minutes=1))
    assert marked(project) == {HOUR, HOUR + timedelta(hours=2)}  # left and entered
    ScoreHourChanged.objects.all().delete()
    Score.objects.filter(score_id="a").delete()
    assert marked(project) == {HOUR + timedelta(hours=2)}


def test_a_conversations_cascade_marks_its_scores_hours(project):
    full_conversation(project, "conv-1", rounds=1)
    store(project, {"name": "n", "value": 1, "occurred_at": HOUR - timedelta(hours=5)})
    score_hours_refresh(project=project, since=SINCE, until=UNTIL)
    assert summarised(project) == {"n": (1, 1.0, 0)}
    Conversation.objects.filter(project=project).delete()  # what retention does
    assert marked(project) == {HOUR - timedelta(hours=5)}
    assert summarised(project) == {}
    score_hours_refresh(project=project, since=SINCE, until=UNTIL)
    assert summarised(project) == {} and not ScoreHour.objects.exists()


@pytest.fixture
def mixed(project):
    full_conversation(project, "conv-1", rounds=2)
    ScoreConfig.objects.create(project=project, name="stars", kind="numeric", min_value=1, max_value=5)
    call = ToolExecution.objects.filter(project=project).first()
    store(project, *[{"name": "stars", "value": v, "round_id": f"conv-1-r{i % 2}",
                      "occurred_at": HOUR + timedelta(minutes=7 * i)} for i, v in enumerate([1, 2, 5, 4, 4, 3])])
    store(project, *[{"name": "ok", "value": i % 3 != 0, "tool_call_id": call.tool_call_id,
                      "occurred_at": HOUR - timedelta(hours=i)} for i in range(6)])
    store(project, {"name": "verdict", "label": "wrong", "occurred_at": HOUR})
    return project


def test_the_summary_is_the_same_before_and_after_a_refresh_and_equals_the_rows(mixed):
    live = score_summary(mixed, since=SINCE, until=UNTIL, bucket="hour")
    assert summarised(mixed) == recomputed(mixed)
    hours = score_hours_refresh(project=mixed, since=SINCE, until=UNTIL)
    assert hours == 6 and not marked(mixed)  # HOUR and the five before it
    stored = score_summary(mixed, since=SINCE, until=UNTIL, bucket="hour")
    assert [(s.name, s.count, s.mean, s.negatives, s.distribution, s.series) for s in stored] == [
        (s.name, s.count, s.mean, s.negatives, s.distribution, s.series) for s in live]
    stars = next(s for s in stored if s.name == "stars")
    assert stars.distribution == [("1", 1), ("2", 1), ("3", 1), ("4", 2), ("5", 1)]
    assert dict(next(s for s in stored if s.name == "ok").distribution) == {"true": 4, "false": 2}
    days = score_summary(mixed, since=SINCE, until=UNTIL, bucket="day")
    assert sum(n for s in days for _, n, _ in s.series) == Score.objects.count()


def test_an_edit_after_a_refresh_is_counted(mixed):
    score_hours_refresh(project=mixed, since=SINCE, until=UNTIL)
    Score.objects.filter(name="stars", value=1).update(value=5.0, negative=False)
    assert summarised(mixed) == recomputed(mixed)  # the hour is computed again, live
    score_hours_refresh(project=mixed, since=SINCE, until=UNTIL)
    assert summarised(mixed) == recomputed(mixed)


def test_per_tool_and_per_model_equal_the_rows(mixed):
    score_hours_refresh(project=mixed, since=SINCE, until=UNTIL)
    by_tool = {(g.name, g.group): (g.count, g.negatives) for g in score_groups(mixed, since=SINCE, until=UNTIL,
                                                                                by="tool")}
    tool = ToolExecution.objects.filter(project=mixed).first().tool_name
    assert by_tool == {("ok", tool): (6, 2)}
    by_model = {(g.name, g.group): g.count for g in score_groups(mixed, since=SINCE, until=UNTIL, by="model")}
    assert by_model == {("ok", "gpt-4o"): 6, ("stars", "gpt-4o"): 6, ("verdict", "gpt-4o"): 1}


def test_a_refreshed_range_is_read_without_a_score_row(mixed):
    score_hours_refresh(project=mixed, since=SINCE, until=UNTIL)
    with CaptureQueriesContext(connection) as captured:
        score_summary(mixed, since=SINCE, until=UNTIL, bucket="hour")
    assert not [q for q in captured.captured_queries if '"judging_score"' in q["sql"]]
    assert len(captured.captured_queries) == 2  # the changed hours (none), the hourly rows


def test_many_distinct_values_are_binned_from_the_rows(project):
    full_conversation(project, "conv-1", rounds=1)
    values = [i / 1000 for i in range(150)]
    store(project, *[{"name": "similarity", "value": v, "occurred_at": HOUR + timedelta(seconds=i)}
                     for i, v in enumerate(values)])
    score_hours_refresh(project=project, since=SINCE, until=UNTIL)
    assert ScoreHour.objects.get(dimension="", name="similarity").counts is None
    (summary,) = score_summary(project, since=SINCE, until=UNTIL, bucket="hour")
    assert len(summary.distribution) == 10 and sum(n for _, n in summary.distribution) == 150
    assert summary.distribution[0] == ("0–0.0149", 15) and summary.distribution[-1][1] == 15
