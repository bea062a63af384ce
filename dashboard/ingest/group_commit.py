"""Group commit: the ingest requests a process is storing at the same moment share
one write transaction.

Small batches cost more in their transaction than in their rows: on SQLite every
request waited for the database's single write lock (SQLite's busy handler polls
it with sleeps of 1 to 100 ms, so the lock also sat idle between writers) and then
synced the WAL alone; 10-span batches from 16 senders stored about 500 requests/s
with a third of the request threads' time spent waiting to begin. Here the request
threads of one process queue their writes; one of them (the leader) runs every
write queued so far in one transaction, commits once, and only then are their
requests answered, so an acknowledged batch is still a committed one. The leader
takes the queue once its transaction has begun, so the writes that arrived while it
waited for the database (another process's turn) join it, and while a group
commits the next one gathers: the busier the server, the larger the groups, with
no timer and no added wait when it is quiet (a lone request is a group of one).
A group of three 10-span batches costs 0.38 ms of CPU a batch where one alone
costs 0.65 ms (its commit syncs the WAL; most pages it writes are the same).

A write (``fn``) runs on the leader's thread and connection: it must use nothing
of its request thread's state but what it closes over, may run twice, and must not
commit on its own. When one raises, its group is rolled back and every write of it
runs once more, each in its own transaction: a bad batch never fails the batches it
was grouped with, and each request gets its own outcome. So does a commit that
fails for a reason of a write's (a deferred foreign key, which PostgreSQL and SQLite
check at the commit: not the database being busy, ``database_busy``): the write at
fault fails alone. A busy database failing the whole group (the lock not had in
time, a lost connection) fails every write of the group alike (503: send again),
as it would have one transaction.

Inside a transaction already (a management command, a test's transaction), a write
runs in it, alone, as before.

One thread may queue several writes at once (``pending_store_all``): the OTLP/HTTP
receiver (ingest.receiver_app) serves many connections from one thread and stores the
requests that arrived together as one group, with no thread to hand them between.

Writes of one kind may also be stored as one (``Together``): a group's span batches
of one project are one insert, one lookup of their traces and one derivation note,
not one each. On PostgreSQL every statement is a round trip and a plan; 16 batches
of 10 spans cost 16 times what one batch of 160 does in statements. The merged
write must give each write its own result; when it cannot tell them apart (some of
the rows were stored already: a retried batch) it raises ``Unmerged`` and the group
runs again with each write alone, as when one write fails.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Generic, Hashable, Iterable, Sequence, TypeVar

from django.db import OperationalError, connection, transaction

from dashboard.observatory.busy import database_busy
from dashboard.priority import ingest_transaction

T = TypeVar("T")

MAX_GROUP = 32  # writes one transaction takes at most (a process runs a few ingest requests at once)
# Rows one group stores at most: a big batch is a group of its own (its commit is already
# a small part of its cost), so a transaction, the write lock's hold and the dirty pages
# SQLite keeps for it stay those of one big batch.
MAX_GROUP_ROWS = 1_000


class Unmerged(Exception):
    """A merged write cannot give each of its writes its own result, or a write that
    took its first try's shortcut (``first_try``) met what needs the long way: run
    each write of the group alone (and not first tries)."""


_attempt = threading.local()  # .first: running a group's writes for the first time


def first_try() -> bool:
    """True while the writes of a group run for the first time: a write may take a
    shortcut that fails on a rare case (PostgreSQL's COPY with no savepoint, failing
    on a stored row) and then raise ``Unmerged``: it runs again alone, without."""
    return getattr(_attempt, "first", False)


@dataclass(frozen=True, slots=True)
class Together:
    """How a write is stored with others of its kind in one group: ``store`` takes
    the ``part`` of each write with an equal ``key`` (two or more, in queue order) and
    returns each one's result in that order, or raises ``Unmerged``."""

    key: Hashable
    part: Any
    store: Callable[[list[Any]], list[Any]]


@dataclass(frozen=True, slots=True)
class Pending(Generic[T]):
    """One request's writes, prepared outside the transaction: ``write`` stores about
    ``rows`` rows and returns the result; with no ``write`` (nothing to store) the
    result is ``empty``. ``together``: how it may be stored with others as one."""

    write: Callable[[], T] | None
    rows: int
    empty: T
    together: Together | None = None


class _Write:
    __slots__ = ("fn", "rows", "together", "result", "error", "lead", "done", "ready")

    def __init__(self, fn: Callable[[], Any], rows: int, together: Together | None = None) -> None:
        self.fn = fn
        self.rows = rows
        self.together = together
        self.result: Any = None
        self.error: BaseException | None = None
        self.lead = False  # woken to lead the next group, not with an outcome
        self.done = False  # has its outcome
        self.ready = threading.Event()

    def finish(self, *, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error, self.done = result, error, True
        self.ready.set()


class GroupCommit:
    """One process's queue of writes waiting for a transaction, and who leads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list[_Write] = []
        self._leading = False  # a thread is running a group; invariant: queue non-empty => leading
        self.groups = 0  # transactions committed or tried (for tests and benchmarks)

    def run(self, fn: Callable[[], T], rows: int = 0, together: Together | None = None) -> T:
        """Run ``fn`` (which stores about ``rows`` rows) in a transaction shared with
        the writes queued alongside it (and with those ``together`` merges it with, as
        one write); return its result (or raise its error) once that transaction
        committed."""
        if connection.in_atomic_block:
            with transaction.atomic():
                return fn()
        write = _Write(fn, rows, together)
        self._wait([write])
        if write.error is not None:
            raise write.error
        return write.result

    def run_all(
        self, calls: Sequence[tuple[Callable[[], Any], int, Together | None]]
    ) -> list[tuple[Any, BaseException | None]]:
        """Run several writes of this thread (fn, rows, together), in order, in the
        group transactions (those of other threads may join them); once all
        committed, each one's (result, None), or (None, the exception it raised)."""
        if connection.in_atomic_block:
            outcomes: list[tuple[Any, BaseException | None]] = []
            for fn, _, _ in calls:
                try:
                    with transaction.atomic():
                        outcomes.append((fn(), None))
                except Exception as exc:  # noqa: BLE001 - each write its own outcome
                    outcomes.append((None, exc))
            return outcomes
        writes = [_Write(fn, rows, together) for fn, rows, together in calls]
        self._wait(writes)
        return [(write.result, write.error) for write in writes]

    def _wait(self, writes: list[_Write]) -> None:
        """Queue ``writes`` and return once each has its outcome, leading a group
        whenever the lead comes to this thread (it is then the first write queued)."""
        if not writes:
            return  # (taking the lead for nothing would leave it taken)
        with self._lock:
            self._queue.extend(writes)
            lead = not self._leading
            self._leading = True
        try:
            for write in writes:
                while not write.done:
                    if lead:
                        lead = False
                        self._lead()
                        continue
                    write.ready.wait()  # an outcome, or the lead
                    if write.lead and not write.done:
                        write.lead, lead = False, True
        except BaseException:
            self._abandon(writes, leading=lead)
            raise

    def _abandon(self, writes: list[_Write], *, leading: bool) -> None:
        """This thread stops waiting (an interrupt): its writes still queued leave the
        queue, and a lead it holds (or was just handed) goes to the next write queued."""
        with self._lock:
            leading = leading or any(write.lead and not write.done for write in writes)
            mine = {id(write) for write in writes}
            self._queue = [write for write in self._queue if id(write) not in mine]
            if leading:
                if self._queue:
                    self._queue[0].lead = True
                    self._queue[0].ready.set()
                else:
                    self._leading = False

    def _lead(self) -> None:
        """Commit the writes queued once this thread's transaction began (its own
        write is among them: the first queued); then hand the lead to the first
        write still queued, if any."""
        group: list[_Write] = []
        try:
            self._commit(group)
        except BaseException as exc:  # noqa: BLE001 - every write must get an outcome
            for write in group:
                if not write.done:
                    write.finish(error=exc)
            raise
        finally:
            with self._lock:
                if self._queue:
                    following = self._queue[0]
                    following.lead = True
                    following.ready.set()
                else:
                    self._leading = False

    def _take(self, group: list[_Write]) -> None:
        """The writes queued, from the first, while they fit: MAX_GROUP writes and
        MAX_GROUP_ROWS rows at most, the first always."""
        with self._lock:
            count = fitting((write.rows for write in self._queue), count=MAX_GROUP, total=MAX_GROUP_ROWS)
            group.extend(self._queue[:count])
            del self._queue[:count]

    def _commit(self, group: list[_Write], *, reconnected: bool = False) -> None:
        self.groups += 1
        began = ran = False
        kept = connection.connection  # the database connection this thread kept, if any
        try:
            with ingest_transaction():
                began = True
                # Taken only now: the writes queued while this transaction waited for
                # the database (another process's turn) join it.
                if not reconnected:
                    self._take(group)
                _attempt.first = True
                try:
                    results = _run_group(group)
                finally:
                    _attempt.first = False
                ran = True
        except Exception as exc:  # noqa: BLE001 - each write gets an outcome
            if not began:
                self._take(group)
            _close_if_left_in_transaction()
            if not ran and not reconnected and isinstance(exc, OperationalError) and _lost(kept):
                # The database dropped this thread's connection (a restart, an idle
                # timeout) and the group's transaction found out: once more on a new
                # one, as ingest's reads outside a transaction reconnect
                # (common.reconnecting), so a dropped connection costs a reconnect, not a 503.
                # (Django has opened a new one already, or opens it at the next statement.)
                self._commit(group, reconnected=True)
                return
            if (not began or (ran and database_busy(exc))
                    or (len(group) == 1 and not isinstance(exc, Unmerged))):
                # The transaction itself failed (no lock in time, a lost connection, a busy
                # commit), or the one write did: the same outcome as a transaction of its own.
                _finish(group, error=exc)
                return
            # One write failed, or the commit did on what one wrote (a deferred constraint),
            # or Unmerged: run each alone, each its own outcome.
            for write in group:
                self.groups += 1
                try:
                    with ingest_transaction():
                        result = write.fn()
                except Exception as alone:  # noqa: BLE001
                    _close_if_left_in_transaction()
                    write.finish(error=alone)
                else:
                    write.finish(result=result)
            return
        for write, result in zip(group, results):
            write.finish(result=result)


def _close_if_left_in_transaction() -> None:
    """Close this thread's connection if a failed commit left it inside its transaction:
    SQLite keeps a transaction (and the database's write lock) open when its COMMIT
    fails on a deferred foreign key, and Django, which runs that COMMIT when it turns
    autocommit back on, then takes the connection for one whose transaction someone
    else manages: the next writes would run in it and never commit. Closed, it rolls
    back; the next statement opens a new one."""
    if connection.connection is not None and not connection.get_autocommit():
        connection.close()


def _lost(kept: Any) -> bool:
    """Whether the connection ``kept`` before a transaction that failed was lost: the
    database dropped it (psycopg marks it broken or closed) or Django closed it."""
    if kept is None:
        return False
    return connection.connection is not kept or bool(getattr(kept, "broken", False) or getattr(kept, "closed", False))


def _run_group(group: list[_Write]) -> list[Any]:
    """Each write's result, in group order; writes with the same ``Together`` key and
    store run as one call (where the first of them is queued)."""
    runs: dict[Any, list[int]] = {}
    for index, write in enumerate(group):
        together = write.together
        runs.setdefault(index if together is None else (together.store, together.key), []).append(index)
    results: list[Any] = [None] * len(group)
    for indexes in runs.values():
        if len(indexes) == 1:
            results[indexes[0]] = group[indexes[0]].fn()
            continue
        store = group[indexes[0]].together.store  # type: ignore[union-attr]
        merged = store([group[index].together.part for index in indexes])  # type: ignore[union-attr]
        for index, result in zip(indexes, merged, strict=True):
            results[index] = result
    return results


def fitting(sizes: Iterable[int], *, count: int, total: int) -> int:
    """How many of the items of these ``sizes``, from the first, make one group: at
    most ``count`` items and ``total`` in size, the first always (alone if larger)."""
    taken = summed = 0
    for size in sizes:
        if taken and (taken >= count or summed + size > total):
            break
        taken, summed = taken + 1, summed + size
    return taken


def _finish(group: list[_Write], *, error: BaseException) -> None:
    for write in group:
        write.finish(error=error)


_process = GroupCommit()


def ingest_write(fn: Callable[[], T], rows: int, together: Together | None = None) -> T:
    """Run one ingest request's writes (``fn``, about ``rows`` rows) in this
    process's next group transaction; returns after its commit. See the module's text."""
    return _process.run(fn, rows, together)


def pending_store(pending: Pending[T]) -> T:
    """Store one prepared request (``ingest_write``); nothing to store returns at once."""
    return pending.empty if pending.write is None else ingest_write(pending.write, pending.rows, pending.together)


def pending_store_all(pendings: Sequence[Pending[Any]]) -> list[tuple[Any, BaseException | None]]:
    """Store several prepared requests of this thread together (``GroupCommit.run_all``):
    each one's (result, None) or (None, its exception), once all committed."""
    writes = [(index, pending) for index, pending in enumerate(pendings) if pending.write is not None]
    outcomes: list[tuple[Any, BaseException | None]] = [(pending.empty, None) for pending in pendings]
    stored = _process.run_all([(pending.write, pending.rows, pending.together) for _, pending in writes])  # type: ignore[misc]
    for (index, _), outcome in zip(writes, stored):
        outcomes[index] = outcome
    return outcomes
