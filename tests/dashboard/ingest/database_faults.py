"""A real busy database and a real broken one, on SQLite and on PostgreSQL, for the
ingest tests of every transport: nothing faked, the driver's own errors come back.

- ``busy_database``: another connection holds the write lock (SQLite: BEGIN
  IMMEDIATE on the file; PostgreSQL: LOCK TABLE … IN SHARE MODE, which lets reads
  through) while ingest's connections wait only a moment for it (a short busy or
  lock timeout), as they would for a long transaction of another process.
- ``broken_table``: a table renamed away, so every statement on it fails the same
  way each time ("no such table", 42P01 undefined_table).
- ``poisoned_spans``: a trigger that fails the insert of spans with one name
  (SQLite RAISE(ABORT), PostgreSQL RAISE EXCEPTION): one request of a group broken,
  the others not.

Tests that use them need ``django_db(transaction=True)``: the holder's connection,
the receiver's and gRPC's threads see only what is committed (and on SQLite a test's
own transaction would hold the write lock).
"""

from __future__ import annotations

import logging
import sqlite3
from contextlib import contextmanager
from typing import Any, Iterator

from django.db import connection

from dashboard.env import SQLITE_BUSY_TIMEOUT_MS
from dashboard.observatory.models import IngestDatabaseFault

WAIT_MS = 200  # how long ingest's connections wait for the lock in these tests


@contextmanager
def busy_database(monkeypatch: Any, *tables: str) -> Iterator[None]:
    """The database busy with another connection's write transaction while the block
    runs (SQLite: the whole file; PostgreSQL: ``tables``)."""
    options = connection.settings_dict["OPTIONS"]
    if connection.vendor == "sqlite":
        monkeypatch.setitem(options, "init_command",
                            options["init_command"].replace(f"busy_timeout={SQLITE_BUSY_TIMEOUT_MS}",
                                                            f"busy_timeout={WAIT_MS}"))
        _set_wait(f"PRAGMA busy_timeout = {WAIT_MS}")
        holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()
            _set_wait(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        return
    import psycopg

    monkeypatch.setitem(options, "options", f"-c lock_timeout={WAIT_MS}")
    _set_wait(f"SET lock_timeout = {WAIT_MS}")
    settings = connection.settings_dict
    holder = psycopg.connect(dbname=settings["NAME"], user=settings["USER"], password=settings["PASSWORD"],
                             host=settings["HOST"], port=settings["PORT"] or None)
    holder.execute(f"LOCK TABLE {', '.join(tables)} IN SHARE MODE")  # inserts wait, reads do not
    try:
        yield
    finally:
        holder.rollback()
        holder.close()
        _set_wait("RESET lock_timeout")


def _set_wait(statement: str) -> None:
    """On this thread's connection (the web port's requests in the test client use it)."""
    with connection.cursor() as cursor:
        cursor.execute(statement)


@contextmanager
def broken_table(table: str) -> Iterator[None]:
    """``table`` renamed away while the block runs, back afterwards."""
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {quote(table)} RENAME TO {quote(table + '_away')}")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {quote(table + '_away')} RENAME TO {quote(table)}")


@contextmanager
def poisoned_spans(name: str) -> Iterator[None]:
    """Inserting a span named ``name`` fails, in the database, while the block runs."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(
                "CREATE TRIGGER poisoned_span BEFORE INSERT ON observatory_span "
                f"WHEN NEW.name = '{name}' BEGIN SELECT RAISE(ABORT, 'poisoned span'); END")
        else:
            cursor.execute(
                "CREATE FUNCTION poisoned_span() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'poisoned span'; END $$")
            cursor.execute(
                "CREATE TRIGGER poisoned_span BEFORE INSERT ON observatory_span FOR EACH ROW "
                f"WHEN (NEW.name = '{name}') EXECUTE FUNCTION poisoned_span()")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
                cursor.execute("DROP TRIGGER poisoned_span")
            else:
                cursor.execute("DROP TRIGGER poisoned_span ON observatory_span")
                cursor.execute("DROP FUNCTION poisoned_span()")


INTERNAL_WORDS = ("observatory", "table", "sql", "relation", "trigger", "poison", "traceback", "select", "insert")


def names_nothing_internal(text: str) -> bool:
    """Whether an answer's text shows nothing of the database (table, SQL, driver, trace)."""
    lowered = text.lower()
    return not any(word in lowered for word in INTERNAL_WORDS)


def broken_reports(caplog: Any) -> list[logging.LogRecord]:
    """The log records of batches a broken database failed (``database_broken_report``)."""
    return [record for record in caplog.records
            if record.name == "dashboard.ingest.common" and record.levelno == logging.ERROR]


def faults(transport: str, project: Any = None) -> int:
    """Broken-database answers counted for the admin (all days)."""
    rows = IngestDatabaseFault.objects.filter(transport=transport)
    rows = rows.filter(project__isnull=True) if project is None else rows.filter(project=project)
    return sum(rows.values_list("count", flat=True))
