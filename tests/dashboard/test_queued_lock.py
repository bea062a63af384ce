"""dashboard/queued_lock.py: a waiter gets the lock when it is released (not at its
next poll), gives up at its deadline, never steals the lock back after giving up, and a
holder killed with -9 lets go."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from dashboard.queued_lock import QueuedFileLock

_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""

_TRY = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    sys.exit(1)
"""


def _holder(path: Path) -> subprocess.Popen:
    """Another process holding the writer lock until its stdin closes."""
    process = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdout.readline() == b"held\n"
    return process


def _free_for_another_process(path: Path) -> bool:
    return subprocess.run([sys.executable, "-c", _TRY, str(path)], timeout=30).returncode == 0


def test_a_waiter_takes_the_lock_when_the_other_process_lets_go(tmp_path):
    path = tmp_path / "db-writers"
    holder = _holder(path)
    queue = QueuedFileLock(str(path))
    threading.Timer(0.3, holder.stdin.close).start()
    started = time.monotonic()
    assert queue.acquire(timeout=20)
    waited = time.monotonic() - started
    try:
        assert 0.2 < waited < 5  # at the release, far from the deadline
        assert not _free_for_another_process(path)
    finally:
        queue.release()
        holder.wait(10)
    assert _free_for_another_process(path)


def test_a_waiter_gives_up_at_its_deadline_and_the_helper_does_not_keep_the_lock(tmp_path):
    path = tmp_path / "db-writers"
    holder = _holder(path)
    queue = QueuedFileLock(str(path))
    started = time.monotonic()
    assert not queue.acquire(timeout=0.2)
    assert time.monotonic() - started < 5
    holder.stdin.close()
    holder.wait(10)
    # The helper still waited in flock for the waiter that gave up: when it got the
    # lock it let it go (nobody wanted it), so another process can take it.
    deadline = time.monotonic() + 10
    while not _free_for_another_process(path):
        assert time.monotonic() < deadline, "the helper kept the lock of a waiter that gave up"
        time.sleep(0.05)
    assert queue.acquire(timeout=5)
    try:
        assert not _free_for_another_process(path)
    finally:
        queue.release()


def test_a_new_waiter_while_the_helper_still_waits_gets_the_lock_from_it_not_twice(tmp_path):
    path = tmp_path / "db-writers"
    holder = _holder(path)
    queue = QueuedFileLock(str(path))
    assert not queue.acquire(timeout=0.1)  # the helper keeps waiting in flock
    threading.Timer(0.3, holder.stdin.close).start()
    assert queue.acquire(timeout=20)  # handed over by the helper when the holder lets go
    try:
        holder.wait(10)
        assert not _free_for_another_process(path)
    finally:
        queue.release()
    assert _free_for_another_process(path)


def test_a_holder_killed_with_minus_9_lets_the_lock_go(tmp_path):
    path = tmp_path / "db-writers"
    holder = _holder(path)
    queue = QueuedFileLock(str(path))
    threading.Timer(0.2, lambda: holder.send_signal(signal.SIGKILL)).start()
    assert queue.acquire(timeout=20)
    queue.release()
    holder.wait(10)


def test_threads_of_one_process_take_turns(tmp_path):
    queue = QueuedFileLock(str(tmp_path / "db-writers"))
    inside = 0
    most = 0
    lock = threading.Lock()

    def writer() -> None:
        nonlocal inside, most
        for _ in range(50):
            assert queue.acquire(timeout=10)
            with lock:
                inside += 1
                most = max(most, inside)
            time.sleep(0.0005)
            with lock:
                inside -= 1
            queue.release()

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert most == 1
