"""Stored costs equal a recomputation from the stored tokens and the price table
in force on each day; unknown models are unpriced, never 0; a rule change re-prices."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from tests.dashboard.web.pages_factories import HOUR, round_record, store, tool_record
from tests.dashboard.web.pages_factories import price_rule as price

from dashboard.observatory.derive.reprice import costs_reprice
from dashboard.observatory.models import Conversation, Round, ToolExecution, ToolHourlyRollup, UsageHourlyRollup
from dashboard.tuning.models import PriceRule
from dashboard.tuning.pricing import PriceTable

pytestmark = pytest.mark.django_db


@pytest.fixture
def prices():
    PriceRule.objects.all().delete()
    price("gpt-4o*", "2.5", "10")
    price("claude-3-5-sonnet*", "3", "15")


def recomputed(conversation):
    table = PriceTable.load()
    total, unpriced = 0, 0
    for r in Round.objects.filter(conversation=conversation):
        p = table.price_for(r.model or conversation.model, r.occurred_at)
        if p is None:
            unpriced += 1
        else:
            total += r.input_tokens * p.input_pico + r.output_tokens * p.output_pico
    return total, unpriced


def test_it_stores_round_and_conversation_costs_equal_to_a_recomputation(project, prices):
    store(project, [round_record("a", i, at=HOUR + timedelta(minutes=i)) for i in range(3)]
          + [round_record("a", 3, at=HOUR + timedelta(minutes=3), model="claude-3-5-sonnet-20241022")])
    conversation = Conversation.objects.get(external_id="a")
    assert (conversation.cost_pico_usd, conversation.unpriced_rounds) == (recomputed(conversation)[0], 0)
    # 3 rounds of 900 in / 100 out at gpt-4o, 1 at claude: exact integers
    assert conversation.cost_pico_usd == 3 * (900 * 2_500_000 + 100 * 10_000_000) + 900 * 3_000_000 + 100 * 15_000_000
    assert sum(Round.objects.filter(conversation=conversation).values_list("cost_pico_usd", flat=True)) == (
        conversation.cost_pico_usd)


def test_it_never_prices_an_unknown_model_at_zero(project, prices):
    store(project, [round_record("b", 0, model="acme-large"), round_record("b", 1, model="gpt-4o")])
    conversation = Conversation.objects.get(external_id="b")
    assert Round.objects.get(conversation=conversation, index=0).cost_pico_usd is None
    assert conversation.unpriced_rounds == 1
    assert conversation.cost_pico_usd == recomputed(conversation)[0] > 0
    store(project, [round_record("c", 0, model="acme-large")])
    only_unknown = Conversation.objects.get(external_id="c")
    assert only_unknown.cost_pico_usd is None and only_unknown.unpriced_rounds == 1


def test_it_uses_the_price_in_force_on_the_day_of_each_round(project, prices):
    day = HOUR.date()
    price("gpt-4o*", "5", "20", day)  # a price rise from the day of the second round on
    store(project, [round_record("d", 0, at=HOUR - timedelta(days=1)), round_record("d", 1, at=HOUR)])
    costs = dict(Round.objects.filter(conversation__external_id="d").values_list("index", "cost_pico_usd"))
    assert costs == {0: 900 * 2_500_000 + 100 * 10_000_000, 1: 900 * 5_000_000 + 100 * 20_000_000}


def test_it_rolls_usage_up_per_hour_and_model_equal_to_the_conversations(project, prices):
    store(project, [round_record(f"e{i}", 0, at=HOUR + timedelta(minutes=i), model=m)
                    for i, m in enumerate(["gpt-4o", "gpt-4o", "acme-large"])])
    rows = {r.model: r for r in UsageHourlyRollup.objects.filter(project=project, hour=HOUR)}
    conversations = Conversation.objects.filter(project=project)
    assert rows["gpt-4o"].conversations == 2 and rows["acme-large"].unpriced_rounds == 1
    assert sum(r.cost_pico_usd for r in rows.values()) == sum(c.cost_pico_usd or 0 for c in conversations)
    assert sum(r.input_tokens for r in rows.values()) == sum(c.input_tokens for c in conversations)


def test_a_conversation_started_exactly_on_the_hour_counts_in_that_hour_only(project, prices):
    """An hour is [start, start + 1 h): a conversation that starts at 10:00:00.000 is
    10:00's, never also 09:00's (the rollups would count it twice, and the overview's
    figures would exceed the conversations)."""
    store(project, [round_record("on-the-hour", 0, at=HOUR),
                    round_record("half-past", 0, at=HOUR - timedelta(minutes=30))])
    earlier = UsageHourlyRollup.objects.get(project=project, hour=HOUR - timedelta(hours=1))
    on_the_hour = UsageHourlyRollup.objects.get(project=project, hour=HOUR)
    conversations = {c.external_id: c for c in Conversation.objects.filter(project=project)}
    assert conversations["on-the-hour"].started_at == HOUR
    assert (earlier.conversations, on_the_hour.conversations) == (1, 1)
    assert earlier.input_tokens == conversations["half-past"].input_tokens
    assert on_the_hour.cost_pico_usd == conversations["on-the-hour"].cost_pico_usd
    assert sum(r.conversations for r in UsageHourlyRollup.objects.filter(project=project)) == len(conversations)


def test_it_moves_a_conversation_between_hours_when_an_earlier_record_arrives(project, prices):
    store(project, [round_record("f", 1, at=HOUR)])
    assert UsageHourlyRollup.objects.filter(project=project, hour=HOUR).exists()
    store(project, [round_record("f", 0, at=HOUR - timedelta(hours=1))])
    assert not UsageHourlyRollup.objects.filter(project=project, hour=HOUR).exists()  # the stale hour is emptied
    assert UsageHourlyRollup.objects.get(project=project, hour=HOUR - timedelta(hours=1)).conversations == 1


def test_it_prices_observation_tokens_per_tool_at_the_input_rate(project, prices):
    store(project, [tool_record("g", tokens={"brief": 10, "standard": 40, "full": 400}),
                    tool_record("g", level="full"), tool_record("g", tool="load_csv", level="brief")])
    rollups = {r.tool_name: r for r in ToolHourlyRollup.objects.filter(project=project)}
    executions = ToolExecution.objects.filter(project=project)
    for tool, rollup in rollups.items():
        expected = sum(e.observation_tokens * 2_500_000 for e in executions.filter(tool_name=tool))
        assert rollup.cost_pico_usd == expected and rollup.priced_calls == rollup.calls


def test_it_reprices_what_a_changed_rule_matches(project, prices, django_capture_on_commit_callbacks):
    store(project, [round_record("h", 0), tool_record("h", round_id="h-r0"), round_record("i", 0, model="deepseek-chat")])
    PriceRule.objects.filter(pattern="gpt-4o*").update(input_usd_per_million=Decimal("1"))
    price("deepseek*", "0.5", "2")
    with django_capture_on_commit_callbacks(execute=True):
        counts = costs_reprice(patterns=["gpt-4o*", "deepseek*"])
    assert counts["conversations"] == 2
    for external_id in ("h", "i"):
        conversation = Conversation.objects.get(external_id=external_id)
        assert (conversation.cost_pico_usd, conversation.unpriced_rounds) == recomputed(conversation)
    assert Conversation.objects.get(external_id="i").cost_pico_usd == 900 * 500_000 + 100 * 2_000_000
    rollup = ToolHourlyRollup.objects.get(project=project, tool_name="query_sales")
    assert rollup.cost_pico_usd == 40 * 1_000_000  # the standard rendering's 40 tokens at $1 / 1M


def test_it_reprices_nothing_for_a_pattern_no_row_names(project, prices, django_capture_on_commit_callbacks):
    store(project, [round_record("j", 0)])
    with django_capture_on_commit_callbacks(execute=True):
        assert costs_reprice(patterns=["deepseek*"]) == {"conversations": 0, "hours": 0}


def test_it_purges_usage_rollups_with_the_records_they_came_from(project, prices):
    from datetime import datetime, timezone

    from dashboard.observatory.services import retention_purge

    old = datetime(2020, 1, 1, 10, tzinfo=timezone.utc)
    store(project, [round_record("old", 0, at=old), round_record("new", 0)])
    assert UsageHourlyRollup.objects.filter(project=project, hour=old).exists()
    retention_purge(project=project)
    assert not UsageHourlyRollup.objects.filter(project=project, hour=old).exists()
    assert UsageHourlyRollup.objects.filter(project=project, hour=HOUR).exists()
