"""SQLite's writers queued in the kernel (dashboard/sqlite/base.py, dashboard/queued_lock.py): a waiter gets
the lock when it is released (not at its next poll), gives up at its deadline,
never steals the lock back after giving up, and a holder killed with -9 lets go."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import OperationalError, connection, transaction

from dashboard.sqlite import base as sqlite_base
from dashboard.queued_lock import QueuedFileLock
from dashboard.sqlite.base import writers

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


def test_in_memory_databases_have_no_queue():
    assert writers(":memory:") is None
    assert writers("file:memorydb_default?mode=memory&cache=shared") is None


@pytest.mark.django_db(transaction=True)
def test_a_transaction_waits_for_the_writer_holding_it_then_fails_as_database_locked(monkeypatch):
    if connection.vendor != "sqlite":
        pytest.skip("SQLite only")
    monkeypatch.setattr(sqlite_base, "BUSY_TIMEOUT_S", 0.3)
    holding, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def other() -> None:
        try:
            with transaction.atomic():
                holding.set()
                assert release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=other)
    thread.start()
    assert holding.wait(10)
    try:
        with pytest.raises(OperationalError, match="database is locked"):
            with transaction.atomic():
                pass
    except BaseException as exc:  # noqa: BLE001
        errors.append(exc)
    release.set()
    thread.join(10)
    assert not errors
    with transaction.atomic():  # its turn once the other committed
        assert connection.in_atomic_block


_OTHER_PROCESS_WRITER = """
import sys, time
from dashboard.queued_lock import QueuedFileLock
from dashboard.sqlite.base import _FirstMarker
marker, queue = _FirstMarker(sys.argv[1] + "-first"), QueuedFileLock(sys.argv[1])
print("ready", flush=True)
deadline = time.monotonic() + 10
while time.monotonic() < deadline:  # an ingest process busy writing: it tries the lock again and again
    if sys.argv[2] == "holds-back":
        marker.wait_clear(5.0)
    if queue.try_acquire():
        break
print(time.monotonic(), flush=True)
queue.release()
"""


@pytest.mark.parametrize("repeat", range(3))
def test_a_derivation_waiting_for_its_turn_goes_before_a_writer_of_another_process_that_comes_after(
        tmp_path, repeat):
    """writes_first across processes (where it matters: ingest and the drainer are
    different gunicorn workers): a busy writer of another process, trying the lock
    again and again, holds back while the derivation waits, so the derivation takes
    the next turn. Without the holding back it takes the lock before the kernel's
    woken waiter runs."""
    path = str(tmp_path / "db-writers")
    holder = QueuedFileLock(path)
    assert holder.acquire(5)
    marker, queue = sqlite_base._FirstMarker(f"{path}-first"), QueuedFileLock(path)
    taken: list[float] = []

    def derivation() -> None:
        with marker.held():
            assert queue.acquire(10)
        taken.append(time.monotonic())
        time.sleep(0.05)
        queue.release()

    thread = threading.Thread(target=derivation)
    thread.start()
    time.sleep(0.2)  # the derivation waits, its marker held
    other = subprocess.Popen([sys.executable, "-c", _OTHER_PROCESS_WRITER, path, "holds-back"],
                             stdout=subprocess.PIPE, text=True)
    assert other.stdout.readline().strip() == "ready"
    time.sleep(0.2)  # the other process's writer holds back
    holder.release()
    thread.join(10)
    other_took = float(other.stdout.readline())
    other.wait(10)
    assert taken and taken[0] < other_took


def test_the_marker_holds_a_writer_back_at_most_its_limit(tmp_path):
    marker = sqlite_base._FirstMarker(str(tmp_path / "db-writers-first"))
    started = time.monotonic()
    marker.wait_clear(1.0)
    assert time.monotonic() - started < 0.5  # nobody waits: at once
    with marker.held():
        started = time.monotonic()
        marker.wait_clear(0.3)
        assert 0.25 < time.monotonic() - started < 2


def test_a_derivation_killed_while_it_waits_first_holds_no_writer_back(tmp_path):
    """A stale "derivations first" marker: its holder killed with -9 mid-wait leaves
    the file behind, but the kernel let its lock go, so writers no longer hold back."""
    path = tmp_path / "db-writers-first"
    marker = sqlite_base._FirstMarker(str(path))
    holder = _holder(path)  # another process's derivation, waiting for its turn
    try:
        started = time.monotonic()
        marker.wait_clear(0.3)
        assert time.monotonic() - started >= 0.25  # held: the writer holds back
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    assert path.exists()
    started = time.monotonic()
    marker.wait_clear(5.0)
    assert time.monotonic() - started < 0.5  # at once, not after the limit


def _sqlite_file_only() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("SQLite only")


def _synchronous() -> int:
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA synchronous")
        return cursor.fetchone()[0]


def _spied_syncs(monkeypatch) -> list[tuple[str, str]]:
    """What happens, in order: the writer lock let go, and each file synced (the
    real calls run: spies, not fakes)."""
    events: list[tuple[str, str]] = []
    fdatasync, release = sqlite_base.os.fdatasync, QueuedFileLock.release

    def spy_sync(fd: int) -> None:
        events.append(("sync", sqlite_base.os.readlink(f"/proc/self/fd/{fd}")))
        fdatasync(fd)

    def spy_release(self: QueuedFileLock) -> None:
        events.append(("released", ""))
        release(self)

    monkeypatch.setattr(sqlite_base.os, "fdatasync", spy_sync)
    monkeypatch.setattr(QueuedFileLock, "release", spy_release)
    return events


@pytest.mark.django_db(transaction=True)
def test_a_transaction_s_commit_is_synced_to_disk_after_the_writer_lock_is_let_go(monkeypatch, project):
    """synchronous=FULL: the log is flushed before commit() returns, but outside the
    lock; the connection is FULL again for statements in autocommit mode."""
    _sqlite_file_only()
    from dashboard.observatory.models import Conversation

    connection.ensure_connection()
    assert _synchronous() == 2
    events = _spied_syncs(monkeypatch)
    with transaction.atomic():
        assert _synchronous() == 1  # SQLite does not sync inside the commit...
        Conversation.objects.create(project=project, external_id="synced")
    wal = f"{connection.settings_dict['NAME']}-wal"
    assert events == [("released", ""), ("sync", wal)]  # ...the commit syncs once the lock is let go
    assert _synchronous() == 2
    events.clear()
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            Conversation.objects.create(project=project, external_id="rolled back")
            raise RuntimeError
    assert events == [("released", "")] and _synchronous() == 2  # a rollback has nothing to sync
    events.clear()
    with transaction.atomic():
        assert Conversation.objects.filter(external_id="synced").exists()
    assert events == [("released", "")]  # nor a transaction that changed no row


@pytest.mark.django_db(transaction=True)
def test_with_synchronous_normal_a_commit_is_not_synced(monkeypatch, project):
    _sqlite_file_only()
    from dashboard.observatory.models import Conversation

    options = connection.settings_dict["OPTIONS"]
    monkeypatch.setitem(options, "init_command", options["init_command"].replace("synchronous=FULL", "synchronous=NORMAL"))
    connection.close()
    try:
        events = _spied_syncs(monkeypatch)
        with transaction.atomic():
            Conversation.objects.create(project=project, external_id="not synced")
        assert events == [("released", "")] and _synchronous() == 1
    finally:
        connection.close()  # the next test's connection is FULL again
