"""Past one machine: ingest on two server groups, the derivations on two Celery
workers, one of each killed with SIGKILL mid-run.

    .venv/bin/python -m benchmarks.bench_cluster                  # the 15-minute soak with the kills
    .venv/bin/python -m benchmarks.bench_cluster --minutes 3
    .venv/bin/python -m benchmarks.bench_cluster --drain          # one fixed backlog, drained by 1, 2, 1, 2 workers

A private PostgreSQL (port 55440-55449) and a private redis-server (6390-6399) as
the Celery broker; two gunicorn groups as deploy/gunicorn.conf.py runs them (each a
master with its workers, on its own port in 18100-18199 and its own data directory:
two nodes' ingest), the derivations off in them (a broker is configured: ingest only
writes its notes and enqueues a drain); two Celery workers started by
deploy/run-worker.sh (each a node's, named apart) and one deploy/run-beat.sh.

The soak (benchmarks.bench_soak's agents, reader and report, spread over both
groups; an agent whose group does not answer turns to the other, as a load balancer
would): at --kill-at of the load, server group A (master and workers) and Celery
worker A (main process and pool) get SIGKILL together; --down seconds later both
start again. After the load: acknowledged against stored (0 lost), rows stored twice
(0), and the seconds until the derived data agreed with the rows
(benchmarks.load.divergence, target <= 60 s).

--drain: whether a second worker adds throughput. Per round, a new project gets a
fixed backlog (--backlog-turns span batches from each agent, records among them)
while no worker runs; then --drain-workers workers (default 1, 2, 1, 2: alternating,
so a drift of the machine shows) start and the seconds until every note of the
backlog is gone and until the derived data agrees are measured, with the CPU the
workers and PostgreSQL used meanwhile.

Every process started here is stopped by its PID (process group) at the end, also
when the run fails; the data directory and the database cluster are removed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

from benchmarks.bench_ingest import (PYTHON, ROOT, cpu_seconds, database_cpu_seconds, free_port, manage, private_postgres,
                                     remove_unless_kept)
from benchmarks.bench_soak import soak, soak_agents
from benchmarks.load import (
    Acknowledged,
    ProcessGroup,
    RssSampler,
    Server,
    django_env,
    load_average,
    losses,
    project_key_and_session,
    setup_django,
    wait_until_converged,
    waiting_notes,
)

PG_PORTS, REDIS_PORTS, HTTP_PORTS = "55440-55449", "6390-6399", "18100-18199"


@contextmanager
def ports(spec: str) -> Iterator[None]:
    """benchmarks.bench_ingest.free_port picks from BENCH_PORTS: these, meanwhile."""
    before = os.environ.get("BENCH_PORTS")
    os.environ["BENCH_PORTS"] = spec
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("BENCH_PORTS", None)
        else:
            os.environ["BENCH_PORTS"] = before


@contextmanager
def private_redis(workdir: Path) -> Iterator[str]:
    """A redis-server of our own on 127.0.0.1, nothing saved to disk; yields its URL."""
    import redis

    with ports(REDIS_PORTS):
        port = free_port()
    server = ProcessGroup(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                           "--appendonly", "no", "--dir", str(workdir)], dict(os.environ), log=workdir / "redis.log")
    server.spawn()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                redis.Redis(host="127.0.0.1", port=port, socket_timeout=1).ping()
                break
            except redis.ConnectionError:
                if (said := server.exited()) is not None or time.monotonic() > deadline:
                    raise SystemExit(f"redis-server did not start: {said or 'no answer within 30 s'}") from None
                time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.stop()


class CeleryWorker(ProcessGroup):
    """A derivation worker as deployed (deploy/run-worker.sh), named ``name``."""

    def __init__(self, env: dict[str, str], name: str, *, concurrency: int, log: Path) -> None:
        super().__init__([str(ROOT / "deploy" / "run-worker.sh"), "-n", f"{name}@%h"],
                         {**env, "PYTHON": PYTHON, "WORKER_CONCURRENCY": str(concurrency)}, log=log)
        self.name = name

    def start(self, *, deadline: float = 60) -> float:
        """Start and wait until Celery says it is ready; returns the seconds that took."""
        started = time.monotonic()
        self.spawn()
        return self.ready(started, deadline=deadline)

    def spawn(self) -> None:
        self.log_from = os.fstat(self.log.fileno()).st_size  # what this start writes comes after
        super().spawn()

    def ready(self, started: float, *, deadline: float = 60) -> float:
        """Wait until Celery says it is ready; the seconds since ``started``."""
        while time.monotonic() - started < deadline:
            if (said := self.exited()) is not None:
                raise SystemExit(f"Celery worker {self.name} exited during start-up:\n{said}")
            size = os.fstat(self.log.fileno()).st_size
            if b" ready." in os.pread(self.log.fileno(), size - self.log_from, self.log_from):
                return time.monotonic() - started
            time.sleep(0.1)
        raise SystemExit(f"Celery worker {self.name} was not ready within {deadline} s")


class Cluster:
    """Two nodes' ingest (gunicorn groups), their Celery workers and one beat, on one
    database and one broker; stopped by PID, always."""

    def __init__(self, workdir: Path, env: dict[str, str], args: argparse.Namespace) -> None:
        web = {**env, "WEB_CONCURRENCY": str(args.web_workers)}
        with ports(HTTP_PORTS):
            self.servers = [Server({**web, "OBSERVATORY_DATA_DIR": str(workdir / f"node-{name}")},
                                   log=workdir / f"web-{name}.log") for name in "ab"]
        self.workers = [CeleryWorker(env, f"derive-{name}", concurrency=args.worker_concurrency,
                                     log=workdir / f"worker-{name}.log") for name in "ab"]
        self.beat = ProcessGroup([str(ROOT / "deploy" / "run-beat.sh")], {**env, "PYTHON": PYTHON},
                                 log=workdir / "beat.log")

    def stop(self) -> None:
        for group in (*self.servers, *self.workers, self.beat):
            group.stop()


def faults(cluster: Cluster, *, at: float, down: float, stop: threading.Event, events: list[str]) -> None:
    """At ``at`` seconds: SIGKILL to server group A and Celery worker A together;
    ``down`` seconds later both start again."""
    began = time.monotonic()
    if stop.wait(at):
        return
    server, worker = cluster.servers[0], cluster.workers[0]
    server.kill()
    worker.kill()
    events.append(f"{time.monotonic() - began:.0f} s: SIGKILL to server group A (port {server.port}) and Celery "
                  f"worker A")
    say(events[-1])
    stop.wait(down)
    restart = server.start()
    ready = worker.start()
    events.append(f"{time.monotonic() - began:.0f} s: both started again (gunicorn answered in {restart:.1f} s, "
                  f"the worker ready in {ready:.1f} s)")
    say(events[-1])


def soak_with_faults(cluster: Cluster, args: argparse.Namespace) -> None:
    project, key, session = project_key_and_session()
    for server in cluster.servers:
        server.start()
    for worker in cluster.workers:
        worker.start()
    cluster.beat.spawn()
    print(f"two server groups ({args.web_workers} gunicorn workers each, ports "
          f"{', '.join(str(server.port) for server in cluster.servers)}), two Celery workers (concurrency "
          f"{args.worker_concurrency}) + beat, PostgreSQL, Redis; SIGKILL to group A and worker A at "
          f"{args.kill_at:.0%} of the load, {args.down:.0f} s down; load average {load_average()}", flush=True)
    events: list[str] = []
    stop_faults, stop_sampling = threading.Event(), threading.Event()
    chaos = threading.Thread(target=faults, kwargs=dict(cluster=cluster, at=args.seconds * args.kill_at,
                                                        down=args.down, stop=stop_faults, events=events))
    # Each node's part apart (the soak's own line sums the two server groups).
    memory = {name: RssSampler(group) for name, group in zip(
        ("server group A", "server group B", "worker A", "worker B"), (*cluster.servers, *cluster.workers))}
    samplers = [threading.Thread(target=sampler.run, args=(stop_sampling,), kwargs={"every": 2.0}, daemon=True)
                for sampler in memory.values()]
    for thread in (chaos, *samplers):
        thread.start()
    try:
        acknowledged, converged = soak(cluster.servers, project, key, session, args)
    finally:
        stop_faults.set()
        stop_sampling.set()
        chaos.join(timeout=120)
    found = losses(project.pk, span_ids=acknowledged.span_ids, tool_call_ids=acknowledged.tool_call_ids)
    print("\n".join(events))
    print("peak PSS: " + ", ".join(f"{name} {sampler.peak_pss:.0f} MB" for name, sampler in memory.items()))
    print(f"acknowledged spans {len(acknowledged.span_ids):,}, stored {found['stored_spans']:,}: lost "
          f"{found['lost_spans']}, duplicates {found['duplicate_spans']}; acknowledged records "
          f"{len(acknowledged.tool_call_ids):,}, stored {found['stored_records']:,}: lost {found['lost_records']}, "
          f"duplicates {found['duplicate_records']}; {acknowledged.connection_errors} connection errors "
          f"(an agent then turned to the other group)")
    print(f"load average at the end {load_average()}; targets: lost 0, duplicates 0, converged <= 60 s after the load"
          + ("" if converged is not None and converged <= 60 else " -- NOT MET"))


def drain_rounds(cluster: Cluster, args: argparse.Namespace) -> None:
    """A fixed backlog per round, drained by 1 or 2 workers: does the second add throughput?"""
    from django.db import close_old_connections
    from django.db.models import Q

    from dashboard.observatory.models import DerivationNote

    for server in cluster.servers:
        server.start()
    cluster.beat.spawn()
    ports_ = tuple(server.port for server in cluster.servers)
    print(f"backlog per round: {args.agents} agents x {args.backlog_turns} span batches (1,000 / 512 / 100 / 10 "
          f"spans in turn) + 50 records every 4, to both server groups, no worker running; then the workers "
          f"(concurrency {args.worker_concurrency} each) drain it", flush=True)
    print(f"{'workers':>7} {'notes':>6} {'spans':>8} {'records':>7} {'drained':>8} {'spans/s':>8} "
          f"{'converged':>9} {'CPU workers':>11} {'CPU pg':>7} {'load':>15}", flush=True)
    results: dict[int, list[float]] = {}
    for count in args.drain_workers:
        close_old_connections()
        project, key, _ = project_key_and_session()
        acknowledged, stop = Acknowledged(), threading.Event()
        agents = soak_agents(ports_, key, acknowledged, agents=args.agents, tool_every=args.tool_every)
        threads = [threading.Thread(target=agent.run, args=(stop,), kwargs={"turns": args.backlog_turns})
                   for agent in agents]
        sending = time.monotonic()
        ingest_cpu = sum(cpu_seconds(server.pids()) for server in cluster.servers), database_cpu_seconds()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
        stop.set()
        web_cpu = sum(cpu_seconds(server.pids()) for server in cluster.servers) - ingest_cpu[0]
        print(f"{'':>7} backlog of {len(acknowledged.span_ids):,} spans and {len(acknowledged.tool_call_ids):,} records sent "
            f"in {time.monotonic() - sending:.1f} s; CPU a span stored: web {web_cpu / len(acknowledged.span_ids) * 1e6:.0f} µs, "
            f"PostgreSQL {(database_cpu_seconds() - ingest_cpu[1]) / len(acknowledged.span_ids) * 1e6:.0f} µs",
              flush=True)
        notes = DerivationNote.objects.filter(project_id=project.pk)
        backlog, last = notes.count(), notes.order_by("-id").values_list("id", flat=True).first()
        time.sleep(2)  # the servers' last requests answered, the machine quiet
        started_workers = cluster.workers[:count]
        for worker in started_workers:  # together: the second is not a start-up behind
            worker.spawn()
        deadline = time.monotonic() + 60
        while not notes.filter(Q(claimed_until__isnull=False) | Q(id__gt=last)).exists() and notes.count() == backlog:
            if time.monotonic() > deadline:
                raise SystemExit("no worker claimed a note within 60 s")
            time.sleep(0.05)
        # From the first claim: the workers' start-up is not the drain's (both start together).
        began = time.monotonic()
        cpu_before = sum(cpu_seconds(worker.pids()) for worker in started_workers), database_cpu_seconds()
        drained, waits = None, Counter()
        while time.monotonic() - began < args.converge_timeout:
            if not notes.filter(id__lte=last).exists():
                drained = time.monotonic() - began
                break
            lock_waits(waits)
            time.sleep(0.2)
        worker_cpu = sum(cpu_seconds(worker.pids()) for worker in started_workers) - cpu_before[0]
        database_cpu = database_cpu_seconds() - cpu_before[1]
        converged, off = wait_until_converged(project.pk, timeout=args.converge_timeout)
        for worker in started_workers:
            worker.stop()
        spans = len(acknowledged.span_ids)
        if drained is not None:
            results.setdefault(count, []).append(spans / drained)
        print(f"{count:>7} {backlog:>6} {spans:>8,} {len(acknowledged.tool_call_ids):>7,} "
              + (f"{drained:>7.1f}s {spans / drained:>8,.0f}" if drained is not None else f"{'NOT':>8} {'-':>8}")
              + f" {'%.1fs' % (converged + (drained or 0)) if converged is not None else 'NOT':>9} "
              f"{worker_cpu:>10.1f}s {database_cpu:>6.1f}s {load_average():>15}", flush=True)
        print(f"{'':>7} CPU a span derived: workers {worker_cpu / spans * 1e6:.0f} µs, PostgreSQL "
              f"{database_cpu / spans * 1e6:.0f} µs", flush=True)
        print(f"{'':>7} a session waiting for a lock in {waits.pop('waiting', 0):,} of {waits.pop('looks', 0):,} looks "
              f"at pg_stat_activity ({', '.join(f'{kind} {n}' for kind, n in waits.most_common()) or 'none'})",
              flush=True)
        if converged is None:
            print(f"  not converged: {off}")
            for line in waiting_notes(project.pk):
                print(f"  {line}")
    print("drained = every note of the backlog done, from the first claim (the workers started together); "
          "converged = the derived data agreeing with the rows, from the same moment; CPU from the first claim")
    for count, rates in sorted(results.items()):
        print(f"{count} worker{'s' if count > 1 else ''}: {', '.join(f'{rate:,.0f}' for rate in rates)} spans/s")


def lock_waits(waits: Counter) -> None:
    """One look at the sessions waiting for a lock (the drainers': ingest is idle then):
    counts the looks, those that found one, and each lock kind (advisory, tuple,
    transactionid, relation) once a look."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT wait_event FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                       "AND pid <> pg_backend_pid()")
        kinds = [kind for (kind,) in cursor.fetchall()]
    waits.update(["looks", *(["waiting"] if kinds else []), *kinds])


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    try:
        with ExitStack() as stack:
            with ports(PG_PORTS):
                database_url = stack.enter_context(private_postgres(workdir))
            broker_url = stack.enter_context(private_redis(workdir))
            env = {**django_env(workdir, database_url), "CELERY_BROKER_URL": broker_url}
            manage(env, "migrate", "--noinput")
            setup_django(env)  # this process reads the database; it runs no derivation
            cluster = Cluster(workdir, env, args)
            stack.callback(cluster.stop)
            if args.drain:
                drain_rounds(cluster, args)
            else:
                soak_with_faults(cluster, args)
    finally:
        remove_unless_kept(workdir, args.keep,
                           f"kept {workdir} (the servers', workers' and beat's logs; the stopped database cluster in pg/)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--rate", type=float, default=20_000.0, help="spans per second offered, all agents together")
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--window", type=float, default=60.0, help="seconds per report line")
    parser.add_argument("--converge-timeout", type=float, default=180.0)
    parser.add_argument("--tool-every", type=int, default=4, help="one span in this many is a GenAI tool span")
    parser.add_argument("--kill-at", type=float, default=0.4, help="fraction of the load at which to SIGKILL")
    parser.add_argument("--down", type=float, default=10.0, help="seconds the killed group and worker stay down")
    parser.add_argument("--web-workers", type=int, default=2, help="gunicorn workers in each server group")
    parser.add_argument("--worker-concurrency", type=int, default=1, help="processes in each Celery worker's pool")
    parser.add_argument("--drain", action="store_true", help="1 against 2 workers on a fixed backlog, no soak")
    parser.add_argument("--drain-workers", default="1,2,1,2", help="workers per drain round")
    parser.add_argument("--backlog-turns", type=int, default=60, help="span batches per agent in a drain backlog")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs, database files)")
    args = parser.parse_args(argv)
    args.db = "postgres"
    args.seconds = args.minutes * 60
    args.drain_workers = [int(count) for count in args.drain_workers.split(",")]
    if args.seconds <= 0 or args.rate <= 0 or args.agents <= 0 or not 0 < args.kill_at < 1:
        sys.exit("--minutes, --rate and --agents must be positive, --kill-at between 0 and 1")
    if not args.drain and args.seconds * args.kill_at + args.down + 30 > args.seconds:
        sys.exit("the killed group and worker must be back well before the load ends: lower --kill-at or --down")
    if any(count not in (1, 2) for count in args.drain_workers):
        sys.exit("--drain-workers: 1 or 2 each (there are two workers)")
    run(args)


if __name__ == "__main__":
    main()
