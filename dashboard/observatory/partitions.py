"""Spans partitioned by day on PostgreSQL (migration 0008 converts the table).

``observatory_span`` is partitioned by RANGE on ``start_time``, one partition per
UTC day (``observatory_span_pYYYYMMDD``), plus a default partition that takes a
span whose day has no partition (a clock far off, a day the scheduler has not
reached), so no span is ever refused. The scheduler (Celery beat hourly, or the
web process's runner: ``tasks.spans_partitions_maintain``) keeps ``DAYS_AHEAD``
days created ahead; creating a day moves that day's rows out of the default
partition first, so a day that was missed is whole again once created.

Retention (``tasks.purge_expired``) drops the daily partitions whose whole day is
older than the LONGEST span retention of any project: dropping is instant where
deleting a day of rows is minutes, but a partition holds every project's spans,
so a project that keeps spans longer than another holds the day for both. The
projects with a shorter retention keep their row deletes (``retention_purge``),
which on a partitioned table only touch the days between the two cutoffs. On
PostgreSQL span retention counts whole UTC days (a span goes at most a day after
its retention ends), so the row delete of a project at the longest retention
finds nothing in the daily partitions that the next drop would not take.

The primary key is (id, start_time) and the retry key (project_id, trace_id,
span_id, start_time): a partitioned table's unique constraints must hold the
partition key. ``id`` still comes from one sequence, so Django keeps it as the
pk; a retried batch carries the same start times, hence lands in the same
partitions and meets its stored rows. Nothing has a database foreign key to a
span (ToolExecution.linked_span is ``db_constraint=False``). Dropping a day leaves
the tool executions linked to its spans holding their span's id, where a row
delete would set it NULL: clearing them costs an update of every such row (12 s
for a day of 1.4M spans and 140k links, measured), which is what dropping a day
avoids; the id points at no span (ids are never reused), and every reader of
``linked_span_id`` (derivations, span_rows) only matches it against spans that
exist, so a dangling id reads as "linked, span gone".

SQLite (and a PostgreSQL table not converted) keeps plain row deletes; every
function here is then a no-op.
"""

from __future__ import annotations

import logging
import re
from datetime import date, datetime, time, timedelta
from datetime import timezone as dt_timezone

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from .models import Span

logger = logging.getLogger(__name__)

SPAN_TABLE = Span._meta.db_table
DEFAULT_PARTITION = f"{SPAN_TABLE}_default"
DAYS_AHEAD = 7
_DAY_NAME = re.compile(re.escape(SPAN_TABLE) + r"_p(\d{8})$")
# Creating or dropping a partition takes a short exclusive lock on the parent: never
# queue behind a long query (and make every page and ingest queue behind us); the
# next scheduled run tries again.
LOCK_TIMEOUT = "5s"


def spans_partitioned() -> bool:
    """Whether ``observatory_span`` is a partitioned table here (PostgreSQL after 0008)."""
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [SPAN_TABLE])
        row = cursor.fetchone()
    return bool(row) and row[0] == "p"


def partition_name(day: date) -> str:
    return f"{SPAN_TABLE}_p{day:%Y%m%d}"


def day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=dt_timezone.utc)


def span_day_partitions() -> dict[date, str]:
    """The daily partitions that exist: day -> table name (others, if any, are left alone)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(%s)",
            [SPAN_TABLE],
        )
        names = [name for (name,) in cursor.fetchall()]
    days = {}
    for name in names:
        match = _DAY_NAME.match(name)
        if match:
            days[datetime.strptime(match.group(1), "%Y%m%d").date()] = name
    return days


def spans_partitions_ensure(*, now: datetime | None = None, days_ahead: int = DAYS_AHEAD,
                            days_back: int = 1) -> list[str]:
    """Create the daily partitions from ``days_back`` days ago to ``days_ahead`` days
    ahead that do not exist yet; returns the names created. Idempotent."""
    if not spans_partitioned():
        return []
    today = (now or timezone.now()).astimezone(dt_timezone.utc).date()
    existing = span_day_partitions()
    created = []
    for offset in range(-days_back, days_ahead + 1):
        day = today + timedelta(days=offset)
        if day not in existing:
            span_day_partition_create(day)
            created.append(partition_name(day))
    return created


def span_day_partition_create(day: date) -> None:
    """Create one day's partition: a plain table filled with that day's rows from the
    default partition (usually none), then attached. ATTACH takes a lighter lock on
    the parent than CREATE ... PARTITION OF (reads and inserts go on), builds the
    parent's indexes and constraints on the new table, and checks that the default
    partition holds no row of the day, which the move guarantees: the default
    partition is locked against writes for the few milliseconds this takes."""
    quote = connection.ops.quote_name
    table, default, parent = quote(partition_name(day)), quote(DEFAULT_PARTITION), quote(SPAN_TABLE)
    low, high = day_start(day), day_start(day + timedelta(days=1))
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cursor.execute(f"LOCK TABLE {default} IN EXCLUSIVE MODE")
        cursor.execute(f"CREATE TABLE {table} (LIKE {parent} INCLUDING DEFAULTS INCLUDING STORAGE)")
        cursor.execute(
            f"WITH moved AS (DELETE FROM {default} WHERE start_time >= %s AND start_time < %s RETURNING *) "
            f"INSERT INTO {table} SELECT * FROM moved",
            [low, high],
        )
        cursor.execute(f"ALTER TABLE {parent} ATTACH PARTITION {table} FOR VALUES FROM (%s) TO (%s)", [low, high])


def longest_span_retention_days() -> int:
    """The longest span retention of any project (the settings' default for a project
    without a policy): a day older than this holds no span anyone keeps."""
    from dashboard.accounts.models import Project
    from dashboard.tuning.models import RetentionPolicy

    days = list(RetentionPolicy.objects.values_list("span_days", flat=True))
    if not days or Project.objects.filter(retention__isnull=True).exists():
        days.append(settings.OBSERVATORY_RETENTION_SPAN_DAYS)
    return max(days)


def span_retention_cutoff(span_days: int, now: datetime) -> datetime:
    """Spans starting before this go. On a partitioned table retention keeps whole UTC
    days (the cutoff floored to midnight), so a project at the longest retention
    never deletes by rows what the next partition drop takes whole."""
    cutoff = now - timedelta(days=span_days)
    if spans_partitioned():
        return day_start(cutoff.astimezone(dt_timezone.utc).date())
    return cutoff


def spans_partitions_drop(*, now: datetime | None = None) -> list[str]:
    """Drop the daily partitions whose whole day is past the longest span retention;
    returns the names dropped. Each day in its own transaction: a lock that cannot be
    had in LOCK_TIMEOUT leaves that day for the next run."""
    if not spans_partitioned():
        return []
    now = now or timezone.now()
    boundary = span_retention_cutoff(longest_span_retention_days(), now)
    quote = connection.ops.quote_name
    past = [name for day, name in sorted(span_day_partitions().items()) if day_start(day + timedelta(days=1)) <= boundary]
    for name in past:
        # Detached first, in its own short transaction: the parent is locked only for
        # that. Dropping a day's table unlinks its files when the drop commits (about
        # a second for 750 MB on a busy disk), which no page or ingest should wait for.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            cursor.execute(f"ALTER TABLE {quote(SPAN_TABLE)} DETACH PARTITION {quote(name)}")
    dropped = []
    for name in sorted(set(past) | set(_detached_days(boundary))):  # and days a crash left detached
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {quote(name)}")
        dropped.append(name)
        logger.info("dropped span partition %s (past %s)", name, boundary.date())
    return dropped


def _detached_days(boundary: datetime) -> list[str]:
    """Day tables no longer attached (a drop interrupted after its detach) past ``boundary``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname FROM pg_class c WHERE relkind = 'r' AND relname LIKE %s "
            "AND relnamespace = to_regnamespace(current_schema()) "
            "AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)",
            [f"{SPAN_TABLE}_p%"],
        )
        names = [name for (name,) in cursor.fetchall()]
    return [
        name for name in names
        if (match := _DAY_NAME.match(name))
        and day_start(datetime.strptime(match.group(1), "%Y%m%d").date() + timedelta(days=1)) <= boundary
    ]
