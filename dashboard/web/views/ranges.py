"""The time range of the overview, tools and level pages: one parse of
``?range=`` for all of them, and the context their range picker needs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable, Optional

from django.http import HttpRequest
from django.utils import timezone

from ..forms import RANGES, RangeForm

EMPTY_RANGE = "24h"  # what a page with no data yet opens on


def range_start(hours: int, now: Optional[datetime] = None) -> datetime:
    """The first whole hour of a range that ends now (rollup hours are hour starts)."""
    now = now or timezone.now()
    return (now - timedelta(hours=hours)).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)


@dataclass(frozen=True)
class ChosenRange:
    since: datetime
    label: str  # "7d"; junk in the URL falls back to the default range
    why: str = ""  # why this range, when the page chose it rather than the URL

    def context(self) -> dict[str, Any]:
        return {"range": self.label, "ranges": list(RANGES), "since": self.since, "range_why": self.why}


def chosen_range(request: HttpRequest) -> ChosenRange:
    form = RangeForm(request.GET)
    return ChosenRange(since=range_start(form.hours()), label=form.label())


def fitted_range(request: HttpRequest, first_activity: Callable[[datetime], Optional[datetime]]) -> ChosenRange:
    """The range of ``?range=``; without one (or with junk), the smallest range that
    holds the data, so a fresh project is not one bar at the edge of a week.
    ``first_activity(since)`` is the first hour with data from ``since`` on, or None."""
    form = RangeForm(request.GET)
    if form.is_valid() and form.cleaned_data.get("range"):
        return chosen_range(request)
    now = timezone.now()
    by_size = sorted(RANGES.items(), key=lambda item: item[1])
    earliest = first_activity(range_start(by_size[-1][1], now))
    if earliest is None:
        return ChosenRange(since=range_start(RANGES[EMPTY_RANGE], now), label=EMPTY_RANGE,
                           why=f"no data in the last {by_size[-1][0]}")
    label, hours = next((label, hours) for label, hours in by_size if range_start(hours, now) <= earliest)
    return ChosenRange(since=range_start(hours, now), label=label, why="the smallest range that holds the data")
