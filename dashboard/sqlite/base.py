"""SQLite whose writers queue in the kernel instead of polling.

SQLite admits one write transaction at a time and makes the others wait with its
busy handler, which sleeps and looks again (1, 2, 5, 10, ... up to 100 ms between
looks). Under ingest from many senders the lock then sat free while every waiter
slept: 10-span batches from 16 senders stored about 500 requests/s with the CPUs a
third idle and the request threads a third of their time waiting to begin.

Here a transaction first takes the database's writer lock: a ``QueuedFileLock``
(``dashboard.queued_lock``) on a file next to the database (``<name>-writers``),
shared by every process that opens it (web workers, the derivation drainers,
celery, management commands). The kernel hands it to a waiter the moment it is
released, and releases it when its holder dies (``kill -9`` included). Past the
deadline (the busy timeout, as before) the transaction fails
with OperationalError "database is locked", as SQLite's own wait would.

The derivations' transactions go first (``writes_first``): while one waits for its
turn, other writers hold back before queueing (a marker file, ``<name>-writers-first``,
locked by the waiting one, probed by the others; at most
``FIRST_WAIT_S`` each time), so the next turn is the derivations'. Without it a writer
that tries the lock as it is released takes it before the kernel's woken waiter runs:
ingest, busy in every process, took most turns, the derivations fell behind and the
backlog bound slowed ingest for them (the 6-minute soak stored 7,800 spans/s at its end
against 9,400 with SQLite's own wait; 9,900 with this and groups bounded in rows).

Only transactions take it (``atomic``: SQLite's BEGIN IMMEDIATE, which would take
SQLite's write lock at once anyway); a statement in autocommit mode still waits
with SQLite's busy handler. In-memory databases have no file and no queue.

With ``synchronous=FULL`` (the default, ``SQLITE_SYNCHRONOUS``) a transaction's
commit is synced to disk, as SQLite does it, but after the write lock is released:
SQLite syncs the write-ahead log inside its commit, holding the lock for the disk's
flush (2.3 ms a commit here), during which no other process may write. A
transaction here commits with ``synchronous=NORMAL`` (the frames written to the
log, not synced) and releases the lock, then syncs the log file itself
(``fdatasync``) before ``commit()`` returns: the commit is on disk before anything
is acknowledged, and the next writer's turn overlaps the flush. The flush covers
every frame written to the file so far (another process's too), and SQLite's
checkpoints still sync the log before copying it and the database after. 10-span
batches from 16 senders to the OTLP/HTTP receiver: 1,345-1,438 requests/s with the
sync inside the lock, 1,587-1,651 outside (``bench_ingest --server receiver``, runs
one after another). Statements in autocommit mode keep SQLite's own FULL.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from django.db.backends.sqlite3 import base as sqlite3_base
from django.db.backends.sqlite3.creation import DatabaseCreation
from django.db.utils import OperationalError

from dashboard.env import SQLITE_BUSY_TIMEOUT_MS
from dashboard.queued_lock import QueuedFileLock

BUSY_TIMEOUT_S = SQLITE_BUSY_TIMEOUT_MS / 1000  # as long as SQLite's own wait
FIRST_WAIT_S = 0.1  # how long another writer holds back for a derivation waiting its turn
_FIRST_POLL_S = 0.001

_role = threading.local()  # .first: this thread's transactions go first


@contextmanager
def writes_first() -> Iterator[None]:
    """The transactions this thread begins in the block go before other writers'
    (the derivations: ingest slows down when they fall behind)."""
    previous = getattr(_role, "first", False)
    _role.first = True
    try:
        yield
    finally:
        _role.first = previous


class _FirstMarker:
    """``<name>-writers-first``: held (exclusive) by a writer that goes first while it
    waits for its turn; another writer probes it (shared, not waiting: probes never
    see each other) before queueing, and holds back while it is held. Two
    descriptors: one to hold, one to probe, so a process's own waiting writer is
    seen by its other threads. One drainer derives at a time on SQLite
    (``derive.drain.drain_exclusive``), so holders seldom meet."""

    def __init__(self, path: str) -> None:
        self._hold = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._probe = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._lock = threading.Lock()
        self._holders = 0

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            if not self._holders:
                fcntl.flock(self._hold, fcntl.LOCK_EX)  # waits at most a probe's instant
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if not self._holders:
                    fcntl.flock(self._hold, fcntl.LOCK_UN)

    def wait_clear(self, limit: float) -> None:
        """Return once no writer that goes first is waiting, or after ``limit`` seconds
        (the usual case, nobody waiting: one probe, no clock read)."""
        deadline = None
        while True:
            try:
                fcntl.flock(self._probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                now = time.monotonic()
                deadline = deadline or now + limit
                if now >= deadline:
                    return
                time.sleep(_FIRST_POLL_S)
                continue
            fcntl.flock(self._probe, fcntl.LOCK_UN)
            return


_queues: dict[str, tuple[QueuedFileLock, _FirstMarker]] = {}
_queues_pid = 0
_queues_lock = threading.Lock()


def writers(database: str) -> Optional[tuple[QueuedFileLock, _FirstMarker]]:
    """This process's writers' queue and first-marker for the database file
    ``database``; None for an in-memory database (Django's own test of the name)."""
    global _queues_pid
    if not database or DatabaseCreation.is_in_memory_db(database):
        return None
    path = f"{database}-writers"
    with _queues_lock:
        if _queues_pid != os.getpid():  # a forked child opens its own files and makes its own helper
            _queues.clear()
            _queues_pid = os.getpid()
        found = _queues.get(path)
        if found is None:
            found = _queues[path] = (QueuedFileLock(path), _FirstMarker(f"{path}-first"))
        return found


_FULL = 2  # PRAGMA synchronous: 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA


class DatabaseWrapper(sqlite3_base.DatabaseWrapper):
    _writer: Optional[QueuedFileLock] = None  # the queue whose lock this connection's transaction holds
    _wal: Optional[str] = None  # the log this connection's commits sync after the lock (synchronous FULL, a file)
    _unsynced = False  # this connection's transaction commits with synchronous=NORMAL
    _changes = 0  # the connection's total_changes when its transaction began

    def get_new_connection(self, conn_params: Any) -> Any:
        conn = super().get_new_connection(conn_params)
        name = str(self.settings_dict["NAME"])
        self._wal, self._unsynced = None, False
        if writers(name) is not None and conn.execute("PRAGMA synchronous").fetchone()[0] == _FULL:
            self._wal = f"{name}-wal"
        return conn

    def _start_transaction_under_autocommit(self) -> None:
        found = writers(str(self.settings_dict["NAME"]))
        if found is not None:
            queue, first = found
            if getattr(_role, "first", False):
                with first.held():
                    taken = queue.acquire(BUSY_TIMEOUT_S)
            else:
                first.wait_clear(FIRST_WAIT_S)
                taken = queue.acquire(BUSY_TIMEOUT_S)
            if not taken:
                raise OperationalError("database is locked (no turn among the writers in time)")
            self._writer = queue
        try:
            if self._wal is not None:
                self.connection.execute("PRAGMA synchronous = NORMAL")
                self._unsynced = True
                self._changes = self.connection.total_changes
            super()._start_transaction_under_autocommit()
        except BaseException:
            self._release_writer()
            raise

    def _release_writer(self) -> None:
        queue, self._writer = self._writer, None
        if queue is not None:
            queue.release()
        if self._unsynced:
            self._unsynced = False
            if self.connection is not None:
                self.connection.execute("PRAGMA synchronous = FULL")

    def _commit(self) -> None:
        # (a transaction that changed no row wrote nothing to sync: a page's read)
        unsynced = self._unsynced and self.connection.total_changes != self._changes
        try:
            super()._commit()
        finally:
            self._release_writer()
        if unsynced:
            self._sync_wal()

    def _sync_wal(self) -> None:
        """Flush the write-ahead log to disk (what SQLite's FULL does inside the commit)."""
        try:
            fd = os.open(self._wal, os.O_RDONLY | os.O_CLOEXEC)  # type: ignore[arg-type]
        except FileNotFoundError:
            return  # no log: checkpointed into the database and synced
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def _rollback(self) -> None:
        try:
            super()._rollback()
        finally:
            self._release_writer()

    def _close(self) -> None:
        self._unsynced = False  # (a setting of the connection closed)
        try:
            super()._close()
        finally:
            self._release_writer()
