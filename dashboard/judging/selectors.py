"""Reads of scores: the filters the API and the pages share."""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Iterator, Optional

from django.db.models import (
    Avg,
    Case,
    Count,
    Exists,
    F,
    IntegerField,
    Max,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, NullIf
from django.utils import timezone

from dashboard.accounts.models import Project
from dashboard.observatory.conventions import tools_offered
from dashboard.observatory.models import Conversation, Message, Round, Span, ToolExecution

from .models import DatasetItem, ReviewItem, ReviewStatus, Score, ScoreEdit, ScoreHour, ScoreHourChanged, ScoreTarget
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
    return with_edit_count(rows)


def with_edit_count(rows: QuerySet[Score]) -> QuerySet[Score]:
    """``rows`` with each score's ``edit_count`` (how many ScoreEdit rows it has)."""
    # A count per row returned (a correlated subquery), not a GROUP BY over every score.
    edits = ScoreEdit.objects.filter(score=OuterRef("pk")).values("score").annotate(n=Count("id")).values("n")
    return rows.annotate(edit_count=Coalesce(Subquery(edits, output_field=IntegerField()), Value(0)))


def score_edits(score: Score) -> list[ScoreEdit]:
    """A score's edits, oldest first (who, through what, when, each field before and after)."""
    return list(ScoreEdit.objects.filter(score=score).order_by("changed_at", "id"))


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
    score_conversation_values index while the list's own index is walked)."""
    if not match:
        return conversations
    return conversations.filter(Exists(match.rows(Score.objects.filter(conversation=OuterRef("pk")))))


def traces_scored(project: Project, match: ScoreMatch) -> tuple[QuerySet[Score], QuerySet[Score]]:
    """For a root span (``OuterRef("trace_id")``): the matching scores of its trace
    (sent with the trace id), and those of a round of that trace (the pages' scores
    name their round)."""
    # ``exclude(trace_id="")`` lets the partial score_trace index serve (its condition, said).
    by_trace = match.rows(Score.objects.filter(project=project, trace_id=OuterRef("trace_id")).exclude(trace_id=""))
    by_round = match.rows(Score.objects.filter(round__project=project, round__trace_id=OuterRef("trace_id")))
    return by_trace, by_round


def scores_of_conversation(conversation: Conversation) -> list[Score]:
    rows = with_edit_count(Score.objects.filter(conversation=conversation))
    return list(rows.order_by("occurred_at", "id")[:PAGE_SCORES_LIMIT])


def scores_of_conversations(conversation_ids: list[int]) -> dict[int, list[Score]]:
    found: dict[int, list[Score]] = {pk: [] for pk in conversation_ids}
    for score in Score.objects.filter(conversation_id__in=conversation_ids).order_by("occurred_at", "id"):
        found[score.conversation_id].append(score)
    return found


def scores_of_trace(project: Project, trace_id: str) -> list[Score]:
    """The trace's scores: those sent with its id, and those of its rounds."""
    # Two index lookups in one query (score_trace; round_project_trace then score_round):
    # an OR of the two conditions would read every score of the project.
    by_trace = Score.objects.filter(project=project, trace_id=trace_id).exclude(trace_id="").values("pk")
    by_round = Score.objects.filter(round__in=Round.objects.filter(project=project, trace_id=trace_id).values("pk"))
    rows = with_edit_count(Score.objects.filter(pk__in=by_trace.union(by_round.values("pk"))))
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


MAX_HOUR_VALUES = 100  # distinct values of a numeric name an hour's counts keep (more: binned from the rows)
HOUR = timedelta(hours=1)


def hour_rows(project_id: int, hour: datetime) -> list[ScoreHour]:
    """One hour's ScoreHour rows (unsaved), computed from its score rows: five
    grouped reads of the hour's range on score_project_name_time."""
    scores = Score.objects.filter(project_id=project_id, occurred_at__gte=hour, occurred_at__lt=hour + HOUR)
    figures = {"n": Count("id"), "valued": Count("value"), "total": Sum("value"),
               "negatives": Count("id", filter=Q(negative=True))}
    rows: dict[tuple[str, str, str], ScoreHour] = {}

    def add(name: str, dimension: str, group: str, row: dict[str, Any], kind: str) -> ScoreHour:
        item = rows.get((name, dimension, group))
        if item is None:
            item = rows[(name, dimension, group)] = ScoreHour(
                project_id=project_id, hour=hour, name=name, dimension=dimension, group=group or "", kinds=[],
                counts={} if dimension == "" else None)
        if kind not in item.kinds:
            item.kinds.append(kind)
        item.count += row["n"]
        item.valued += row["valued"]
        item.value_sum += row["total"] or 0.0
        item.negatives += row["negatives"]
        return item

    for row in scores.values("name", "kind").order_by().annotate(**figures, low=Min("value"), high=Max("value")):
        item = add(row["name"], "", "", row, row["kind"])
        if row["kind"] == ScoreKind.NUMERIC and row["low"] is not None:
            item.low = row["low"] if item.low is None else min(item.low, row["low"])
            item.high = row["high"] if item.high is None else max(item.high, row["high"])
    for row in scores.values("name", "kind", "label", "value").order_by().annotate(n=Count("id")):
        item = rows[(row["name"], "", "")]
        if item.counts is None:
            continue
        if row["kind"] == ScoreKind.NUMERIC:
            key = f"{row['value']!r}" if row["value"] is not None else None
        elif row["kind"] == ScoreKind.BOOLEAN:
            key = "true" if row["value"] else "false"
        else:
            key = row["label"]
        if key is None:
            continue
        item.counts[key] = item.counts.get(key, 0) + row["n"]
        if row["kind"] == ScoreKind.NUMERIC and len(item.counts) > MAX_HOUR_VALUES:
            item.counts = None  # too many values to keep: the summary bins the rows
    by_tool = scores.filter(tool_execution__isnull=False).values("name", "kind", group=F("tool_execution__tool_name"))
    by_model = scores.filter(conversation__isnull=False).values(
        "name", "kind", group=Coalesce(NullIf(F("round__model"), Value("")), F("conversation__model")))
    for dimension, grouped in (("tool", by_tool), ("model", by_model)):
        for row in grouped.order_by().annotate(**figures):
            add(row["name"], dimension, row["group"], row, row["kind"])
    return list(rows.values())


def _changed_hours(project: Project, since: datetime, until: datetime) -> list[datetime]:
    return sorted(set(ScoreHourChanged.objects.filter(project=project, hour__gte=since, hour__lt=until)
                      .values_list("hour", flat=True).distinct()))


def score_hours(project: Project, since: datetime, until: datetime) -> list[ScoreHour]:
    """The overall ScoreHour rows (dimension "") of [since, until): the stored ones
    (read as plain values: a 90-day range holds thousands) for the hours no score
    changed since they were computed, computed now for the others (a refresh not done yet)."""
    changed = _changed_hours(project, since, until)
    fields = ("hour", "name", "kinds", "count", "valued", "value_sum", "negatives", "low", "high", "counts")
    stored = (ScoreHour.objects.filter(project=project, hour__gte=since, hour__lt=until, dimension="")
              .exclude(hour__in=changed).values_list(*fields))
    rows = [ScoreHour(project_id=project.pk, **dict(zip(fields, values))) for values in stored]
    return rows + [row for hour in changed for row in hour_rows(project.pk, hour) if row.dimension == ""]


def score_summary(project: Project, *, since: datetime, until: datetime, bucket: str) -> list[NameSummary]:
    """Per score name, over [since, until) (whole hours): count, mean, negatives,
    distribution (labels, true/false, each value, or HISTOGRAM_BINS equal bins of the
    values) and per ``bucket`` ("hour" or "day") the count and mean, every bucket of
    the range (one with no score: count 0, mean None; ``bucket_starts``). From the hourly
    rows (score_hours), which are sums of the score rows."""
    names: dict[str, NameSummary] = {}
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    series: dict[str, dict[datetime, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0, 0]))
    counts: dict[str, Optional[dict[str, int]]] = {}
    ranges: dict[str, tuple[float, float]] = {}
    for row in score_hours(project, since, until):
        summary = names.setdefault(row.name, NameSummary(row.name, []))
        summary.kinds.extend(kind for kind in row.kinds if kind not in summary.kinds)
        summary.count += row.count
        summary.negatives += row.negatives
        sums[row.name][0] += row.value_sum
        sums[row.name][1] += row.valued
        start = row.hour if bucket == "hour" else row.hour.replace(hour=0)
        point = series[row.name][start]
        point[0] += row.count
        point[1] += row.value_sum
        point[2] += row.valued
        if row.low is not None:
            low, high = ranges.get(row.name, (row.low, row.high))
            ranges[row.name] = (min(low, row.low), max(high, row.high))
        merged = counts.get(row.name, {})
        if merged is not None and row.counts is not None:
            for key, n in row.counts.items():
                merged[key] = merged.get(key, 0) + n
            counts[row.name] = merged
        else:
            counts[row.name] = None
    buckets = bucket_starts(since, until, bucket)
    for name, summary in names.items():
        total, valued = sums[name]
        summary.mean = total / valued if valued else None
        points = series[name]
        summary.series = [(start, int(points[start][0]), points[start][1] / points[start][2] if start in points
                           and points[start][2] else None) for start in buckets]
        summary.distribution = _distribution(project, name, since, until, counts.get(name), ranges.get(name))
    return sorted(names.values(), key=lambda summary: summary.name)


def bucket_starts(since: datetime, until: datetime, bucket: str) -> list[datetime]:
    """Every bucket of [since, until) in order, those with no score too (a chart's
    time axis is true): whole hours, or UTC days (the first one holding ``since``)."""
    step = HOUR if bucket == "hour" else timedelta(days=1)
    start = since.replace(minute=0, second=0, microsecond=0)
    if bucket != "hour":
        start = start.replace(hour=0)
    starts = []
    while start < until:
        starts.append(start)
        start += step
    return starts


def _distribution(project: Project, name: str, since: datetime, until: datetime,
                  counts: Optional[dict[str, int]], numeric: Optional[tuple[float, float]]) -> list[tuple[str, int]]:
    """Labels and true/false by count, most first; numeric values each (up to
    HISTOGRAM_BINS of them) or in HISTOGRAM_BINS equal bins from the lowest to the
    highest; from the rows when an hour kept no counts of its values."""
    if counts is None:
        low, high = numeric or (0.0, 0.0)
        scores = Score.objects.filter(project=project, name=name, occurred_at__gte=since, occurred_at__lt=until)
        shown = [(label, n) for label, n in scores.exclude(kind=ScoreKind.NUMERIC).values_list("label").order_by()
                 .annotate(n=Count("id"))]
        return shown + _histogram_of_rows(scores.filter(kind=ScoreKind.NUMERIC), low, high)
    words = sorted(((key, n) for key, n in counts.items() if not _is_number(key)), key=lambda item: (-item[1], item[0]))
    values = sorted((float(key), n) for key, n in counts.items() if _is_number(key))
    if len(values) <= HISTOGRAM_BINS:
        return words + [(f"{value:g}", n) for value, n in values]
    low, high = values[0][0], values[-1][0]
    width = (high - low) / HISTOGRAM_BINS
    bins = [0] * HISTOGRAM_BINS
    for value, n in values:
        bins[min(int((value - low) / width), HISTOGRAM_BINS - 1)] += n
    return words + _bin_labels(low, width, bins)


def _is_number(key: str) -> bool:
    return key[:1].isdigit() or key[:1] == "-" or key[:2] in ("in", "na")


def _bin_labels(low: float, width: float, bins: list[int]) -> list[tuple[str, int]]:
    return [(f"{low + i * width:.3g}–{low + (i + 1) * width:.3g}", count) for i, count in enumerate(bins)]


def _histogram_of_rows(scores: QuerySet[Score], low: float, high: float) -> list[tuple[str, int]]:
    """The values' counts in HISTOGRAM_BINS equal bins from low to high (the last one
    closed), binned by the database with plain comparisons."""
    if high <= low:
        total = scores.count()
        return [(f"{low:g}", total)] if total else []
    width = (high - low) / HISTOGRAM_BINS
    edges = [When(value__lt=low + (i + 1) * width, then=Value(i)) for i in range(HISTOGRAM_BINS - 1)]
    index = Case(*edges, default=Value(HISTOGRAM_BINS - 1), output_field=IntegerField())
    bins = [0] * HISTOGRAM_BINS
    for row in scores.annotate(bin=index).values("bin").order_by().annotate(n=Count("id")):
        bins[row["bin"]] += row["n"]
    return _bin_labels(low, width, bins)


def score_groups(project: Project, *, since: datetime, until: datetime, by: str) -> list[GroupSummary]:
    """Per score name and tool (``by="tool"``: scores of tool calls) or model
    (``by="model"``: the round's model, else the conversation's): the stored hours
    summed by the database, the changed ones computed now."""
    changed = _changed_hours(project, since, until)
    found: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0, 0])
    stored = (ScoreHour.objects.filter(project=project, hour__gte=since, hour__lt=until, dimension=by)
              .exclude(hour__in=changed).values("name", "group").order_by()
              .annotate(n=Sum("count"), total=Sum("value_sum"), valued=Sum("valued"), negatives=Sum("negatives")))
    live = [{"name": row.name, "group": row.group, "n": row.count, "total": row.value_sum, "valued": row.valued,
             "negatives": row.negatives} for hour in changed for row in hour_rows(project.pk, hour)
            if row.dimension == by]
    for row in [*stored, *live]:
        item = found[(row["name"], row["group"])]
        item[0] += row["n"]
        item[1] += row["total"] or 0.0
        item[2] += row["valued"]
        item[3] += row["negatives"]
    return [GroupSummary(name, group, int(n), value_sum / valued if valued else None, int(negatives))
            for (name, group), (n, value_sum, valued, negatives) in sorted(found.items())]


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
    """Per score name, the scores of each conversation (all their rounds and tool
    calls): read from the score_conversation_values index alone."""
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


# --- datasets ---------------------------------------------------------------------------

CASE_MESSAGES = 500  # messages of the context a case keeps at most (the latest ones)
CASE_TEXT = 20_000  # characters of one message or answer a case keeps
CASE_TOOL_CALLS = 200


@dataclass
class DatasetCase:
    """A dataset item in the making: its id, input, output and source."""

    item_id: str
    input: dict[str, Any]
    output: Any
    source: dict[str, str]
    conversation_id: int
    round_id: Optional[int] = None


def _text(value: Optional[str]) -> str:
    return (value or "")[:CASE_TEXT]


def _item_key(*parts: str) -> str:
    key = ":".join(parts)
    if len(key) <= 200:
        return key
    return f"{parts[0]}:{hashlib.sha256(key.encode()).hexdigest()}"


TRACE_SPANS_READ = 500  # spans of a round's trace read at most to find the tools offered


def tools_offered_to_rounds(rounds: list[Round]) -> dict[int, list[dict[str, Any]]]:
    """Round pk -> the tools its model call was offered, where a span says so
    (``conventions.tools_offered``: GenAI ``gen_ai.tool.definitions``, OpenInference
    ``llm.tools``, OpenLLMetry ``llm.request.functions``): the round's own span, else
    the first span of its trace in the round's time that says. Records carry no tool
    list: a round only recorded is absent. Two queries."""
    found: dict[int, list[dict[str, Any]]] = {}
    if not rounds:
        return found
    project_id = rounds[0].project_id
    own = {(r.trace_id, r.span_id): r for r in rounds if r.trace_id and r.span_id}
    if own:
        spans = Span.objects.filter(project_id=project_id, trace_id__in={t for t, _ in own},
                                    span_id__in={s for _, s in own}).values_list("trace_id", "span_id", "attributes")
        for trace_id, span_id, attributes in spans:
            round_ = own.get((trace_id, span_id))
            tools = tools_offered(attributes) if round_ is not None else None
            if tools:
                found[round_.pk] = tools
    rest = [r for r in rounds if r.pk not in found and r.trace_id]
    if rest:
        spans = list(Span.objects.filter(project_id=project_id, trace_id__in={r.trace_id for r in rest})
                     .order_by("start_time", "span_id").values_list("trace_id", "start_time", "attributes")
                     [:TRACE_SPANS_READ])
        for round_ in rest:
            for trace_id, start, attributes in spans:
                if trace_id != round_.trace_id or (round_.started_at and start < round_.started_at) or (
                        round_.ended_at and start > round_.ended_at):
                    continue
                tools = tools_offered(attributes)
                if tools:
                    found[round_.pk] = tools
                    break
    return found


def _tools_input(offered: Optional[list[dict[str, Any]]], called: list[str]) -> dict[str, Any]:
    """What a case says of tools: those offered to the model where a span said so,
    else only those the agent called (named so: the model may have had others)."""
    return {"tools_offered": offered} if offered else {"tools_called": called}


def cases_of_rounds(rounds: list[Round]) -> list[DatasetCase]:
    """Each round as a case: the context the model saw when the round began (the
    messages of the rounds before it, and the round's user message), the tools
    offered to the model (``tools_offered``, where a span says; else
    ``tools_called``: those the conversation's agent called), and what the round
    answered and called. A constant number of queries per conversation."""
    cases = []
    by_conversation: dict[int, list[Round]] = defaultdict(list)
    for round_ in rounds:
        by_conversation[round_.conversation_id].append(round_)
    for conversation_id, chosen in by_conversation.items():
        conversation = Conversation.objects.only("id", "external_id").get(pk=conversation_id)
        order = dict(Round.objects.filter(conversation_id=conversation_id).values_list("round_id", "index"))
        messages = list(Message.objects.filter(conversation_id=conversation_id).order_by("index", "id").values(
            "round_id", "role", "content", "name", "tool_calls", "tool_call_id", "is_meta"))
        executions = list(ToolExecution.objects.filter(conversation_id=conversation_id).order_by(
            "occurred_at", "id").values("round_id", "tool_name", "parameters", "success", "observation",
                                        "error_type"))
        called = sorted({e["tool_name"] for e in executions})
        offered = tools_offered_to_rounds(chosen)
        for round_ in chosen:
            earlier = [m for m in messages if order.get(m["round_id"], -1) < round_.index]
            context = [_message(m) for m in earlier][-CASE_MESSAGES:]
            calls = [{"tool": e["tool_name"], "arguments": e["parameters"], "success": e["success"],
                      "observation": _text(e["observation"]), "error_type": e["error_type"]}
                     for e in executions if e["round_id"] == round_.round_id][:CASE_TOOL_CALLS]
            cases.append(DatasetCase(
                item_id=_item_key("round", conversation.external_id, round_.round_id),
                input={"user_message": _text(round_.user_message), "messages": context,
                       **_tools_input(offered.get(round_.pk), called)},
                output={"final_answer": None if round_.final_answer is None else _text(round_.final_answer),
                        "tool_calls": calls, "status": round_.status},
                source={"conversation_id": conversation.external_id, "round_id": round_.round_id,
                        "trace_id": round_.trace_id, "model": round_.model},
                conversation_id=conversation_id, round_id=round_.pk,
            ))
    return cases


def _message(row: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": row["role"], "content": _text(row["content"])}
    for name in ("name", "tool_call_id"):
        if row[name]:
            message[name] = row[name]
    if row["tool_calls"]:
        message["tool_calls"] = row["tool_calls"]
    return message


def cases_of_conversations(conversations: list[Conversation]) -> list[DatasetCase]:
    """Each conversation as a case: its user messages in order and the tools offered
    to its model (all its rounds', by name, where spans say; else the tools its agent
    called) as input; its answers and tool calls as output."""
    cases = []
    for conversation in conversations:
        round_rows = list(Round.objects.filter(conversation=conversation).order_by("index", "id").only(
            "id", "project_id", "round_id", "trace_id", "span_id", "started_at", "ended_at", "user_message",
            "final_answer", "status"))
        offered_by_name: dict[str, dict[str, Any]] = {}
        offered = tools_offered_to_rounds(round_rows)
        for round_ in round_rows:  # in the rounds' order
            for tool in offered.get(round_.pk, []):
                offered_by_name.setdefault(tool["name"], tool)
        rounds = [{"round_id": r.round_id, "user_message": r.user_message, "final_answer": r.final_answer,
                   "status": r.status} for r in round_rows]
        executions = list(ToolExecution.objects.filter(conversation=conversation).order_by("occurred_at", "id")
                          .values("round_id", "tool_name", "parameters", "success")[:CASE_TOOL_CALLS])
        cases.append(DatasetCase(
            item_id=_item_key("conversation", conversation.external_id),
            input={"user_messages": [_text(r["user_message"]) for r in rounds],
                   **_tools_input(list(offered_by_name.values()), sorted({e["tool_name"] for e in executions}))},
            output={"final_answers": [None if r["final_answer"] is None else _text(r["final_answer"])
                                      for r in rounds],
                    "tool_calls": [{"round_id": e["round_id"], "tool": e["tool_name"], "arguments": e["parameters"],
                                    "success": e["success"]} for e in executions],
                    "status": conversation.status},
            source={"conversation_id": conversation.external_id, "model": conversation.model},
            conversation_id=conversation.pk,
        ))
    return cases


def dataset_item_json(item: Any) -> str:
    """One item as its JSONL line (the pipeline's DatasetItem form)."""
    return json.dumps({"item_id": item.item_id, "input": item.input, "output": item.output,
                       "expected_output": item.expected_output, "source": item.source, "metadata": item.metadata},
                      ensure_ascii=False)


def dataset_lines(dataset: Any) -> Iterator[str]:
    """The dataset's items as JSONL, in the order they were added, a chunk at a time."""
    items = DatasetItem.objects.filter(dataset=dataset).order_by("id")
    for item in items.iterator(chunk_size=500):
        yield dataset_item_json(item) + "\n"
