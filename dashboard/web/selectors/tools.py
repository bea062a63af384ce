"""Per-tool statistics over a time range, read from the hourly rollups.

Counts and sums are exact (the rollups are recomputed whole from the rows).
Latency percentiles come from the merged bucket histogram, so they are bucket upper
bounds; the tool detail page computes them exactly from the rows when the range
holds few enough calls to do it cheaply, and says which one it shows.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Optional

from django.db.models import Count, Sum
from django.utils import timezone

from dashboard.accounts.models import Project
from dashboard.observatory import histogram
from dashboard.observatory.models import ToolExecution, ToolHourlyRollup

# Up to this many calls in range, the tool detail page reads the durations and
# computes exact percentiles; above it, the histogram's bucket bounds are shown.
EXACT_PERCENTILE_LIMIT = 5_000
RECENT_FAILURES = 20
# The level-cost table reads at most this many of the newest calls in range.
LEVEL_COST_CALLS = 5_000
LEVELS = ("brief", "standard", "full")
SUM_FIELDS = (
    "calls", "successes", "errors", "retries", "timeouts", "cache_hits", "duration_sum_ms",
    "brief_tokens", "brief_count", "standard_tokens", "standard_count", "full_tokens", "full_count",
)


def range_start(hours: int, now: Optional[datetime] = None) -> datetime:
    """The first whole hour of a range that ends now (rollup hours are hour starts)."""
    now = now or timezone.now()
    return (now - timedelta(hours=hours)).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)


@dataclass
class ToolStats:
    tool_name: str
    calls: int = 0
    successes: int = 0
    errors: int = 0
    retries: int = 0
    timeouts: int = 0
    cache_hits: int = 0
    duration_sum_ms: float = 0.0
    brief_tokens: int = 0
    brief_count: int = 0
    standard_tokens: int = 0
    standard_count: int = 0
    full_tokens: int = 0
    full_count: int = 0
    latency_histogram: list[int] = field(default_factory=histogram.empty_histogram)
    error_types: Counter = field(default_factory=Counter)

    @property
    def success_rate(self) -> Optional[float]:
        return self.successes / self.calls if self.calls else None

    @property
    def error_rate(self) -> Optional[float]:
        return self.errors / self.calls if self.calls else None

    @property
    def cache_hit_rate(self) -> Optional[float]:
        return self.cache_hits / self.calls if self.calls else None

    @property
    def mean_duration_ms(self) -> Optional[float]:
        return self.duration_sum_ms / self.calls if self.calls else None

    def mean_tokens(self, level: str) -> Optional[float]:
        count = getattr(self, f"{level}_count")
        return getattr(self, f"{level}_tokens") / count if count else None

    @property
    def mean_brief_tokens(self) -> Optional[float]:
        return self.mean_tokens("brief")

    @property
    def mean_standard_tokens(self) -> Optional[float]:
        return self.mean_tokens("standard")

    @property
    def mean_full_tokens(self) -> Optional[float]:
        return self.mean_tokens("full")

    def percentile(self, q: float) -> Optional[float]:
        return histogram.percentile(self.latency_histogram, q)

    @property
    def p50(self) -> Optional[float]:
        return self.percentile(0.50)

    @property
    def p95(self) -> Optional[float]:
        return self.percentile(0.95)

    @property
    def p99(self) -> Optional[float]:
        return self.percentile(0.99)

    @property
    def top_error_types(self) -> list[tuple[str, int]]:
        return self.error_types.most_common(3)

    def beyond_last_bound(self, q: float) -> bool:
        """The q-quantile lies in the overflow bucket: it is a floor, not a bound."""
        total = sum(self.latency_histogram)
        rank = max(1, math.ceil(q * total))
        return total > 0 and total - self.latency_histogram[-1] < rank

    @property
    def p50_op(self) -> str:
        return ">" if self.beyond_last_bound(0.50) else "≤"

    @property
    def p95_op(self) -> str:
        return ">" if self.beyond_last_bound(0.95) else "≤"

    @property
    def p99_op(self) -> str:
        return ">" if self.beyond_last_bound(0.99) else "≤"


def tool_stats(project: Project, *, since: datetime, tool_name: str = "") -> list[ToolStats]:
    """One ToolStats per tool with calls since ``since``, busiest first.

    One query: the rollup rows of the range (tools x hours, a few thousand at most
    for 90 days), merged in Python because histograms and error types are JSON.
    """
    qs = ToolHourlyRollup.objects.filter(project=project, hour__gte=since)
    if tool_name:
        qs = qs.filter(tool_name=tool_name)
    stats: dict[str, ToolStats] = {}
    for row in qs.values("tool_name", "latency_histogram", "error_types", *SUM_FIELDS).iterator(
        chunk_size=2000
    ):
        entry = stats.get(row["tool_name"])
        if entry is None:
            entry = stats[row["tool_name"]] = ToolStats(tool_name=row["tool_name"])
        for name in SUM_FIELDS:
            setattr(entry, name, getattr(entry, name) + (row[name] or 0))
        counts = row["latency_histogram"] or []
        for i, count in enumerate(list(counts)[: histogram.BUCKET_COUNT]):
            entry.latency_histogram[i] += int(count)
        if isinstance(row["error_types"], dict):
            for error_type, count in row["error_types"].items():
                entry.error_types[str(error_type)] += int(count)
    return sorted(stats.values(), key=lambda s: (-s.calls, s.tool_name))


def histogram_chart(counts: list[int]) -> dict[str, list[Any]]:
    """Labels and counts for the latency chart (overflow shown as '> last bound')."""
    labels = [f"≤ {bound:g}" for bound in histogram.LATENCY_BUCKET_BOUNDS_MS]
    labels.append(f"> {histogram.LATENCY_BUCKET_BOUNDS_MS[-1]:g}")
    return {"labels": labels, "counts": list(counts)}


@dataclass
class Percentiles:
    p50: Optional[float]
    p95: Optional[float]
    p99: Optional[float]
    exact: bool
    # "≤" / ">" before a bucket estimate; empty for exact values.
    p50_op: str = ""
    p95_op: str = ""
    p99_op: str = ""


def exact_or_bucket_percentiles(
    project: Project, tool_name: str, *, since: datetime, stats: Optional[ToolStats]
) -> Percentiles:
    """Exact percentiles (nearest rank over the rows) when the range holds at most
    EXACT_PERCENTILE_LIMIT calls, else the rollup histogram's bucket bounds."""
    calls = stats.calls if stats else 0
    if calls <= EXACT_PERCENTILE_LIMIT:
        durations = sorted(
            ToolExecution.objects.filter(
                project=project, tool_name=tool_name, occurred_at__gte=since
            ).values_list("duration_ms", flat=True)[: EXACT_PERCENTILE_LIMIT + 1]
        )
        if len(durations) <= EXACT_PERCENTILE_LIMIT:
            return Percentiles(
                p50=nearest_rank(durations, 0.50),
                p95=nearest_rank(durations, 0.95),
                p99=nearest_rank(durations, 0.99),
                exact=True,
            )
    if stats is None:
        return Percentiles(None, None, None, exact=False)
    return Percentiles(
        stats.p50, stats.p95, stats.p99, exact=False,
        p50_op=stats.p50_op, p95_op=stats.p95_op, p99_op=stats.p99_op,
    )


def nearest_rank(sorted_values: list[float], q: float) -> Optional[float]:
    """The nearest-rank q-quantile: the smallest value with at least q of the values
    at or below it (the same rank rule as histogram.percentile)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return float(sorted_values[rank - 1])


def recent_failures(project: Project, *, tool_name: str = "", limit: int = RECENT_FAILURES) -> list[ToolExecution]:
    qs = ToolExecution.objects.filter(project=project, success=False)
    if tool_name:
        qs = qs.filter(tool_name=tool_name)
    return list(
        qs.select_related("conversation")
        .only(
            "id", "tool_name", "tool_call_id", "occurred_at", "error_type", "error_code",
            "error_message", "retry_count", "duration_ms", "output_level", "conversation__id",
            "conversation__external_id", "conversation__title", "conversation__project_id",
        )
        .order_by("-occurred_at")[:limit]
    )


def level_costs(project: Project, tool_name: str, *, since: datetime) -> dict[str, Any]:
    """What each output level would have cost across the tool's calls in range: the
    sum of each rendering's tokens, over the calls that sent that rendering, and the
    tokens the model actually saw (observation_tokens).

    Read from the rows (the rollups keep only the tokens of the level that was
    seen), so it is bounded to the newest LEVEL_COST_CALLS calls of the range;
    ``sampled`` says when the range held more and the page says so.
    """
    newest = (
        ToolExecution.objects.filter(project=project, tool_name=tool_name, occurred_at__gte=since)
        .order_by("-occurred_at")
        .values("id")[:LEVEL_COST_CALLS]
    )
    totals = ToolExecution.objects.filter(id__in=newest).aggregate(
        brief=Sum("brief_tokens"),
        standard=Sum("standard_tokens"),
        full=Sum("full_tokens"),
        seen=Sum("observation_tokens"),
        calls=Count("id"),
        brief_calls=Count("brief_tokens"),
        standard_calls=Count("standard_tokens"),
        full_calls=Count("full_tokens"),
    )
    costs: dict[str, Any] = {key: int(value or 0) for key, value in totals.items()}
    for level in LEVELS:
        calls = costs[f"{level}_calls"]
        costs[f"{level}_mean"] = costs[level] / calls if calls else None
    costs["seen_mean"] = costs["seen"] / costs["calls"] if costs["calls"] else None
    costs["sampled"] = costs["calls"] >= LEVEL_COST_CALLS
    costs["limit"] = LEVEL_COST_CALLS
    return costs
