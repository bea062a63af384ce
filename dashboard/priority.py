"""Pages before ingest inside one web process.

A gunicorn worker's threads share one interpreter lock: while three threads decode
and store big span batches, a page gets about a quarter of the process's CPU and
took 0.5–0.9 s at p95 under 16 senders (30 ms alone). So ingest steps aside: page
requests are counted while they run (``PagePriorityMiddleware``), and ingest calls
``yield_to_pages`` at safe points — between chunks of decoding, before taking the
database's write lock, never inside a transaction — where it waits while a page
is being served, at most ``MAX_WAIT`` each time so ingest always progresses.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from django.http import HttpRequest, HttpResponse

MAX_WAIT = 0.05  # seconds one safe point may wait

_lock = threading.Lock()
_pages = 0
_no_page = threading.Event()
_no_page.set()


def yield_to_pages() -> None:
    """Wait (bounded) while this process serves a page."""
    if not _no_page.is_set():
        _no_page.wait(MAX_WAIT)


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
