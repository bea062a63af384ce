"""Pages before ingest across the server's processes: the page board."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from django.http import HttpResponse
from django.test import RequestFactory

from dashboard import priority
from dashboard.priority import SLOTS, PageBoard

CHILD = """
import sys, time
from dashboard.priority import PageBoard
board = PageBoard(sys.argv[1], 5)
board.mark(time.time())
print("marked", flush=True)
sys.stdin.readline()
board.mark(0.0)
print("cleared", flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def board_path(tmp_path):
    path = tmp_path / "board"
    PageBoard.create(str(path))
    return str(path)


@pytest.fixture
def this_process_on_slot_1(board_path, monkeypatch):
    monkeypatch.setenv(priority.BOARD_ENV, board_path)
    monkeypatch.setenv(priority.SLOT_ENV, "1")
    monkeypatch.setattr(priority, "_board_pid", 0)  # reopen with this environment
    yield priority.page_board()
    monkeypatch.setattr(priority, "_board_pid", 0)


def test_a_page_served_by_another_process_shows_on_the_board(board_path):
    mine = PageBoard(board_path, 1)
    assert not mine.others_busy()
    child = subprocess.Popen([sys.executable, "-c", CHILD, board_path], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "marked"
        assert mine.others_busy()
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "cleared"
        assert not mine.others_busy()
    finally:
        child.stdin.close()
        child.wait(10)


def test_its_own_slot_and_stale_slots_do_not_count(board_path):
    mine, other = PageBoard(board_path, 1), PageBoard(board_path, SLOTS - 1)
    mine.mark(time.time())
    assert not mine.others_busy()
    other.mark(time.time() - priority.STALE_S - 1)  # a process killed mid-page long ago
    assert not mine.others_busy()
    other.mark(time.time())
    assert mine.others_busy()


@pytest.mark.parametrize("slot", [-1, SLOTS])
def test_it_refuses_a_slot_outside_the_board(board_path, slot):
    with pytest.raises(ValueError):
        PageBoard(board_path, slot)


def test_no_board_without_the_environment(monkeypatch):
    monkeypatch.delenv(priority.BOARD_ENV, raising=False)
    monkeypatch.setattr(priority, "_board_pid", 0)
    assert priority.page_board() is None
    started = time.monotonic()
    priority.yield_to_pages()  # nothing to wait for
    assert time.monotonic() - started < priority.MAX_WAIT


def test_a_board_that_cannot_be_opened_is_no_board(tmp_path, monkeypatch):
    monkeypatch.setenv(priority.BOARD_ENV, str(tmp_path / "missing"))
    monkeypatch.setenv(priority.SLOT_ENV, "1")
    monkeypatch.setattr(priority, "_board_pid", 0)
    assert priority.page_board() is None
    monkeypatch.setattr(priority, "_board_pid", 0)


def test_ingest_waits_while_another_process_serves_a_page_until_it_ends(this_process_on_slot_1, board_path, monkeypatch):
    monkeypatch.setattr(priority, "MAX_WAIT", 30.0)
    other = PageBoard(board_path, 7)
    other.mark(time.time())
    threading.Timer(0.2, other.mark, args=(0.0,)).start()  # the other page ends
    started = time.monotonic()
    priority.yield_to_pages()
    waited = time.monotonic() - started
    assert 0.15 < waited < 20


def test_ingest_waits_at_most_max_wait_for_another_process(this_process_on_slot_1, board_path, monkeypatch):
    monkeypatch.setattr(priority, "MAX_WAIT", 0.2)
    PageBoard(board_path, 7).mark(time.time())  # a page that does not end
    started = time.monotonic()
    priority.yield_to_pages()
    assert 0.15 < time.monotonic() - started < 10


def test_the_middleware_marks_this_process_while_a_page_runs(this_process_on_slot_1, board_path):
    observer = PageBoard(board_path, 9)
    seen = []
    page = priority.PagePriorityMiddleware(lambda request: (seen.append(observer.others_busy()), HttpResponse())[1])
    page(RequestFactory().get("/"))
    assert seen == [True]
    assert not observer.others_busy()
