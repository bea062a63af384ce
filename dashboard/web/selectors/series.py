"""Time series for the overview and tool pages: per hour up to seven days, per
day beyond, read from the hourly rollups only (tool rollups for calls, errors,
latency and observation cost; usage rollups for conversations, tokens and
cost), so a 90-day chart costs a few thousand small rows whatever the traffic.

Every bucket carries the link that drills into it: the conversation list of the
conversations started in it, or the tool's failures in it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Callable, Optional

from django.utils import timezone

from dashboard.accounts.models import Project
from dashboard.observatory import histogram
from dashboard.observatory.models import ToolHourlyRollup, UsageHourlyRollup
from dashboard.observatory.selectors import LEVELS
from dashboard.observatory.services import hour_of

HOURLY_UP_TO = timedelta(days=7)
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
    for row in tools.values_list("hour", "calls", "errors", "cost_pico_usd", "priced_calls", "latency_histogram",
                                 *(f"{level}_tokens" for level in LEVELS)).iterator(chunk_size=2000):
        i = index(row[0])
        if not 0 <= i < n:
            continue
        calls[i] += row[1]
        errors[i] += row[2]
        tool_cost[i] += row[3]
        tool_priced[i] += row[4]
        for b, count in enumerate(list(row[5] or [])[: histogram.BUCKET_COUNT]):
            histograms[i][b] += int(count)
        observation_tokens[i] += sum(row[6:])
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
    return series


def _usd(pico: list[int], priced: list[int]) -> list[Optional[float]]:
    """USD per bucket for drawing; null (a gap, not $0) where nothing had a price."""
    return [amount / 10**12 if count else None for amount, count in zip(pico, priced)]


def _label(start: datetime, step: timedelta) -> str:
    return start.strftime("%m-%d %H:00" if step == timedelta(hours=1) else "%Y-%m-%d")


def url_time(moment: datetime) -> str:
    return moment.strftime(URL_TIME)
