"""SQLite whose writers queue in the kernel instead of polling.

SQLite admits one write transaction at a time and makes the others wait with its
busy handler, which sleeps and looks again (1, 2, 5, 10, ... up to 100 ms between
looks). Under ingest from many senders the lock then sat free while every waiter
slept: 10-span batches from 16 senders stored about 500 requests/s with the CPUs a
third idle and the request threads a third of their time waiting to begin.

Here a transaction first takes the database's writer lock: an ``flock`` on a file
next to the database (``<name>-writers``), shared by every process that opens it
(web workers, the derivation drainers, celery, management commands). The kernel
hands it to a waiter the moment it is released, and releases it when its holder
dies (``kill -9`` included). Inside a process one thread at a time holds or waits
for it; a thread that finds it taken by another process waits through the
process's helper thread, so the wait can end at a deadline (``flock`` itself
cannot). Past the deadline (the busy timeout, as before) the transaction fails
with OperationalError "database is locked", as SQLite's own wait would.

Only transactions take it (``atomic``: SQLite's BEGIN IMMEDIATE, which would take
SQLite's write lock at once anyway); a statement in autocommit mode still waits
with SQLite's busy handler. In-memory databases have no file and no queue.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from typing import Optional

from django.db.backends.sqlite3 import base as sqlite3_base
from django.db.utils import OperationalError

from dashboard.env import SQLITE_BUSY_TIMEOUT_MS

BUSY_TIMEOUT_S = SQLITE_BUSY_TIMEOUT_MS / 1000  # as long as SQLite's own wait


class WriterQueue:
    """One process's place in the queue of a database file's writers."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._mutex = threading.Lock()  # held by the thread holding, or waiting for, the file lock
        self._cond = threading.Condition(threading.Lock())
        self._wanted = False  # a thread waits for the helper to get the lock
        self._granted = False  # the helper got it for that thread
        self._helper_blocked = False  # the helper is inside flock(LOCK_EX)
        self._helper: Optional[threading.Thread] = None

    def acquire(self, timeout: float) -> bool:
        """Take the writer lock within ``timeout`` seconds; False when not had in time."""
        deadline = time.monotonic() + timeout
        if not self._mutex.acquire(timeout=timeout):
            return False
        try:
            if self._take(deadline):
                return True
        except BaseException:
            self._mutex.release()
            raise
        self._mutex.release()
        return False

    def release(self) -> None:
        with self._cond:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._mutex.release()

    def _take(self, deadline: float) -> bool:
        with self._cond:
            # While the helper waits in flock on this same open file, a second
            # flock here would succeed at once (the file description is the
            # lock's owner): then only the helper may take it.
            if not self._helper_blocked:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    pass
            self._wanted, self._granted = True, False
            if self._helper is None:
                self._helper = threading.Thread(target=self._wait_in_kernel, name="sqlite-writers", daemon=True)
                self._helper.start()
            self._cond.notify_all()
            if self._cond.wait_for(lambda: self._granted, timeout=max(0.0, deadline - time.monotonic())):
                self._granted = False
                return True
            self._wanted = False  # given up: the helper lets the lock go if it gets it now
            return False

    def _wait_in_kernel(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._wanted)
                self._helper_blocked = True
            fcntl.flock(self._fd, fcntl.LOCK_EX)  # the GIL is released while the kernel queues us
            with self._cond:
                self._helper_blocked = False
                if self._wanted:
                    self._wanted, self._granted = False, True
                    self._cond.notify_all()
                else:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)


_queues: dict[str, WriterQueue] = {}
_queues_pid = 0
_queues_lock = threading.Lock()


def writer_queue(database: str) -> Optional[WriterQueue]:
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
            queue = _queues[path] = WriterQueue(path)
        return queue


class DatabaseWrapper(sqlite3_base.DatabaseWrapper):
    _writer: Optional[WriterQueue] = None  # the queue whose lock this connection's transaction holds

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
