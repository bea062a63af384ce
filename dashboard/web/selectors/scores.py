"""Scores placed where the things they judge are shown."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from dashboard.judging.models import Score
from dashboard.observatory.selectors import Timeline


def scores_attach(timeline: Timeline, scores: list[Score]) -> list[Score]:
    """Give each round view (``.scores``) and tool execution (``.scores``) of the
    timeline page its scores; returns the rest: the conversation's own (and those
    of rounds on other pages, which are not shown here)."""
    by_round: dict[int, list[Score]] = defaultdict(list)
    by_execution: dict[int, list[Score]] = defaultdict(list)
    rest: list[Score] = []
    for score in scores:
        if score.tool_execution_id is not None:
            by_execution[score.tool_execution_id].append(score)
        elif score.round_id is not None:
            by_round[score.round_id].append(score)
        else:
            rest.append(score)
    views: list[Any] = list(timeline.rounds) + ([timeline.unassigned] if timeline.unassigned else [])
    for view in views:
        view.scores = by_round.get(view.round.pk, []) if view.round is not None else []
        for execution in view.tool_executions:
            execution.scores = by_execution.get(execution.pk, [])
    return rest
