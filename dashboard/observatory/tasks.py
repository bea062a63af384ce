"""Celery tasks: each takes ids, calls the derivation engine, and is idempotent (it
recomputes from rows), so a retry or a duplicate delivery is harmless. With no
broker nothing sends them: the embedded runner (derive.runner) calls the same
functions on its own thread."""

from __future__ import annotations

from datetime import datetime

from celery import shared_task

from .derive import drain, schedule
from .derive.passes import rollups, totals


@shared_task(name="observatory.outbox_drain")
def outbox_drain() -> dict[str, int]:
    """Drain the derivation outbox (after commits, and every few seconds by beat)."""
    outcome = drain.outbox_drain_all(wait=False)  # SQLite: a drainer at work already drains these
    return {"notes": outcome.notes, "failed": outcome.failed, "parked": outcome.parked}


@shared_task(name="observatory.conversation_totals_refresh")
def conversation_totals_refresh(conversation_ids: list[int], minutes: list[str] | None = None) -> int:
    """A rebuild of these conversations' totals; ``minutes`` (ISO timestamps): those
    whose tool rows changed; None: all of them."""
    return totals.conversation_totals_refresh(
        conversation_ids=conversation_ids,
        minutes=None if minutes is None else [datetime.fromisoformat(minute) for minute in minutes])


@shared_task(name="observatory.tool_rollups_refresh")
def tool_rollups_refresh(project_id: int, hours: list[str], minutes: list[str] | None = None) -> int:
    """A rebuild of tool rollups: ``hours`` (whole) and ``minutes``, ISO timestamps."""
    return rollups.tool_rollups_refresh(
        project_id=project_id, hours=[datetime.fromisoformat(hour) for hour in hours],
        minutes=[datetime.fromisoformat(minute) for minute in minutes or ()],
    )


@shared_task(name="observatory.links_refresh")
def links_refresh(project_id: int) -> dict:
    """The link pass over the recent past, and what follows for the conversations it linked."""
    return schedule.links_sweep(project_id)


@shared_task(name="observatory.rollup_recent_hours")
def rollup_recent_hours(hours_back: int = 3, slice_minutes_back: int = 70) -> int:
    """Beat, hourly: see derive.schedule.rollup_recent_hours."""
    return schedule.rollup_recent_hours(hours_back, slice_minutes_back)


@shared_task(name="observatory.spans_partitions_maintain")
def spans_partitions_maintain() -> list[str]:
    """Beat, hourly: the spans' daily partitions created ahead (PostgreSQL; else nothing)."""
    return schedule.spans_partitions_maintain()


@shared_task(name="observatory.purge_expired")
def purge_expired() -> dict[str, int]:
    """Beat, daily: the retention purge and spent log-in throttle rows."""
    return schedule.purge_expired()
