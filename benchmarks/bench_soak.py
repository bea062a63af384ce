"""Steady ingest for an hour: does the server keep up, derivations included, without
growing?

    .venv/bin/python -m benchmarks.bench_soak                      # 60 minutes, SQLite
    .venv/bin/python -m benchmarks.bench_soak --short              # 10 minutes
    .venv/bin/python -m benchmarks.bench_soak --db postgres --rate 20000

A fresh database (SQLite in a temp data dir, or a private PostgreSQL cluster),
gunicorn with deploy/gunicorn.conf.py and the embedded derivations, and
--agents agents together offering --rate spans per second in mixed batch sizes
(1,000, 512, 100 and 10 spans, a quarter GenAI tool spans naming a conversation,
all of them with --tool-every 1)
plus a batch of tool records after every four span batches, each batch retried
like an exporter until acknowledged. A logged-in reader opens the overview,
conversation list and tools page throughout.

Every --window seconds a line: spans and records stored per second in the window
(from the database), what the agents had acknowledged, the server's RSS and PSS
(master + workers), page p95, and the derivation lag: for each acknowledged record batch,
the seconds until its conversation's stored tool-call total covered it (p95 and
max over the batches that became visible in the window and, as their age so far,
those not visible yet), and the derivation notes waiting. After the load: the
seconds until rollups and links agree with the rows (benchmarks.load.divergence).

``--lock-probe`` (SQLite) adds a line a window: the share of it ingest and the
derivations held SQLite's one write lock (benchmarks/sqlite_lock_probe.py).
``--keep`` leaves the data dir for ``benchmarks.sqlite_floor``: what SQLite alone
takes to insert the rows the soak stored, the floor under any code on its one writer.

Targets: lag p95 < 10 s, PSS < 400 MB and flat over the hour (the last window
within 10 % of the first after warm-up; PSS counts a page the workers share with
the master once, where RSS summed counts it in every process), page p95 < 500 ms,
rollups and links agreeing with the rows within 60 s of the load's end.
"""

from __future__ import annotations

import argparse
import bisect
import sys
import tempfile
import threading
import time
from collections import defaultdict
from contextlib import nullcontext
from pathlib import Path

from benchmarks import sqlite_lock_probe
from benchmarks.bench_ingest import manage, private_postgres, remove_unless_kept
from benchmarks.load import (
    Acknowledged,
    Agent,
    PageReader,
    RssSampler,
    Server,
    conversation_tool_calls,
    django_env,
    percentile,
    project_key_and_session,
    setup_django,
    wait_until_converged,
    waiting_notes,
)

BATCH_SIZES = (1000, 512, 100, 10)


class LagTracker:
    """When each acknowledged record batch became visible in its conversation's total."""

    def __init__(self, acknowledged: Acknowledged) -> None:
        self.acknowledged = acknowledged
        self.seen = 0  # acked_at entries folded into the cumulative lists
        self.cumulative: dict[str, tuple[list[float], list[int]]] = defaultdict(lambda: ([], []))
        self.visible_upto: dict[str, int] = defaultdict(int)  # index of the first not-yet-visible batch
        self.lags: list[tuple[float, float]] = []  # (visible at, lag seconds)

    def poll(self, project_id: int) -> None:
        with self.acknowledged.lock:
            new = self.acknowledged.acked_at[self.seen:]
            self.seen += len(new)
        for at, conversation, items in new:
            times, totals = self.cumulative[conversation]
            times.append(at)
            totals.append((totals[-1] if totals else 0) + items)
        pending = [c for c, (times, _) in self.cumulative.items() if self.visible_upto[c] < len(times)]
        if not pending:
            return
        now = time.time()
        stored = conversation_tool_calls(project_id, pending)
        for conversation in pending:
            times, totals = self.cumulative[conversation]
            upto = bisect.bisect_right(totals, stored.get(conversation, 0))
            for index in range(self.visible_upto[conversation], upto):
                self.lags.append((now, now - times[index]))
            self.visible_upto[conversation] = max(self.visible_upto[conversation], upto)

    def window(self, since: float) -> list[float]:
        return [lag for at, lag in self.lags if at >= since]

    def waiting(self, now: float) -> list[float]:
        """The ages of the batches not visible yet: each lag is at least that. They
        count in the figures, or a batch that never became visible would drop out
        of them (a run with 30,000 notes stuck showed a lag p95 of 1.9 s)."""
        return [now - times[index] for conversation, (times, _) in self.cumulative.items()
                for index in range(self.visible_upto[conversation], len(times))]


def stored_counts(project_id: int) -> tuple[int, int]:
    """Rows stored so far, from the highest ids (a COUNT(*) of millions of rows
    would itself load the database every window)."""
    from django.db.models import Max

    from dashboard.observatory.models import Span, ToolExecution

    spans = Span.objects.filter(project_id=project_id).aggregate(n=Max("id"))["n"] or 0
    records = ToolExecution.objects.filter(project_id=project_id).aggregate(n=Max("id"))["n"] or 0
    return spans, records


def notes_waiting() -> int:
    from dashboard.observatory.models import DerivationNote

    return DerivationNote.objects.count()


def run(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-soak-{args.db}-"))
    try:
        with private_postgres(workdir) if args.db == "postgres" else nullcontext("") as database_url:
            env = django_env(workdir, database_url)
            manage(env, "migrate", "--noinput")
            setup_django(env)
            project, key, session = project_key_and_session()
            options: tuple[str, ...] = ()
            probe = workdir / "lock-probe" if args.lock_probe else None
            if probe is not None:
                probe.mkdir()
                env[sqlite_lock_probe.DIR] = str(probe)
                options = ("-c", str(Path(__file__).with_name("gunicorn_lock_probe.conf.py")))
            server = Server(env, options=options)
            server.start()
            try:
                soak([server], project, key, session, args, lock_probe=probe)
            finally:
                server.stop()
    finally:
        remove_unless_kept(workdir, args.keep, f"data kept in {workdir / 'data'}")


def soak_agents(ports: tuple[int, ...], key: str, acknowledged: Acknowledged, *, agents: int,
                tool_every: int) -> list[Agent]:
    """The soak's agents, spread over the servers' ports: each its own turn of batch
    sizes, a batch of 50 records after every four span batches."""
    return [
        Agent(ports[index % len(ports)], key, acknowledged,
              span_batch_sizes=BATCH_SIZES[index % 4:] + BATCH_SIZES[:index % 4],
              records_per_batch=50, records_every=4, seed=index, tool_every=tool_every, also=ports)
        for index in range(agents)
    ]


def soak(servers: list[Server], project, key: str, session: str, args: argparse.Namespace, *,
         lock_probe: Path | None = None) -> tuple[Acknowledged, float | None]:
    """The load, a line a window, the convergence after it. With several servers the
    agents are spread over them (each turning to the others while its own does not
    answer), the reader reads from the last, memory is summed over them. ``lock_probe``:
    the directory the servers' lock probes write to (a line of their shares a window). Returns what
    was acknowledged and the seconds until the derived data agreed with the rows (None:
    not within the timeout)."""
    from django.db import close_old_connections

    acknowledged = Acknowledged()
    stop, stop_watch = threading.Event(), threading.Event()
    per_agent = args.rate / args.agents
    ports = tuple(server.port for server in servers)
    agents = soak_agents(ports, key, acknowledged, agents=args.agents, tool_every=args.tool_every)
    reader = PageReader(ports[-1], session, project.slug)
    sampler = RssSampler(*servers)
    lag = LagTracker(acknowledged)
    threads = [threading.Thread(target=agent.run, args=(stop,), kwargs={"spans_per_second": per_agent}) for agent in agents]
    threads.append(threading.Thread(target=reader.run, args=(stop,), kwargs={"pause": 1.0}))
    watcher = threading.Thread(target=sampler.run, args=(stop_watch,), daemon=True)  # an interrupted run still exits
    watcher.start()
    for thread in threads:
        thread.start()
    print(f"{args.agents} agents offering {args.rate:,.0f} spans/s (one in {args.tool_every} a tool span) in batches of {BATCH_SIZES} + 50 records "
          f"every 4 batches, for {args.seconds / 60:.0f} min on {args.db}; a line every {args.window:.0f} s", flush=True)
    print(f"{'min':>5} {'spans/s':>8} {'records/s':>9} {'acked spans':>12} {'RSS MB':>7} {'PSS MB':>7} {'page p95':>9} "
          f"{'lag p95':>8} {'lag max':>8} {'notes':>6}", flush=True)
    started = time.time()
    window_start, last = started, stored_counts(project.pk)
    held = sqlite_lock_probe.totals(lock_probe) if lock_probe is not None else None
    rss_by_window, pss_by_window, lag_all = [], [], []
    try:
        while time.time() - started < args.seconds:
            time.sleep(min(2.0, max(0.0, started + args.seconds - time.time())))
            close_old_connections()
            lag.poll(project.pk)
            if time.time() - window_start >= args.window or time.time() - started >= args.seconds:
                now = time.time()
                counts = stored_counts(project.pk)
                seconds = now - window_start
                visible = lag.window(window_start)
                lag_all.extend(visible)
                lags = visible + lag.waiting(now)
                page_times = reader.times[:]
                reader.times.clear()
                rss = max((value for at, value in sampler.samples if at >= window_start), default=0.0)
                rss_by_window.append(rss)
                pss_by_window.append(sampler.window_pss(window_start))
                print(f"{(now - started) / 60:>5.1f} {(counts[0] - last[0]) / seconds:>8.0f} "
                      f"{(counts[1] - last[1]) / seconds:>9.0f} {len(acknowledged.span_ids):>12,} {rss:>7.0f} "
                      f"{pss_by_window[-1]:>7.0f} "
                      f"{percentile(page_times, 95) * 1000:>7.0f}ms {percentile(lags, 95):>7.1f}s "
                      f"{max(lags, default=float('nan')):>7.1f}s {notes_waiting():>6}", flush=True)
                if held is not None:
                    now_held = sqlite_lock_probe.totals(lock_probe)
                    print(f"      {sqlite_lock_probe.window_line(held, now_held, seconds)}", flush=True)
                    held = now_held
                window_start, last = now, counts
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    lag_all.extend(lag.waiting(time.time()))  # still not visible when the load ended
    converged, off = wait_until_converged(project.pk, timeout=args.converge_timeout, report=args.window / 4)
    stop_watch.set()
    watcher.join()
    def after_warm_up(values: list[float]) -> float:
        return values[1] if len(values) > 2 else (values[0] if values else 0.0)

    print(f"\nacknowledged {len(acknowledged.span_ids):,} spans and {len(acknowledged.tool_call_ids):,} records "
          f"({acknowledged.retries} batches answered 429/503, {acknowledged.refused} refused "
          f"{acknowledged.first_refusal}); lag p95 {percentile(lag_all, 95):.1f} s over {len(lag_all)} record batches")
    print("page p95 over the soak: " + ", ".join(
        f"{label} {percentile(times, 95) * 1000:.0f} ms"
        for label, times in zip(("overview", "conversations", "tools"), reader.by_path.values())) + f"; the pages' own time (Server-Timing) "
        f"p95 {percentile(reader.server, 95) * 1000:.0f} ms")
    print(f"server PSS: peak {sampler.peak_pss:.0f} MB, after warm-up {after_warm_up(pss_by_window):.0f} MB, last window "
          f"{pss_by_window[-1] if pss_by_window else 0:.0f} MB; RSS summed: peak {sampler.peak:.0f} MB, after warm-up "
          f"{after_warm_up(rss_by_window):.0f} MB, last window {rss_by_window[-1] if rss_by_window else 0:.0f} MB; "
          f"{sampler.process_summary()}")
    print("rollups and links " + (f"agreed with the rows {converged:.1f} s after the load" if converged is not None
                                  else f"did NOT agree with the rows within {args.converge_timeout:.0f} s: {off}"))
    if converged is None:
        for line in waiting_notes(project.pk):
            print(f"  {line}")
    print("targets: lag p95 < 10 s, PSS < 400 MB and flat, page p95 < 500 ms, converged within 60 s")
    return acknowledged, converged


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--short", action="store_true", help="10 minutes")
    parser.add_argument("--rate", type=float, default=20_000.0, help="spans per second offered, all agents together")
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--window", type=float, default=60.0, help="seconds per report line")
    parser.add_argument("--converge-timeout", type=float, default=120.0)
    parser.add_argument("--tool-every", type=int, default=4,
                        help="one span in this many is a GenAI tool span (1: OpenTelemetry-only tool calls)")
    parser.add_argument("--lock-probe", action="store_true",
                        help="SQLite: each window, the share of it ingest and the derivations held the write lock "
                             "(benchmarks/sqlite_lock_probe.py)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the data dir (its path is printed): benchmarks.sqlite_floor reads its rows")
    args = parser.parse_args(argv)
    if args.lock_probe and args.db != "sqlite":
        sys.exit("--lock-probe is for SQLite")
    args.seconds = (10.0 if args.short else args.minutes) * 60
    if args.seconds <= 0 or args.rate <= 0 or args.agents <= 0:
        sys.exit("--minutes, --rate and --agents must be positive")
    run(args)


if __name__ == "__main__":
    main()
