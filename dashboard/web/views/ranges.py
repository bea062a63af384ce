"""The time range of the overview, tools and level pages: one parse of
``?range=`` for all of them, and the context their range picker needs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Optional

from django.http import HttpRequest
from django.utils import timezone

from ..forms import RANGES, RangeForm


def range_start(hours: int, now: Optional[datetime] = None) -> datetime:
    """The first whole hour of a range that ends now (rollup hours are hour starts)."""
    now = now or timezone.now()
    return (now - timedelta(hours=hours)).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)


@dataclass(frozen=True)
class ChosenRange:
    since: datetime
    label: str  # "7d"; junk in the URL falls back to the default range

    def context(self) -> dict[str, Any]:
        return {"range": self.label, "ranges": list(RANGES), "since": self.since}


def chosen_range(request: HttpRequest) -> ChosenRange:
    form = RangeForm(request.GET)
    return ChosenRange(since=range_start(form.hours()), label=form.label())
