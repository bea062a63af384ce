"""How derivation tasks leave the ingest request.

With a broker, ``derive`` enqueues Celery tasks. With none (the embedded default),
running them inside each request would make every batch pay for recomputing its
conversations and hours; instead one background thread per process collects what
batches touched, merges it, and runs the same idempotent tasks every
``OBSERVATORY_DERIVE_DELAY_MS``. So a burst of 100 batches costs one rollup per
(project, hour), not 100, and ingest answers as soon as its rows are committed.

The thread also plays Celery beat's part (hourly rollups, daily retention purge),
so the embedded default needs neither Redis nor cron. Work pending at exit is lost
only until the next hourly pass recomputes the recent hours: tasks recompute from rows.

Under a test runner (``OBSERVATORY_DERIVE_INLINE``, on by default there) the tasks
run right after commit in the request, as Celery's eager mode would.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import close_old_connections, connections

logger = logging.getLogger(__name__)


@dataclass
class _Pending:
    conversation_ids: set[int] = field(default_factory=set)
    hours: set[str] = field(default_factory=set)
    artifact_ids: set[str] = field(default_factory=set)


class DerivationRunner:
    """Merges derivation requests and runs them on one daemon thread. A failed pass is
    put back and tried again (up to MAX_RETRIES times in a row, waiting longer each time)."""

    MAX_RETRIES = 3

    def __init__(self, *, delay_seconds: float, beat_interval_seconds: float = 60.0) -> None:
        self.delay_seconds = delay_seconds
        self.beat_interval_seconds = beat_interval_seconds
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = defaultdict(_Pending)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None
        self._last_hourly: float = 0.0  # monotonic time of the last hourly pass
        self._last_purge_day: str | None = None
        self._failures = 0  # failed passes in a row

    def submit(self, project_id: int, conversation_ids: Iterable[int], hours: Iterable[str],
               artifact_ids: Iterable[str] = ()) -> None:
        with self._lock:
            self._merge(project_id, conversation_ids, hours, artifact_ids)
            self._idle.clear()
            self._ensure_thread()
        self._wake.set()

    def flush(self, timeout: float = 10.0) -> bool:
        """Run what is pending now; True when it was all done within ``timeout``."""
        self._wake.set()
        return self._idle.wait(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Finish what is pending, then end the thread (waiting at most ``timeout`` for each)."""
        self.flush(timeout)
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

    def _merge(self, project_id: int, conversation_ids: Iterable[int], hours: Iterable[str],
               artifact_ids: Iterable[str]) -> None:
        """Add work to what is pending (the caller holds the lock)."""
        pending = self._pending[project_id]
        pending.conversation_ids.update(conversation_ids)
        pending.hours.update(hours)
        pending.artifact_ids.update(artifact_ids)

    def _requeue(self, work: dict[int, _Pending]) -> None:
        with self._lock:
            for project_id, pending in work.items():
                self._merge(project_id, pending.conversation_ids, pending.hours, pending.artifact_ids)
        self._wake.set()

    def _take(self) -> dict[int, _Pending]:
        with self._lock:
            taken, self._pending = self._pending, defaultdict(_Pending)
            return taken

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=self.beat_interval_seconds)
            self._wake.clear()
            if self._stop.is_set():
                break
            # Let a burst of batches pile up; wait longer after failed passes.
            time.sleep(self.delay_seconds * (1 + self._failures))
            work = self._take()
            try:
                self._run(work)
                self._failures = 0
            except Exception:  # never let the thread die
                self._failures += 1
                logger.exception("derivation pass failed (%d in a row)", self._failures)
                if self._failures <= self.MAX_RETRIES:
                    self._requeue(work)  # tasks recompute from rows: running them again is safe
                else:
                    self._failures = 0  # leave this work to the hourly pass; new work starts afresh
            try:
                self._beat()
            except Exception:  # a failed hourly or daily job runs again at its next time
                logger.exception("scheduled derivation failed")
            try:
                close_old_connections()
                connections.close_all()
            except Exception:  # nothing may end the thread
                logger.exception("closing the derivation thread's connections failed")
            with self._lock:
                if not self._pending:
                    self._idle.set()

    def _run(self, work: dict[int, _Pending]) -> None:
        from . import tasks

        for project_id, pending in work.items():
            if pending.conversation_ids:
                ids = sorted(pending.conversation_ids)
                tasks.links_refresh(project_id, ids)
                tasks.conversation_totals_refresh(ids)
            if pending.hours:
                tasks.tool_rollups_refresh(project_id, sorted(pending.hours))
            if pending.artifact_ids:
                tasks.links_refresh(project_id, None, sorted(pending.artifact_ids))

    def _beat(self) -> None:
        from django.utils import timezone

        from . import tasks

        now = time.monotonic()
        if now - self._last_hourly >= 3600 or self._last_hourly == 0.0:
            self._last_hourly = now
            tasks.rollup_recent_hours()
        today = timezone.now().date().isoformat()
        if self._last_purge_day != today:
            self._last_purge_day = today
            tasks.purge_expired()


_runner: DerivationRunner | None = None
_runner_lock = threading.Lock()


def runner() -> DerivationRunner:
    global _runner
    with _runner_lock:
        if _runner is None:
            _runner = DerivationRunner(delay_seconds=settings.OBSERVATORY_DERIVE_DELAY_MS / 1000)
            atexit.register(_runner.stop)
        return _runner


def derive(project_id: int, conversation_ids: list[int], hours: list[str], artifact_ids: list[str]) -> None:
    """Called after commit: hand the work to Celery, to the in-process runner, or run it now."""
    from . import tasks

    if not settings.CELERY_TASK_ALWAYS_EAGER or settings.OBSERVATORY_DERIVE_INLINE:
        if conversation_ids:
            tasks.links_refresh.delay(project_id, conversation_ids)
            tasks.conversation_totals_refresh.delay(conversation_ids)
        if hours:
            tasks.tool_rollups_refresh.delay(project_id, hours)
        if artifact_ids:
            tasks.links_refresh.delay(project_id, None, artifact_ids)
        return
    runner().submit(project_id, conversation_ids, hours, artifact_ids)
