"""The project overview: totals and cost over a range (the series are in
``series``), recent failures.

Every figure comes from the hourly rollups (tool rollups for the calls, usage
rollups for the conversations started): a few thousand rows at most, whatever
the traffic.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

from django.db.models import Min, Sum

from dashboard.accounts.models import Project
from dashboard.observatory.models import ToolHourlyRollup, UsageHourlyRollup
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
    unknown_token_calls: int  # calls left out of observation_tokens: their tokens are unknown

    @property
    def error_rate(self) -> Optional[float]:
        return self.tool_errors / self.tool_calls if self.tool_calls else None


def overview_totals(project: Project, *, since: datetime) -> Totals:
    # The conversations started in the range, from the usage rollups (a few rows an
    # hour, the same ones the series and the cost by model read): an aggregate over
    # the conversation rows read every conversation of the range (100k: ~100 ms).
    conv = UsageHourlyRollup.objects.filter(project=project, hour__gte=since).aggregate(
        n=Sum("conversations"),
        with_errors=Sum("conversations_with_errors"),
        input_tokens=Sum("input_tokens"),
        output_tokens=Sum("output_tokens"),
    )
    tools = ToolHourlyRollup.objects.filter(project=project, hour__gte=since).aggregate(
        calls=Sum("calls"), errors=Sum("errors"), retries=Sum("retries"), unknown=Sum("unknown_token_calls"),
        unleveled=Sum("unleveled_tokens"), **level_token_sums()
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
        unknown_token_calls=tools["unknown"] or 0,
    )


@dataclass
class ModelCost:
    model: str
    conversations: int
    input_tokens: int
    output_tokens: int
    cost_pico_usd: Optional[int]  # None: no conversation of this model had a price
    unpriced_rounds: int


@dataclass
class CostTotals:
    cost_pico_usd: Optional[int]
    unpriced_rounds: int
    tool_cost_pico_usd: Optional[int]  # None: no call had a price
    unpriced_calls: int  # calls with known tokens left out of tool_cost_pico_usd: no price
    unknown_token_calls: int  # calls left out of it too: their tokens are unknown
    by_model: list[ModelCost]


def cost_totals(project: Project, *, since: datetime) -> CostTotals:
    """What the conversations started in the range cost, per model (the
    conversation's model), and what the tool results in it cost the context
    (a share of the input cost, not an addition to it). From the hourly rollups."""
    by_model = [
        ModelCost(
            model=row["model"], conversations=row["n"] or 0, input_tokens=row["tokens_in"] or 0,
            output_tokens=row["tokens_out"] or 0,
            cost_pico_usd=(row["cost"] or 0) if row["priced"] else None, unpriced_rounds=row["unpriced"] or 0,
        )
        for row in UsageHourlyRollup.objects.filter(project=project, hour__gte=since)
        .values("model").annotate(n=Sum("conversations"), tokens_in=Sum("input_tokens"),
                                  tokens_out=Sum("output_tokens"), cost=Sum("cost_pico_usd"),
                                  priced=Sum("priced_conversations"), unpriced=Sum("unpriced_rounds"))
        .order_by("-cost", "model")
    ]
    priced = [m.cost_pico_usd for m in by_model if m.cost_pico_usd is not None]
    tool_cost = ToolHourlyRollup.objects.filter(project=project, hour__gte=since).aggregate(
        c=Sum("cost_pico_usd"), priced=Sum("priced_calls"), calls=Sum("calls"), unknown=Sum("unknown_token_calls"))
    return CostTotals(
        cost_pico_usd=sum(priced) if priced else None,
        unpriced_rounds=sum(m.unpriced_rounds for m in by_model),
        tool_cost_pico_usd=(tool_cost["c"] or 0) if tool_cost["priced"] else None,
        unpriced_calls=(tool_cost["calls"] or 0) - (tool_cost["priced"] or 0) - (tool_cost["unknown"] or 0),
        unknown_token_calls=tool_cost["unknown"] or 0,
        by_model=by_model,
    )


def first_activity(project: Project, *, since: datetime) -> Optional[datetime]:
    """The first hour from ``since`` on in which a conversation started or a tool
    was called (the hours the overview's figures are read from); None: none."""
    firsts = [model.objects.filter(project=project, hour__gte=since).aggregate(first=Min("hour"))["first"]
              for model in (UsageHourlyRollup, ToolHourlyRollup)]
    return min((hour for hour in firsts if hour is not None), default=None)


def _observation_tokens(sums: dict[str, Any]) -> int:
    """The tokens the model saw: each call counts at the level it was shown at, a
    call with no level (known only from a span) apart; unknown ones are left out."""
    return sum(sums[level] or 0 for level in LEVELS) + (sums["unleveled"] or 0)
