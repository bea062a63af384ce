"""Pages before ingest across the server's processes: the page board."""

from __future__ import annotations

import os
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
    monkeypatch.setattr(priority.page_board, "_pid", 0)  # reopen with this environment
    yield priority.page_board()
    monkeypatch.setattr(priority.page_board, "_pid", 0)


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
    monkeypatch.setattr(priority.page_board, "_pid", 0)
    assert priority.page_board() is None
    started = time.monotonic()
    priority.yield_to_pages()  # nothing to wait for
    assert time.monotonic() - started < priority.MAX_WAIT


def test_a_board_that_cannot_be_opened_is_no_board(tmp_path, monkeypatch):
    monkeypatch.setenv(priority.BOARD_ENV, str(tmp_path / "missing"))
    monkeypatch.setenv(priority.SLOT_ENV, "1")
    monkeypatch.setattr(priority.page_board, "_pid", 0)
    assert priority.page_board() is None
    monkeypatch.setattr(priority.page_board, "_pid", 0)


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


HOLDER = """
import sys
from dashboard.priority import WriteSlots
slots = WriteSlots(sys.argv[1], 1)
print("took" if slots.try_take() is not None else "none", flush=True)
sys.stdin.readline()
"""


def _holder(board_path):
    child = subprocess.Popen([sys.executable, "-c", HOLDER, board_path], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "took"
    return child


def test_a_write_slot_held_by_another_process_is_not_free_until_it_ends(board_path):
    mine = priority.WriteSlots(board_path, 1)
    child = _holder(board_path)
    try:
        assert mine.try_take() is None
    finally:
        child.stdin.close()
        child.wait(10)
    slot = mine.try_take()
    assert slot == 0
    mine.give_back(slot)


def test_a_process_killed_holding_a_slot_frees_it(board_path):
    mine = priority.WriteSlots(board_path, 1)
    child = _holder(board_path)
    child.kill()  # SIGKILL: no chance to give it back
    child.wait(10)
    assert mine.try_take() == 0


def test_two_threads_of_a_process_never_share_a_slot(board_path):
    slots = priority.WriteSlots(board_path, 2)
    first, second = slots.try_take(), slots.try_take()
    assert {first, second} == {0, 1}
    taken = []
    thread = threading.Thread(target=lambda: taken.append(slots.try_take()))
    thread.start()
    thread.join(10)
    assert taken == [None]
    slots.give_back(first)
    assert slots.try_take() == first


def test_a_transaction_goes_on_without_a_slot_after_the_wait(board_path):
    slots = priority.WriteSlots(board_path, 1)
    child = _holder(board_path)
    try:
        started = time.monotonic()
        with slots.held(0.1) as got:
            assert got is False
        assert time.monotonic() - started >= 0.1
    finally:
        child.stdin.close()
        child.wait(10)
    with slots.held(0.1) as got:
        assert got is True


@pytest.mark.django_db
def test_ingest_transactions_take_a_write_slot_when_there_is_a_board(this_process_on_slot_1, board_path, settings, monkeypatch):
    settings.OBSERVATORY_MAX_CONCURRENT_WRITES = 1
    monkeypatch.setattr(priority.write_slots, "_pid", 0)
    observer = priority.WriteSlots(board_path, 1)
    try:
        with priority.ingest_transaction():
            assert observer.try_take() is None  # held by this transaction
        slot = observer.try_take()
        assert slot == 0
        observer.give_back(slot)
    finally:
        monkeypatch.setattr(priority.write_slots, "_pid", 0)


def test_gunicorn_removes_the_boards_of_masters_that_died(tmp_path):
    import runpy
    from pathlib import Path

    conf = runpy.run_path(str(Path(__file__).resolve().parents[2] / "deploy" / "gunicorn.conf.py"))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(10)
    left = [tmp_path / f"observatory-pages-{dead.pid}-abc", tmp_path / f"observatory-pages-{dead.pid}-abc.w0"]
    alive = tmp_path / f"observatory-pages-{os.getpid()}-def"
    other = tmp_path / "observatory-pages-notapid-x"
    for path in (*left, alive, other):
        path.write_bytes(b"")
    conf["_remove_boards_of_dead_masters"](str(tmp_path))
    assert not any(path.exists() for path in left)
    assert alive.exists() and other.exists()
