"""How the pages and the CSV exports write an amount of pico-USD: one place, so a
page and its export show the same number."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Optional

from dashboard.tuning.pricing import PICO_PER_USD

NO_PRICE = "no price"


def usd_decimal(pico: Any) -> Optional[Decimal]:
    if pico is None or pico == "":
        return None
    return Decimal(int(pico)) / PICO_PER_USD


def usd_places(amount: Decimal) -> int:
    """Cents from a dollar up; four decimals from a cent; six below (a single
    call's observation can cost a millionth of a dollar)."""
    size = abs(amount)
    return 2 if size >= 1 or size == 0 else 4 if size >= Decimal("0.01") else 6


def usd_rounded(pico: Any) -> Optional[Decimal]:
    amount = usd_decimal(pico)
    if amount is None:
        return None
    return amount.quantize(Decimal(1).scaleb(-usd_places(amount)), rounding=ROUND_HALF_UP)


def usd_text(pico: Any) -> str:
    amount = usd_rounded(pico)
    if amount is None:
        return NO_PRICE
    sign = "-" if amount < 0 else ""
    return f"{sign}${abs(amount):,}"


def usd_plain(pico: Any) -> str:
    """The exact amount for a CSV cell ('0.012345670000'); empty when unpriced."""
    amount = usd_decimal(pico)
    return "" if amount is None else f"{amount:.12f}"
