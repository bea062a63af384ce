"""A cross-process file lock whose waiters queue in the kernel, with a deadline.

Used by the server's write slots on PostgreSQL (``dashboard.priority.WriteSlots``),
which used to poll (every 5 ms), leaving the lock free while every waiter slept.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from typing import Optional


class QueuedFileLock:
    """An exclusive lock on a file, shared by every process that opens it, whose
    waiters queue in the kernel: ``flock`` hands it to a waiter the moment it is
    released (no polling, no sleep between looks) and releases it when its holder
    dies, ``kill -9`` included. In a process one thread at a time holds it or waits
    for it (a second waits for the first, on a thread lock). A thread that finds it
    held by another process waits through the process's helper thread, blocked in
    ``flock`` with the GIL released, so the wait can end at a deadline (``flock``
    itself has none)."""

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
        """Take the lock within ``timeout`` seconds; False when not had in time."""
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

    def try_acquire(self) -> bool:
        """Take the lock if it is free now, without waiting."""
        if not self._mutex.acquire(blocking=False):
            return False
        with self._cond:
            if self._take_now():
                return True
        self._mutex.release()
        return False

    def release(self) -> None:
        with self._cond:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._mutex.release()

    def _take(self, deadline: float) -> bool:
        with self._cond:
            if self._take_now():
                return True
            self._wanted, self._granted = True, False
            if self._helper is None:
                self._helper = threading.Thread(target=self._wait_in_kernel, name="file-lock-waiter", daemon=True)
                self._helper.start()
            self._cond.notify_all()
            if self._cond.wait_for(lambda: self._granted, timeout=max(0.0, deadline - time.monotonic())):
                self._granted = False
                return True
            self._wanted = False  # given up: the helper lets the lock go if it gets it now
            return False

    def _take_now(self) -> bool:
        """The lock if it is free now (under ``_cond``). While the helper waits in
        flock on this same open file, a second flock here would succeed at once (the
        file description is the lock's owner): then only the helper may take it."""
        if self._helper_blocked:
            return False
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

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
