"""Reads of scores: the filters the API and the pages share."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Optional

from django.db.models import Avg, Count, Exists, F, FloatField, Max, Min, OuterRef, Q, QuerySet, Sum, Value
from django.db.models.functions import Coalesce, Floor, Least, NullIf, TruncDay, TruncHour
from django.utils import timezone

from dashboard.accounts.models import Project
from dashboard.observatory.models import Conversation, Round

from .models import ReviewItem, ReviewStatus, Score, ScoreTarget
from .rules import ScoreKind

# A score whose target is found (the same rule as Score.linked).
LINKED = (
    Q(conversation__isnull=False)
    & ~(Q(target=ScoreTarget.TOOL_CALL) & Q(tool_execution__isnull=True))
    & ~(Q(target=ScoreTarget.ROUND) & Q(round__isnull=True))
)


@dataclass(frozen=True)
class ScoreFilters:
    name: Optional[str] = None
    source: Optional[str] = None
    target: Optional[str] = None
    conversation_id: Optional[str] = None  # the agent's id (as sent, or of the conversation found)
    trace_id: Optional[str] = None
    span_id: Optional[str] = None
    tool_call_id: Optional[str] = None
    label: Optional[str] = None
    min_value: Optional[float] = None
    max_value: Optional[float] = None
    negative: Optional[bool] = None
    linked: Optional[bool] = None
    since: Optional[datetime] = None
    until: Optional[datetime] = None


def scores_filtered(project: Project, filters: ScoreFilters) -> QuerySet[Score]:
    """The project's scores that pass every filter given, with ``edit_count``."""
    match = ScoreMatch(name=filters.name or "", min_value=filters.min_value, max_value=filters.max_value,
                       label=filters.label or "", negative=filters.negative is True, since=filters.since,
                       until=filters.until)
    rows = match.rows(Score.objects.filter(project=project))
    exact = {name: getattr(filters, name) for name in ("source", "target", "trace_id", "span_id")}
    rows = rows.filter(**{name: value for name, value in exact.items() if value is not None})
    if filters.conversation_id is not None:
        found = Conversation.objects.filter(project=project, external_id=filters.conversation_id).first()
        rows = rows.filter(Q(conversation_key=filters.conversation_id) | Q(conversation=found) if found
                           else Q(conversation_key=filters.conversation_id))
    if filters.tool_call_id is not None:
        rows = rows.filter(Q(tool_call_id=filters.tool_call_id)
                           | Q(tool_execution__tool_call_id=filters.tool_call_id))
    if filters.negative is False:
        rows = rows.filter(negative=False)
    if filters.linked is not None:
        rows = rows.filter(LINKED) if filters.linked else rows.exclude(LINKED)
    return rows.annotate(edit_count=Count("edits"))


# --- the pages ----------------------------------------------------------------------

PAGE_SCORES_LIMIT = 500  # scores one timeline page or trace page shows at most


@dataclass(frozen=True)
class ScoreMatch:
    """A list's score filter: conversations (or traces) with a score that has this
    name, a value in [min_value, max_value], this label, or negative feedback, made
    in [since, until). Empty fields match anything."""

    name: str = ""
    min_value: Optional[float] = None
    max_value: Optional[float] = None
    label: str = ""
    negative: bool = False
    since: Optional[datetime] = None
    until: Optional[datetime] = None

    def __bool__(self) -> bool:
        return bool(self.name or self.label or self.negative or self.since or self.until
                    or self.min_value is not None or self.max_value is not None)

    def rows(self, scores: QuerySet[Score]) -> QuerySet[Score]:
        if self.name:
            scores = scores.filter(name=self.name)
        if self.label:
            scores = scores.filter(label=self.label)
        if self.negative:
            scores = scores.filter(negative=True)
        if self.min_value is not None:
            scores = scores.filter(value__gte=self.min_value)
        if self.max_value is not None:
            scores = scores.filter(value__lte=self.max_value)
        if self.since is not None:
            scores = scores.filter(occurred_at__gte=self.since)
        if self.until is not None:
            scores = scores.filter(occurred_at__lt=self.until)
        return scores


def conversations_scored(conversations: QuerySet[Conversation], match: ScoreMatch) -> QuerySet[Conversation]:
    """The conversations with a score that matches (checked per candidate on the
    score_conversation index while the list's own index is walked)."""
    if not match:
        return conversations
    return conversations.filter(Exists(match.rows(Score.objects.filter(conversation=OuterRef("pk")))))


def traces_scored(project: Project, match: ScoreMatch) -> tuple[QuerySet[Score], QuerySet[Score]]:
    """For a root span (``OuterRef("trace_id")``): the matching scores of its trace
    (sent with the trace id), and those of a round of that trace (the pages' scores
    name their round)."""
    by_trace = match.rows(Score.objects.filter(project=project, trace_id=OuterRef("trace_id")))
    by_round = match.rows(Score.objects.filter(round__project=project, round__trace_id=OuterRef("trace_id")))
    return by_trace, by_round


def scores_of_conversation(conversation: Conversation) -> list[Score]:
    return list(Score.objects.filter(conversation=conversation).order_by("occurred_at", "id")[:PAGE_SCORES_LIMIT])


def scores_of_conversations(conversation_ids: list[int]) -> dict[int, list[Score]]:
    found: dict[int, list[Score]] = {pk: [] for pk in conversation_ids}
    for score in Score.objects.filter(conversation_id__in=conversation_ids).order_by("occurred_at", "id"):
        found[score.conversation_id].append(score)
    return found


def scores_of_trace(project: Project, trace_id: str) -> list[Score]:
    """The trace's scores: those sent with its id, and those of its rounds."""
    rounds = Round.objects.filter(project=project, trace_id=trace_id).values("pk")
    rows = Score.objects.filter(Q(project=project, trace_id=trace_id) | Q(round__in=rounds))
    return list(rows.select_related("round").order_by("occurred_at", "id")[:PAGE_SCORES_LIMIT])


def score_mean(scores: list[Score]) -> Optional[float]:
    values = [score.value for score in scores if score.value is not None]
    return sum(values) / len(values) if values else None


# --- summaries ----------------------------------------------------------------------

HISTOGRAM_BINS = 10


@dataclass
class NameSummary:
    """One score name over a range: how many, their mean (numbers and booleans),
    how many negative, how they are distributed, and the count and mean per bucket."""

    name: str
    kinds: list[str]
    count: int = 0
    mean: Optional[float] = None
    negatives: int = 0
    distribution: list[tuple[str, int]] = field(default_factory=list)
    series: list[tuple[datetime, int, Optional[float]]] = field(default_factory=list)


@dataclass
class GroupSummary:
    """One score name's figures for one tool or one model."""

    name: str
    group: str
    count: int
    mean: Optional[float]
    negatives: int


def score_summary(project: Project, *, since: datetime, until: datetime, bucket: str) -> list[NameSummary]:
    """Per score name, over [since, until): count, mean, negatives, distribution
    (labels, true/false, or HISTOGRAM_BINS equal bins of the values) and per
    ``bucket`` ("hour" or "day") the count and mean. Read from the score rows."""
    scores = Score.objects.filter(project=project, occurred_at__gte=since, occurred_at__lt=until)
    names: dict[str, NameSummary] = {}
    totals = scores.values("name", "kind").order_by().annotate(
        n=Count("id"), total=Sum("value"), valued=Count("value"), negatives=Count("id", filter=Q(negative=True)),
        low=Min("value"), high=Max("value"))
    ranges: dict[str, tuple[float, float]] = {}
    sums: dict[str, tuple[float, int]] = {}
    for row in totals:
        summary = names.setdefault(row["name"], NameSummary(row["name"], []))
        summary.kinds.append(row["kind"])
        summary.count += row["n"]
        summary.negatives += row["negatives"]
        total, valued = sums.get(row["name"], (0.0, 0))
        sums[row["name"]] = (total + (row["total"] or 0.0), valued + row["valued"])
        if row["kind"] == ScoreKind.NUMERIC and row["low"] is not None:
            low, high = ranges.get(row["name"], (row["low"], row["high"]))
            ranges[row["name"]] = (min(low, row["low"]), max(high, row["high"]))
    for name, (total, valued) in sums.items():
        names[name].mean = total / valued if valued else None
    for row in scores.exclude(kind=ScoreKind.NUMERIC).values("name", "kind", "label", "value").order_by().annotate(
            n=Count("id")):
        shown = row["label"] if row["kind"] == ScoreKind.CATEGORICAL else ("true" if row["value"] else "false")
        names[row["name"]].distribution.append((shown, row["n"]))
    for name, (low, high) in ranges.items():
        names[name].distribution.extend(_histogram(scores.filter(name=name, kind=ScoreKind.NUMERIC), low, high))
    trunc = TruncDay if bucket == "day" else TruncHour
    for row in scores.annotate(bucket=trunc("occurred_at")).values("name", "bucket").order_by("bucket").annotate(
            n=Count("id"), mean=Avg("value")):
        names[row["name"]].series.append((row["bucket"], row["n"], row["mean"]))
    for summary in names.values():
        summary.distribution.sort(key=lambda item: (-item[1], item[0]) if summary.name not in ranges else 0)
    return sorted(names.values(), key=lambda summary: summary.name)


def _histogram(scores: QuerySet[Score], low: float, high: float) -> list[tuple[str, int]]:
    """Counts of the values in HISTOGRAM_BINS equal bins from low to high (the last closed)."""
    if high <= low:
        return [(f"{low:g}", scores.count())]
    width = (high - low) / HISTOGRAM_BINS
    bins = [0] * HISTOGRAM_BINS
    index = Least(Floor((F("value") - low) / width), Value(HISTOGRAM_BINS - 1), output_field=FloatField())
    for row in scores.annotate(bin=index).values("bin").order_by().annotate(n=Count("id")):
        bins[int(row["bin"])] += row["n"]
    return [(f"{low + i * width:.3g}–{low + (i + 1) * width:.3g}", count) for i, count in enumerate(bins)]


def score_groups(project: Project, *, since: datetime, until: datetime, by: str) -> list[GroupSummary]:
    """Per score name and tool (``by="tool"``: scores of tool calls) or model
    (``by="model"``: the round's model, else the conversation's)."""
    scores = Score.objects.filter(project=project, occurred_at__gte=since, occurred_at__lt=until)
    if by == "tool":
        scores = scores.filter(tool_execution__isnull=False).annotate(group=F("tool_execution__tool_name"))
    else:
        scores = scores.filter(conversation__isnull=False).annotate(
            group=Coalesce(NullIf(F("round__model"), Value("")), F("conversation__model")))
    rows = scores.values("name", "group").order_by("name", "group").annotate(
        n=Count("id"), mean=Avg("value"), negatives=Count("id", filter=Q(negative=True)))
    return [GroupSummary(row["name"], row["group"] or "", row["n"], row["mean"], row["negatives"]) for row in rows]


def score_means_by_conversation(conversation_ids: list[int]) -> dict[int, str]:
    """Each conversation's scores in a CSV cell: ``name=mean (n)`` per name, the
    mean over the values (a label-only name: its count), ``; `` between names."""
    found: dict[int, list[str]] = {}
    rows = (Score.objects.filter(conversation_id__in=conversation_ids).values("conversation_id", "name")
            .order_by("conversation_id", "name").annotate(n=Count("id"), mean=Avg("value")))
    for row in rows:
        mean = "" if row["mean"] is None else f"={row['mean']:.4g}"
        found.setdefault(row["conversation_id"], []).append(f"{row['name']}{mean} ({row['n']})")
    return {pk: "; ".join(parts) for pk, parts in found.items()}


@dataclass
class ScoreComparison:
    """One score name on two conversations: count, mean and negatives on each side."""

    name: str
    a_count: int = 0
    a_mean: Optional[float] = None
    a_negatives: int = 0
    b_count: int = 0
    b_mean: Optional[float] = None
    b_negatives: int = 0

    @property
    def delta(self) -> Optional[float]:
        return None if self.a_mean is None or self.b_mean is None else self.b_mean - self.a_mean


def scores_compared(a: Conversation, b: Conversation) -> list[ScoreComparison]:
    """Per score name, the scores of each conversation (all their rounds and tool calls)."""
    found: dict[str, ScoreComparison] = {}
    rows = (Score.objects.filter(conversation_id__in=[a.pk, b.pk]).values("conversation_id", "name").order_by()
            .annotate(n=Count("id"), mean=Avg("value"), negatives=Count("id", filter=Q(negative=True))))
    for row in rows:
        item = found.setdefault(row["name"], ScoreComparison(row["name"]))
        side = "a" if row["conversation_id"] == a.pk else "b"
        setattr(item, f"{side}_count", row["n"])
        setattr(item, f"{side}_mean", row["mean"])
        setattr(item, f"{side}_negatives", row["negatives"])
    return sorted(found.values(), key=lambda item: item.name)


# --- review queues ----------------------------------------------------------------------


@dataclass
class QueueProgress:
    queue: Any
    total: int = 0
    done: int = 0
    skipped: int = 0
    in_review: int = 0  # pending items a reviewer holds now
    by_reviewer: list[tuple[str, int]] = field(default_factory=list)  # (username, items finished)

    @property
    def left(self) -> int:
        return self.total - self.done - self.skipped


def queue_progress(queues: list[Any]) -> list[QueueProgress]:
    """Done, skipped, in review and left per queue, and who finished how many: two queries."""
    now = timezone.now()
    progress = {queue.pk: QueueProgress(queue) for queue in queues}
    for row in ReviewItem.objects.filter(queue__in=queues).values("queue_id").order_by().annotate(
            total=Count("id"), done=Count("id", filter=Q(status=ReviewStatus.DONE)),
            skipped=Count("id", filter=Q(status=ReviewStatus.SKIPPED)),
            held=Count("id", filter=Q(status=ReviewStatus.PENDING, claimed_until__gt=now))):
        item = progress[row["queue_id"]]
        item.total, item.done, item.skipped, item.in_review = row["total"], row["done"], row["skipped"], row["held"]
    for row in ReviewItem.objects.filter(queue__in=queues, done_by__isnull=False).values(
            "queue_id", "done_by__username").order_by("queue_id", "done_by__username").annotate(n=Count("id")):
        progress[row["queue_id"]].by_reviewer.append((row["done_by__username"], row["n"]))
    return [progress[queue.pk] for queue in queues]
