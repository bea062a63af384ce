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

Only transactions take it (``atomic``: SQLite's BEGIN IMMEDIATE, which would take
SQLite's write lock at once anyway); a statement in autocommit mode still waits
with SQLite's busy handler. In-memory databases have no file and no queue.
"""

from __future__ import annotations

import os
import threading
from typing import Optional

from django.db.backends.sqlite3 import base as sqlite3_base
from django.db.utils import OperationalError

from dashboard.env import SQLITE_BUSY_TIMEOUT_MS
from dashboard.queued_lock import QueuedFileLock

BUSY_TIMEOUT_S = SQLITE_BUSY_TIMEOUT_MS / 1000  # as long as SQLite's own wait

_queues: dict[str, QueuedFileLock] = {}
_queues_pid = 0
_queues_lock = threading.Lock()


def writer_queue(database: str) -> Optional[QueuedFileLock]:
    """This process's queue for the database file ``database``; None for an in-memory one."""
    global _queues_pid
    if not database or database == ":memory:" or database.startswith("file:") and "mode=memory" in database:
        return None
    path = f"{database}-writers"
    with _queues_lock:
        if _queues_pid != os.getpid():  # a forked child opens its own file and makes its own helper
            _queues.clear()
            _queues_pid = os.getpid()
        queue = _queues.get(path)
        if queue is None:
            queue = _queues[path] = QueuedFileLock(path)
        return queue


class DatabaseWrapper(sqlite3_base.DatabaseWrapper):
    _writer: Optional[QueuedFileLock] = None  # the queue whose lock this connection's transaction holds

    def _start_transaction_under_autocommit(self) -> None:
        queue = None if self.is_in_memory_db() else writer_queue(str(self.settings_dict["NAME"]))
        if queue is not None:
            if not queue.acquire(BUSY_TIMEOUT_S):
                raise OperationalError("database is locked (no turn among the writers in time)")
            self._writer = queue
        try:
            super()._start_transaction_under_autocommit()
        except BaseException:
            self._release_writer()
            raise

    def _release_writer(self) -> None:
        queue, self._writer = self._writer, None
        if queue is not None:
            queue.release()

    def _commit(self) -> None:
        try:
            super()._commit()
        finally:
            self._release_writer()

    def _rollback(self) -> None:
        try:
            super()._rollback()
        finally:
            self._release_writer()

    def _close(self) -> None:
        try:
            super()._close()
        finally:
            self._release_writer()
