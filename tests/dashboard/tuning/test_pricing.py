"""The price table: one matcher with the encoder rules, the rule in force on the
day, exact integer costs, and the admin form's refusals."""

from __future__ import annotations

from datetime import date, datetime, timezone
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from tests.dashboard.web.pages_factories import price_rule

from dashboard.tuning.models import PriceRule
from dashboard.tuning.patterns import best_match, match_rank
from dashboard.tuning.pricing import PriceTable, pico_per_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def table_rows():
    PriceRule.objects.all().delete()  # the seeded list prices
    price_rule("gpt-4o*", "2.50", "10.00", date(2024, 1, 1))
    price_rule("gpt-4o-mini*", "0.15", "0.60")
    price_rule("gpt-4o*", "5.00", "20.00", date(2025, 6, 1))  # a price change
    price_rule("claude-3-5-sonnet*", "3", "15")


def test_it_ranks_exact_over_the_most_specific_wildcard():
    assert match_rank("gpt", "GPT") == (1, 3)
    assert match_rank("g*", "gpt") == (0, 1)
    assert match_rank("claude*", "gpt") is None
    assert best_match([("*", "any"), ("gpt-4o*", "4o"), ("gpt-4o-mini*", "mini")], "gpt-4o-mini-2024") == [
        "mini", "4o", "any"]


def test_it_picks_the_most_specific_rule_in_force_that_day(table_rows):
    table = PriceTable.load()
    assert table.price_for("gpt-4o-mini-2024-07-18", date(2025, 1, 1)).input_pico == 150_000
    assert table.price_for("gpt-4o", datetime(2025, 5, 31, 23, 59, tzinfo=timezone.utc)).input_pico == 2_500_000
    assert table.price_for("GPT-4o", date(2025, 6, 1)).output_pico == 20_000_000
    assert table.price_for("gpt-4o", date(2023, 12, 31)) is None  # before any rule
    assert table.price_for("deepseek-chat", date(2025, 1, 1)) is None  # no rule: no price, never 0
    assert table.price_for("", date(2025, 1, 1)) is None


def test_it_costs_tokens_exactly_in_pico_usd(table_rows):
    price = PriceTable.load().price_for("claude-3-5-sonnet-20241022", date(2025, 1, 1))
    assert price.cost(1_000_000, 1_000_000) == 18 * 10**12  # $3 + $15
    assert price.cost(1, 0) == 3_000_000
    assert pico_per_token(Decimal("0.000001")) == 1  # six decimals stay exact


@pytest.mark.parametrize("pattern, model", [("*", "anything"), ("foo*", "foo-7b"), ("acme-large", "acme-large"),
                                            ("??", "o3"), ("Scripted-Analyst-1 ", "scripted-analyst-1")])
def test_it_takes_a_rule_for_any_model_or_pattern(pattern, model):
    PriceRule.objects.all().delete()
    rule = PriceRule(pattern=pattern, input_usd_per_million=1, output_usd_per_million=2, effective_from=date(2025, 1, 1))
    rule.full_clean()
    rule.save()
    assert PriceTable.load().price_for(model, date(2025, 6, 1)).rule_id == rule.pk


@pytest.mark.parametrize("pattern", ["", "   "])
def test_it_refuses_a_rule_that_names_no_model(pattern):
    with pytest.raises(ValidationError) as error:
        PriceRule(pattern=pattern, input_usd_per_million=1, output_usd_per_million=2,
                  effective_from=date(2025, 1, 1)).full_clean()
    assert "pattern" in error.value.message_dict


@pytest.mark.parametrize("field, value", [("input_usd_per_million", "-1"), ("output_usd_per_million", "100001")])
def test_it_refuses_a_negative_or_absurd_price(field, value):
    values = {"input_usd_per_million": Decimal("1"), "output_usd_per_million": Decimal("2"), field: Decimal(value)}
    with pytest.raises(ValidationError) as error:
        PriceRule(pattern="gpt-4o*", effective_from=date(2025, 1, 1), **values).full_clean()
    assert field in error.value.message_dict


def test_it_seeds_dated_list_prices_with_their_source():
    rows = list(PriceRule.objects.all())
    assert len(rows) >= 15
    assert all(r.source and r.effective_from for r in rows)
    assert {"gpt-4o*", "claude-3-5-sonnet*"} <= {r.pattern for r in rows}
    for r in rows:
        r.full_clean()  # every seeded pattern names a known model family


def test_it_keeps_the_encoder_rules_on_the_same_matcher(project):
    from dashboard.tuning.models import EncoderRule

    assert EncoderRule(project=project, pattern="G*", safety_margin=1.1).families() == ["gpt", "gemini", "glm"]
