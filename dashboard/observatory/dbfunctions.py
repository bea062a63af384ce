"""Database functions whose SQLite form runs in C, and the database's clock."""

from __future__ import annotations

from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any

from django.db import connections
from django.db.models.functions import TruncDate, TruncHour, TruncMinute
from django.utils import timezone


class _TruncUTC:
    """Truncation to the day, hour or minute in UTC, in C on SQLite too: Django's Trunc
    calls a Python function there for every row (``hours_with_rows`` over 300,000
    tool rows: 1.03 s with it, 0.11 s without; benchmarks/bench_sweep.py). SQLite's
    strftime reads a stored datetime, offset or not, as UTC and writes it back in
    the stored form."""

    sqlite_format = ""

    def __init__(self, expression: str) -> None:
        super().__init__(expression, tzinfo=dt_timezone.utc)

    def as_sqlite(self, compiler: Any, connection: Any, **extra_context: Any) -> tuple[str, list[Any]]:
        sql, params = compiler.compile(self.lhs)
        return f"strftime(%s, {sql})", [self.sqlite_format, *params]


class MinuteUTC(_TruncUTC, TruncMinute):
    sqlite_format = "%Y-%m-%d %H:%M:00"


class HourUTC(_TruncUTC, TruncHour):
    sqlite_format = "%Y-%m-%d %H:00:00"


class DateUTC(_TruncUTC, TruncDate):
    sqlite_format = "%Y-%m-%d"


def database_now(using: str = "default") -> datetime:
    """Now, by the database's clock on PostgreSQL (several nodes, one clock), by this
    process's on SQLite (one machine; its CURRENT_TIMESTAMP counts whole seconds).

    What a pass stamps as the moment it began reading: "a pass that began later wins"
    compares stamps that drainers on different nodes wrote, and with each node's own
    clock a node running s seconds ahead had its older pass win over a newer one that
    began within s of it, until the hourly beat."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]
