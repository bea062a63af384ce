"""One tool execution at BRIEF, STANDARD and FULL, and each level's cost per tool."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse
from tests.dashboard.web.pages_factories import store, tool_record

from dashboard.observatory.models import ToolExecution

pytestmark = pytest.mark.django_db


@pytest.fixture
def execution(project):
    store(project, [
        tool_record("c", tool="query_sales", level="brief", tokens={"brief": 12, "standard": 55, "full": 700}),
        tool_record("c", tool="query_sales", level="full", tokens={"brief": 8, "standard": 45, "full": 300}),
        tool_record("c", tool="other", level="full", tokens={"brief": 1, "standard": 2, "full": 3}),
    ])
    return ToolExecution.objects.get(project=project, tool_name="query_sales", output_level="brief")


def test_it_shows_three_levels_with_the_seen_one_highlighted(client_in, execution):
    response = client_in.get(reverse("web:levels", args=[execution.project.slug, execution.pk]))
    assert response.status_code == 200
    body = response.content.decode()
    columns = re.findall(r'<div class="level-col( seen)?" data-level="(\w+)">', body)
    assert columns == [(" seen", "brief"), ("", "standard"), ("", "full")]
    assert re.search(r'data-testid="tokens-brief">12 tokens<', body)
    assert re.search(r'data-testid="tokens-standard">55 tokens<', body)
    assert re.search(r'data-testid="tokens-full">700 tokens<', body)
    assert execution.full_observation in body and execution.standard_observation in body


def test_it_sums_each_levels_cost_across_the_tools_calls(client_in, execution):
    body = client_in.get(reverse("web:levels", args=[execution.project.slug, execution.pk])).content.decode()
    table = re.search(r'data-testid="level-costs">(.*?)</table>', body, re.S).group(1)
    cells = re.findall(r'<td class="num">([^<]*)</td>', table)
    # (calls, total) per row: BRIEF, STANDARD, FULL, as given to the model
    assert cells == ["2", "20", "2", "100", "2", "1,000", "2", "312"]


def test_it_says_when_a_rendering_was_not_sent(client_in, project):
    record = tool_record("c", tool="t")
    record["renderings"] = [r for r in record["renderings"] if r["level"] != "full"]
    store(project, [record])
    execution = ToolExecution.objects.get(project=project, tool_name="t")
    body = client_in.get(reverse("web:levels", args=[project.slug, execution.pk])).content.decode()
    assert "The agent did not send this rendering." in body
    assert re.search(r'data-testid="tokens-full">—<', body)


def test_it_escapes_renderings(client_in, project):
    record = tool_record("c", tool="t")
    for r in record["renderings"]:
        r["observation"] = "<script>steal()</script>"
    store(project, [record])
    execution = ToolExecution.objects.get(project=project, tool_name="t")
    body = client_in.get(reverse("web:levels", args=[project.slug, execution.pk])).content.decode()
    assert "<script>steal()" not in body and body.count("&lt;script&gt;steal()&lt;/script&gt;") == 3


def test_it_keeps_the_query_count_flat(client_in, execution, django_assert_max_num_queries):
    url = reverse("web:levels", args=[execution.project.slug, execution.pk])
    with django_assert_max_num_queries(8):  # + the price table and the sampled calls' prices
        assert client_in.get(url).status_code == 200


def test_it_prices_what_each_level_policy_would_have_saved(client_in, execution):
    from tests.dashboard.web.pages_factories import price_rule as price

    from dashboard.tuning.models import PriceRule
    from dashboard.web.costs import usd_text

    PriceRule.objects.all().delete()
    price("gpt-4o*", "2", "8")  # $2 / 1M input tokens = 2,000,000 pico-USD a token
    body = client_in.get(reverse("web:levels", args=[execution.project.slug, execution.pk])).content.decode()
    calls = ToolExecution.objects.filter(project=execution.project, tool_name="query_sales")
    for level in ("brief", "standard", "full"):
        row = re.search(rf'<tr data-level="{level}">(.*?)</tr>', body, re.S).group(1)
        at_level = sum(getattr(c, f"{level}_tokens") for c in calls) * 2_000_000
        as_seen = sum(c.observation_tokens for c in calls) * 2_000_000
        assert re.search(r'data-field="usd">([^<]*)<', row).group(1) == usd_text(at_level)
        saving = re.search(r'data-field="saving">([^<]*)<', row).group(1)
        expected = usd_text(abs(as_seen - at_level))
        assert saving == (f"+{expected}" if as_seen > at_level else f"−{expected}" if as_seen < at_level else expected)


def test_it_says_no_price_when_the_model_has_none(client_in, project):
    record = tool_record("c", tool="t")
    record["model"] = "acme-large"
    store(project, [record])
    execution = ToolExecution.objects.get(project=project, tool_name="t")
    body = client_in.get(reverse("web:levels", args=[project.slug, execution.pk])).content.decode()
    assert re.search(r'data-field="usd">no price<', body)
    assert 'data-testid="unpriced-calls">1 call' in body


def test_it_prices_a_call_that_names_no_model_at_its_conversations_model(client_in, project):
    from tests.dashboard.web.pages_factories import price_rule as price

    from dashboard.observatory.models import Conversation
    from dashboard.tuning.models import PriceRule
    from dashboard.web.costs import usd_text

    PriceRule.objects.all().delete()
    price("gpt-4o*", "2", "8")  # 2,000,000 pico-USD an input token
    named, unnamed = tool_record("c", tool="t"), tool_record("c", tool="t", tokens={"brief": 5, "standard": 7,
                                                                                   "full": 9})
    unnamed["model"] = None
    other = tool_record("d", tool="t")
    other["model"] = None  # and its conversation's model has no price
    store(project, [named, unnamed, other])
    Conversation.objects.filter(project=project, external_id="c").update(model="gpt-4o")
    Conversation.objects.filter(project=project, external_id="d").update(model="acme-large")
    assert ToolExecution.objects.filter(project=project, model="").count() == 2
    execution = ToolExecution.objects.filter(project=project, tool_name="t").first()
    body = client_in.get(reverse("web:levels", args=[project.slug, execution.pk])).content.decode()
    row = re.search(r'<tr data-level="full">(.*?)</tr>', body, re.S).group(1)
    assert re.search(r'data-field="usd">([^<]*)<', row).group(1) == usd_text((400 + 9) * 2_000_000)
    assert 'data-testid="unpriced-calls">1 call' in body
