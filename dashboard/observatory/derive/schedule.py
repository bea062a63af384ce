"""The periodic jobs: what Celery beat runs, and the embedded runner's own beat.

Hourly: the link pass over recent rows and the recompute of the last hours' tool
rollups and minute slices (what a race left behind), the spans' partitions ahead;
daily: the retention purge. On SQLite each step holds the drain lock
(``drain_exclusive``) so the outbox drains between steps; reading is done outside it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, ContextManager

from django.utils import timezone

from dashboard.accounts.models import Project
from dashboard.accounts.throttle import login_throttle_purge
from dashboard.observatory import partitions
from dashboard.observatory.services import retention_purge

from .batch import Batch
from .drain import drain_exclusive, passes_run
from .passes import links, log_messages, rollups, span_rows, totals


def rollup_recent_hours(hours_back: int = 3, slice_minutes_back: int = 70) -> int:
    """Recompute the last few hours of every project (links, tool rollups),
    catching spans linked late and anything a lost task missed, and the
    conversations' minute slices of the last ``slice_minutes_back`` minutes (their
    minutes are noted exactly: only a race can leave one behind).

    On SQLite each step (a page of links, the writes of an hour of rollups, a step of
    slices) holds the drain lock, so it runs between drainers' passes and the outbox
    drains between its steps; reading is done outside it. Held for the whole job, the
    hour-long soak's last notes waited behind it for minutes (it reads hours of rows
    on a busy database); held for the whole link pass, they did again (2 notes still
    waiting 240 s after the load: the pass read 6.7M tool executions)."""
    now = timezone.now()
    since = now - timedelta(hours=hours_back)
    written = 0
    for project_id in Project.objects.values_list("pk", flat=True):
        links_sweep(project_id)
        for hour in sorted(rollups.hours_with_rows(project_id=project_id, since=since)):
            written += rollups.tool_rollups_refresh(project_id=project_id, hours=[hour], step=drain_exclusive)
        totals.slices_sweep(project_id=project_id, since=now - timedelta(minutes=slice_minutes_back),
                            step=drain_exclusive)
    return written


def links_sweep(project_id: int, *, step: Callable[[], ContextManager[Any]] | None = None) -> dict[str, Any]:
    """The link pass over the unlinked rows of the last hours (links.SWEEP_LOOKBACK),
    then the passes after it for the conversations that gained spans (their whole
    span history: the spans may have been received long before). Each step inside
    ``step()`` (default: the drain lock)."""
    step = step or drain_exclusive
    counts = links.links_refresh(project_id=project_id, step=step)
    if counts["conversation_ids"]:
        batch = Batch(project_id=project_id, conversation_ids=set(counts["conversation_ids"]),
                      linked_traces=set(counts["trace_ids"]))
        with step():
            passes_run(batch, (span_rows.PASS, log_messages.PASS, totals.PASS, rollups.PASS))
    with step():
        counts["log_records"] = links.log_records_link(
            project_id=project_id, since=timezone.now() - links.SWEEP_LOOKBACK)
    return counts


def spans_partitions_maintain() -> list[str]:
    """Hourly: the spans' daily partitions created ahead (PostgreSQL; else nothing)."""
    return partitions.spans_partitions_ensure()


def purge_expired() -> dict[str, int]:
    """Daily: the retention purge of every project, and spent log-in throttle rows.
    On PostgreSQL the span days past every project's retention are dropped whole first.
    On SQLite, between drainers' passes (its deletes take the one write lock too)."""
    totals_purged = {"span_partitions": len(partitions.spans_partitions_drop()),
                     "spans": 0, "records": 0, "conversations": 0, "artifacts": 0}
    with drain_exclusive():
        for project in Project.objects.all():
            outcome = retention_purge(project=project)
            for name in ("spans", "records", "conversations", "artifacts"):
                totals_purged[name] += getattr(outcome, name)
    totals_purged["login_throttles"] = login_throttle_purge()
    return totals_purged
