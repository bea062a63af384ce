"""Seed the price table with list prices of common model families.

Each row names where its price was read. Prices were taken from stored copies of
public pages (no live access to the vendors' sites from where this was written);
a family whose price could not be checked in such a source (Gemini, Mistral,
DeepSeek, Qwen, Llama, GLM, OpenAI o-series, whose two sources disagreed) is left
out rather than guessed: add it in the admin. ``effective_from`` is the earliest
day the source vouches for: the dated snapshot in an Anthropic model id, else the
date of the source page; usage before it stays unpriced until an older row says
otherwise.
"""

from datetime import date
from decimal import Decimal

from django.db import migrations

OPENAI_APR_2026 = ("OpenAI list price per platform.openai.com/docs/pricing, as quoted by "
                   "aimodelcalc.pages.dev (May 2026) and goitreels-com.pages.dev (2026-04-06); read 2026-11-24")
OPENAI_JUN_2026 = ("OpenAI list price as quoted from OpenAI's pricing page by morphllm.com/openai-api-pricing "
                   "(as of June 2026); read 2026-11-24")
ANTHROPIC_SNAPSHOT = ("Anthropic list price, langchain-community bedrock_anthropic_callback cost table "
                      "(per 1K x 1000); from the snapshot date in the model id; read 2026-11-24")
ANTHROPIC_2026 = ("Anthropic list price: platform.claude.com model overview (Sonnet 5 page, comparison table) "
                  "and platform.claude.com pricing as quoted by docs.rs/synaps (verified 2026-10-10); read 2026-11-24")

PRICES = [
    # pattern, input USD / 1M, output USD / 1M, effective from, source
    ("gpt-4o*", "2.50", "10.00", date(2026, 4, 6), OPENAI_APR_2026),
    ("gpt-4o-mini*", "0.15", "0.60", date(2026, 4, 6), OPENAI_APR_2026),
    ("gpt-3.5-turbo*", "0.50", "1.50", date(2026, 4, 6), OPENAI_APR_2026),
    ("gpt-5.5*", "5.00", "30.00", date(2026, 6, 1), OPENAI_JUN_2026),
    ("gpt-5.5-pro*", "30.00", "180.00", date(2026, 6, 1), OPENAI_JUN_2026),
    ("gpt-5.4*", "2.50", "15.00", date(2026, 6, 1), OPENAI_JUN_2026),
    ("gpt-5.4-mini*", "0.75", "4.50", date(2026, 6, 1), OPENAI_JUN_2026),
    ("gpt-5.4-nano*", "0.20", "1.25", date(2026, 6, 1), OPENAI_JUN_2026),
    ("gpt-5.4-pro*", "30.00", "180.00", date(2026, 6, 1), OPENAI_JUN_2026),
    ("claude-3-sonnet*", "3.00", "15.00", date(2024, 2, 29), ANTHROPIC_SNAPSHOT),
    ("claude-3-opus*", "15.00", "75.00", date(2024, 2, 29), ANTHROPIC_SNAPSHOT),
    ("claude-3-haiku*", "0.25", "1.25", date(2024, 3, 7), ANTHROPIC_SNAPSHOT),
    ("claude-3-5-sonnet*", "3.00", "15.00", date(2024, 6, 20), ANTHROPIC_SNAPSHOT),
    ("claude-3-5-haiku*", "0.80", "4.00", date(2024, 10, 22), ANTHROPIC_SNAPSHOT),
    ("claude-3-7-sonnet*", "3.00", "15.00", date(2025, 2, 19), ANTHROPIC_SNAPSHOT),
    ("claude-sonnet-4*", "3.00", "15.00", date(2025, 5, 14), ANTHROPIC_SNAPSHOT),
    ("claude-opus-4*", "15.00", "75.00", date(2025, 5, 14), ANTHROPIC_SNAPSHOT),
    ("claude-opus-4-5*", "5.00", "25.00", date(2026, 10, 10), ANTHROPIC_2026),
    ("claude-haiku-4-5*", "1.00", "5.00", date(2026, 10, 10), ANTHROPIC_2026),
    ("claude-sonnet-5*", "2.00", "10.00", date(2026, 10, 10), ANTHROPIC_2026),
    ("claude-opus-5*", "5.00", "25.00", date(2026, 10, 10), ANTHROPIC_2026),
]


def seed(apps, schema_editor):
    PriceRule = apps.get_model("tuning", "PriceRule")
    for pattern, input_price, output_price, effective_from, source in PRICES:
        PriceRule.objects.get_or_create(
            pattern=pattern, effective_from=effective_from,
            defaults={"input_usd_per_million": Decimal(input_price),
                      "output_usd_per_million": Decimal(output_price), "source": source},
        )


def unseed(apps, schema_editor):
    PriceRule = apps.get_model("tuning", "PriceRule")
    for pattern, _, _, effective_from, _ in PRICES:
        PriceRule.objects.filter(pattern=pattern, effective_from=effective_from).delete()


class Migration(migrations.Migration):
    dependencies = [("tuning", "0002_price_rules")]
    operations = [migrations.RunPython(seed, unseed)]
