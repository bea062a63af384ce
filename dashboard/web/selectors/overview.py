"""The project overview: totals and a daily trend over a range, recent failures.

Tool figures come from the hourly rollups (a few thousand rows at most); the
conversation figures are one aggregate over the (project, started_at) index.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncDay

from dashboard.accounts.models import Project
from dashboard.observatory.models import Conversation, ToolHourlyRollup
from dashboard.observatory.selectors import LEVELS, level_token_sums


@dataclass
class Totals:
    conversations: int
    conversations_with_errors: int
    input_tokens: int
    output_tokens: int
    tool_calls: int
    tool_errors: int
    retries: int
    observation_tokens: int

    @property
    def error_rate(self) -> Optional[float]:
        return self.tool_errors / self.tool_calls if self.tool_calls else None


def overview_totals(project: Project, *, since: datetime) -> Totals:
    conv = Conversation.objects.filter(project=project, started_at__gte=since).aggregate(
        n=Count("id"),
        with_errors=Count("id", filter=Q(has_errors=True)),
        input_tokens=Sum("input_tokens"),
        output_tokens=Sum("output_tokens"),
    )
    tools = ToolHourlyRollup.objects.filter(project=project, hour__gte=since).aggregate(
        calls=Sum("calls"), errors=Sum("errors"), retries=Sum("retries"), **level_token_sums()
    )
    return Totals(
        conversations=conv["n"] or 0,
        conversations_with_errors=conv["with_errors"] or 0,
        input_tokens=conv["input_tokens"] or 0,
        output_tokens=conv["output_tokens"] or 0,
        tool_calls=tools["calls"] or 0,
        tool_errors=tools["errors"] or 0,
        retries=tools["retries"] or 0,
        observation_tokens=_observation_tokens(tools),
    )


def daily_trend(project: Project, *, since: datetime) -> dict[str, list[Any]]:
    """Tool calls, errors and observation tokens per day (UTC) for the trend chart."""
    rows = (
        ToolHourlyRollup.objects.filter(project=project, hour__gte=since)
        .annotate(day=TruncDay("hour"))
        .values("day")
        .annotate(calls=Sum("calls"), errors=Sum("errors"), **level_token_sums())
        .order_by("day")
    )
    labels, calls, errors, tokens = [], [], [], []
    for row in rows:
        labels.append(row["day"].strftime("%Y-%m-%d"))
        calls.append(row["calls"] or 0)
        errors.append(row["errors"] or 0)
        tokens.append(_observation_tokens(row))
    return {"labels": labels, "calls": calls, "errors": errors, "tokens": tokens}


def _observation_tokens(sums: dict[str, Any]) -> int:
    """The tokens the model saw: each call counts at the level it was shown at."""
    return sum(sums[level] or 0 for level in LEVELS)
