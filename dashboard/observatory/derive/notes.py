"""The ingest side of the derivations: what a writer calls, and nothing else.

A writer (records, OTLP spans and logs, artifact uploads, a repricing) calls
``derivations_enqueue`` inside the transaction that stores its rows: the note
(DerivationNote) commits with them or not at all, so a ``kill -9`` never loses the
derivations of acknowledged rows. After the commit the wakers registered at start-up
are called (``waker_register``: the embedded runner's thread, or a Celery task);
this module knows nothing of who they are, so ingest never imports the drainer.

Also here, because ingest and the admin read and change the notes table too:
``backlog_seconds`` (ingest's 429 while derivations are behind), ``notes_ready``
and ``notes_retry`` (the admin's "retry now").
"""

from __future__ import annotations

import functools
import logging
from datetime import datetime
from typing import Callable, Iterable

from django.db import connections, router, transaction
from django.db.models import Min, Q
from django.utils import timezone

from ..models import DerivationNote, hour_of, minute_of

logger = logging.getLogger(__name__)

_wakers: list[Callable[[], None]] = []


def waker_register(waker: Callable[[], None]) -> None:
    """Have ``waker`` called after each commit that wrote a note (at start-up, once)."""
    if waker not in _wakers:
        _wakers.append(waker)


def wake() -> None:
    """Tell the registered drainers that notes wait (after a commit). A waker that
    fails is logged: the note is committed and the next poll drains it."""
    for waker in list(_wakers):
        try:
            waker()
        except Exception:
            logger.exception("waking the derivation drainer failed; the next poll drains the note")


def derivations_enqueue(
    *,
    project_id: int,
    conversation_ids: Iterable[int] = (),
    hours: Iterable[datetime] = (),
    artifact_ids: Iterable[str] = (),
    trace_ids: Iterable[str] = (),
    rows_from: datetime | None = None,
    minutes: Iterable[datetime] = (),
) -> None:
    """Record the derivations a write needs: conversation totals, tool rollups
    of the minutes its tool rows fall in (or of whole hours), links between spans, records and artifacts, traces whose spans to link. Records, OTLP spans and
    artifact uploads all come here, inside the transaction that stores their rows:
    the note (derive.drain) commits with them or not at all, so a crash never
    loses derivations of acknowledged rows. After the commit the drainer is told.
    ``rows_from``: a time taken before the rows were stamped received (their
    derivation then reads the rows received from it, nothing earlier)."""
    conversation_list = sorted(set(conversation_ids))
    hour_list = sorted({hour_of(hour).isoformat() for hour in hours})
    minute_list = sorted({minute_of(minute).isoformat() for minute in minutes})
    artifact_list = sorted(set(artifact_ids))
    trace_list = sorted(set(trace_ids))
    if not conversation_list and not hour_list and not minute_list and not artifact_list and not trace_list:
        return
    note_write(project_id=project_id, conversation_ids=conversation_list, hours=hour_list, minutes=minute_list,
               artifact_ids=artifact_list, trace_ids=trace_list, rows_from=rows_from)
    # The batch and its note are committed then; a failing waker (broker down, an
    # eager pass's error) is logged by wake() and the note drained by the next poll.
    transaction.on_commit(wake)


def note_write(
    *, project_id: int, conversation_ids: list[int], hours: list[str], artifact_ids: list[str],
    trace_ids: list[str] = (), rows_from: datetime | None = None, minutes: list[str] = (),
) -> None:
    """Record work to derive; call it inside the transaction that stores the rows
    (``rows_from``: a time taken before they were stamped received).

    One hand-written INSERT (values prepared by the model's fields, so each
    database gets what the ORM would send): every ingest request with something
    to derive writes a note, and the ORM's ``create`` cost about 0.3 ms more."""
    now = timezone.now()
    values = {
        "project_id": project_id, "conversation_ids": conversation_ids, "hours": hours, "minutes": list(minutes),
        "artifact_ids": artifact_ids, "trace_ids": list(trace_ids), "created_at": now, "rows_from": rows_from,
        "available_at": now,
        "claimed_until": None, "attempts": 0, "last_error": "", "parked": False,
    }
    connection = connections[router.db_for_write(DerivationNote)]
    fields = _note_fields()
    with connection.cursor() as cursor:
        cursor.execute(
            _note_insert(connection.alias),
            [field.get_db_prep_save(values[field.attname], connection) for field in fields],
        )


@functools.cache
def _note_fields() -> tuple:
    return tuple(field for field in DerivationNote._meta.concrete_fields if not field.primary_key)


@functools.cache
def _note_insert(alias: str) -> str:
    quote = connections[alias].ops.quote_name
    fields = _note_fields()
    return (
        f"INSERT INTO {quote(DerivationNote._meta.db_table)} ({', '.join(quote(field.column) for field in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))})"
    )


def ready(now) -> Q:
    """The notes a drainer may claim now: not parked, due, and not leased."""
    return Q(parked=False, available_at__lte=now) & (Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))


def notes_ready() -> bool:
    return DerivationNote.objects.filter(ready(timezone.now())).exists()


def backlog_seconds() -> float:
    """How long the oldest note due has waited, while a drainer is at work (one
    holds a lease); 0 when none is: then nothing derives (no runner, the Celery
    workers down), and slowing ingest down would not help. Two queries on the
    ``note_ready`` index and the small notes table."""
    now = timezone.now()
    oldest = DerivationNote.objects.filter(parked=False, available_at__lte=now).aggregate(
        oldest=Min("available_at"))["oldest"]
    if oldest is None or not DerivationNote.objects.filter(claimed_until__gt=now).exists():
        return 0.0
    return (now - oldest).total_seconds()


def notes_retry(*, ids: Iterable[int]) -> int:
    """Make parked or waiting notes ready again now (the admin's "retry now")."""
    return DerivationNote.objects.filter(id__in=list(ids)).update(
        parked=False, available_at=timezone.now(), claimed_until=None, attempts=0
    )
