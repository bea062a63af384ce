"""Two conversations side by side, aligned round by round (by position: the
first round of each, then the second, ...), with what differs marked and a
summary of the totals with their deltas.

A page of ROUNDS_PER_PAGE aligned rounds costs three queries per side (rounds,
their tool calls, their compressions) whatever the conversations' length; the
heavy texts (observations, renderings, the compression's message list) stay in
the database. The page size is set by rendering, not by the database: drawing two
sides of 50 rounds takes a few tens of milliseconds, of 200 several times that.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

from django.db.models.fields.json import KT

from dashboard.observatory.costs import observation_cost
from dashboard.observatory.models import CompressionEvent, Conversation, Round, ToolExecution
from dashboard.tuning.pricing import PriceTable

ROUNDS_PER_PAGE = 50
ROUND_FIELDS = ("id", "round_id", "index", "status", "model", "user_message", "final_answer",
                "context_tokens", "derived_context_tokens", "context_window", "input_tokens", "output_tokens",
                "cost_pico_usd", "started_at", "ended_at", "occurred_at")
TOOL_FIELDS = ("id", "round_id", "tool_name", "parameters", "output_level", "observation_tokens", "success",
               "error_type", "error_code", "retry_count", "duration_ms", "model", "occurred_at", "cache_hit")
# Aspects of a round that are compared; a row lists those that differ.
ASPECTS = ("user_message", "tools", "levels", "observation_tokens", "errors", "context", "compressions",
           "final_answer")


@dataclass
class ToolCall:
    row: dict[str, Any]
    arguments: str  # canonical JSON, so equal arguments compare equal
    cost_pico_usd: Optional[int]


@dataclass
class SideRound:
    round: dict[str, Any]
    tools: list[ToolCall] = field(default_factory=list)
    compressions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def context_tokens(self) -> int:
        return self.round["derived_context_tokens"] or self.round["context_tokens"] or 0

    @property
    def observation_tokens(self) -> tuple[int, int]:
        """(the known tokens' sum, the calls whose tokens are unknown: left out of it)."""
        known = [t.row["observation_tokens"] for t in self.tools if t.row["observation_tokens"] is not None]
        return sum(known), len(self.tools) - len(known)

    @property
    def errors(self) -> tuple[int, int]:
        """(failed calls, retries): a failed round counts as a failure too."""
        failed = sum(1 for t in self.tools if not t.row["success"]) + (self.round["status"] == "error")
        return failed, sum(t.row["retry_count"] for t in self.tools)

    def signature(self, aspect: str) -> Any:
        if aspect == "user_message":
            return self.round["user_message"] or ""
        if aspect == "final_answer":
            return self.round["final_answer"] or ""
        if aspect == "tools":
            return [(t.row["tool_name"], t.arguments) for t in self.tools]
        if aspect == "levels":
            return [t.row["output_level"] for t in self.tools]
        if aspect == "observation_tokens":
            return self.observation_tokens
        if aspect == "errors":
            return self.errors
        if aspect == "context":
            return (self.context_tokens, self.round["context_window"])
        return [(c["mode"], c["tokens_before"], c["tokens_after"], json.dumps(c["config"], sort_keys=True))
                for c in self.compressions]


@dataclass
class AlignedRow:
    position: int
    a: Optional[SideRound]
    b: Optional[SideRound]
    differs: set[str]


@dataclass
class SummaryItem:
    name: str
    a: Optional[int]
    b: Optional[int]
    kind: str = "count"  # "count", "usd" (pico) or "ms"
    a_left_out: int = 0  # usd: the rounds with no price the amount leaves out
    b_left_out: int = 0

    @property
    def delta(self) -> Optional[int]:
        return None if self.a is None or self.b is None else self.b - self.a


@dataclass
class Comparison:
    a: Conversation
    b: Conversation
    rows: list[AlignedRow]
    summary: list[SummaryItem]
    page: int
    has_next: bool
    rounds_differing: int


def _side(conversation: Conversation, start: int, table: PriceTable) -> list[SideRound]:
    rounds = list(
        Round.objects.filter(conversation=conversation).order_by("index", "id")
        .values(*ROUND_FIELDS)[start: start + ROUNDS_PER_PAGE + 1]
    )
    sides = {r["round_id"]: SideRound(round=r) for r in rounds}
    round_ids = list(sides)
    for row in (ToolExecution.objects.filter(conversation=conversation, round_id__in=round_ids)
                .order_by("occurred_at", "id").values(*TOOL_FIELDS)):
        row["parameters_text"] = json.dumps(row["parameters"], sort_keys=True, ensure_ascii=False)
        cost = observation_cost(_Row(row), table, fallback_model=conversation.model)
        sides[row["round_id"]].tools.append(ToolCall(row=row, arguments=row["parameters_text"], cost_pico_usd=cost))
    for row in (CompressionEvent.objects.filter(conversation=conversation, round_id__in=round_ids)
                .order_by("occurred_at", "id")
                .values("id", "round_id", "mode", "tokens_before", "tokens_after", "target_tokens",
                        config=KT("result__config"))):
        config = row["config"]
        if isinstance(config, str):  # KT returns the JSON text on some backends
            try:
                config = json.loads(config)
            except ValueError:
                config = {}
        row["config"] = config if isinstance(config, dict) else {}
        sides[row["round_id"]].compressions.append(row)
    return [sides[r["round_id"]] for r in rounds]


class _Row:
    """Attribute access over a values() row, for the cost functions."""

    def __init__(self, row: dict[str, Any]) -> None:
        self.__dict__.update(row)


def compare(a: Conversation, b: Conversation, *, page: int = 1) -> Comparison:
    table = PriceTable.load()
    start = (page - 1) * ROUNDS_PER_PAGE
    left, right = _side(a, start, table), _side(b, start, table)
    has_next = len(left) > ROUNDS_PER_PAGE or len(right) > ROUNDS_PER_PAGE
    left, right = left[:ROUNDS_PER_PAGE], right[:ROUNDS_PER_PAGE]
    rows = []
    for i in range(max(len(left), len(right))):
        ra = left[i] if i < len(left) else None
        rb = right[i] if i < len(right) else None
        differs = set(ASPECTS) if ra is None or rb is None else {
            aspect for aspect in ASPECTS if ra.signature(aspect) != rb.signature(aspect)
        }
        rows.append(AlignedRow(position=start + i + 1, a=ra, b=rb, differs=differs))
    return Comparison(
        a=a, b=b, rows=rows, summary=summary(a, b), page=page, has_next=has_next,
        rounds_differing=sum(1 for row in rows if row.differs),
    )


def _duration_ms(conversation: Conversation) -> int:
    return int((conversation.last_activity_at - conversation.started_at).total_seconds() * 1000)


def summary(a: Conversation, b: Conversation) -> list[SummaryItem]:
    """The conversations' stored totals side by side (the list's numbers)."""
    return [
        SummaryItem("rounds", a.rounds, b.rounds),
        SummaryItem("tool calls", a.tool_calls, b.tool_calls),
        SummaryItem("tokens in", a.input_tokens, b.input_tokens),
        SummaryItem("tokens out", a.output_tokens, b.output_tokens),
        SummaryItem("max context", a.max_context_tokens, b.max_context_tokens),
        SummaryItem("cost", a.cost_pico_usd, b.cost_pico_usd, kind="usd",
                    a_left_out=a.unpriced_rounds, b_left_out=b.unpriced_rounds),
        SummaryItem("duration", _duration_ms(a), _duration_ms(b), kind="ms"),
        SummaryItem("errors", a.errors, b.errors),
        SummaryItem("retries", a.retries, b.retries),
        SummaryItem("compressions", a.compressions, b.compressions),
    ]
