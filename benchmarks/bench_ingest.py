"""Ingest throughput under gunicorn: OTLP spans (POST /v1/traces) and records
(POST /api/v1/records), on SQLite and on a private PostgreSQL.

    .venv/bin/python -m benchmarks.bench_ingest --db both --batches 100

Small batches (the cost of a request rather than of a span):

    .venv/bin/python -m benchmarks.bench_ingest --db both --spans-per-batch 10 --batches 12000 \
        --clients 16 --record-batches 2 --records-per-batch 10 --server receiver --senders loop [--floor]

For each database it makes a fresh data dir (and for PostgreSQL its own cluster
under a temp dir, run as user postgres, stopped at the end), migrates, creates a
project and a key, starts gunicorn on 127.0.0.1 on a free port as deployed
(deploy/gunicorn.conf.py; ``--worker-class`` runs plain gunicorn instead), and sends
pre-built batches from a few client threads: OTLP protobuf batches of 1,000 spans
(about 600 bytes, 10 attributes each) and JSON batches of ToolResultRecords. A
throughput is the count of rows found in the database at the end (so only stored
rows count) over the time until the last batch was acknowledged. Before timing,
empty batches warm the workers up (app loaded, first-request imports done), so a
short phase measures ingest rather than a worker's start. Between the phases the
server is left to finish the derivations the records started (a background
thread per worker), so they do not slow the span phase; their CPU counts for the
records (rows/cpu-s), not the span phase. The server's peak memory is the sum of
VmHWM over the gunicorn master and its workers. For the span phase it also reports
requests/s, the retries by status, and the CPU a request took in gunicorn, in
PostgreSQL and in the client, with the requests/s two idle CPUs would take at that
cost (the machine is shared, so this says more than the wall-clock rate); ``--floor``
sends the same batches once more with an unknown key, refused before any database
work: what gunicorn and Django cost for a request that stores nothing; then to the
same gunicorn config serving ``benchmarks.bare_wsgi`` (an app that only reads the
body): what gunicorn and the client cost before any application code.

Targets on the 2-core machine: >= 20,000 spans/s, >= 10,000 records/s, RSS < 300 MB;
10-span batches from 16 senders: >= 1,500 requests/s.
Bounded: every request has a timeout, the run has a deadline, and every process
started here is stopped (also on Ctrl-C).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from benchmarks import run_threads
from benchmarks.http_load import post_all

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
GUNICORN = str(Path(PYTHON).with_name("gunicorn"))
PG_BIN = Path("/usr/lib/postgresql/15/bin")
SPANS_PER_BATCH = 1000
REQUEST_TIMEOUT = 60  # seconds, one request
RUN_DEADLINE = 600  # seconds, one phase


@dataclass
class Phase:
    name: str
    sent: int
    stored: int
    seconds: float
    retries: int
    failures: int
    requests: int

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def per_second(self) -> float:
        return self.stored / self.seconds if self.seconds else 0.0


# --- payloads -------------------------------------------------------------------


def span_batches(count: int, *, genai_every: int, size: int = SPANS_PER_BATCH) -> list[bytes]:
    """OTLP protobuf batches of ``size`` spans, ~600 bytes and 10 attributes each.

    One span in ``genai_every`` carries GenAI attributes (conversation, tool, tokens),
    as the tool and LLM spans of an agent do; 0 means none does.
    """
    bodies = []
    start = time.time_ns()
    for batch in range(count):
        request = ExportTraceServiceRequest()
        resource_spans = request.resource_spans.add()
        for key, value in (("service.name", "bench-agent"), ("service.version", "1.4.2"), ("host.name", "bench-1")):
            resource_spans.resource.attributes.add(key=key, value=AnyValue(string_value=value))
        scope_spans = resource_spans.scope_spans.add()
        scope_spans.scope.name = "pipeline"
        trace_id = os.urandom(16)
        for index in range(size):
            if index % 20 == 0:
                trace_id = os.urandom(16)
            span = scope_spans.spans.add()
            span.trace_id = trace_id
            span.span_id = os.urandom(8)
            span.parent_span_id = os.urandom(8)
            span.name = f"execute_tool search_orders_{index % 7}"
            span.kind = 1
            span.start_time_unix_nano = start + (batch * size + index) * 1_000_000
            span.end_time_unix_nano = span.start_time_unix_nano + 3_500_000
            attributes = span.attributes
            genai = genai_every and index % genai_every == 0
            if genai:
                attributes.add(key="gen_ai.conversation.id", value=AnyValue(string_value=f"conv-{batch}-{index % 5}"))
                attributes.add(key="gen_ai.tool.name", value=AnyValue(string_value=f"search_orders_{index % 7}"))
                attributes.add(key="gen_ai.tool.call.id", value=AnyValue(string_value=f"call_{uuid.uuid4().hex}"))
                attributes.add(key="gen_ai.usage.input_tokens", value=AnyValue(int_value=1200 + index))
            else:
                attributes.add(key="code.function", value=AnyValue(string_value="pipeline.executor.run_tool"))
                attributes.add(key="code.filepath", value=AnyValue(string_value="pipeline/_executor.py"))
                attributes.add(key="thread.name", value=AnyValue(string_value="MainThread"))
                attributes.add(key="code.lineno", value=AnyValue(int_value=120 + index % 50))
            attributes.add(key="ba.output_level", value=AnyValue(string_value=("brief", "standard", "full")[index % 3]))
            attributes.add(key="ba.retry_count", value=AnyValue(int_value=index % 3))
            attributes.add(key="ba.cache_hit", value=AnyValue(bool_value=index % 4 == 0))
            attributes.add(key="ba.observation_tokens", value=AnyValue(int_value=300 + index % 900))
            attributes.add(key="ba.data_summary", value=AnyValue(string_value="orders for customer 4711, 2024-Q3: " + "x" * 120))
            attributes.add(key="ba.duration_ratio", value=AnyValue(double_value=0.25 + index / 10_000))
        bodies.append(request.SerializeToString())
    return bodies


def record_batches(count: int, size: int) -> list[bytes]:
    """JSON bodies of ToolResultRecords, as the pipeline's RecordExporter sends them."""
    from pipeline import ToolExecutionResult, ToolResultRecord

    bodies = []
    for batch in range(count):
        records = []
        for index in range(size):
            record = ToolResultRecord(
                conversation_id=f"rec-conv-{batch}-{index % 10}",
                tool_name=f"search_orders_{index % 7}",
                parameters={"customer": 4711, "quarter": "2024-Q3"},
                model="gpt-4o",
                result=ToolExecutionResult(
                    tool_call_id=f"call_{uuid.uuid4().hex}",
                    observation="Found 12 orders; total 4,210.00 EUR. " + "y" * 100,
                    success=index % 10 != 0,
                    error_type=None if index % 10 else "timeout",
                    retry_count=index % 3,
                    duration_ms=35.0 + index % 100,
                    observation_tokens=60,
                ),
            )
            records.append(record.model_dump(mode="json"))
        bodies.append(json.dumps({"records": records}).encode())
    return bodies


# --- processes ------------------------------------------------------------------


def remove_unless_kept(workdir: Path, keep: bool, kept: str) -> None:
    """A benchmark's temp dir at its end: removed, or (``--keep``) left there with
    ``kept`` printed, which says what is in it."""
    if keep:
        print(kept, flush=True)
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def free_port() -> int:
    """A free loopback port: any, or one of BENCH_PORTS ("18400-18499") when set, so
    benchmarks run side by side on a shared machine each stay in their own range."""
    low, _, high = os.environ.get("BENCH_PORTS", "").partition("-")
    candidates = range(int(low), int(high or low) + 1) if low else [0]
    for port in random.sample(candidates, len(candidates)) if low else candidates:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise SystemExit(f"no free port in BENCH_PORTS={os.environ['BENCH_PORTS']}")


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    if done.returncode:
        raise SystemExit(f"manage.py {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def create_project_and_key(env: dict[str, str]) -> str:
    code = (
        "from dashboard.accounts.services import project_create, apikey_create\n"
        "project = project_create(name='bench')\n"
        "print(apikey_create(project=project)[1])\n"
    )
    return manage(env, "shell", "-c", code).strip().splitlines()[-1]


_postgres_pids: list[int] = []  # the running private cluster's postmaster, for its CPU time


def database_cpu_seconds() -> float:
    """CPU time of the private PostgreSQL (postmaster and backends, those ended
    included: a backend's time is added to its parent's when it exits); 0 on SQLite,
    whose work is done inside gunicorn's processes."""
    return cpu_seconds(process_tree(_postgres_pids[0])) if _postgres_pids else 0.0


@contextmanager
def private_postgres(workdir: Path) -> Iterator[str]:
    """A throwaway PostgreSQL cluster owned by user postgres; yields its DATABASE_URL."""
    data = workdir / "pg"
    data.mkdir()
    shutil.chown(workdir, "postgres")
    shutil.chown(data, "postgres")
    run_as = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*run_as, str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-E", "UTF8"], check=True, capture_output=True, timeout=120)
    port = free_port()
    options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c max_connections=50"
    subprocess.run(
        [*run_as, str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(data / "log"), "-w", "start"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    try:
        _postgres_pids.clear()
        _postgres_pids.append(int((data / "postmaster.pid").read_text().split()[0]))
        yield f"postgres://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*run_as, str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], capture_output=True, timeout=120
        )


@contextmanager
def gunicorn(
    env: dict[str, str], port: int, *, workers: int | None = None, worker_class: str | None = None,
    threads: int | None = None, log: Path | None = None, app: str = "dashboard.wsgi:application",
) -> Iterator[subprocess.Popen]:
    """gunicorn as deployed: deploy/gunicorn.conf.py (workers, gthread threads,
    preload, the ingest gate sized from WEB_THREADS, the access log), only bound
    to this port; or, with ``--workers``/``--worker-class``/``--threads``, plain
    gunicorn with those (the setup of the figures measured before the config)."""
    if worker_class:
        command = [
            GUNICORN, app,
            "--bind", f"127.0.0.1:{port}",
            "--workers", str(workers or 2),
            "--worker-class", worker_class,
            "--threads", str(threads or 1),
            "--timeout", "120",
            "--log-level", "warning",
        ]
    else:
        env = {**env, "OBSERVATORY_BIND": f"127.0.0.1:{port}", "WEB_TIMEOUT": "120", "WEB_LOG_LEVEL": "warning"}
        if workers:
            env["WEB_CONCURRENCY"] = str(workers)
        if threads:
            env["WEB_THREADS"] = str(threads)
        command = [GUNICORN, "--config", str(ROOT / "deploy" / "gunicorn.conf.py"), app]
    # The access log is written as deployed, to stdout (not kept).
    with _serving(command, env, port, log) as server:
        yield server


@contextmanager
def receiver(env: dict[str, str], port: int, *, processes: int | None, log: Path | None,
             nice: int = 0) -> Iterator[subprocess.Popen]:
    """The OTLP/HTTP receiver (manage.py otlp_http) on ``port``, ``processes`` of it
    (default: its own, one a core); with ``nice``, at that lower CPU priority
    (``nice -n``: its processes and their derivation threads)."""
    command = [*(["nice", "-n", str(nice)] if nice else []), PYTHON, "manage.py", "otlp_http",
               "--host", "127.0.0.1", "--port", str(port)]
    if processes:
        command += ["--processes", str(processes)]
    with _serving(command, env, port, log) as server:
        yield server


@contextmanager
def _serving(command: list[str], env: dict[str, str], port: int, log: Path | None) -> Iterator[subprocess.Popen]:
    """``command`` started, once it answers on ``port``; stopped (SIGTERM, then kill) at the end.
    Its output goes to a file, not a pipe nobody reads while the run lasts (a full pipe
    would stall it)."""
    errors = open(log, "w+") if log else tempfile.TemporaryFile("w+")
    with errors:
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=errors, text=True)
        try:
            yield _started(server, port, errors)
        finally:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
                try:
                    server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()


def _started(server: subprocess.Popen, port: int, errors: Any) -> subprocess.Popen:
    """``server`` once it answers on ``port``."""
    deadline = time.monotonic() + 60
    while True:
        if server.poll() is not None:
            errors.seek(0)
            raise SystemExit(f"server exited: {errors.read()[-2000:]}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/v1/traces")
            connection.getresponse().read()
            connection.close()
            return server
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit("server did not start within 60 s") from None
            time.sleep(0.2)


def server_setup(args: argparse.Namespace) -> str:
    """The gunicorn setup a run used, for the report."""
    if args.worker_class:
        threads = f" x {args.threads or 1} threads" if args.worker_class == "gthread" else ""
        return f"{args.workers or 2} workers, {args.worker_class}{threads}"
    workers = args.workers or max(2, 2 * (os.cpu_count() or 1))
    return f"deploy/gunicorn.conf.py: {workers} workers, gthread x {args.threads or 4} threads, preload, access log"


def process_tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                children = Path(f"/proc/{current}/task/{task}/children").read_text().split()
                todo.extend(int(child) for child in children)
        except OSError:
            continue
    return pids


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes (and their reaped children)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    return total / ticks


def peak_rss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


# --- load -----------------------------------------------------------------------


SENDERS = ("threads", "loop")
_senders = "threads"  # --senders


def send_all(
    port: int, path: str, content_type: str, key: str, bodies: list[bytes], clients: int, *, expect: int = 200
) -> tuple[float, int, int]:
    """Send every body over ``clients`` keep-alive connections, one request in flight
    on each: from as many threads (``--senders threads``), or from one thread of
    non-blocking sockets (``--senders loop``, ``benchmarks.http_load``).

    Which measures the server better depends on the load. Small batches from 16
    senders: the threads cost 0.15-0.18 ms of CPU a request and queue at the GIL
    for their answers, the loop 0.05 ms. Big batches to saturated workers: the one
    thread pushing every body is scheduled less often than threads blocked in
    sendall, and the workers wait for bodies (the same code: 25,500 spans/s with the
    loop, 31,900 with threads). 429/503 are retried after their Retry-After, as an
    OTLP exporter does. Returns (seconds until the last acknowledgement, retries,
    failures).
    """
    if _senders == "threads":
        return _send_threads(port, path, content_type, key, bodies, clients, expect=expect)
    outcome = post_all(port, path, content_type, key, bodies, clients, expect=expect,
                       request_timeout=REQUEST_TIMEOUT, run_deadline=RUN_DEADLINE)
    if outcome.first_failure:
        print(f"  first failure: {outcome.first_failure}", flush=True)
    if outcome.retries:
        refused = sum(outcome.statuses.values())
        print(f"  {path}: retried {outcome.retries} (429: {outcome.statuses.get(429, 0)}, "
              f"503: {outcome.statuses.get(503, 0)}, connection: {outcome.retries - refused})", flush=True)
    return outcome.seconds, outcome.retries, outcome.failures


def _send_threads(
    port: int, path: str, content_type: str, key: str, bodies: list[bytes], clients: int, *, expect: int = 200
) -> tuple[float, int, int]:
    """Send every body from ``clients`` threads (http.client) over keep-alive connections.

    429/503 are retried after their Retry-After, as an OTLP exporter does.
    Returns (seconds until the last acknowledgement, retries, failures).
    """
    work: queue.Queue[bytes] = queue.Queue()
    for body in bodies:
        work.put(body)
    counters: dict[str, int] = {"retries": 0, "failures": 0, "429": 0, "503": 0}
    first_failure: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + RUN_DEADLINE
    headers = {"Content-Type": content_type, "Authorization": f"Bearer {key}"}

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT)
        while time.monotonic() < deadline:
            try:
                body = work.get_nowait()
            except queue.Empty:
                break
            while time.monotonic() < deadline:
                try:
                    connection.request("POST", path, body=body, headers=headers)
                    response = connection.getresponse()
                    response.content = response.read()  # type: ignore[attr-defined]
                except (OSError, http.client.HTTPException):
                    connection.close()
                    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT)
                    with lock:
                        counters["retries"] += 1
                    continue
                if response.status in (429, 503):
                    with lock:
                        counters["retries"] += 1
                        counters[str(response.status)] += 1
                    time.sleep(float(response.getheader("Retry-After", "1")))
                    continue
                if response.status != expect:
                    with lock:
                        counters["failures"] += 1
                        if not first_failure:
                            first_failure.append(f"{path}: HTTP {response.status} {body_text(response)}")
                break
        connection.close()

    elapsed = run_threads([client] * clients)
    if first_failure:
        print(f"  first failure: {first_failure[0]}", flush=True)
    if counters["retries"]:
        print(f"  {path}: retried {counters['retries']} (429: {counters['429']}, 503: {counters['503']}, "
              f"connection: {counters['retries'] - counters['429'] - counters['503']})", flush=True)
    return elapsed, counters["retries"], counters["failures"]


def warm_up(port: int, key: str, *, clients: int, records: bool = True) -> None:
    """Empty batches on both paths from every client at once, so each worker has
    served a request (nothing is stored by them)."""
    empty_records = json.dumps({"records": []}).encode()
    empty_spans = ExportTraceServiceRequest().SerializeToString()
    for _ in range(3):
        if records:
            send_all(port, "/api/v1/records", "application/json", key, [empty_records] * clients * 2, clients)
        send_all(port, "/v1/traces", "application/x-protobuf", key, [empty_spans] * clients * 2, clients)


def measure_floor(port: int, pids: Callable[[], list[int]], bodies: list[bytes], clients: int, *,
                  key: str | None = None, expect: int = 401) -> tuple[float, float, float]:
    """What the stack costs for a request that stores nothing: the same bodies sent
    with a well-formed key that does not exist, refused (401) before any database
    work (or, to benchmarks.bare_wsgi, answered 200 by an app that does nothing).
    Returns (requests/s, gunicorn CPU ms a request, client CPU ms a request)."""
    key = key or "po_0123456789abcdef_" + "A" * 43
    server_before, client_before = cpu_seconds(pids()), time.process_time()
    seconds, _, failures = send_all(port, "/v1/traces", "application/x-protobuf", key, bodies, clients,
                                    expect=expect)
    if failures:
        print(f"  floor: {failures} answers were not {expect}", flush=True)
    requests = len(bodies)
    return (requests / seconds, (cpu_seconds(pids()) - server_before) / requests * 1000,
            (time.process_time() - client_before) / requests * 1000)


def settle(pid: int, *, idle_cpu: float = 0.03, interval: float = 0.25, deadline: float = 30.0) -> float:
    """Wait until gunicorn is idle (under ``idle_cpu`` CPU seconds per interval,
    twice in a row): the derivations a phase started are done. Returns the wait."""
    started = time.monotonic()
    quiet, before = 0, cpu_seconds(process_tree(pid))
    while quiet < 2 and time.monotonic() - started < deadline:
        time.sleep(interval)
        now = cpu_seconds(process_tree(pid))
        quiet = quiet + 1 if now - before < idle_cpu else 0
        before = now
    return time.monotonic() - started


def body_text(response: http.client.HTTPResponse) -> str:
    return response.content[:200].decode("utf-8", "replace")  # type: ignore[attr-defined]


def count_rows(env: dict[str, str]) -> tuple[int, int]:
    code = (
        "from dashboard.observatory.models import Source, Span, ToolExecution\n"
        # the records sent, not the tool executions derived from the GenAI spans
        "print(Span.objects.count(), ToolExecution.objects.filter(source=Source.RECORD).count())\n"
    )
    spans, records = manage(env, "shell", "-c", code).strip().splitlines()[-1].split()
    return int(spans), int(records)


def run_one(db: str, args: argparse.Namespace, spans: list[bytes], records: list[bytes]) -> dict[str, object]:
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-ingest-{db}-"))
    try:
        env = {
            **os.environ,
            "OBSERVATORY_DATA_DIR": str(workdir / "data"),
            "SECRET_KEY": secrets.token_urlsafe(48),
            "DEBUG": "0",
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "DJANGO_SETTINGS_MODULE": "dashboard.settings",
        }
        env.pop("CELERY_BROKER_URL", None)  # the embedded default: eager tasks
        with (private_postgres(workdir) if db == "postgres" else _nothing()) as database_url:
            if database_url:
                env["DATABASE_URL"] = database_url
            else:
                env.pop("DATABASE_URL", None)
            manage(env, "migrate", "--noinput")
            key = create_project_and_key(env)
            port = free_port()
            with gunicorn(env, port, workers=args.workers, worker_class=args.worker_class, threads=args.threads,
                          log=workdir / "gunicorn.log") as server:
                warm_up(port, key, clients=args.clients)
                # Records first, then spans: each path on a database the other
                # barely touched (the records' eager link task scans recent
                # unlinked spans, so after a span run it would measure that scan).
                cpu_before = cpu_seconds(process_tree(server.pid))
                record_seconds, record_retries, record_failures = send_all(
                    port, "/api/v1/records", "application/json", key, records, args.clients
                )
                settle_seconds = settle(server.pid)
                record_rss_kib = peak_rss_kib(process_tree(server.pid))
                span_port = free_port() if args.server == "receiver" else port
                with (receiver(env, span_port, processes=args.workers, log=workdir / "receiver.log")
                      if args.server == "receiver" else _nothing()) as span_server:
                    # Spans to the receiver when asked (warmed up like gunicorn); the CPU of
                    # both servers counts (gunicorn's derivation threads may take its notes).
                    pids = lambda: process_tree(server.pid) + (process_tree(span_server.pid) if span_server else [])  # noqa: E731
                    if span_server:
                        warm_up(span_port, key, clients=args.clients, records=False)
                    cpu_middle = cpu_seconds(pids())
                    database_before, client_before = database_cpu_seconds(), time.process_time()
                    span_seconds, span_retries, span_failures = send_all(
                        span_port, "/v1/traces", "application/x-protobuf", key, spans, args.clients
                    )
                    rss_kib = peak_rss_kib(pids())
                    cpu_after = cpu_seconds(pids())
                    span_database_cpu = database_cpu_seconds() - database_before
                    span_client_cpu = time.process_time() - client_before
                    floor = measure_floor(span_port, pids, spans, args.clients) if args.floor else None
            bare = None
            if args.floor and args.server == "gunicorn":  # the same config serving an app that does nothing (benchmarks.bare_wsgi)
                port = free_port()
                with gunicorn(env, port, workers=args.workers, worker_class=args.worker_class, threads=args.threads,
                              log=workdir / "gunicorn-bare.log", app="benchmarks.bare_wsgi:application") as server:
                    bare = measure_floor(port, lambda: process_tree(server.pid), spans, args.clients, key=key, expect=200)
            stored_spans, stored_records = count_rows(env)
        return {
            "db": db,
            "spans": Phase("spans", len(spans) * args.spans_per_batch, stored_spans, span_seconds, span_retries, span_failures, len(spans)),
            "records": Phase("records", len(records) * args.records_per_batch, stored_records, record_seconds, record_retries, record_failures, len(records)),
            "record_rss_mb": record_rss_kib / 1024,
            "record_cpu": cpu_middle - cpu_before,
            "span_cpu": cpu_after - cpu_middle,
            "rss_mb": rss_kib / 1024,
            "settle_seconds": settle_seconds,
            "span_database_cpu": span_database_cpu,
            "span_client_cpu": span_client_cpu,
            "floor": floor,
            "bare": bare,
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def _nothing() -> Iterator[str]:
    yield ""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--batches", type=int, default=60, help="OTLP batches")
    parser.add_argument("--spans-per-batch", type=int, default=SPANS_PER_BATCH,
                        help="spans in each OTLP batch (10 measures the per-request cost)")
    parser.add_argument("--record-batches", type=int, default=20)
    parser.add_argument("--records-per-batch", type=int, default=500)
    parser.add_argument("--genai-every", type=int, default=0, help="one span in N has GenAI attributes (0: none)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--senders", choices=SENDERS, default="threads",
                        help="threads (http.client, one a client) or loop (one thread, non-blocking sockets): see send_all")
    parser.add_argument("--floor", action="store_true",
                        help="also send the span batches with an unknown key: what a request costs that stores nothing")
    parser.add_argument("--workers", type=int, default=None,
                        help="gunicorn workers (default: deploy/gunicorn.conf.py's, two a core)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads a worker (default: deploy/gunicorn.conf.py's, 4)")
    parser.add_argument("--worker-class", choices=["sync", "gthread"], default=None,
                        help="run plain gunicorn with this worker class instead of deploy/gunicorn.conf.py")
    parser.add_argument("--server", choices=["gunicorn", "receiver"], default="gunicorn",
                        help="where the spans go: the dashboard (gunicorn) or the OTLP/HTTP receiver "
                             "(manage.py otlp_http; --workers sets its processes)")
    args = parser.parse_args(argv)
    global _senders
    _senders = args.senders

    print(f"building {args.batches} span batches and {args.record_batches} record batches ...", flush=True)
    spans = span_batches(args.batches, genai_every=args.genai_every, size=args.spans_per_batch)
    records = record_batches(args.record_batches, args.records_per_batch)
    if spans:
        print(f"span batch {len(spans[0]) / 1024:.0f} KiB ({len(spans[0]) / args.spans_per_batch:.0f} B/span)", flush=True)
    if records:
        print(f"record batch {len(records[0]) / 1024:.0f} KiB ({args.records_per_batch} records)", flush=True)

    results = []
    for db in (["sqlite", "postgres"] if args.db == "both" else [args.db]):
        print(f"running {db} ...", flush=True)
        results.append(run_one(db, args, spans, records))

    print()
    spans_to = "spans to the OTLP/HTTP receiver (manage.py otlp_http), records to " if args.server == "receiver" else ""
    print(f"{spans_to}gunicorn: {server_setup(args)}; {args.spans_per_batch} spans a batch, {args.clients} senders ({args.senders}), "
          f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"{'db':<9} {'path':<8} {'sent':>8} {'stored':>8} {'seconds':>8} {'rows/s':>9} {'req/s':>7} "
          f"{'rows/cpu-s':>10} {'retries':>8} {'fails':>6} {'peak RSS':>9}")
    for result in results:
        # Peak RSS is cumulative: after the records phase, then after both.
        # rows/cpu-s: rows per CPU second of gunicorn (master + workers), which
        # leaves out the database server, the client and other load.
        for phase, rss, cpu in (
            (result["records"], result["record_rss_mb"], result["record_cpu"]),
            (result["spans"], result["rss_mb"], result["span_cpu"]),
        ):
            print(
                f"{result['db']:<9} {phase.name:<8} {phase.sent:>8} {phase.stored:>8} {phase.seconds:>8.2f} "
                f"{phase.per_second:>9.0f} {phase.requests_per_second:>7.0f} {phase.stored / cpu if cpu else 0:>10.0f} {phase.retries:>8} "
                f"{phase.failures:>6} {rss:>7.0f}MB"
            )
    for result in results:
        spans_phase = result["spans"]
        server, database, client = result["span_cpu"], result["span_database_cpu"], result["span_client_cpu"]
        per_request = (server + database + client) / spans_phase.requests if spans_phase.requests else 0.0
        print(f"{result['db']} spans: CPU a request {per_request * 1000:.2f} ms (server {server / spans_phase.requests * 1000:.2f}, "
              f"database {database / spans_phase.requests * 1000:.2f}, client {client / spans_phase.requests * 1000:.2f}): "
              f"{os.cpu_count()} idle CPUs would take about {(os.cpu_count() or 1) / per_request if per_request else 0:.0f} requests/s")
    for result in results:
        if result["floor"]:
            rate, server_ms, client_ms = result["floor"]
            print(f"{result['db']} floor (the same requests refused for their key, nothing stored): {rate:.0f} requests/s; "
                  f"CPU a request server {server_ms:.2f} ms, client {client_ms:.2f} ms: {os.cpu_count()} idle CPUs "
                  f"would take about {(os.cpu_count() or 1) / (server_ms + client_ms) * 1000:.0f} requests/s")
        if result["bare"]:
            rate, server_ms, client_ms = result["bare"]
            print(f"{result['db']} bare floor (the same config serving benchmarks.bare_wsgi: no Django, nothing parsed "
                  f"or stored): {rate:.0f} requests/s; CPU a request server {server_ms:.2f} ms, client "
                  f"{client_ms:.2f} ms: {os.cpu_count()} idle CPUs would take about "
                  f"{(os.cpu_count() or 1) / (server_ms + client_ms) * 1000:.0f} requests/s")
    for result in results:
        print(f"{result['db']}: after the records the server was busy deriving for {result['settle_seconds']:.1f} s "
              "(counted in their rows/cpu-s)")
    print("targets: spans >= 20,000/s, records >= 10,000/s, peak RSS < 300 MB (master + workers)")
    print(f"load average now: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (other work on the machine slows every figure)")


if __name__ == "__main__":
    main()
