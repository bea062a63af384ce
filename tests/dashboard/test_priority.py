"""Pages before ingest inside one web process (dashboard/priority.py): ingest's safe
points wait, bounded, while a page of this process is being served."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connection
from django.http import HttpResponse
from django.test import RequestFactory

from dashboard import priority


@pytest.fixture
def page_in_progress() -> Iterator[threading.Event]:
    """A page served on another thread of this process until the event is set."""
    started, end = threading.Event(), threading.Event()

    def view(request):
        started.set()
        end.wait(30)
        return HttpResponse()

    page = threading.Thread(target=priority.PagePriorityMiddleware(view), args=(RequestFactory().get("/"),))
    page.start()
    assert started.wait(10)
    try:
        yield end
    finally:
        end.set()
        page.join(10)


def test_ingest_does_not_wait_when_no_page_runs():
    assert priority.pages_in_progress() == 0
    started = time.monotonic()
    priority.yield_to_pages()
    assert time.monotonic() - started < priority.MAX_WAIT


def test_ingest_waits_while_a_page_runs_until_it_ends(page_in_progress, monkeypatch):
    monkeypatch.setattr(priority, "MAX_WAIT", 30.0)
    threading.Timer(0.2, page_in_progress.set).start()  # the page ends
    started = time.monotonic()
    priority.yield_to_pages()
    assert 0.15 < time.monotonic() - started < 20


def test_ingest_waits_at_most_max_wait_for_a_page_that_does_not_end(page_in_progress, monkeypatch):
    monkeypatch.setattr(priority, "MAX_WAIT", 0.2)
    started = time.monotonic()
    priority.yield_to_pages()
    assert 0.15 < time.monotonic() - started < 10
    assert priority.pages_in_progress() == 1  # still served: ingest went on anyway


def test_the_middleware_counts_pages_while_they_run_and_says_their_time():
    seen = []
    page = priority.PagePriorityMiddleware(lambda request: (seen.append(priority.pages_in_progress()), HttpResponse())[1])
    response = page(RequestFactory().get("/"))
    assert seen == [1] and priority.pages_in_progress() == 0
    assert response.headers["Server-Timing"].startswith("app;dur=")


def test_a_page_that_fails_is_no_longer_counted():
    def view(request):
        raise RuntimeError("the view failed")

    with pytest.raises(RuntimeError):
        priority.PagePriorityMiddleware(view)(RequestFactory().get("/"))
    assert priority.pages_in_progress() == 0
    started = time.monotonic()
    priority.yield_to_pages()  # nothing left to wait for
    assert time.monotonic() - started < priority.MAX_WAIT


@pytest.mark.django_db(transaction=True)
def test_an_ingest_transaction_begins_after_the_wait_not_during_it(page_in_progress, monkeypatch):
    """On SQLite the transaction holds the write lock: waiting inside it would keep
    every other writer out while the page runs."""
    monkeypatch.setattr(priority, "MAX_WAIT", 30.0)
    threading.Timer(0.2, page_in_progress.set).start()
    started = time.monotonic()
    with priority.ingest_transaction():
        waited = time.monotonic() - started
        assert connection.in_atomic_block
    assert 0.15 < waited < 20
    assert not connection.in_atomic_block
