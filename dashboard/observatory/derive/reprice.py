"""A price rule changed: the derivations of what it may have priced, noted again.

The admin calls ``costs_reprice`` after a rule is saved or deleted; it writes notes
(derive.notes) for the conversations and tool hours whose models a changed pattern
matches, and the passes reprice them like any other batch."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from django.db.models import Q

from dashboard.observatory.models import Conversation, Round, ToolExecution, ToolHourlyRollup
from dashboard.tuning.patterns import match_rank

from .notes import derivations_enqueue

REPRICE_BATCH = 1_000


def costs_reprice(*, patterns: Iterable[str]) -> dict[str, int]:
    """After price rules with these patterns changed: re-derive, through the
    derivation entry point, the conversations and tool hours of every project
    whose rows name a model one of the patterns matches. Returns counts."""
    patterns = [p for p in patterns if p]
    models: set[str] = set()
    for source in (Conversation, Round, ToolExecution):
        models |= set(source.objects.exclude(model="").values_list("model", flat=True).distinct())
    matching = sorted(m for m in models if any(match_rank(p, m) is not None for p in patterns))
    counts = {"conversations": 0, "hours": 0}
    if not matching:
        return counts
    affected = (
        Conversation.objects.filter(Q(model__in=matching) | Q(round_set__model__in=matching))
        .values_list("project_id", "id").distinct().order_by("project_id", "id")
    )
    by_project: dict[int, list[int]] = defaultdict(list)
    for project_id, pk in affected.iterator(chunk_size=5_000):
        by_project[project_id].append(pk)
    for project_id, ids in by_project.items():
        hours = list(ToolHourlyRollup.objects.filter(project_id=project_id).values_list("hour", flat=True).distinct())
        for i in range(0, len(ids), REPRICE_BATCH):
            derivations_enqueue(project_id=project_id, conversation_ids=ids[i: i + REPRICE_BATCH],
                                hours=hours if i == 0 else ())
        counts["conversations"] += len(ids)
        counts["hours"] += len(hours)
    return counts
