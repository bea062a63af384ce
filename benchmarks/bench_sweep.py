"""The hourly beat's reads of busy recent minutes: what the sweep of the
conversations' minute slices and the link pass cost in time and in memory.

    .venv/bin/python -m benchmarks.bench_sweep                       # 200 x 10 x 150 calls
    .venv/bin/python -m benchmarks.bench_sweep --per-minute 500 --database-url postgres://...

A fresh SQLite data dir (or ``--database-url``), in this process. --conversations
conversations each with --per-minute tool calls a minute for 10 minutes, every one
naming its model (as the demo agent's records do) and none linked to a span (the
project has one span; the link pass walked them all until it stopped reading tool
executions, 2026-11-28), inserted with bulk_create.
Then, as the beat runs them: the sweep of those minutes (``slices_sweep``: steps of
200 conversations x 10 minutes, reads and writes), ``hours_with_rows`` and the link
sweep over the project (``schedule.links_sweep``), each timed, then the sweep and the link
pass again under tracemalloc for their peaks of Python allocations (traced
separately: tracing slows them several times). Printed: rows, seconds and peak MiB.
Target: their memory does not grow with the calls in the minutes.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
import uuid
from datetime import timedelta

from benchmarks.load import fresh_django

MINUTES = 10


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--per-minute", type=int, default=150, help="tool calls a conversation a minute")
    parser.add_argument("--database-url", default="")
    args = parser.parse_args(argv)
    if args.conversations <= 0 or args.per_minute <= 0:
        raise SystemExit("--conversations and --per-minute must be positive")
    with fresh_django("bench-sweep-", args.database_url):
        run(args)


def run(args: argparse.Namespace) -> None:
    from django.utils import timezone

    from dashboard.accounts.services import project_create
    from dashboard.observatory.derive.passes import rollups, totals
    from dashboard.observatory.derive.schedule import links_sweep
    from dashboard.observatory.models import Conversation, Span, ToolExecution, minute_of

    project = project_create(name="sweep", slug=f"sweep-{uuid.uuid4().hex[:8]}")
    start = minute_of(timezone.now()) - timedelta(minutes=MINUTES + 5)
    conversations = Conversation.objects.bulk_create(
        [Conversation(project=project, external_id=f"c{n}") for n in range(args.conversations)])
    rows, stored = [], 0
    for conversation in conversations:
        for minute in range(MINUTES):
            for call in range(args.per_minute):
                rows.append(ToolExecution(
                    project=project, conversation=conversation, record_id=uuid.uuid4(), tool_name="search",
                    tool_call_id=f"call-{conversation.pk}-{minute}-{call}", output_level="standard", success=True,
                    model="gpt-4o", occurred_at=start + timedelta(minutes=minute, seconds=call * 59 / args.per_minute)))
        if len(rows) >= 20_000:
            ToolExecution.objects.bulk_create(rows)
            stored, rows = stored + len(rows), []
    ToolExecution.objects.bulk_create(rows)
    stored += len(rows)
    Span.objects.create(project=project, trace_id="1" * 32, span_id="1" * 16, start_time=start, end_time=start)

    began = time.perf_counter()
    updated = totals.slices_sweep(project_id=project.pk, since=start)
    sweep_seconds = time.perf_counter() - began
    began = time.perf_counter()
    hours = rollups.hours_with_rows(project_id=project.pk, since=start)
    hours_seconds = time.perf_counter() - began
    began = time.perf_counter()
    links_sweep(project.pk)
    links_seconds = time.perf_counter() - began
    peaks = []
    for beat_read in (lambda: totals.slices_sweep(project_id=project.pk, since=start),
                      lambda: links_sweep(project.pk)):
        tracemalloc.start()
        beat_read()
        peaks.append(tracemalloc.get_traced_memory()[1] / 2**20)
        tracemalloc.stop()
    print(f"{stored:,} tool calls in {args.conversations} conversations x {MINUTES} minutes "
          f"({args.per_minute} a minute each, all naming a model)")
    print(f"sweep of the minutes since: {sweep_seconds:.2f} s ({updated} conversations updated), "
          f"peak {peaks[0]:.1f} MiB of Python allocations")
    print(f"hours_with_rows: {hours_seconds:.2f} s ({len(hours)} hour(s))")
    print(f"link sweep of the project (the beat's): {links_seconds:.2f} s, peak {peaks[1]:.1f} MiB of Python allocations")


if __name__ == "__main__":
    main()
