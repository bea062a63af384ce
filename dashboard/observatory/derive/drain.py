"""The drainer: notes claimed, merged into a batch, derived by the passes, deleted.

``derivations_enqueue`` (derive.notes) writes a DerivationNote in the ingest
transaction, so work to derive is exactly as durable as the rows: a ``kill -9``
after the commit loses nothing, before it loses both. ``outbox_drain`` claims ready
notes under a short lease (``SELECT … FOR UPDATE SKIP LOCKED`` on PostgreSQL; on
SQLite the claiming transaction holds the write lock, and one drainer at a time
derives: ``drain_exclusive``), merges them per project so a burst of batches
costs one pass, runs the passes (derive.passes, in their fixed order) over the
batch, and deletes the notes. A drainer
that dies mid-pass leaves its notes to be claimed again when the lease ends. A
pass reads what its notes' batches brought (the rows received from its earliest
batch to its latest: ``_rows_window``), not the conversations' history, and
recomputes the tool rollups of a minute at most once per
OBSERVATORY_ROLLUP_INTERVAL_SECONDS, leaving a note due then for the minutes it
did not (a recompute reads the whole minute).

Failures are contained: when a merged pass fails, each note is derived on its own;
a failing note with several conversations, minutes or hours is split into one
note per conversation, minute and hour, so one poisonous conversation never holds back another;
a single-item note that fails waits (backoff doubling from
OBSERVATORY_DERIVE_RETRY_SECONDS) and after MAX_ATTEMPTS is parked with its error
for an admin (``admin/observatory/derivationnote``, "retry now"). A database that
is busy (a lock, a deadlock, a lost connection: ``database_busy``) says nothing
about the note, so such a failure is retried after OBSERVATORY_DERIVE_RETRY_SECONDS
and never parks it: under sixteen senders on SQLite a note could otherwise use up its attempts on
"database is locked" alone and its conversation would never converge.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Iterator

from django.conf import settings
from django.db import connections, router, transaction
from django.db.models import F
from django.utils import timezone

from dashboard.priority import yield_to_pages

from dashboard.observatory.busy import database_busy
from dashboard.observatory.models import DerivationNote

from .batch import Batch, Pass
from .extra import registered_passes
from .notes import ready
from .passes import PASSES

logger = logging.getLogger(__name__)

NOTE_BATCH = 500  # notes one pass claims
# How long a drainer's claim holds unless renewed: what notes of a drainer killed mid-pass
# wait before another takes them. A live drainer renews it while it derives (lease_kept).
LEASE = timedelta(seconds=30)
# A pass still going after this long lets its notes go to another drainer (a hung pass).
LEASE_KEPT_AT_MOST = timedelta(minutes=10)
# How long before its note a batch's rows may have been received (the ingest
# transaction between them waits at most the database's busy timeout); generous.
# Only for notes without rows_from (not written by an ingest request).
ROWS_BEFORE_NOTE = timedelta(seconds=60)
# Rows and notes are stamped by the same clock in the same request; this absorbs a
# small step of it (NTP) between the two.
CLOCK_SLACK = timedelta(seconds=1)
MAX_ATTEMPTS = 5
ERROR_LENGTH = 2000


@dataclass
class DrainOutcome:
    notes: int = 0  # notes done (deleted)
    failed: int = 0  # notes that failed this pass (split, delayed or parked)
    parked: int = 0


def notes_claim(*, limit: int = NOTE_BATCH) -> list[DerivationNote]:
    """Ready notes, oldest first, leased to this drainer (their attempts counted now,
    so a note whose pass kills the process still ends up parked)."""
    now = timezone.now()
    with transaction.atomic():
        ids = list(
            DerivationNote.objects.filter(ready(now)).order_by("id")
            .select_for_update(skip_locked=True).values_list("id", flat=True)[:limit]
        )
        if not ids:
            return []
        DerivationNote.objects.filter(id__in=ids).update(claimed_until=now + LEASE, attempts=F("attempts") + 1)
    return list(DerivationNote.objects.filter(id__in=ids).order_by("id"))


def outbox_drain(*, limit: int = NOTE_BATCH) -> DrainOutcome:
    """One pass: claim ready notes, derive them per project, delete what is done."""
    outcome = DrainOutcome()
    notes = notes_claim(limit=limit)
    by_project: dict[int, list[DerivationNote]] = defaultdict(list)
    for note in notes:
        by_project[note.project_id].append(note)
    with lease_kept([note.pk for note in notes]):
        for project_id, group in by_project.items():
            _project_drain(project_id, group, outcome)
    return outcome


def _project_drain(project_id: int, group: list[DerivationNote], outcome: DrainOutcome) -> None:
    """Derive one project's claimed notes, merged; on failure, note by note."""
    yield_to_pages()  # the runner shares the web process with the pages
    try:
        passes_run(_merged(group))
    except Exception as exc:
        if database_busy(exc):
            # A busy database says nothing about the notes: the whole group again soon,
            # merged. Deriving 6,000 notes one by one after "database is locked" had
            # each recompute its hour's rollups: the soak's backlog then never drained.
            _delay_busy(group, f"{type(exc).__name__}: {exc}"[:ERROR_LENGTH])
            outcome.failed += len(group)
            return
        logger.warning("derivation pass of %d notes of project %d failed; deriving them one by one",
                       len(group), project_id, exc_info=True)
        for note in group:
            _derive_alone(note, outcome)
        return
    DerivationNote.objects.filter(id__in=[note.pk for note in group]).delete()
    outcome.notes += len(group)


@contextlib.contextmanager
def lease_kept(ids: list[int]) -> Iterator[None]:
    """While the block derives these claimed notes, renew their lease every third of
    LEASE (for at most LEASE_KEPT_AT_MOST), from a thread with its own connection.

    A merged pass of 500 notes can outlast the lease: 37 s each on a busy 2-core
    machine (bench_cluster --drain). Past it a second drainer claimed the same notes and
    derived them again while the first was still at it: two workers did 1,776 notes'
    work for a backlog of 1,273. Renewed, the lease still ends 30 s after a drainer is
    killed. On SQLite one drainer derives at a time (``drain_exclusive``): nothing to
    keep the notes from, and the renewal would wait for the drainer's own write lock."""
    connection = connections[router.db_for_write(DerivationNote)]
    if not ids or connection.vendor == "sqlite":
        yield
        return
    done = threading.Event()

    def renew() -> None:
        until = time.monotonic() + LEASE_KEPT_AT_MOST.total_seconds()
        try:
            while not done.wait(LEASE.total_seconds() / 3) and time.monotonic() < until:
                # Only the notes still claimed: one the block let go (a failure's backoff) stays so.
                DerivationNote.objects.filter(id__in=ids, claimed_until__isnull=False).update(
                    claimed_until=timezone.now() + LEASE)
        except Exception:  # the lease then ends as if not renewed: another drainer may take over
            logger.warning("renewing the lease of %d derivation notes failed", len(ids), exc_info=True)
        finally:
            connections.close_all()  # this thread's own

    thread = threading.Thread(target=renew, name="observatory-lease", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def outbox_drain_all(
    *, passes: int = 100, stop: threading.Event | None = None, wait: bool = True,
) -> DrainOutcome:
    """Drain until nothing is ready (bounded by ``passes``; between passes, ends once
    ``stop`` is set). On SQLite one drainer at a time (``drain_exclusive``): with
    ``wait`` False, a drainer that finds another at work returns at once."""
    total = DrainOutcome()
    with drain_exclusive(wait=wait) as mine:
        if not mine:
            return total
        for _ in range(passes):
            if stop is not None and stop.is_set():
                break
            outcome = outbox_drain()
            total.notes += outcome.notes
            total.failed += outcome.failed
            total.parked += outcome.parked
            if not outcome.notes and not outcome.failed:
                break
    return total


@contextlib.contextmanager
def drain_exclusive(*, wait: bool = True) -> Iterator[bool]:
    """On a SQLite file: hold an exclusive lock on ``<database>-derive.lock`` while
    deriving, across processes and threads; yields False when ``wait`` is False and
    another drainer holds it. Elsewhere (PostgreSQL claims notes with SKIP LOCKED and
    its passes write concurrently) yields True at once.

    SQLite has one write lock. Four web workers each draining took turns at it, each
    pass's write transactions waiting for the others' until "database is locked"
    (busy timeout): after the 16-minute soak 825 of 1,178 notes waiting had failed so,
    and the data did not converge within 150 s. One drainer merges more notes per
    pass and never waits for another. The kernel drops the lock with the process, so
    a ``kill -9`` mid-pass leaves nothing held."""
    connection = connections[router.db_for_write(DerivationNote)]
    name = str(connection.settings_dict.get("NAME") or "")
    if connection.vendor != "sqlite" or name in ("", ":memory:") or name.startswith("file:"):
        yield True
        return
    descriptor = os.open(f"{name}-derive.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(descriptor)  # releases the lock


def _merged(notes: list[DerivationNote]) -> Batch:
    """One batch of one project's notes: the union of what they name."""
    since, until = _rows_window(notes)
    batch = Batch(project_id=notes[0].project_id, since=since, until=until)
    for note in notes:
        batch.conversation_ids.update(note.conversation_ids)
        batch.hours.update(map(datetime.fromisoformat, note.hours))
        batch.minutes.update(map(datetime.fromisoformat, note.minutes))
        batch.artifact_ids.update(note.artifact_ids)
        batch.trace_ids.update(note.trace_ids)
        if note.rows_from is None:
            batch.whole.update(note.conversation_ids)
    return batch


def _rows_window(notes: list[DerivationNote]) -> tuple[datetime, datetime]:
    """When the rows of these notes' batches were received: from the earliest
    ``rows_from`` (for a note without one, its created_at less ROWS_BEFORE_NOTE) to
    the latest created_at (a note is written after its rows, in their transaction).

    Both ends matter. Without the upper one, a pass behind a backlog read every row
    received up to now, so the further behind, the slower each pass: after a
    16-minute soak one drainer sat on a pass of 500 notes reading 16 minutes of
    rows, and 30,171 notes did not move in three minutes. Rows received later belong
    to later notes. Without ``rows_from`` each pass read the 60 s before its notes
    again. Notes about minutes or hours alone (rollups due later) say nothing about rows."""
    about_rows = [note for note in notes if note.conversation_ids or note.trace_ids] or notes
    since = min(note.rows_from - CLOCK_SLACK if note.rows_from else note.created_at - ROWS_BEFORE_NOTE
                for note in about_rows)
    return since, max(note.created_at for note in about_rows) + CLOCK_SLACK


def passes_run(batch: Batch, passes: tuple[Pass, ...] | None = None) -> None:
    """Run the passes over the batch, in their fixed order (``passes.PASSES``, then
    those other apps registered: ``extra``), or only ``passes``."""
    for derivation in PASSES + registered_passes() if passes is None else passes:
        derivation.run(batch)


def _derive_alone(note: DerivationNote, outcome: DrainOutcome) -> None:
    try:
        passes_run(_merged([note]))
    except Exception as exc:
        outcome.failed += 1
        _failed(note, exc, outcome)
        return
    note.delete()
    outcome.notes += 1


def _failed(note: DerivationNote, exc: Exception, outcome: DrainOutcome) -> None:
    """Split a note of several items into one note each; delay or park a single one."""
    error = f"{type(exc).__name__}: {exc}"[:ERROR_LENGTH]
    items = (
        [dict(conversation_ids=[c]) for c in note.conversation_ids]
        + [dict(hours=[h]) for h in note.hours]
        + [dict(minutes=[m]) for m in note.minutes]
        + [dict(artifact_ids=[a]) for a in note.artifact_ids]
        + [dict(trace_ids=[t]) for t in note.trace_ids]
    )
    if database_busy(exc):
        _delay_busy([note], error)
        return
    if len(items) > 1:
        with transaction.atomic():
            DerivationNote.objects.bulk_create(
                DerivationNote(project_id=note.project_id, attempts=note.attempts, last_error=error,
                               created_at=note.created_at, rows_from=note.rows_from,
                               **item)  # its rows' time: see _rows_window
                for item in items
            )
            note.delete()
        return
    parked = note.attempts >= MAX_ATTEMPTS
    delay = settings.OBSERVATORY_DERIVE_RETRY_SECONDS * 2 ** max(note.attempts - 1, 0)
    DerivationNote.objects.filter(pk=note.pk).update(
        last_error=error, parked=parked, claimed_until=None,
        available_at=timezone.now() + timedelta(seconds=delay),
    )
    if parked:
        outcome.parked += 1
        logger.error("derivation note %d parked after %d attempts: %s", note.pk, note.attempts, error)
    else:
        logger.warning("derivation note %d failed (attempt %d), retried in %.0f s: %s",
                       note.pk, note.attempts, delay, error)


def _delay_busy(notes: list[DerivationNote], error: str) -> None:
    """Retry later without counting the attempt (the claim counted it): the busy
    database is not the notes' fault. Whole, not split: splitting would only
    multiply the contention."""
    delay = settings.OBSERVATORY_DERIVE_RETRY_SECONDS
    DerivationNote.objects.filter(pk__in=[note.pk for note in notes]).update(
        last_error=error, claimed_until=None, attempts=F("attempts") - 1,
        available_at=timezone.now() + timedelta(seconds=delay),
    )
    logger.warning("%d derivation notes: database busy, retried in %.0f s: %s", len(notes), delay, error)
