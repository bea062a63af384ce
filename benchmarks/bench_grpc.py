"""OTLP/gRPC ingest throughput (``manage.py otlp_grpc``) beside the OTLP/HTTP figure,
with the same 1,000-span protobuf batches as bench_ingest, on SQLite and on a
private PostgreSQL.

    .venv/bin/python -m benchmarks.bench_grpc --db both --batches 100

For each database: a fresh data dir (and for PostgreSQL its own cluster), migrate,
a project and a key; then ``manage.py otlp_grpc`` on a free loopback port, sent
every batch from ``--clients`` threads (one channel each, retrying
RESOURCE_EXHAUSTED / UNAVAILABLE after the RetryInfo delay as an exporter does),
then the same batches to gunicorn's /v1/traces (bench_ingest's server and
client), each on a database the other did not touch (its own trace ids). A
throughput is the spans found in the database over the time until the last batch
was acknowledged. ``--processes`` runs that many receivers on one port
(SO_REUSEPORT, the kernel spreads connections), as gunicorn runs workers;
``--rounds 2`` runs gRPC and HTTP in turn twice (A B A B), each on a fresh
database; ``--no-http`` runs gRPC only. Each run prints the load average before it.
Bounded: every call has a deadline and every process started here is stopped.
"""

from __future__ import annotations

import argparse
import os
import queue
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import grpc
from google.rpc import error_details_pb2, status_pb2

from benchmarks import run_threads
from benchmarks.load import load_average
from benchmarks.bench_ingest import (
    PYTHON,
    REQUEST_TIMEOUT,
    ROOT,
    RUN_DEADLINE,
    _nothing,
    cpu_seconds,
    create_project_and_key,
    free_port,
    gunicorn,
    manage,
    private_postgres,
    process_tree,
    send_all,
    span_batches,
)

TRACES = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
RETRYABLE = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)


@contextmanager
def grpc_receivers(env: dict[str, str], port: int, processes: int) -> Iterator[list[subprocess.Popen]]:
    """``manage.py otlp_grpc --processes N``: N processes serving the port (SO_REUSEPORT)."""
    servers = [
        subprocess.Popen([PYTHON, "manage.py", "otlp_grpc", "--port", str(port), "--processes", str(processes)],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ]
    try:
        for _ in range(processes):
            line = servers[0].stdout.readline()  # "OTLP/gRPC listening on ...", one a process
            if "listening" not in line:
                raise SystemExit(f"otlp_grpc did not start: {line}{servers[0].stderr.read()[-2000:]}")
        yield servers
    finally:
        for server in servers:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
        for server in servers:
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def retry_delay(error: grpc.RpcError) -> float:
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.RetryInfo()
                if detail.Unpack(info):
                    return info.retry_delay.seconds + info.retry_delay.nanos / 1e9
    return 1.0


def send_grpc(port: int, key: str, bodies: list[bytes], clients: int) -> tuple[float, int, int]:
    """Every body from ``clients`` threads; (seconds, retries, failures)."""
    work: queue.Queue[bytes] = queue.Queue()
    for body in bodies:
        work.put(body)
    counters = {"retries": 0, "failures": 0}
    first_failure: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + RUN_DEADLINE
    metadata = (("authorization", f"Bearer {key}"),)

    def client() -> None:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
        export = channel.unary_unary(TRACES)
        try:
            while time.monotonic() < deadline:
                try:
                    body = work.get_nowait()
                except queue.Empty:
                    return
                while time.monotonic() < deadline:
                    try:
                        export(body, metadata=metadata, timeout=REQUEST_TIMEOUT)
                        break
                    except grpc.RpcError as error:
                        if error.code() in RETRYABLE:
                            with lock:
                                counters["retries"] += 1
                            time.sleep(retry_delay(error))
                            continue
                        with lock:
                            counters["failures"] += 1
                            if not first_failure:
                                first_failure.append(f"{error.code()}: {error.details()}")
                        break
        finally:
            channel.close()

    elapsed = run_threads([client] * clients)
    if first_failure:
        print(f"  first failure: {first_failure[0]}", flush=True)
    return elapsed, counters["retries"], counters["failures"]


def count_spans(env: dict[str, str]) -> int:
    code = "from dashboard.observatory.models import Span\nprint(Span.objects.count())\n"
    return int(manage(env, "shell", "-c", code).strip().splitlines()[-1])


def fresh_env(workdir: Path, name: str, database_url: str) -> dict[str, str]:
    env = {
        **os.environ,
        "OBSERVATORY_DATA_DIR": str(workdir / f"data-{name}"),
        "SECRET_KEY": secrets.token_urlsafe(48),
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DJANGO_SETTINGS_MODULE": "dashboard.settings",
    }
    env.pop("CELERY_BROKER_URL", None)
    if database_url:
        env["DATABASE_URL"] = database_url
    else:
        env.pop("DATABASE_URL", None)
    return env


def _database(database_url: str, name: str) -> str:
    """A database of its own on the benchmark's cluster ('' for SQLite)."""
    if not database_url:
        return ""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return database_url.rsplit("/", 1)[0] + f"/{name}"


def legs(args: argparse.Namespace) -> list[str]:
    """The runs of a sitting, in order: each round gRPC, then HTTP unless --no-http."""
    return [leg for _ in range(args.rounds) for leg in ["grpc"] + ([] if args.no_http else ["http"])]


def run_one(db: str, args: argparse.Namespace, batches: list[bytes]) -> dict[str, object]:
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-grpc-{db}-"))
    sent = len(batches) * args.spans_per_batch
    try:
        with (private_postgres(workdir) if db == "postgres" else _nothing()) as cluster:
            results: dict[str, object] = {"db": db, "sent": sent, "legs": []}
            for number, leg in enumerate(legs(args)):
                name = f"{leg}_{number}"
                env = fresh_env(workdir, name, _database(cluster, f"bench_{name}"))
                env["OBSERVATORY_GRPC_THREADS"] = str(args.threads)
                env["OBSERVATORY_MAX_CONCURRENT_INGEST"] = str(args.threads)
                manage(env, "migrate", "--noinput")
                key = create_project_and_key(env)
                port = free_port()
                load = load_average()
                if leg == "grpc":
                    with grpc_receivers(env, port, args.processes) as servers:
                        send_grpc(port, key, [batches[0][:0]] * args.clients * 2, args.clients)  # warm up
                        cpu_before = sum(cpu_seconds(process_tree(s.pid)) for s in servers)
                        seconds, retries, failures = send_grpc(port, key, batches, args.clients)
                        cpu = sum(cpu_seconds(process_tree(s.pid)) for s in servers) - cpu_before
                else:
                    with gunicorn(env, port, workers=args.http_workers or args.processes, worker_class="gthread",
                                  threads=args.threads) as server:
                        send_all(port, "/v1/traces", "application/x-protobuf", key,
                                 [b""] * args.clients * 2, args.clients)  # warm up
                        cpu_before = cpu_seconds(process_tree(server.pid))
                        seconds, retries, failures = send_all(
                            port, "/v1/traces", "application/x-protobuf", key, batches, args.clients
                        )
                        cpu = cpu_seconds(process_tree(server.pid)) - cpu_before
                stored = count_spans(env)
                results["legs"].append({"transport": leg, "stored": stored, "seconds": seconds, "retries": retries,
                                        "failures": failures, "cpu": cpu, "load": load})
                print(f"  {leg}: {stored / seconds if seconds else 0:,.0f} spans/s (load {load})", flush=True)
        return results
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--spans-per-batch", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--processes", type=int, default=2, help="receivers (gRPC) / gunicorn workers (HTTP)")
    parser.add_argument("--threads", type=int, default=4, help="threads per receiver / worker")
    parser.add_argument("--http-workers", type=int, default=None, help="gunicorn workers (default: --processes)")
    parser.add_argument("--rounds", type=int, default=1, help="times gRPC then HTTP run, in turn (A B A B)")
    parser.add_argument("--no-http", action="store_true", help="gRPC runs only")
    args = parser.parse_args(argv)

    print(f"building {args.batches} batches of {args.spans_per_batch} spans ...", flush=True)
    batches = span_batches(args.batches, genai_every=0, size=args.spans_per_batch)
    results = []
    for db in (["sqlite", "postgres"] if args.db == "both" else [args.db]):
        print(f"running {db} ...", flush=True)
        results.append(run_one(db, args, batches))
    print()
    print(f"gRPC {args.processes} processes, HTTP {args.http_workers or args.processes} gunicorn workers, "
          f"x {args.threads} threads each, {args.clients} client threads, "
          f"{os.cpu_count()} cores, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"{'db':9} {'transport':10} {'spans/s':>9} {'stored':>9} {'sent':>9} {'retries':>8} {'failed':>7} "
          f"{'cpu-s':>7} {'cpu-us/span':>11}  load before")
    for result in results:
        for row in result["legs"]:
            rate = row["stored"] / row["seconds"] if row["seconds"] else 0.0
            per_span = row["cpu"] / row["stored"] * 1e6 if row["stored"] else 0.0
            print(f"{result['db']:9} {row['transport']:10} {rate:9,.0f} {row['stored']:9,} {result['sent']:9,} "
                  f"{row['retries']:8} {row['failures']:7} {row['cpu']:7.1f} {per_span:11.0f}  {row['load']}")


if __name__ == "__main__":
    main()
