"""Does the hourly link sweep cost more as history grows? Its time after 1, 2 and 3
days of unlinked rows beneath the same last hour.

    .venv/bin/python -m benchmarks.bench_link_history                  # 3 days x 300,000 executions
    .venv/bin/python -m benchmarks.bench_link_history --per-day 1000000 --database-url postgres://...

A fresh SQLite data dir (or ``--database-url``), in this process. Each day adds
--per-day tool executions that no span will ever describe (an agent that sends
records and no spans: the soak's 732,450 such calls an hour) and --per-day / 10 plain
spans with no conversation (HTTP calls), spread over that day, inserted with
bulk_create; the last hour holds the same --recent rows every time. After each day the
sweep (the hourly beat's link pass over the project) runs three times, timed; the
median is printed with the rows it linked. Target: flat from day 1 to day 3 (the
work follows the last hour's arrivals, not the days before).

To compare with code where the beat's pass is ``tasks.links_refresh`` (before the
derivation engine), run this file from that checkout with this ``load.fresh_django``
beside it: it calls that when ``derive.schedule`` does not exist.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from datetime import timedelta

from benchmarks.load import fresh_django

DAYS = 3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-day", type=int, default=300_000, help="unlinked tool executions a day")
    parser.add_argument("--recent", type=int, default=5_000, help="tool executions and spans of the last hour")
    parser.add_argument("--database-url", default="")
    args = parser.parse_args(argv)
    if args.per_day <= 0 or args.recent <= 0:
        raise SystemExit("--per-day and --recent must be positive")
    with fresh_django("bench-link-history-", args.database_url):
        run(args)


def sweep_function():
    """The beat's link pass of one project, as this checkout names it."""
    try:
        from dashboard.observatory.derive.schedule import links_sweep
    except ImportError:  # the code before the derivation engine
        from dashboard.observatory import tasks

        return lambda project_id: tasks.links_refresh(project_id)
    return links_sweep


def run(args: argparse.Namespace) -> None:
    from django.utils import timezone

    from dashboard.accounts.services import project_create
    from dashboard.observatory.models import Conversation, Span, ToolExecution

    sweep = sweep_function()
    project = project_create(name="history", slug=f"history-{uuid.uuid4().hex[:8]}")
    conversations = Conversation.objects.bulk_create(
        [Conversation(project=project, external_id=f"c{n}") for n in range(200)])
    now = timezone.now()

    def executions(count: int, start, span_seconds: float, tag: str) -> None:
        rows = []
        for n in range(count):
            at = start + timedelta(seconds=span_seconds * n / count)
            rows.append(ToolExecution(
                project=project, conversation=conversations[n % len(conversations)], record_id=uuid.uuid4(),
                tool_name="search", tool_call_id=f"{tag}-{n}", output_level="standard", success=True,
                occurred_at=at, received_at=at))
            if len(rows) == 20_000:
                ToolExecution.objects.bulk_create(rows)
                rows = []
        ToolExecution.objects.bulk_create(rows)

    def plain_spans(count: int, start, span_seconds: float, tag: str) -> None:
        rows = []
        for n in range(count):
            at = start + timedelta(seconds=span_seconds * n / count)
            rows.append(Span(project=project, trace_id=uuid.uuid4().hex, span_id=uuid.uuid4().hex[:16],
                             name=f"GET /{tag}", start_time=at, end_time=at, received_at=at))
            if len(rows) == 20_000:
                Span.objects.bulk_create(rows)
                rows = []
        Span.objects.bulk_create(rows)

    recent_start = now - timedelta(hours=1)
    executions(args.recent, recent_start, 3600, "recent")
    plain_spans(args.recent, recent_start, 3600, "recent")
    print(f"the last hour: {args.recent:,} unlinked tool executions and {args.recent:,} plain spans")
    for day in range(1, DAYS + 1):
        day_start = recent_start - timedelta(days=day)
        began = time.perf_counter()
        executions(args.per_day, day_start, 86400, f"day{day}")
        plain_spans(args.per_day // 10, day_start, 86400, f"day{day}")
        seeded = time.perf_counter() - began
        times, linked = [], None
        for _ in range(3):
            began = time.perf_counter()
            counts = sweep(project.pk)
            times.append(time.perf_counter() - began)
            linked = linked if linked is not None else counts
        print(f"after day {day} ({day * args.per_day:,} older executions, {day * args.per_day // 10:,} older spans; "
              f"seeded in {seeded:.0f} s): sweep {statistics.median(times):.3f} s median of 3 "
              f"({min(times):.3f}-{max(times):.3f}); first run linked {linked.get('tool_executions', 0)} executions, "
              f"{linked.get('spans', 0)} spans")


if __name__ == "__main__":
    main()
