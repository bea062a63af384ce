"""Pages before ingest, inside one web process and across the server's processes.

A gunicorn worker's threads share one interpreter lock: while three threads decode
and store big span batches, a page gets about a quarter of the process's CPU and
took 0.5–0.9 s at p95 under 16 senders (30 ms alone). So ingest steps aside: page
requests are counted while they run (``PagePriorityMiddleware``), and ingest calls
``yield_to_pages`` at safe points — between chunks of decoding, before taking the
database's write lock, never inside a transaction — where it waits while a page
is being served, at most ``MAX_WAIT`` each time so ingest always progresses.

Across processes: the CPU is shared too. Under 16 senders on PostgreSQL a page
took about a second of its own time while the other workers' ingest threads and
their database backends kept both cores busy. So the server's processes share a
small board (a file every process maps, made by gunicorn's master: ``PageBoard``):
each process's slot holds when the latest page it is serving started, and ingest
at a safe point also waits, polling, while another process serves a page. A slot
left behind by a process killed mid-page is ignored after ``STALE_S``. Outside
gunicorn (runserver, tests, the gRPC server) there is no board and only the
process's own pages count.

Fewer writers at once: on PostgreSQL every ingest thread of every worker can be
inside a transaction at the same time (sixteen with the deployed 4 × 4), each with a
database backend competing for the two cores with the page being served. So the
server's ingest transactions take one of ``OBSERVATORY_MAX_CONCURRENT_WRITES``
write slots (default: half the cores on PostgreSQL; SQLite's own write lock already
admits one) — lock files next to the board, held with ``flock`` (a process killed
holding one releases it) — and wait, queued in the kernel, for one (at most
``WRITE_WAIT``, then go on without: the slots shape the load, they never refuse it).
"""

from __future__ import annotations

import mmap
import os
import random
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Optional

from django.http import HttpRequest, HttpResponse

from dashboard.queued_lock import QueuedFileLock

MAX_WAIT = 0.05  # seconds one safe point may wait
POLL = 0.005  # seconds between looks at the board while another process serves a page
STALE_S = 10.0  # a board slot older than this is a process killed mid-page: ignored
BOARD_ENV = "OBSERVATORY_PAGE_BOARD"  # the board file's path (set by the gunicorn master)
SLOT_ENV = "OBSERVATORY_PAGE_SLOT"  # this process's slot (set in gunicorn's post_fork)
SLOTS = 64
_SLOT = struct.Struct("d")
_ALL = struct.Struct(f"{SLOTS}d")
_EMPTY = bytes(_ALL.size)


class PageBoard:
    """The server's processes' page slots in one mapped file: slot i holds the
    epoch time at which process i started the latest page it serves now, 0.0
    when it serves none. Each process writes only its own slot (an aligned 8-byte
    store); reads are a hint, so no lock is taken across processes."""

    def __init__(self, path: str, slot: int) -> None:
        if not 0 <= slot < SLOTS:
            raise ValueError(f"slot must be in 0..{SLOTS - 1}")
        with open(path, "r+b") as file:
            self._map = mmap.mmap(file.fileno(), _ALL.size)
        self.slot = slot

    @staticmethod
    def create(path: str) -> None:
        """Make (or empty) the board file; the master does it before forking."""
        with open(path, "wb") as file:
            file.write(_EMPTY)

    def mark(self, started: float) -> None:
        _SLOT.pack_into(self._map, self.slot * _SLOT.size, started)

    def others_busy(self) -> bool:
        board = self._map
        if board[:] == _EMPTY:
            return False
        now = time.time()
        return any(
            started and now - started < STALE_S
            for slot, started in enumerate(_ALL.unpack_from(board))
            if slot != self.slot
        )

    def close(self) -> None:
        self._map.close()


class _PerProcess:
    """A value made once per process, on first use: after a fork the child makes
    its own (the board and the slots are opened after gunicorn forks). None when
    it cannot be made: then only the process's own pages count."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make, self._pid, self._value = make, 0, None

    def __call__(self) -> Any:
        pid = os.getpid()
        if self._pid != pid:
            self._pid, self._value = pid, None
            try:
                self._value = self._make()
            except (OSError, ValueError):
                pass
        return self._value


def _open_board() -> Optional[PageBoard]:
    path, slot = os.environ.get(BOARD_ENV), os.environ.get(SLOT_ENV)
    return PageBoard(path, int(slot) % SLOTS) if path and slot is not None else None


page_board = _PerProcess(_open_board)  # this process's view of the server's board, if any

_lock = threading.Lock()
_pages = 0
_no_page = threading.Event()
_no_page.set()


class WriteSlots:
    """``count`` slots shared by the server's processes: a ``QueuedFileLock`` on
    ``{board}.w{k}`` per slot (one descriptor per slot per process, so two threads
    of a process never share one: ``flock`` belongs to the descriptor). A waiter
    queues in the kernel on one slot and takes it the moment it is released."""

    def __init__(self, board_path: str, count: int) -> None:
        self.count = count
        self._locks = [QueuedFileLock(f"{board_path}.w{slot}") for slot in range(count)]

    def try_take(self) -> Optional[int]:
        """A free slot, taken; None when all are held."""
        start = random.randrange(self.count)  # spread the processes over the slots
        for step in range(self.count):
            slot = (start + step) % self.count
            if self._locks[slot].try_acquire():
                return slot
        return None

    def give_back(self, slot: int) -> None:
        self._locks[slot].release()

    @contextmanager
    def held(self, wait: float) -> Iterator[bool]:
        """Hold a slot for the block; after ``wait`` seconds without one, go on
        without (yields False): the slots shape the load, they never refuse it."""
        slot = self.try_take()
        if slot is None:
            queued = random.randrange(self.count)
            slot = queued if self._locks[queued].acquire(wait) else None
        try:
            yield slot is not None
        finally:
            if slot is not None:
                self.give_back(slot)


def _open_write_slots() -> Optional[WriteSlots]:
    from django.conf import settings

    path, count = os.environ.get(BOARD_ENV), settings.OBSERVATORY_MAX_CONCURRENT_WRITES
    return WriteSlots(path, count) if path and count > 0 else None


write_slots = _PerProcess(_open_write_slots)  # the server's write slots, if a board and a limit


WRITE_WAIT = 2.0  # seconds a transaction waits for a write slot before going on without


@contextmanager
def ingest_transaction() -> Iterator[None]:
    """The transaction of one ingest batch: after a bounded wait while a page is
    served (not inside: on SQLite it holds the write lock), in one of the server's
    write slots."""
    from django.db import transaction

    yield_to_pages()
    slots = write_slots()
    with slots.held(WRITE_WAIT) if slots is not None else nullcontext(), transaction.atomic():
        yield


def yield_to_pages() -> None:
    """Wait (bounded) while this process, or another process of the server,
    serves a page."""
    if not _no_page.is_set():
        _no_page.wait(MAX_WAIT)
        return
    board = page_board()
    if board is None or not board.others_busy():
        return
    deadline = time.monotonic() + MAX_WAIT
    while board.others_busy() and time.monotonic() < deadline and _no_page.is_set():
        time.sleep(POLL)


def pages_in_progress() -> int:
    return _pages


class PagePriorityMiddleware:
    """Counts the requests that are not ingest (placed after IngestFastPathMiddleware,
    which answers ingest itself) while they run."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        global _pages
        with _lock:
            _pages += 1
            _no_page.clear()
            board = page_board()
            if board is not None:  # the latest start: busy for STALE_S more at least
                board.mark(time.time())
        started = time.perf_counter()
        try:
            response = self.get_response(request)
            # The page's own time, apart from any wait for a thread (browser dev tools show it).
            response.headers.setdefault("Server-Timing", f"app;dur={(time.perf_counter() - started) * 1000:.1f}")
            return response
        finally:
            with _lock:
                _pages -= 1
                if not _pages:
                    _no_page.set()
                    board = page_board()
                    if board is not None:
                        board.mark(0.0)
