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
from types import SimpleNamespace
from typing import Any, Iterable, Optional

from django.db.models import Count, F, Q, Sum

from dashboard.tuning.pricing import PriceTable

from .models import Conversation, Round, UsageHourlyRollup, hour_of
from .paging import values_read
from .rows import update_rows

# The Conversation columns conversation_totals_refresh writes for us.
CONVERSATION_FIELDS = ["cost_pico_usd", "unpriced_rounds"]
USAGE_FIELDS = ("conversations", "conversations_with_errors", "input_tokens", "output_tokens", "cost_pico_usd",
                "priced_conversations", "unpriced_rounds")


@dataclass
class ConversationPricing:
    """What ``conversations_priced`` computed, written by ``save`` inside the
    totals' transaction (after the conversations themselves)."""

    rounds: list[Any] = field(default_factory=list)  # rounds whose cost changed (rows for update_rows)
    hours: dict[int, set[datetime]] = field(default_factory=lambda: defaultdict(set))

    def save(self) -> None:
        update_rows(Round, self.rounds, ["cost_pico_usd"])
        for project_id, hours in self.hours.items():
            usage_hours_refresh(project_id=project_id, hours=hours)


_PRICED_FIELDS = ("id", "conversation_id", "model", "occurred_at", "input_tokens", "output_tokens", "cost_pico_usd")


def conversations_priced(conversations: list[Conversation], table: Optional[PriceTable] = None, *,
                         only: Optional[dict[int, set[int]]] = None) -> ConversationPricing:
    """Price the rounds of these conversations (each round's model, else the
    conversation's) and set each conversation's cost and unpriced rounds. Call
    before the conversations are written: the hours their start moves from are
    read from the database.

    ``only``: per conversation, the pks of the rounds to price (what a pass after batches
    brought); its other rounds keep their stored cost, summed by the database, so a
    long conversation costs what arrived, not its history. A conversation not in
    ``only`` (or every one, without it) has all its rounds priced."""
    table = table or PriceTable.load()
    pricing = ConversationPricing()
    by_id = {c.pk: c for c in conversations}
    for project_id, started_at in Conversation.objects.filter(pk__in=list(by_id)).values_list(
        "project_id", "started_at"
    ):
        pricing.hours[project_id].add(hour_of(started_at))
    totals: dict[int, list[int]] = {pk: [0, 0, 0] for pk in by_id}  # cost, priced rounds, unpriced rounds
    part = {pk: round_pks for pk, round_pks in (only or {}).items() if pk in by_id}
    whole = [pk for pk in by_id if pk not in part]
    rows = values_read(Round.objects.filter(conversation_id__in=whole).values_list(*_PRICED_FIELDS)) if whole else []
    round_pks = sorted(round_pk for some in part.values() for round_pk in some)
    for start in range(0, len(round_pks), ROUNDS_A_QUERY):
        rows += values_read(Round.objects.filter(pk__in=round_pks[start:start + ROUNDS_A_QUERY]).values_list(*_PRICED_FIELDS))
    if part:  # the stored sums, less the rounds priced again below
        for pk, cost, priced, count in Round.objects.filter(conversation_id__in=list(part)).values(
            "conversation_id"
        ).order_by().annotate(cost=Sum("cost_pico_usd"), priced=Count("cost_pico_usd"), n=Count("id")).values_list(
            "conversation_id", "cost", "priced", "n"
        ):
            totals[pk] = [cost or 0, priced, count - priced]
    for row in rows:
        pk, model, occurred_at, stored = row[1], row[2], row[3], row[6]
        entry = totals[pk]
        if pk in part:  # counted in the stored sums: take it out again
            if stored is None:
                entry[2] -= 1
            else:
                entry[0] -= stored
                entry[1] -= 1
        price = table.price_for(model or by_id[pk].model, occurred_at)
        cost = None if price is None else price.cost(row[4], row[5])
        if cost is None:
            entry[2] += 1
        else:
            entry[0] += cost
            entry[1] += 1
        if cost != stored:
            pricing.rounds.append(SimpleNamespace(pk=row[0], conversation_id=pk, cost_pico_usd=cost))
    for pk, conversation in by_id.items():
        cost, priced, unpriced = totals[pk]
        conversation.cost_pico_usd = cost if priced else None
        conversation.unpriced_rounds = unpriced
        pricing.hours[conversation.project_id].add(hour_of(conversation.started_at))
    return pricing


ROUNDS_A_QUERY = 500


def observation_cost(execution: Any, table: PriceTable, *, fallback_model: str = "") -> Optional[int]:
    """pico-USD of a tool result's observation tokens at its model's input rate; None
    when the model has no price or the tokens are unknown."""
    if execution.observation_tokens is None:
        return None
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
    A call whose tokens are unknown is no priced call (the rollup counts it apart).
    One grouped query."""
    table = table or PriceTable.load()
    for row in executions.values("tool_name", "model").order_by().annotate(
        conversation_model=F("conversation__model"), tokens=Sum("observation_tokens"),
        calls=Count("observation_tokens"),
    ):
        price = table.price_for(row["model"] or row["conversation_model"] or "", at)
        if price is not None and row["tool_name"] in stats:
            entry = stats[row["tool_name"]]
            entry["cost_pico_usd"] += price.cost(row["tokens"] or 0)
            entry["priced_calls"] += row["calls"]
