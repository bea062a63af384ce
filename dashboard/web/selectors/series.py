"""Time series for the overview and tool pages: per hour up to seven days, per
day beyond, read from the hourly rollups only (tool rollups for calls, errors,
latency and observation cost; usage rollups for conversations, tokens and
cost), so a 90-day chart costs a few thousand small rows whatever the traffic.

Every bucket carries the link that drills into it: the conversation list of the
conversations started in it, or the tool's failures in it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import Any, Callable, Optional

from django.db.models import Sum
from django.utils import timezone

from dashboard.accounts.models import Project
from dashboard.metrics.selectors import metric_series
from dashboard.observatory import histogram
from dashboard.observatory.models import ToolHourlyRollup, UsageHourlyRollup
from dashboard.observatory.selectors import LEVELS, cursor_rows, histogram_bucket_sums
from dashboard.observatory.models import hour_of

HOURLY_UP_TO = timedelta(days=7)
# What an hour's tool rollups add up to: the counts, the observation tokens and
# each latency histogram bucket (the JSON list's b-th element).
HOUR_SUMS = {
    "s_calls": Sum("calls"), "s_errors": Sum("errors"), "s_cost": Sum("cost_pico_usd"),
    "s_priced": Sum("priced_calls"), **{f"s_{level}": Sum(f"{level}_tokens") for level in LEVELS},
    "s_unleveled": Sum("unleveled_tokens"),
    **histogram_bucket_sums(),
}
URL_TIME = "%Y-%m-%dT%H:%M"  # what the list's since/until take (UTC)


def bucket_edges(since: datetime, until: datetime) -> tuple[list[datetime], timedelta]:
    """Bucket starts from ``since`` to ``until``: hours, or UTC days (the first
    one starting at ``since``) when the range is longer than seven days."""
    if until - since <= HOURLY_UP_TO:
        step = timedelta(hours=1)
        count = max(1, int((until - since) / step))
        return [since + i * step for i in range(count)], step
    step = timedelta(days=1)
    edges = [since]
    day = since.replace(hour=0) + step
    while day < until:
        edges.append(day)
        day += step
    return edges, step


def time_series(
    project: Project,
    *,
    since: datetime,
    link: Callable[[datetime, datetime], str],
    tool_name: str = "",
    now: Optional[datetime] = None,
) -> dict[str, Any]:
    """Series over [since, the end of this hour): tool calls, errors, p95 latency
    (the merged histogram's bucket bound), observation tokens and their cost;
    without ``tool_name`` also conversations started, their tokens and cost.
    Amounts are USD floats for drawing; ``link(start, end)`` makes each bucket's URL."""
    until = hour_of(now or timezone.now()) + timedelta(hours=1)
    edges, step = bucket_edges(since, until)
    ends = edges[1:] + [until]
    n = len(edges)

    def index(hour: datetime) -> int:
        if step == timedelta(hours=1):
            return int((hour - since) / step)
        return (hour.date() - since.date()).days

    calls, errors, observation_tokens = [0] * n, [0] * n, [0] * n
    tool_cost, tool_priced = [0] * n, [0] * n
    histograms = [histogram.empty_histogram() for _ in range(n)]
    tools = ToolHourlyRollup.objects.filter(project=project, hour__gte=since, hour__lt=until)
    if tool_name:
        tools = tools.filter(tool_name=tool_name)
    # Summed per hour by the database, histograms bucket by bucket too: one row an
    # hour instead of one per tool and hour, no histogram decoded in Python, and
    # read through the cursor (Django's per-value converters cost more than the sums).
    rows = cursor_rows(tools.values("hour").order_by().annotate(**HOUR_SUMS).values_list("hour", *HOUR_SUMS))
    for hour, hour_calls, hour_errors, cost, priced, *rest in rows:
        i = index(_aware(hour))
        if not 0 <= i < n:
            continue
        calls[i] += int(hour_calls or 0)
        errors[i] += int(hour_errors or 0)
        tool_cost[i] += int(cost or 0)
        tool_priced[i] += int(priced or 0)
        observation_tokens[i] += sum(int(tokens or 0) for tokens in rest[: len(LEVELS) + 1])  # levels, unleveled
        counts = histograms[i]
        for b, count in enumerate(rest[len(LEVELS) + 1:]):
            counts[b] += int(count or 0)
    series: dict[str, Any] = {
        "labels": [_label(start, step) for start in edges],
        "starts": [start.isoformat() for start in edges],
        "links": [link(start, end) for start, end in zip(edges, ends)],
        "calls": calls,
        "errors": errors,
        "p95_ms": [histogram.percentile(h, 0.95) for h in histograms],
        "observation_tokens": observation_tokens,
        "tool_cost_usd": _usd(tool_cost, tool_priced),
        "step": "hour" if step == timedelta(hours=1) else "day",
    }
    if not tool_name:
        conversations, tokens, cost, priced = [0] * n, [0] * n, [0] * n, [0] * n
        for hour, started, tokens_in, tokens_out, pico, priced_conversations in UsageHourlyRollup.objects.filter(
            project=project, hour__gte=since, hour__lt=until
        ).values_list("hour", "conversations", "input_tokens", "output_tokens", "cost_pico_usd",
                      "priced_conversations"):
            i = index(hour)
            if 0 <= i < n:
                conversations[i] += started
                tokens[i] += tokens_in + tokens_out
                cost[i] += pico
                priced[i] += priced_conversations
        series.update(conversations=conversations, tokens=tokens, cost_usd=_usd(cost, priced))
        # what the app's own metrics (OTLP gen_ai.client.token.usage) say, per model, beside them
        series["metric_tokens"] = metric_series(project, edges=edges, until=until, index=index)
    return series


def _aware(hour: Any) -> datetime:
    """A rollup hour as the cursor gives it: aware on PostgreSQL, text on SQLite (UTC)."""
    if isinstance(hour, str):
        hour = datetime.fromisoformat(hour)
    return hour if hour.tzinfo else hour.replace(tzinfo=dt_timezone.utc)


def _usd(pico: list[int], priced: list[int]) -> list[Optional[float]]:
    """USD per bucket for drawing; null (a gap, not $0) where nothing had a price."""
    return [amount / 10**12 if count else None for amount, count in zip(pico, priced)]


def _label(start: datetime, step: timedelta) -> str:
    return start.strftime("%m-%d %H:00" if step == timedelta(hours=1) else "%Y-%m-%d")


def url_time(moment: datetime) -> str:
    return moment.strftime(URL_TIME)
