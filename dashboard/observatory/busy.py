"""Whether a database failure is the database's state at the time (busy) or the
statement's fault (broken): one rule for every caller that retries. The outbox
retries a busy pass uncounted and parks a broken one; ingest answers a busy
database with 503 + Retry-After and a broken one with 500."""

from __future__ import annotations

import sqlite3

from django.db import OperationalError


# SQLSTATEs of a PostgreSQL that is busy, not of a statement that is wrong: serialization
# failure, deadlock, lock not available, too many connections, shutting down.
_BUSY_SQLSTATES = frozenset({"40001", "40P01", "55P03", "53300", "57P01", "57P02", "57P03"})


def database_busy(exc: BaseException) -> bool:
    """Whether a failure is the database's state at the time (a lock, a deadlock, a
    lost connection), so that trying the same work again later can succeed: SQLite's
    "database is locked" or "busy", PostgreSQL's SQLSTATEs above and class 08
    (connection), a connection lost without a SQLSTATE. Not every OperationalError:
    "too many SQL variables", "disk I/O error" or a statement that always runs past a
    timeout fail the same way every time: retried as busy, uncounted, such a note
    would wait forever, never parked, and its data would never converge."""
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    sqlstate = getattr(cause, "sqlstate", None)
    if sqlstate is not None:
        return sqlstate in _BUSY_SQLSTATES or sqlstate.startswith("08")
    code = getattr(cause, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    if "database is locked" in str(exc):  # (an error that lost its code on the way)
        return True
    # psycopg's own connection failures (closed, lost, refused) carry no SQLSTATE.
    return type(cause).__module__.startswith("psycopg")
