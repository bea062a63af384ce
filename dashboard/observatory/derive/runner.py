"""Who drains the notes, and when: the embedded runner thread, or Celery.

Ingest writes a DerivationNote in its own transaction (derive.notes); after the
commit the waker registered at start-up (``notify``, by ObservatoryConfig.ready)
makes sure something drains it soon: with a broker, a
Celery task (and the beat drains every few seconds whatever a lost message left);
with none (the embedded default), one background thread per web process that
drains notes every ``OBSERVATORY_DERIVE_DELAY_MS`` after being woken and polls every
``POLL_SECONDS`` anyway, so a burst of 100 batches costs one rollup per (project,
hour), not 100, and notes left by a killed process are taken up after their lease.

The thread also plays Celery beat's part (hourly rollups and span partitions, daily
retention purge), so the embedded default needs neither Redis nor cron.

Under a test runner (``OBSERVATORY_DERIVE_INLINE``, on by default there) the notes
are drained right after commit in the request, as Celery's eager mode would.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time

from django.conf import settings
from django.db import close_old_connections, connections

from dashboard.observatory import tasks

from . import schedule
from .drain import outbox_drain_all
from .notes import notes_ready

logger = logging.getLogger(__name__)


class DerivationRunner:
    """Drains the outbox on one daemon thread: woken after commits, and every
    POLL_SECONDS regardless (notes of a crashed process, notes waiting out a backoff)."""

    POLL_SECONDS = 5.0
    CHECKPOINT_SECONDS = 60.0  # how often at most this process tries to truncate SQLite's log

    def __init__(self, *, delay_seconds: float, beat_interval_seconds: float = 60.0) -> None:
        self.delay_seconds = delay_seconds
        self.beat_interval_seconds = beat_interval_seconds
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None
        self._next_checkpoint: float = 0.0  # monotonic time of the next try at truncating SQLite's log

    def start(self) -> None:
        with self._lock:
            self._ensure_thread()

    def wake(self) -> None:
        with self._lock:
            self._idle.clear()
            self._ensure_thread()
        self._wake.set()

    def flush(self, timeout: float = 10.0) -> bool:
        """Drain what is ready now; True when nothing was left ready within ``timeout``."""
        self.wake()
        return self._idle.wait(timeout)

    def stop(self, timeout: float = 15.0) -> None:
        """End the thread: no pass starts after this, the pass under way finishes
        (waited for at most ``timeout``, within gunicorn's graceful 20 s). What is
        ready and not claimed stays for the other processes; a pass cut short would
        leave its notes claimed until their lease ends (30 s of lag: a worker replaced
        for its memory used to do that when it first finished what was ready)."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _ensure_thread(self) -> None:
        # Started on first use, so under gunicorn each worker gets its own thread after fork.
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="observatory-derive", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            woken = self._wake.wait(timeout=self.POLL_SECONDS)
            self._wake.clear()
            if self._stop.is_set():
                break
            if woken:
                time.sleep(self.delay_seconds)  # let a burst of batches pile up
            try:
                # Failures are contained per note there. Another process draining (SQLite:
                # one at a time) drains these notes too: no waiting for it here.
                outbox_drain_all(stop=self._stop, wait=False)
                left = notes_ready()
            except Exception:  # the database is away: the next poll tries again
                logger.exception("draining the derivation outbox failed")
                left = True
            if self._stop.is_set():
                self._close_connections()
                break
            if time.monotonic() >= self._next_checkpoint:
                # At most once a minute: a checkpoint that waits for readers holds the
                # writers back meanwhile (after every pass of every process, with a 1 s
                # wait, the soak's passes failed on "database is locked", likely from it).
                self._next_checkpoint = time.monotonic() + self.CHECKPOINT_SECONDS
                try:
                    sqlite_wal_truncate(settings.OBSERVATORY_SQLITE_WAL_LIMIT_MB << 20)
                except Exception:  # a busy database: the next try is a minute later
                    logger.exception("checkpointing the SQLite write-ahead log failed")
            try:
                self._beat()
            except Exception:  # a failed hourly or daily job runs again at its next time
                logger.exception("scheduled derivation failed")
            self._close_connections()
            if not left and not self._wake.is_set():
                self._idle.set()

    @staticmethod
    def _close_connections() -> None:
        try:
            close_old_connections()
            connections.close_all()
        except Exception:  # nothing may end the thread
            logger.exception("closing the derivation thread's connections failed")

    def _beat(self) -> None:
        if _once_per("derive-hourly", 3600):
            try:
                schedule.spans_partitions_maintain()
            except Exception:  # a lock not had in time: the next hour tries again
                logger.exception("creating the spans' partitions ahead failed")
            schedule.rollup_recent_hours()
        if _once_per("derive-daily", 86400):
            schedule.purge_expired()


def _once_per(name: str, seconds: float) -> bool:
    """True at most once per ``seconds`` for all the processes sharing DATA_DIR: the
    last time is the modification time of the file ``name`` there. Kept per process
    before, so every web worker ran the hourly pass (the last three hours' rollups
    recomputed, every unlinked span of two days read) and the purge when it started:
    in a soak each worker replaced for its memory did. Two processes starting at once
    may both run it; both jobs are idempotent."""
    marker = settings.DATA_DIR / name
    try:
        last = marker.stat().st_mtime
    except OSError:
        last = 0.0
    if time.time() - last < seconds:
        return False
    try:
        marker.touch()
    except OSError:  # a read-only data directory: run, as each process did before
        logger.warning("could not mark the time of %s in the data directory", name)
    return True


WAL_BUSY_MS = 250  # how long a checkpoint may wait for readers (writers wait meanwhile)


def sqlite_wal_truncate(limit_bytes: int, alias: str = "default") -> bool | None:
    """Checkpoint SQLite's write-ahead log whole and truncate it when it is over
    ``limit_bytes``; True when done, False when readers kept it busy past
    WAL_BUSY_MS (the runner tries again a minute later), None when there was nothing to do.

    SQLite's automatic checkpoints are passive: they copy only the frames no reader
    still needs, and the log restarts only once all are copied. Under steady ingest
    some reader always holds an older snapshot, so the log never restarted: 8.8 GB
    after 20 minutes, each read searching an index of it. TRUNCATE waits for the
    readers (blocking writers for at most WAL_BUSY_MS), copies everything, and
    empties the file. Under steady load it rarely gets there; when ingest pauses it
    does, and the file on disk shrinks again."""
    connection = connections[alias]
    if connection.vendor != "sqlite":
        return None
    try:
        size = os.path.getsize(f"{connection.settings_dict['NAME']}-wal")
    except OSError:
        return None
    if size <= limit_bytes:
        return None
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout")
        (configured,) = cursor.fetchone()
        cursor.execute(f"PRAGMA busy_timeout = {WAL_BUSY_MS:d}")
        try:
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            busy, _, _ = cursor.fetchone()
        finally:
            cursor.execute(f"PRAGMA busy_timeout = {int(configured):d}")
    if busy:
        logger.info("SQLite write-ahead log of %d MB not checkpointed: readers kept it busy", size >> 20)
    return not busy


_runner: DerivationRunner | None = None
_runner_lock = threading.Lock()


def runner() -> DerivationRunner:
    global _runner
    with _runner_lock:
        if _runner is None:
            _runner = DerivationRunner(delay_seconds=settings.OBSERVATORY_DERIVE_DELAY_MS / 1000)
            atexit.register(_runner.stop)
        return _runner


def notify() -> None:
    """After a commit that wrote a note: have it drained soon (see the module doc).
    Registered with derive.notes at start-up (ObservatoryConfig.ready)."""
    if settings.OBSERVATORY_DERIVE_INLINE and settings.CELERY_TASK_ALWAYS_EAGER:
        outbox_drain_all()
    elif not settings.CELERY_TASK_ALWAYS_EAGER:
        tasks.outbox_drain.delay()
    else:
        runner().wake()


def start_background() -> None:
    """In a web process of the embedded mode: start draining now, so notes left by a
    killed process are derived even if no request comes."""
    if settings.CELERY_TASK_ALWAYS_EAGER and not settings.OBSERVATORY_DERIVE_INLINE:
        runner().start()


def background_stop() -> None:
    """Stop this process's derivation thread, if it started (what exit does; for a
    process that leaves with ``os._exit``)."""
    if _runner is not None:
        _runner.stop()
