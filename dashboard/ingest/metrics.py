"""Store decoded OTLP metric points as hourly sums (``dashboard.metrics``).

The metrics twin of ``logs.logs_store``: one (group) transaction, acknowledged after
the commit. Nothing is stored point by point: each point adds its increment to the
row of its project, hour, metric, model, tool and token type (``MetricHour``).

Temporality. The OpenTelemetry SDKs export cumulative points by default: every
export carries the total since the series started, so adding the points would count
the same tokens again at each export. Each series' last point is kept
(``MetricSeries``) and a point adds its increment over it:

- cumulative: the value (a histogram: its count and sum) minus the last one, when the
  series has the same start time and did not go down; else the series restarted (a
  new process) and the whole value is new. A point no later than the last one is a
  retry (or late) and adds nothing.
- delta: the value itself, unless its interval starts before the last point's time
  (a retry of a point counted already).

The increment lands in the hour of the point's time. So a retried export stores
nothing twice, whatever its temporality, and the hourly rows stay bounded by the
series, not by the export interval. At most ``MAX_SERIES`` series a project (their
points beyond are counted as other metrics), and at most ``MAX_OTHER_NAMES`` names
of other metrics (the rest counted under one name).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Sequence

from django.db.models import F
from django.utils import timezone as dj_timezone

from dashboard.accounts.models import Project
from dashboard.metrics.models import NAME_LENGTH, MetricHour, MetricSeries, OtherMetric
from dashboard.observatory.models import hour_of

from .group_commit import Pending, pending_store
from .otlp_metrics import DecodedMetrics, MetricPoint
from .spans import _LOOKUP_CHUNK, _aware

MAX_SERIES = 5_000  # series a project keeps state for
MAX_OTHER_NAMES = 1_000  # names of other metrics a project counts apart
OTHER_NAMES_FOLDED = "(other names)"


@dataclass(frozen=True, slots=True)
class StoredMetrics:
    inserted: int  # points that added to the hourly rows (a retried point adds nothing)
    others: int  # points of other metrics, counted


def metrics_store(*, project: Project, metrics: DecodedMetrics) -> StoredMetrics:
    """Store one decoded export for ``project`` in one (group) transaction."""
    return pending_store(metrics_prepare(project=project, metrics=metrics))


def metrics_prepare(*, project: Project, metrics: DecodedMetrics) -> Pending[StoredMetrics]:
    """What ``metrics_store`` does before its transaction (see ``spans.spans_prepare``)."""
    if not metrics.points and not metrics.others:
        return Pending(None, 0, StoredMetrics(0, 0))
    points = sorted(metrics.points, key=lambda point: (point.series, point.time_unix_nano))
    others = Counter(metrics.others)
    return Pending(lambda: _metrics_write(project.pk, points, others), len(points) + len(others),
                   StoredMetrics(0, 0))


def _metrics_write(project_id: int, points: Sequence[MetricPoint], others: Counter[str]) -> StoredMetrics:
    """Inside the (group) transaction; may run twice (see ingest.group_commit): it
    changes nothing it was given."""
    now = dj_timezone.now()
    others = Counter(others)
    keys = sorted({point.series for point in points})
    known = _series_locked(project_id, keys)
    missing = [key for key in keys if key not in known]
    if missing:
        # A new series is inserted (as never seen: its first point counts whole) and then
        # locked like the others: two exports of it at once take turns (the second waits
        # for the first's commit, then sees its point), where both had counted it whole.
        room = max(MAX_SERIES - MetricSeries.objects.filter(project_id=project_id).count(), 0)
        MetricSeries.objects.bulk_create([MetricSeries(project_id=project_id, key=key, seen_at=now)
                                          for key in missing[:room]], ignore_conflicts=True)
        known.update(_series_locked(project_id, missing[:room]))
    changed: dict[str, MetricSeries] = {}
    sums: dict[tuple[datetime, str, str, str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    added = 0
    for point in points:
        series = known.get(point.series)
        if series is None:
            others[f"{point.name[:NAME_LENGTH - 24]} (past {MAX_SERIES} series)"] += 1
            continue
        increment = _increment(series, point)
        if increment is None:
            continue  # counted already
        series.start_time_unix_nano, series.time_unix_nano = point.start_time_unix_nano, point.time_unix_nano
        series.value, series.count, series.seen_at = point.value, point.count, now
        changed[point.series] = series
        added += 1
        if increment != (0.0, 0):
            row = sums[(hour_of(_aware(point.time_unix_nano)), point.name, point.model, point.tool_name,
                        point.token_type)]
            row[0] += increment[0]
            row[1] += increment[1]
    MetricSeries.objects.bulk_update(list(changed.values()),
                                     ["start_time_unix_nano", "time_unix_nano", "value", "count", "seen_at"])
    for (hour, name, model, tool_name, token_type), (value, count) in sorted(sums.items()):
        key = dict(project_id=project_id, hour=hour, name=name, model=model, tool_name=tool_name,
                   token_type=token_type)
        if not MetricHour.objects.filter(**key).update(value=F("value") + value, count=F("count") + count):
            MetricHour.objects.create(**key, value=value, count=count)
    _others_count(project_id, others, now)
    return StoredMetrics(added, sum(others.values()))


def _series_locked(project_id: int, keys: Sequence[str]) -> dict[str, MetricSeries]:
    """The project's stored series of these keys, locked for the transaction (two exports
    of one series at once must not both take the same last point)."""
    found: dict[str, MetricSeries] = {}
    for start in range(0, len(keys), _LOOKUP_CHUNK):
        for series in MetricSeries.objects.select_for_update().filter(
                project_id=project_id, key__in=keys[start:start + _LOOKUP_CHUNK]).order_by("key"):
            found[series.key] = series
    return found


def _increment(series: MetricSeries, point: MetricPoint) -> tuple[float, int] | None:
    """What ``point`` adds over the series' last point (module docstring); None: nothing, seen already."""
    seen = series.time_unix_nano > 0
    if point.cumulative:
        same_start = point.start_time_unix_nano == series.start_time_unix_nano
        if seen and same_start and point.time_unix_nano <= series.time_unix_nano:
            return None
        if seen and same_start and point.value >= series.value and point.count >= series.count:
            return point.value - series.value, point.count - series.count
        return point.value, point.count  # a new series, or one that restarted
    if seen and (point.start_time_unix_nano or point.time_unix_nano) < series.time_unix_nano:
        return None
    if seen and point.time_unix_nano <= series.time_unix_nano:
        return None
    return point.value, point.count


def _others_count(project_id: int, others: Counter[str], now: datetime) -> None:
    if not others:
        return
    names = sorted(others)
    existing = set(OtherMetric.objects.filter(project_id=project_id, name__in=names).values_list("name", flat=True))
    new = [name for name in names if name not in existing]
    if new:
        room = MAX_OTHER_NAMES - OtherMetric.objects.filter(project_id=project_id).count()
        for name in new[max(room, 0):]:
            others[OTHER_NAMES_FOLDED] += others.pop(name)
    for name, points in sorted(others.items()):
        rows = OtherMetric.objects.filter(project_id=project_id, name=name)
        if not rows.update(points=F("points") + points, last_at=now):
            OtherMetric.objects.create(project_id=project_id, name=name, points=points, last_at=now)
