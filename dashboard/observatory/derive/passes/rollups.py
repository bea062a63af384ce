"""The rollups pass: per-tool statistics by minute and by hour.

A minute's slice (ToolMinuteRollup) counts the minute's tool executions and the
tool spans no tool execution describes; an hour (ToolHourlyRollup) is the sum of
its slices. Only the minutes the batch touched are recounted, each at most once per
OBSERVATORY_ROLLUP_INTERVAL_SECONDS: a minute not due yet gets a note for when it
is. Recomputed from rows, never incremented; a slice written by a pass that began
later is never overwritten, so two drainers can finish in any order.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any, Callable, ContextManager, Iterable

from django.conf import settings
from django.db import connections, router, transaction
from django.db.models import Count, Exists, Max, OuterRef, Q, Sum
from django.db.models.fields.json import KeyTextTransform
from django.utils import timezone

from dashboard.priority import yield_to_pages
from dashboard.observatory import costs
from dashboard.observatory.conventions import count_of, token_count_of
from dashboard.observatory.dbfunctions import HourUTC, database_now
from dashboard.observatory.histogram import LATENCY_BUCKET_BOUNDS_MS, bucket_index, empty_histogram
from dashboard.observatory.models import (
    SPAN_TOOL_UNDERIVED,
    DerivationNote,
    Span,
    ToolExecution,
    ToolHourlyRollup,
    ToolMinuteRollup,
    hour_of,
    minute_of,
)

from ..batch import Batch, Pass


SPAN_STATUS_ERROR = 2


# --- hourly tool rollups --------------------------------------------------------------

def _histogram_aggregates() -> dict[str, Any]:
    aggregates: dict[str, Any] = {}
    lower = None
    for i, upper in enumerate(LATENCY_BUCKET_BOUNDS_MS):
        condition = Q(duration_ms__lte=upper)
        if lower is not None:
            condition &= Q(duration_ms__gt=lower)
        aggregates[f"b{i}"] = Count("id", filter=condition)
        lower = upper
    aggregates[f"b{len(LATENCY_BUCKET_BOUNDS_MS)}"] = Count("id", filter=Q(duration_ms__gt=lower))
    return aggregates


_LEVELS = ("brief", "standard", "full")
_TIMEOUT = Q(error_type__iexact="timeout") | Q(error_code__iexact="timeout")


def _empty_rollup() -> dict[str, Any]:
    return {
        "calls": 0, "successes": 0, "errors": 0, "retries": 0, "timeouts": 0, "cache_hits": 0,
        "duration_sum_ms": 0.0, "latency_histogram": empty_histogram(), "error_types": Counter(),
        "cost_pico_usd": 0, "priced_calls": 0,  # [costs]
        "unknown_token_calls": 0,  # in no token sum, no level's count, no cost
        "unleveled_tokens": 0,  # known tokens of calls with no output level
        **{f"{level}_{kind}": 0 for level in _LEVELS for kind in ("tokens", "count")},
    }


ROLLUP_SLICE = timedelta(minutes=1)  # a slice is what models.minute_of names
# The slice every recompute of a minute writes, whatever the minute holds: a pass that
# finds a minute empty (its rows deleted since: a record won over a derived call) still
# says when it read, so a pass begun earlier cannot write its stale slices over it. No
# tool has an empty name (ingest and the span-row pass give one), and the hour's sum skips it.
MINUTE_MARK = ""


def tool_rollups_refresh(*, project_id: int, hours: Iterable[datetime] = (), minutes: Iterable[datetime] = (),
                         step: Callable[[], ContextManager[Any]] = nullcontext) -> int:
    """Recompute tool statistics from the rows, minute by minute: the given
    minutes, and every minute of the given hours (the sweep, a repricing, a note
    written before the slices); then sum each hour touched from its minute slices.
    Returns the hour rollups written.

    A minute's slice counts the minute's tool executions plus its tool spans that
    no tool execution describes; a slice of a tool that has no rows left in the
    minute is deleted. A batch's rows fall in the minutes around now, so its pass
    reads seconds of rows: recomputing its whole hour read up to an hour of them,
    and 25 minutes into the hour-long soak that was 75 % of the derivation's time.

    A slice says when the pass that wrote it began reading (``updated_at``), and a
    pass writes a slice only when no pass that began later has written it: two
    drainers recomputing one minute can finish in any order, and the one that read
    first would otherwise overwrite the newer figures with stale ones that no later
    note corrects (the soak once ended 1,462 calls behind so). The hour's sum is
    taken in the same transaction, from the slices as they are then. That
    transaction is inside ``step()``; the reading before it is not (the beat: on
    SQLite the drain lock is held for an hour's writes, not for reading its rows)."""
    by_hour: dict[datetime, list[datetime]] = defaultdict(list)
    for minute in rollup_minutes(hours=hours, minutes=minutes):
        by_hour[hour_of(minute)].append(minute)
    written = 0
    for hour, hour_minutes in sorted(by_hour.items()):
        began, clock = database_now(), time.monotonic()
        slices = {minute: _minute_stats(project_id, minute) for minute in hour_minutes}
        with step(), transaction.atomic():
            newer = _slices_newer(project_id, hour, hour_minutes, began)
            fresh = {minute: stats for minute, stats in slices.items() if minute not in newer}
            ToolMinuteRollup.objects.filter(project_id=project_id, minute__in=list(fresh)).delete()
            ToolMinuteRollup.objects.bulk_create(
                ToolMinuteRollup(project_id=project_id, minute=minute, tool_name=tool_name, updated_at=began,
                                 **{**entry, "error_types": dict(entry["error_types"])})
                for minute, stats in fresh.items()
                for tool_name, entry in [(MINUTE_MARK, _empty_rollup()), *stats.items()]
            )
            written += _hour_sum(project_id, hour)
        seconds = time.monotonic() - clock
        for minute in hour_minutes:
            _recompute_cost_note(project_id, minute, seconds / len(hour_minutes))
    return written


def rollup_minutes(*, hours: Iterable[datetime] = (), minutes: Iterable[datetime] = ()) -> list[datetime]:
    """The minutes to recompute, in order: the given ones, and every minute of the given hours."""
    wanted = {minute_of(minute) for minute in minutes}
    for hour in {hour_of(hour) for hour in hours}:
        wanted.update(hour + i * ROLLUP_SLICE for i in range(timedelta(hours=1) // ROLLUP_SLICE))
    return sorted(wanted)


def _minute_stats(project_id: int, start: datetime) -> dict[str, dict[str, Any]]:
    """Each tool's figures in the minute from ``start``, read from the rows: a few
    grouped queries, and five extracted attribute values per span-only call."""
    end = start + ROLLUP_SLICE
    stats: dict[str, dict[str, Any]] = defaultdict(_empty_rollup)
    executions = ToolExecution.objects.filter(project_id=project_id, occurred_at__gte=start, occurred_at__lt=end)
    level_aggregates = {}
    for level in _LEVELS:
        level_aggregates[f"{level}_tokens"] = Sum("observation_tokens", filter=Q(output_level=level))
        # the calls of the level whose tokens are known (a null count is no 0)
        level_aggregates[f"{level}_count"] = Count("observation_tokens", filter=Q(output_level=level))
    for row in executions.values("tool_name").order_by().annotate(
        calls=Count("id"), successes=Count("id", filter=Q(success=True)),
        errors=Count("id", filter=Q(success=False)), retries=Sum("retry_count"),
        timeouts=Count("id", filter=Q(success=False) & _TIMEOUT),
        cache_hits=Count("id", filter=Q(cache_hit=True)), duration_sum_ms=Sum("duration_ms"),
        unknown_token_calls=Count("id", filter=Q(observation_tokens__isnull=True)),
        unleveled_tokens=Sum("observation_tokens", filter=~Q(output_level__in=_LEVELS)),
        **level_aggregates, **_histogram_aggregates(),
    ):
        entry = stats[row["tool_name"]]
        for name in ("calls", "successes", "errors", "retries", "timeouts", "cache_hits", "duration_sum_ms",
                     "unknown_token_calls", "unleveled_tokens", *level_aggregates):
            entry[name] = row[name] or 0
        entry["latency_histogram"] = [row[f"b{i}"] for i in range(len(LATENCY_BUCKET_BOUNDS_MS) + 1)]
    if stats:
        for row in executions.filter(success=False).values("tool_name", "error_type").order_by().annotate(
                n=Count("id")):
            stats[row["tool_name"]]["error_types"][row["error_type"] or "unknown"] += row["n"]
        costs.tool_call_costs(stats, executions, start)  # [costs] observation tokens at the input price

    # Five attribute values per span, extracted by the database, read in chunks:
    # never the spans' whole attributes, never all of a minute's spans at once.
    span_only = span_only_calls(project_id, start, end).annotate(**_SPAN_FACTS)
    for span in span_only.values_list("tool_name", "duration_ms", "status_code",
                                      *_SPAN_FACTS).iterator(chunk_size=_SPAN_CHUNK):
        _add_span(stats[span[0]], span[1], span[2], dict(zip(_SPAN_FACT_KEYS, span[3:])))
        if stats[span[0]]["calls"] % _SPAN_CHUNK == 0:
            yield_to_pages()
    return stats


# The figures an hour adds up from its slices: all but the histogram and the error types.
_SUMMED = tuple(name for name in _empty_rollup() if name not in ("latency_histogram", "error_types"))


def _hour_sum(project_id: int, hour: datetime) -> int:
    """Write the hour's rollups as the sums of its minute slices (at most sixty a
    tool); a tool with no slice left loses its hour rollup. Returns rows written."""
    stats: dict[str, dict[str, Any]] = defaultdict(_empty_rollup)
    for minute in ToolMinuteRollup.objects.filter(project_id=project_id, minute__gte=hour,
                                                  minute__lt=hour + timedelta(hours=1)).exclude(tool_name=MINUTE_MARK):
        entry = stats[minute.tool_name]
        for name in _SUMMED:
            entry[name] += getattr(minute, name)
        entry["latency_histogram"] = [a + b for a, b in zip(entry["latency_histogram"], minute.latency_histogram)]
        entry["error_types"].update(minute.error_types)
    ToolHourlyRollup.objects.filter(project_id=project_id, hour=hour).exclude(tool_name__in=list(stats)).delete()
    now = timezone.now()
    ToolHourlyRollup.objects.bulk_create(
        [ToolHourlyRollup(project_id=project_id, tool_name=tool_name, hour=hour, updated_at=now,
                          **{**entry, "error_types": dict(entry["error_types"])})
         for tool_name, entry in stats.items()],
        update_conflicts=True, unique_fields=["project", "tool_name", "hour"],
        update_fields=[f for f in _empty_rollup()] + ["updated_at"],
    )
    return len(stats)


# What the last recompute of a minute cost, in seconds, as this process saw it: a busy
# minute is recomputed at most once per ROLLUP_COST_SPACING times that (rollup_minutes_due).
ROLLUP_COST_SPACING = 4
_recompute_costs: dict[tuple[int, datetime], float] = {}
_RECOMPUTE_COSTS_KEPT = 10_000


def _recompute_cost_note(project_id: int, minute: datetime, seconds: float) -> None:
    if len(_recompute_costs) >= _RECOMPUTE_COSTS_KEPT:
        _recompute_costs.clear()  # old minutes; the next recompute of each learns again
    _recompute_costs[(project_id, minute)] = seconds


def span_only_calls(project_id: int, start: datetime, end: datetime) -> Any:
    """The tool spans started in [start, end) that no tool execution describes:
    not by tool_call_id, and not as the span a tool execution (a record's, or one
    derived from the span) links to. Only among those no span-row pass derives
    (``span_tool_underived``): a tool span of a conversation is counted as the tool
    execution derived from it. Before, every tool span of the hour was read, with
    two lookups each, at every recompute: 44 % of the derivation's time 25 minutes
    into the hour-long soak."""
    described = ToolExecution.objects.filter(project_id=project_id, tool_call_id=OuterRef("tool_call_id"))
    linked = ToolExecution.objects.filter(linked_span_id=OuterRef("pk"))
    return (
        Span.objects.filter(SPAN_TOOL_UNDERIVED, project_id=project_id, start_time__gte=start, start_time__lt=end)
        .annotate(described=Exists(described), linked=Exists(linked))
        .filter(Q(described=False) | Q(tool_call_id=""))
        .filter(linked=False)
    )


def _slices_newer(project_id: int, hour: datetime, minutes: list[datetime], began: datetime) -> set[datetime]:
    """Inside the writing transaction: the minutes of ``hour`` among ``minutes``
    that a pass begun after ``began`` wrote. The check, the write and the hour's
    sum are one step per hour: on SQLite the IMMEDIATE transaction holds the write
    lock, on PostgreSQL a transaction-scoped advisory lock on (project, hour) does."""
    connection = connections[router.db_for_write(ToolMinuteRollup)]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [project_id, int(hour.timestamp()) // 3600])
    return set(ToolMinuteRollup.objects.filter(project_id=project_id, minute__in=minutes, updated_at__gt=began)
               .values_list("minute", flat=True).distinct())


def rollup_minutes_due(*, project_id: int, minutes: Iterable[datetime], interval: timedelta) -> tuple[
        list[datetime], list[datetime], datetime | None]:
    """(minutes due, minutes not due yet, when those are due): a minute is due
    when no pass began recomputing it within ``interval``, or within
    ROLLUP_COST_SPACING times what its last recompute took. Every batch of a busy
    minute would otherwise recompute it, on every drainer; the outbox recomputes a
    minute at most that often and notes the rest for then."""
    minutes = sorted({minute_of(minute) for minute in minutes})
    if interval <= timedelta(0) or not minutes:
        return minutes, [], None
    now = database_now()  # the clock the slices were stamped by
    last = dict(ToolMinuteRollup.objects.filter(project_id=project_id, minute__in=minutes).values("minute")
                .order_by().annotate(last=Max("updated_at")).values_list("minute", "last"))
    next_due = {
        minute: last[minute] + max(interval, timedelta(
            seconds=ROLLUP_COST_SPACING * _recompute_costs.get((project_id, minute), 0.0)))
        for minute in minutes if minute in last
    }
    due = [minute for minute in minutes if minute not in next_due or next_due[minute] <= now]
    later = [minute for minute in minutes if minute in next_due and next_due[minute] > now]
    return due, later, max((next_due[minute] for minute in later), default=None)


# The span attributes a tool rollup reads, extracted as scalars by the database
# (SQLite's json_extract gives numbers and 1/0 for booleans, PostgreSQL's ->> text).
_SPAN_FACT_KEYS = ("ba.retry_count", "ba.cache_hit", "error.type", "ba.output_level", "ba.observation_tokens")
_SPAN_FACTS = {f"fact{i}": KeyTextTransform(key, "attributes") for i, key in enumerate(_SPAN_FACT_KEYS)}
_SPAN_CHUNK = 2_000


def _add_span(entry: dict[str, Any], duration_ms: float, status_code: int, attributes: Any) -> None:
    attributes = attributes if isinstance(attributes, dict) else {}
    # Failed: status ERROR, or an error type (the GenAI conventions set error.type on failure).
    failed = status_code == SPAN_STATUS_ERROR or attributes.get("error.type") not in (None, "")
    entry["calls"] += 1
    entry["successes" if not failed else "errors"] += 1
    entry["retries"] += count_of(attributes.get("ba.retry_count")) or 0
    entry["cache_hits"] += 1 if attributes.get("ba.cache_hit") in (True, 1, "true", "1") else 0
    entry["duration_sum_ms"] += duration_ms or 0.0
    entry["latency_histogram"][bucket_index(duration_ms or 0.0)] += 1
    if failed:
        error_type = str(attributes.get("error.type") or "unknown")[:200]
        entry["error_types"][error_type] += 1
        entry["timeouts"] += 1 if error_type.lower() == "timeout" else 0
    # No result is read here: a span-only call's tokens are the pipeline's count or unknown.
    tokens = token_count_of(attributes.get("ba.observation_tokens"))
    if tokens is None:
        entry["unknown_token_calls"] += 1
        return
    level = attributes.get("ba.output_level")
    if level in _LEVELS:
        entry[f"{level}_count"] += 1
        entry[f"{level}_tokens"] += tokens
    else:
        entry["unleveled_tokens"] += tokens


def hours_with_rows(*, project_id: int, since: datetime) -> set[datetime]:
    """The hours since ``since`` that have tool executions or tool spans (one
    distinct hour per row group, truncated by the database: never the rows)."""
    hours = set(
        ToolExecution.objects.filter(project_id=project_id, occurred_at__gte=since)
        .annotate(hour=HourUTC("occurred_at")).values_list("hour", flat=True).distinct()
    )
    hours |= set(
        Span.objects.filter(project_id=project_id, start_time__gte=since).exclude(tool_name="")
        .annotate(hour=HourUTC("start_time")).values_list("hour", flat=True).distinct()
    )
    # Hours whose rows are gone still need their stale rollups removed.
    hours |= set(ToolHourlyRollup.objects.filter(project_id=project_id, hour__gte=hour_of(since))
                 .values_list("hour", flat=True))
    return {hour_of(hour) for hour in hours}


def run(batch: Batch) -> None:
    """Recompute the minutes due now (those of whole hours included); note the
    others for when they are due (a minute at most once per
    OBSERVATORY_ROLLUP_INTERVAL_SECONDS: see rollup_minutes_due)."""
    if not batch.hours and not batch.minutes:
        return
    due, later, when = rollup_minutes_due(
        project_id=batch.project_id, minutes=rollup_minutes(hours=batch.hours, minutes=batch.minutes),
        interval=timedelta(seconds=settings.OBSERVATORY_ROLLUP_INTERVAL_SECONDS),
    )
    if due:
        tool_rollups_refresh(project_id=batch.project_id, minutes=due)
    if later:
        DerivationNote.objects.create(project_id=batch.project_id, minutes=[minute.isoformat() for minute in later],
                                      available_at=when)


PASS = Pass(
    name="rollups",
    reads=("ToolExecution", "Span (tool spans no execution describes)", "PriceRule", "ToolMinuteRollup"),
    writes=("ToolMinuteRollup", "ToolHourlyRollup", "DerivationNote (minutes not due yet)"),
    run=run,
)
