"""Celery tasks: each takes ids, calls a service, and is idempotent (it recomputes
from rows), so a retry or a duplicate enqueue is harmless. With no broker they run
eagerly in-process after the ingest transaction commits."""

from __future__ import annotations

from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any, Callable, ContextManager

from celery import shared_task
from django.utils import timezone

from dashboard.accounts.models import Project
from dashboard.accounts.throttle import login_throttle_purge

from . import derivations, partitions, services, span_rows


@shared_task(name="observatory.conversation_totals_refresh")
def conversation_totals_refresh(conversation_ids: list[int], minutes: list[str] | None = None) -> int:
    """``minutes`` (ISO timestamps): those whose tool rows changed; None: all of them."""
    return derivations.conversation_totals_refresh(
        conversation_ids=conversation_ids,
        minutes=None if minutes is None else [datetime.fromisoformat(minute) for minute in minutes])


@shared_task(name="observatory.tool_rollups_refresh")
def tool_rollups_refresh(project_id: int, hours: list[str], minutes: list[str] | None = None) -> int:
    """``hours`` (recomputed whole) and ``minutes`` are ISO timestamps (JSON-safe for the broker)."""
    return derivations.tool_rollups_refresh(
        project_id=project_id, hours=[datetime.fromisoformat(hour) for hour in hours],
        minutes=[datetime.fromisoformat(minute) for minute in minutes or ()],
    )


@shared_task(name="observatory.links_refresh")
def links_refresh(
    project_id: int, conversation_ids: list[int] | None = None, artifact_ids: list[str] | None = None,
    since: str | None = None, trace_ids: list[str] | None = None, until: str | None = None,
    minutes_changed: list[str] | None = None, step: Callable[[], ContextManager[Any]] = nullcontext,
) -> dict[str, Any]:
    """Without ids: everything unlinked of the last two days (the beat's pass).
    ``since`` and ``until`` (ISO times, JSON-safe for the broker): with
    ``conversation_ids``, only their rows received between them (the outbox gives
    the times of its notes' batches).
    ``trace_ids``: traces whose spans were linked late before this (their spans
    are derived from whenever they were received).
    ``minutes_changed``: those whose tool rows the batches changed (ISO times), recounted in
    the totals of the conversations that gained spans with the minutes of the rows
    derived here.
    ``step`` (direct calls only, not through a broker): each part of the pass is written
    inside it (the beat's: ``drain_exclusive``; see derivations.links_refresh)."""
    since_time = datetime.fromisoformat(since) if since else None
    until_time = datetime.fromisoformat(until) if until else None
    counts = derivations.links_refresh(
        project_id=project_id, conversation_ids=conversation_ids, artifact_ids=artifact_ids, since=since_time,
        until=until_time, step=step,
    )
    if counts["conversation_ids"]:
        # Spans that just joined a conversation may be model or tool calls: their rows first
        # (after a batch: the spans received since, and those of the traces just linked).
        with step():
            _gained_derive(project_id, counts, since_time, until_time, trace_ids, minutes_changed)
    if artifact_ids is None or conversation_ids is not None:
        # Log records that arrived before their span get the span's conversation.
        with step():
            counts["log_records"] = derivations.log_records_link(
                project_id=project_id,
                conversation_ids=None if conversation_ids is None else [*conversation_ids, *counts["conversation_ids"]],
            )
    return counts


def _gained_derive(project_id: int, counts: dict[str, Any], since: datetime | None, until: datetime | None,
                   trace_ids: list[str] | None, minutes_changed: list[str] | None) -> None:
    """Rows, totals and rollups of the conversations a link pass gave spans."""
    minutes = span_rows.span_rows_derive(project_id=project_id, conversation_ids=counts["conversation_ids"],
                                         since=since, until=until,
                                         trace_ids=[*counts["trace_ids"], *(trace_ids or ())])
    derivations.conversation_totals_refresh(
        conversation_ids=counts["conversation_ids"],
        minutes=minutes | {datetime.fromisoformat(minute) for minute in minutes_changed or ()})
    if minutes:
        derivations.tool_rollups_refresh(project_id=project_id, minutes=minutes)


@shared_task(name="observatory.outbox_drain")
def outbox_drain() -> dict[str, int]:
    """Drain the derivation outbox (after commits, and every few seconds by beat)."""
    from .outbox import outbox_drain_all

    outcome = outbox_drain_all(wait=False)  # SQLite: a drainer at work already drains these
    return {"notes": outcome.notes, "failed": outcome.failed, "parked": outcome.parked}


@shared_task(name="observatory.rollup_recent_hours")
def rollup_recent_hours(hours_back: int = 3, slice_minutes_back: int = 70) -> int:
    """Beat, hourly: recompute the last few hours of every project (links, tool
    rollups), catching spans linked late and anything a lost task missed, and the
    conversations' minute slices of the last ``slice_minutes_back`` minutes (their
    minutes are noted exactly: only a race can leave one behind).

    On SQLite each step (a page of links, the writes of an hour of rollups, a step of
    slices) holds the drain lock, so it runs between drainers' passes and the outbox
    drains between its steps; reading is done outside it. Held for the whole job, the
    hour-long soak's last notes waited behind it for minutes (it reads hours of rows
    on a busy database); held for the whole link pass, they did again (2 notes still
    waiting 240 s after the load: the pass read 6.7M tool executions)."""
    from .outbox import drain_exclusive

    now = timezone.now()
    since = now - timedelta(hours=hours_back)
    written = 0
    for project_id in Project.objects.values_list("pk", flat=True):
        links_refresh(project_id, step=drain_exclusive)
        for hour in sorted(derivations.hours_with_rows(project_id=project_id, since=since)):
            written += derivations.tool_rollups_refresh(project_id=project_id, hours=[hour], step=drain_exclusive)
        derivations.slices_sweep(project_id=project_id, since=now - timedelta(minutes=slice_minutes_back),
                                 step=drain_exclusive)
    return written


@shared_task(name="observatory.spans_partitions_maintain")
def spans_partitions_maintain() -> list[str]:
    """Beat, hourly: the spans' daily partitions created ahead (PostgreSQL; else nothing)."""
    return partitions.spans_partitions_ensure()


@shared_task(name="observatory.purge_expired")
def purge_expired() -> dict[str, int]:
    """Beat, daily: the retention purge of every project, and spent log-in throttle rows.
    On PostgreSQL the span days past every project's retention are dropped whole first.
    On SQLite, between drainers' passes (its deletes take the one write lock too)."""
    from .outbox import drain_exclusive

    totals = {"span_partitions": len(partitions.spans_partitions_drop()),
              "spans": 0, "records": 0, "conversations": 0, "artifacts": 0}
    with drain_exclusive():
        for project in Project.objects.all():
            outcome = services.retention_purge(project=project)
            for name in ("spans", "records", "conversations", "artifacts"):
                totals[name] += getattr(outcome, name)
    totals["login_throttles"] = login_throttle_purge()
    return totals
