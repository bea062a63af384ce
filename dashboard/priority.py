"""Pages before ingest inside one web process.

A gunicorn worker's threads share one interpreter lock: while three threads decode
and store big span batches, a page gets about a quarter of the process's CPU and
took 0.5–0.9 s at p95 under 16 senders (30 ms alone). So ingest steps aside: page
requests are counted while they run (``PagePriorityMiddleware``), and ingest calls
``yield_to_pages`` at safe points — between chunks of decoding, before taking the
database's write lock, never inside a transaction — where it waits while a page
is being served, at most ``MAX_WAIT`` each time so ingest always progresses.

Across processes the deployment decides, not this module: heavy ingest goes to the
OTLP receivers' own ports, and they run at a lower CPU priority than the web server
(``nice``, deploy/run-otlp-http.sh and deploy/run-grpc.sh). A page board shared by
the web server's processes and write slots for their transactions were here before;
they bought no page time that the niced receiver does not (deploy/SCALING.md,
*Pages under ingest*) and were removed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable

from django.db import transaction
from django.http import HttpRequest, HttpResponse

MAX_WAIT = 0.05  # seconds one safe point may wait

_lock = threading.Lock()
_pages = 0
_no_page = threading.Event()
_no_page.set()


@contextmanager
def ingest_transaction() -> Iterator[None]:
    """The transaction of one ingest batch, after a bounded wait while a page is
    served (not inside: on SQLite the transaction holds the write lock)."""
    yield_to_pages()
    with transaction.atomic():
        yield


def yield_to_pages() -> None:
    """Wait (at most ``MAX_WAIT``) while this process serves a page."""
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
