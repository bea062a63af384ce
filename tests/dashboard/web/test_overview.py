"""The project overview: totals, daily trend and recent failures, against the rows."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.urls import reverse
from tests.dashboard.web.pages_factories import HOUR, full_conversation, store, tool_record

from dashboard.observatory.models import Conversation, ToolExecution

pytestmark = pytest.mark.django_db


@pytest.fixture
def filled(project):
    full_conversation(project, "a", rounds=2)
    full_conversation(project, "b", rounds=3)
    store(project, [tool_record("old", at=HOUR - timedelta(days=40), success=False, error_type="network")])
    return project


def value(body: str, testid: str) -> str:
    return re.search(rf'data-testid="{testid}">([^<]*)<', body).group(1)


def test_it_totals_the_range_from_the_rows(client_in, filled):
    body = client_in.get(reverse("web:overview", args=[filled.slug]) + "?range=7d").content.decode()
    recent = ToolExecution.objects.filter(project=filled, occurred_at__gte=HOUR - timedelta(days=6))
    calls, errors = recent.count(), recent.filter(success=False).count()
    assert value(body, "total-tool-calls") == f"{calls:,}"
    assert value(body, "error-rate") == f"{errors / calls * 100:.1f}%"
    started = Conversation.objects.filter(project=filled, started_at__gte=HOUR - timedelta(days=6)).count()
    assert value(body, "total-conversations") == f"{started:,}"


def test_it_widens_with_the_range(client_in, filled):
    body = client_in.get(reverse("web:overview", args=[filled.slug]) + "?range=90d").content.decode()
    assert value(body, "total-tool-calls") == f"{ToolExecution.objects.filter(project=filled).count():,}"


def test_it_draws_the_daily_trend(client_in, filled):
    body = client_in.get(reverse("web:overview", args=[filled.slug])).content.decode()
    start = body.index('<script id="trend-data" type="application/json">')
    data = json.loads(body[body.index(">", start) + 1: body.index("</script>", start)])
    day = HOUR.strftime("%Y-%m-%d")
    assert day in data["labels"]
    i = data["labels"].index(day)
    rows = ToolExecution.objects.filter(project=filled, occurred_at__date=HOUR.date())
    assert data["calls"][i] == rows.count()
    assert data["errors"][i] == rows.filter(success=False).count()
    assert data["tokens"][i] == sum(rows.values_list("observation_tokens", flat=True))


def test_it_lists_recent_failures_linked_to_their_conversations(client_in, filled):
    body = client_in.get(reverse("web:overview", args=[filled.slug])).content.decode()
    failure = ToolExecution.objects.filter(project=filled, success=False).order_by("-occurred_at").first()
    link = reverse("web:conversation", args=[filled.slug, failure.conversation_id]) + f"#exec-{failure.pk}"
    assert link in body


def test_it_keeps_the_query_count_flat(client_in, filled, django_assert_max_num_queries):
    page = reverse("web:overview", args=[filled.slug])
    with django_assert_max_num_queries(8):
        assert client_in.get(page).status_code == 200


def test_it_shows_an_empty_project(client_in, project):
    body = client_in.get(reverse("web:overview", args=[project.slug])).content.decode()
    assert "No tool calls in this range." in body and "No failures." in body
