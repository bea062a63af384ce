"""A compression event as a diff: the original messages, each with its fate, and
the summaries placed where they replaced messages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from pydantic import ValidationError

from pipeline import CompressionResult, CompressionSummary, MessageChange


@dataclass
class DiffRow:
    change: MessageChange
    # The summary that replaced this message, set on the first message it replaced;
    # later replaced messages point back to it by summary_id.
    summary: Optional[CompressionSummary] = None


@dataclass
class CompressionDiff:
    result: CompressionResult
    rows: list[DiffRow]
    counts: dict[str, int]

    @property
    def tokens_saved(self) -> int:
        return self.result.tokens_before - self.result.tokens_after


class UnreadableCompression(ValueError):
    """The stored result does not parse as a CompressionResult."""


def compression_diff(result_json: Any) -> CompressionDiff:
    try:
        result = CompressionResult.model_validate(result_json)
    except ValidationError as exc:
        raise UnreadableCompression(str(exc.errors()[0]["msg"])) from None
    summaries = {s.summary_id: s for s in result.summaries}
    first_of: dict[str, int] = {}
    for s in result.summaries:
        if s.replaced_indices:
            first_of[s.summary_id] = min(s.replaced_indices)
    rows = []
    for change in sorted(result.changes, key=lambda c: c.index):
        summary = None
        if change.summary_id and first_of.get(change.summary_id) == change.index:
            summary = summaries.get(change.summary_id)
        rows.append(DiffRow(change=change, summary=summary))
    counts = {action: 0 for action in ("kept", "dropped", "truncated", "summarized")}
    for change in result.changes:
        counts[change.action.value] += 1
    return CompressionDiff(result=result, rows=rows, counts=counts)
