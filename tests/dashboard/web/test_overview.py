"""The project overview: totals, daily trend and recent failures, against the rows."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.db.models import Count, Q, Sum
from django.urls import reverse
from django.utils import timezone
from tests.dashboard.web.pages_factories import HOUR, full_conversation, round_record, store, tool_record

from dashboard.observatory.models import Conversation, ToolExecution
from dashboard.web.templatetags.observatory import tokens

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
    started = Conversation.objects.filter(project=filled, started_at__gte=HOUR - timedelta(days=6))
    assert value(body, "total-conversations") == f"{started.count():,}"


def test_it_totals_the_conversations_started_in_the_range_from_the_rows(client_in, filled):
    # The cards read the usage rollups: they must say what the conversation rows say.
    store(filled, [round_record("clean", 0), tool_record("clean", round_id="clean-r0")])  # no error
    body = client_in.get(reverse("web:overview", args=[filled.slug]) + "?range=7d").content.decode()
    started = Conversation.objects.filter(project=filled, started_at__gte=HOUR - timedelta(days=6))
    rows = started.aggregate(n=Count("id"), with_errors=Count("id", filter=Q(has_errors=True)),
                             tokens_in=Sum("input_tokens"), tokens_out=Sum("output_tokens"))
    assert (rows["n"], rows["with_errors"]) == (3, 2) and rows["tokens_in"] > 0
    assert value(body, "total-conversations") == f"{rows['n']:,}"
    assert value(body, "conversations-with-errors") == f"{rows['with_errors']:,}"
    assert (value(body, "input-tokens"), value(body, "output-tokens")) == (
        tokens(rows["tokens_in"]), tokens(rows["tokens_out"]))


def test_it_widens_with_the_range(client_in, filled):
    body = client_in.get(reverse("web:overview", args=[filled.slug]) + "?range=90d").content.decode()
    assert value(body, "total-tool-calls") == f"{ToolExecution.objects.filter(project=filled).count():,}"


def series_of(body: str) -> dict:
    start = body.index('<script id="series-data" type="application/json">')
    return json.loads(body[body.index(">", start) + 1: body.index("</script>", start)])


def test_it_draws_hourly_series_equal_to_the_rows(client_in, filled):
    data = series_of(client_in.get(reverse("web:overview", args=[filled.slug]) + "?range=7d").content.decode())
    assert data["step"] == "hour" and len(data["labels"]) == 7 * 24
    i = data["starts"].index(HOUR.isoformat())
    rows = ToolExecution.objects.filter(project=filled, occurred_at__gte=HOUR, occurred_at__lt=HOUR + timedelta(hours=1))
    assert data["calls"][i] == rows.count()
    assert data["errors"][i] == rows.filter(success=False).count()
    assert data["observation_tokens"][i] == sum(rows.values_list("observation_tokens", flat=True))
    started = Conversation.objects.filter(project=filled, started_at__gte=HOUR, started_at__lt=HOUR + timedelta(hours=1))
    assert data["conversations"][i] == started.count()
    assert data["tokens"][i] == sum(c.input_tokens + c.output_tokens for c in started)
    assert data["cost_usd"][i] == pytest.approx(sum(c.cost_pico_usd or 0 for c in started) / 1e12)
    assert sum(data["calls"]) == ToolExecution.objects.filter(project=filled, occurred_at__gte=HOUR - timedelta(days=6)).count()


def test_it_links_each_bucket_to_the_conversations_started_in_it(client_in, filled):
    data = series_of(client_in.get(reverse("web:overview", args=[filled.slug]) + "?range=7d").content.decode())
    i = data["starts"].index(HOUR.isoformat())
    listed = client_in.get(data["links"][i]).content.decode()
    started = Conversation.objects.filter(project=filled, started_at__gte=HOUR, started_at__lt=HOUR + timedelta(hours=1))
    assert started.count() == data["conversations"][i] > 0
    for conversation in started:
        assert conversation.external_id in listed
    empty = data["links"][i - 1]
    assert "No conversation matches." in client_in.get(empty).content.decode()


def test_it_draws_daily_buckets_past_seven_days(client_in, filled):
    data = series_of(client_in.get(reverse("web:overview", args=[filled.slug]) + "?range=90d").content.decode())
    assert data["step"] == "day" and 90 <= len(data["labels"]) <= 91
    assert sum(data["calls"]) == ToolExecution.objects.filter(project=filled).count()


def test_it_shows_cost_by_model_equal_to_the_conversations(client_in, filled):
    from dashboard.web.costs import usd_text

    body = client_in.get(reverse("web:overview", args=[filled.slug]) + "?range=90d").content.decode()
    conversations = Conversation.objects.filter(project=filled)
    priced = [c.cost_pico_usd for c in conversations if c.cost_pico_usd is not None]
    assert value(body, "total-cost") == usd_text(sum(priced))
    assert 'data-model="gpt-4o"' in body


def test_it_lists_recent_failures_linked_to_their_conversations(client_in, filled):
    body = client_in.get(reverse("web:overview", args=[filled.slug])).content.decode()
    failure = ToolExecution.objects.filter(project=filled, success=False).order_by("-occurred_at").first()
    link = reverse("web:conversation", args=[filled.slug, failure.conversation_id]) + f"#exec-{failure.pk}"
    assert link in body


def test_it_keeps_the_query_count_flat(client_in, filled, django_assert_max_num_queries):
    page = reverse("web:overview", args=[filled.slug])
    # + the cost totals (2), the series' two rollups, the range's fit (2), the metrics (3: hours, others, per model and hour)
    with django_assert_max_num_queries(16):
        assert client_in.get(page).status_code == 200


@pytest.mark.parametrize("ago, opened", [(timedelta(hours=2), "24h"), (timedelta(days=3), "7d"),
                                         (timedelta(days=20), "30d"), (timedelta(days=80), "90d")])
def test_it_opens_on_the_smallest_range_that_holds_the_data(client_in, project, ago, opened):
    now = timezone.now()
    store(project, [round_record("old", 0, at=now - ago), tool_record("old", at=now - ago),
                    round_record("new", 0, at=HOUR), tool_record("new")])
    body = client_in.get(reverse("web:overview", args=[project.slug])).content.decode()
    assert re.search(r"Range:.*?<strong>([^<]+)</strong>", body, re.S).group(1) == opened
    assert value(body, "range-why") == f"{opened}: the smallest range that holds the data"
    assert value(body, "total-conversations") == "2"  # both, and the calls of both
    assert value(body, "total-tool-calls") == str(ToolExecution.objects.filter(project=project).count())
    data = series_of(body)
    assert sum(data["conversations"]) == 2 and data["step"] == ("day" if opened in ("30d", "90d") else "hour")


def test_it_opens_on_24_hours_with_no_data_and_says_why(client_in, project):
    store(project, [round_record("ancient", 0, at=timezone.now() - timedelta(days=200))])
    body = client_in.get(reverse("web:overview", args=[project.slug]) + "?range=junk").content.decode()
    assert value(body, "range-why") == "24h: no data in the last 90d"
    assert len(series_of(body)["labels"]) == 24


def test_it_keeps_the_range_the_url_asks_for(client_in, project):
    store(project, [round_record("c", 0)])
    body = client_in.get(reverse("web:overview", args=[project.slug]) + "?range=30d").content.decode()
    assert re.search(r"Range:.*?<strong>([^<]+)</strong>", body, re.S).group(1) == "30d"
    assert 'data-testid="range-why"' not in body


def test_it_shows_an_empty_project(client_in, project):
    body = client_in.get(reverse("web:overview", args=[project.slug])).content.decode()
    assert "No conversations in this range." in body and "No failures." in body
    assert value(body, "total-cost") == "no price"


def test_it_never_shows_an_unpriced_tool_cost_as_zero(client_in, project):
    from dashboard.tuning.models import PriceRule

    PriceRule.objects.all().delete()
    store(project, [tool_record("c")])
    body = client_in.get(reverse("web:overview", args=[project.slug])).content.decode()
    assert value(body, "tool-cost") == "no price" and value(body, "total-cost") == "no price"
    data = series_of(body)
    assert data["tool_cost_usd"][data["starts"].index(HOUR.isoformat())] is None


def test_it_says_how_many_calls_the_tool_cost_leaves_out(client_in, project):
    # 3 of 4 calls are of a model the price table does not know: the figure is the
    # one priced call's cost, and it says so, never a bare amount that reads as all.
    from dashboard.tuning.pricing import PriceTable
    from dashboard.web.costs import usd_text

    unknown = [tool_record("c", at=HOUR + timedelta(minutes=i)) | {"model": "my-own-model"} for i in range(3)]
    store(project, [round_record("c", 0, model="my-own-model"), tool_record("c"), *unknown])
    body = client_in.get(reverse("web:overview", args=[project.slug])).content.decode()
    priced = ToolExecution.objects.filter(project=project, model="gpt-4o")
    assert priced.count() == 1 and ToolExecution.objects.filter(project=project).count() == 4
    call = priced.get()
    expected = PriceTable.load().price_for("gpt-4o", call.occurred_at).cost(call.observation_tokens)
    assert expected > 0 and value(body, "tool-cost") == usd_text(expected)
    assert value(body, "tool-cost-left-out") == "(3 calls without a price left out)"
    assert "1 round and 3 tool calls in this range" in value(body, "series-left-out")


def test_it_counts_every_call_of_an_unpriced_tool_cost(client_in, project):
    from dashboard.tuning.models import PriceRule

    PriceRule.objects.all().delete()
    store(project, [tool_record("c"), tool_record("c", at=HOUR + timedelta(minutes=1))])
    body = client_in.get(reverse("web:overview", args=[project.slug])).content.decode()
    assert value(body, "tool-cost") == "no price" and value(body, "tool-cost-left-out") == "(2 calls)"


def test_it_escapes_a_hostile_model_name_in_the_cost_table(client_in, project):
    from tests.dashboard.web.pages_factories import round_record

    evil = '"><script>alert(1)</script>'
    store(project, [round_record("c", 0, model=evil)])
    body = client_in.get(reverse("web:overview", args=[project.slug])).content.decode()
    assert "<script>alert(1)</script>" not in body and "&lt;script&gt;" in body
