"""The tool pages' own reads: the latency chart's series, the tool detail's exact
percentiles and what each output level costs. The per-tool statistics themselves
come from the domain (``observatory.selectors.tool_stats``, over the hourly rollups).

Rollup percentiles are bucket upper bounds; the tool detail page computes them
exactly from the rows when the range holds few enough calls to do it cheaply, and
says which one it shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Optional

from django.db import connection
from django.db.models import Case, F, OuterRef, Subquery, When

from dashboard.accounts.models import Project
from dashboard.observatory import histogram
from dashboard.observatory.dbfunctions import DateUTC
from dashboard.observatory.models import Conversation, ToolExecution
from dashboard.observatory.selectors import LEVELS, ToolStats
from dashboard.tuning.pricing import PriceTable

# Up to this many calls in range, the tool detail page reads the durations and
# computes exact percentiles; above it, the histogram's bucket bounds are shown.
EXACT_PERCENTILE_LIMIT = 5_000
# The level-cost table reads at most this many of the newest calls in range.
LEVEL_COST_CALLS = 5_000


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
        # Exact only when the rows are all the calls: tool spans no execution
        # describes (outside any conversation) count in the rollups alone.
        if len(durations) <= EXACT_PERCENTILE_LIMIT and (stats is None or len(durations) == stats.calls):
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


def level_costs(project: Project, tool_name: str, *, since: datetime) -> dict[str, Any]:
    """What each output level would have cost across the tool's calls in range: the
    sum of each rendering's tokens, over the calls that sent that rendering, and the
    tokens the model actually saw (observation_tokens; ``unknown_calls`` calls whose
    tokens are unknown are left out of that sum and its mean).

    Read from the rows (the rollups keep only the tokens of the level that was
    seen), so it is bounded to the newest LEVEL_COST_CALLS calls of the range;
    ``sampled`` says when the range held more and the page says so.
    """
    # One read of the newest calls on the (project, tool, time) index, grouped by
    # priced model and day (what prices depend on) around it in the same statement:
    # grouping a `WHERE id IN (the newest ids)` instead read each sampled call twice
    # and joined every one to its conversation (67 ms at 1M calls), and grouping in
    # Python costs the transfer of every sampled row. The conversation's model is
    # looked up only for a call that names none (CASE: a subquery per such row).
    conversation_model = Conversation.objects.filter(pk=OuterRef("conversation_id")).values("model")[:1]
    newest = (
        ToolExecution.objects.filter(project=project, tool_name=tool_name, occurred_at__gte=since)
        .order_by("-occurred_at")
        .annotate(priced_model=Case(When(model="", then=Subquery(conversation_model)), default=F("model")),
                  day=DateUTC("occurred_at"))
        .values_list("priced_model", "day", "observation_tokens", *(f"{level}_tokens" for level in LEVELS))
    )[:LEVEL_COST_CALLS]
    sql, params = newest.query.sql_with_params()
    sums = ", ".join(
        f"SUM({level}_tokens), COUNT({level}_tokens), SUM(CASE WHEN {level}_tokens IS NOT NULL "
        f"THEN observation_tokens END)" for level in LEVELS
    )
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT priced_model, day, COUNT(*), COUNT(observation_tokens), SUM(observation_tokens), {sums} "
                       f"FROM ({sql}) newest GROUP BY priced_model, day", params)
        rows = cursor.fetchall()
    groups = []
    for model, day, calls, known, seen, *per_level in rows:
        group = {"model": model or "", "day": day if isinstance(day, date) else date.fromisoformat(str(day)),
                 "calls": calls, "seen_calls": known, "seen": seen or 0}
        for i, level in enumerate(LEVELS):  # the calls that sent that rendering, what the model was given on them
            tokens, sent, seen_on_them = per_level[3 * i: 3 * i + 3]
            group.update({level: tokens or 0, f"{level}_calls": sent, f"{level}_seen": seen_on_them or 0})
        groups.append(group)
    names = [*LEVELS, *(f"{level}_calls" for level in LEVELS), "seen", "seen_calls", "calls"]
    costs: dict[str, Any] = {name: sum(int(g[name] or 0) for g in groups) for name in names}
    for level in LEVELS:
        calls = costs[f"{level}_calls"]
        costs[f"{level}_mean"] = costs[level] / calls if calls else None
    # over the calls whose tokens are known: those of unknown tokens are left out, and counted
    costs["seen_mean"] = costs["seen"] / costs["seen_calls"] if costs["seen_calls"] else None
    costs["unknown_calls"] = costs["calls"] - costs["seen_calls"]
    costs["sampled"] = costs["calls"] >= LEVEL_COST_CALLS
    costs["limit"] = LEVEL_COST_CALLS
    costs.update(level_costs_usd(groups))
    return costs


def level_costs_usd(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """In USD (pico), at the input price of each group's model on its day: what each
    level's rendering would have cost over the calls that sent it, what the
    renderings the model was actually given cost over those same calls, and the
    difference (what a policy of that level would have saved; negative: cost
    more). Calls whose model has no price are left out and counted."""
    table = PriceTable.load()
    out: dict[str, Any] = {f"{level}_{kind}": 0 for level in LEVELS for kind in ("usd", "seen_usd")}
    out["unpriced_calls"] = priced = 0
    for group in groups:
        price = table.price_for(group["model"], group["day"])
        if price is None:
            out["unpriced_calls"] += group["calls"]
            continue
        priced += group["calls"]
        for level in LEVELS:
            out[f"{level}_usd"] += price.cost(group[level] or 0)
            out[f"{level}_seen_usd"] += price.cost(group[f"{level}_seen"] or 0)
    for level in LEVELS:
        out[f"{level}_saving_usd"] = out[f"{level}_seen_usd"] - out[f"{level}_usd"]
        if not priced:  # no call had a price: "no price", not $0
            out[f"{level}_usd"] = out[f"{level}_seen_usd"] = out[f"{level}_saving_usd"] = None
    return out
