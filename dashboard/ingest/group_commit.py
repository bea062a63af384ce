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
was grouped with, and each request gets its own outcome. A database error of the
whole group (the lock not had in time, a lost connection) fails every write of the
group alike (503: send again), as it would have one transaction.

Inside a transaction already (a management command, a test's transaction), a write
runs in it, alone, as before.

One thread may queue several writes at once (``pending_store_all``): the OTLP/HTTP
receiver (ingest.receiver) serves many connections from one thread and stores the
requests that arrived together as one group, with no thread to hand them between.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, Sequence, TypeVar

from django.db import connection, transaction

from dashboard.priority import ingest_transaction

T = TypeVar("T")

MAX_GROUP = 32  # writes one transaction takes at most (a process runs a few ingest requests at once)
# Rows one group stores at most: a big batch is a group of its own (its commit is already
# a small part of its cost), so a transaction, the write lock's hold and the dirty pages
# SQLite keeps for it stay those of one big batch.
MAX_GROUP_ROWS = 1_000


@dataclass(frozen=True, slots=True)
class Pending(Generic[T]):
    """One request's writes, prepared outside the transaction: ``write`` stores about
    ``rows`` rows and returns the result; with no ``write`` (nothing to store) the
    result is ``empty``."""

    write: Callable[[], T] | None
    rows: int
    empty: T


class _Write:
    __slots__ = ("fn", "rows", "result", "error", "lead", "done", "ready")

    def __init__(self, fn: Callable[[], Any], rows: int) -> None:
        self.fn = fn
        self.rows = rows
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

    def run(self, fn: Callable[[], T], rows: int = 0) -> T:
        """Run ``fn`` (which stores about ``rows`` rows) in a transaction shared with
        the writes queued alongside it; return its result (or raise its error) once
        that transaction committed."""
        if connection.in_atomic_block:
            with transaction.atomic():
                return fn()
        write = _Write(fn, rows)
        self._wait([write])
        if write.error is not None:
            raise write.error
        return write.result

    def run_all(self, calls: Sequence[tuple[Callable[[], Any], int]]) -> list[tuple[Any, BaseException | None]]:
        """Run several writes of this thread, in order, in the group transactions
        (those of other threads may join them); once all committed, each one's
        (result, None), or (None, the exception it raised)."""
        if connection.in_atomic_block:
            outcomes: list[tuple[Any, BaseException | None]] = []
            for fn, _ in calls:
                try:
                    with transaction.atomic():
                        outcomes.append((fn(), None))
                except Exception as exc:  # noqa: BLE001 - each write its own outcome
                    outcomes.append((None, exc))
            return outcomes
        writes = [_Write(fn, rows) for fn, rows in calls]
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

    def _commit(self, group: list[_Write]) -> None:
        self.groups += 1
        began = ran = False
        try:
            with ingest_transaction():
                began = True
                # Taken only now: the writes queued while this transaction waited for
                # the database (another process's turn) join it.
                self._take(group)
                results = [write.fn() for write in group]
                ran = True
        except Exception as exc:  # noqa: BLE001 - each write gets an outcome
            if not began:
                self._take(group)
            if not began or ran or len(group) == 1:
                # The transaction itself failed (no lock in time, a lost connection, the
                # commit), or the one write did: the same outcome as a transaction of its own.
                _finish(group, error=exc)
                return
            for write in group:  # one write failed: run each alone, each its own outcome
                self.groups += 1
                try:
                    with ingest_transaction():
                        result = write.fn()
                except Exception as alone:  # noqa: BLE001
                    write.finish(error=alone)
                else:
                    write.finish(result=result)
            return
        for write, result in zip(group, results):
            write.finish(result=result)


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


def ingest_write(fn: Callable[[], T], rows: int) -> T:
    """Run one ingest request's writes (``fn``, about ``rows`` rows) in this
    process's next group transaction; returns after its commit. See the module's text."""
    return _process.run(fn, rows)


def pending_store(pending: Pending[T]) -> T:
    """Store one prepared request (``ingest_write``); nothing to store returns at once."""
    return pending.empty if pending.write is None else ingest_write(pending.write, pending.rows)


def pending_store_all(pendings: Sequence[Pending[Any]]) -> list[tuple[Any, BaseException | None]]:
    """Store several prepared requests of this thread together (``GroupCommit.run_all``):
    each one's (result, None) or (None, its exception), once all committed."""
    writes = [(index, pending) for index, pending in enumerate(pendings) if pending.write is not None]
    outcomes: list[tuple[Any, BaseException | None]] = [(pending.empty, None) for pending in pendings]
    stored = _process.run_all([(pending.write, pending.rows) for _, pending in writes])  # type: ignore[misc]
    for (index, _), outcome in zip(writes, stored):
        outcomes[index] = outcome
    return outcomes
