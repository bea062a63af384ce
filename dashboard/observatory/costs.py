"""Cost in USD of what agents did, from the stored tokens and the price table
(``tuning.pricing``) in force on the day the tokens were used.

Stored, not computed on read, so that lists and overviews of 100k conversations
stay one indexed read: the derivations call in here when they recompute a
conversation's totals (round and conversation costs, and the hourly usage rollup
of the hours its start moved between) or an hour of tool rollups (observation
tokens priced at the input rate of the call's model). A price rule saved or
deleted in the admin re-derives what it may have priced (``derive.reprice``).

Amounts are integers of pico-USD (1e-12 USD), so every total equals the sum of
its parts exactly. A model with no price is never counted as 0: rounds without a
price have a null cost and are counted as unpriced.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Iterable, Optional

from django.db.models import Count, F, Q, Sum

from dashboard.tuning.pricing import PriceTable

from .models import Conversation, Round, UsageHourlyRollup, hour_of
from .rows import update_rows

# The Conversation columns conversation_totals_refresh writes for us.
CONVERSATION_FIELDS = ["cost_pico_usd", "unpriced_rounds"]
USAGE_FIELDS = ("conversations", "conversations_with_errors", "input_tokens", "output_tokens", "cost_pico_usd",
                "priced_conversations", "unpriced_rounds")


@dataclass
class ConversationPricing:
    """What ``conversations_priced`` computed, written by ``save`` inside the
    totals' transaction (after the conversations themselves)."""

    rounds: list[Round] = field(default_factory=list)  # rounds whose cost changed
    hours: dict[int, set[datetime]] = field(default_factory=lambda: defaultdict(set))

    def save(self) -> None:
        update_rows(Round, self.rounds, ["cost_pico_usd"])
        for project_id, hours in self.hours.items():
            usage_hours_refresh(project_id=project_id, hours=hours)


def conversations_priced(conversations: list[Conversation], table: Optional[PriceTable] = None) -> ConversationPricing:
    """Price every round of these conversations (its model, else the
    conversation's) and set each conversation's cost and unpriced rounds. Call
    before the conversations are written: the hours their start moves from are
    read from the database. Two queries."""
    table = table or PriceTable.load()
    pricing = ConversationPricing()
    by_id = {c.pk: c for c in conversations}
    for project_id, started_at in Conversation.objects.filter(pk__in=list(by_id)).values_list(
        "project_id", "started_at"
    ):
        pricing.hours[project_id].add(hour_of(started_at))
    totals: dict[int, list[int]] = {pk: [0, 0, 0] for pk in by_id}  # cost, priced rounds, unpriced rounds
    for round_ in Round.objects.filter(conversation_id__in=list(by_id)).only(
        "id", "conversation_id", "model", "occurred_at", "input_tokens", "output_tokens", "cost_pico_usd"
    ):
        conversation = by_id[round_.conversation_id]
        cost = round_cost(round_, table, fallback_model=conversation.model)
        entry = totals[round_.conversation_id]
        if cost is None:
            entry[2] += 1
        else:
            entry[0] += cost
            entry[1] += 1
        if cost != round_.cost_pico_usd:
            round_.cost_pico_usd = cost
            pricing.rounds.append(round_)
    for pk, conversation in by_id.items():
        cost, priced, unpriced = totals[pk]
        conversation.cost_pico_usd = cost if priced else None
        conversation.unpriced_rounds = unpriced
        pricing.hours[conversation.project_id].add(hour_of(conversation.started_at))
    return pricing


def round_cost(round_: Any, table: PriceTable, *, fallback_model: str = "") -> Optional[int]:
    """pico-USD of a round's input and output tokens; None when its model has no price."""
    price = table.price_for(round_.model or fallback_model, round_.occurred_at)
    return None if price is None else price.cost(round_.input_tokens, round_.output_tokens)


def observation_cost(execution: Any, table: PriceTable, *, fallback_model: str = "") -> Optional[int]:
    """pico-USD of a tool result's observation tokens at its model's input rate."""
    price = table.price_for(execution.model or fallback_model, execution.occurred_at)
    return None if price is None else price.cost(execution.observation_tokens)


def usage_hours_refresh(*, project_id: int, hours: Iterable[datetime]) -> int:
    """Recompute the usage rollups of these hours from the conversation rows
    (one grouped query per hour on the (project, started_at) index); a model with
    no conversation left in the hour loses its row. Returns rows written."""
    written = 0
    for hour in sorted(set(hours)):
        rows = [
            UsageHourlyRollup(project_id=project_id, hour=hour, model=row["model"], **{
                name: row[f"sum_{name}"] or 0 for name in USAGE_FIELDS
            })
            for row in Conversation.objects.filter(
                project_id=project_id, started_at__gte=hour, started_at__lt=hour + timedelta(hours=1)
            ).values("model").order_by().annotate(
                sum_conversations=Count("id"), sum_conversations_with_errors=Count("id", filter=Q(has_errors=True)),
                sum_input_tokens=Sum("input_tokens"), sum_output_tokens=Sum("output_tokens"),
                sum_cost_pico_usd=Sum("cost_pico_usd"), sum_priced_conversations=Count("cost_pico_usd"),
                sum_unpriced_rounds=Sum("unpriced_rounds"),
            )
        ]
        UsageHourlyRollup.objects.filter(project_id=project_id, hour=hour).exclude(
            model__in=[row.model for row in rows]
        ).delete()
        UsageHourlyRollup.objects.bulk_create(
            rows, update_conflicts=True, unique_fields=["project", "hour", "model"], update_fields=list(USAGE_FIELDS),
        )
        written += len(rows)
    return written


def tool_call_costs(stats: dict[str, dict[str, Any]], executions: Any, at: datetime,
                    table: Optional[PriceTable] = None) -> None:
    """Add each tool's observation cost and priced calls of ``executions`` (those of
    the minute from ``at``) to its rollup entry (``tool_rollups_refresh``'s ``stats``).
    One grouped query."""
    table = table or PriceTable.load()
    for row in executions.values("tool_name", "model").order_by().annotate(
        conversation_model=F("conversation__model"), tokens=Sum("observation_tokens"), calls=Count("id"),
    ):
        price = table.price_for(row["model"] or row["conversation_model"] or "", at)
        if price is not None and row["tool_name"] in stats:
            entry = stats[row["tool_name"]]
            entry["cost_pico_usd"] += price.cost(row["tokens"] or 0)
            entry["priced_calls"] += row["calls"]
