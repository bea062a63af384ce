"""A ceiling on a web worker's private memory: past it, the worker finishes its
requests and gunicorn starts a fresh one in its place (deploy/gunicorn.conf.py).

What a long-running worker keeps grows slowly even when nothing leaks: glibc keeps
freed blocks in its arenas for reuse, and fragments them, and SQLite's and Python's
caches fill up to their limits. In a 16-minute soak the workers' malloc arenas grew
from 37 to 55 MB with the number of live Python objects flat. Freed memory rarely
goes back to the system, so bounding it by design means replacing the process, the
way uWSGI's ``reload-on-rss`` does; gunicorn's ``max_requests`` does it by count,
which no longer bounds memory when requests grow big. A fresh worker is forked from
the master, which holds the imported app, and costs a few milliseconds.

Private memory (the pages only this process maps: Linux's USS) is what the ceiling
reads, not RSS: RSS also counts the pages a worker shares with the master and its
siblings, which the ceiling could not lower. It is read from
``/proc/self/smaps_rollup`` at most every ``every`` seconds; elsewhere (no such
file) the ceiling never trips.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

ROLLUP = "/proc/self/smaps_rollup"


def private_mib(path: str = ROLLUP) -> Optional[float]:
    """Private_Clean + Private_Dirty of this process in MiB; None where unknown."""
    total_kib = 0
    found = False
    try:
        with open(path, encoding="ascii") as rollup:
            for line in rollup:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total_kib += int(line.split()[1])
                    found = True
    except (OSError, ValueError, IndexError):
        return None
    return total_kib / 1024 if found else None


class MemoryCeiling:
    """``exceeded()`` is True once private memory passed ``limit_mib`` (checked at
    most every ``every`` seconds, and not in the first ``min_age`` seconds, so a
    ceiling set below what a fresh worker needs replaces a worker at most once a
    minute instead of in a loop; a limit of 0 turns it off)."""

    def __init__(self, limit_mib: float, *, every: float = 5.0, min_age: float = 60.0,
                 read: Callable[[], Optional[float]] = private_mib, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_mib = limit_mib
        self.every = every
        self._read = read
        self._clock = clock
        self._next = clock() + min_age
        self.last_mib: Optional[float] = None

    def exceeded(self) -> bool:
        if self.limit_mib <= 0:
            return False
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + self.every
        self.last_mib = self._read()
        return self.last_mib is not None and self.last_mib > self.limit_mib
