"""The price table in force: which PriceRule prices a model's tokens on a day.

Loaded once per derivation pass (the table has tens of rows) and memoised per
(model, day). Prices are handled as integers of pico-USD per token (1e-12 USD):
a price of USD x per million tokens with up to six decimals is exactly
x * 10**6 pico-USD per token, so costs and their sums are exact integers and a
total always equals the recomputation from the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Iterable, Optional

from .patterns import best_match

PICO_PER_USD = 10**12


def pico_per_token(usd_per_million: Decimal) -> int:
    return int(Decimal(usd_per_million) * 10**6)


@dataclass(frozen=True)
class Price:
    rule_id: int
    pattern: str
    effective_from: date
    input_pico: int  # pico-USD per input token
    output_pico: int  # pico-USD per output token

    def cost(self, input_tokens: int, output_tokens: int = 0) -> int:
        """pico-USD for these tokens."""
        return (input_tokens or 0) * self.input_pico + (output_tokens or 0) * self.output_pico


def day_of(moment: datetime | date) -> date:
    if isinstance(moment, datetime):
        return moment.astimezone(timezone.utc).date() if moment.tzinfo else moment.date()
    return moment


class PriceTable:
    """Rules grouped by pattern; ``price_for`` picks the most specific matching
    pattern that has a rule in force on the day, and of its rules the latest."""

    def __init__(self, rules: Iterable[object]) -> None:
        self._by_pattern: dict[str, list[Price]] = {}
        for rule in rules:
            price = Price(
                rule_id=rule.pk, pattern=rule.pattern, effective_from=rule.effective_from,
                input_pico=pico_per_token(rule.input_usd_per_million),
                output_pico=pico_per_token(rule.output_usd_per_million),
            )
            self._by_pattern.setdefault(rule.pattern, []).append(price)
        for prices in self._by_pattern.values():
            prices.sort(key=lambda p: p.effective_from, reverse=True)
        self._memo: dict[tuple[str, date], Optional[Price]] = {}

    @classmethod
    def load(cls) -> "PriceTable":
        from .models import PriceRule

        return cls(PriceRule.objects.all())

    def price_for(self, model: str, when: datetime | date) -> Optional[Price]:
        """The price of ``model``'s tokens on the day of ``when``; None: no price."""
        day = day_of(when)
        key = ((model or "").strip().lower(), day)
        if key not in self._memo:
            self._memo[key] = self._find(key[0], day) if key[0] else None
        return self._memo[key]

    def _find(self, model: str, day: date) -> Optional[Price]:
        for prices in best_match(((pattern, prices) for pattern, prices in self._by_pattern.items()), model):
            for price in prices:  # newest first
                if price.effective_from <= day:
                    return price
        return None


def usd(pico: Optional[int]) -> Optional[Decimal]:
    return None if pico is None else Decimal(pico) / PICO_PER_USD
