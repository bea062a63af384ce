"""What the fault and endurance benchmarks share: a real server under the deploy's
gunicorn config that can be killed with SIGKILL and restarted, agents that send
spans and records the way exporters do (retrying the same batch until it is
acknowledged), a logged-in reader timing pages, a memory sampler, and the checks
that say whether stored and derived data agree with what was acknowledged.

Everything runs on 127.0.0.1 with bounded timeouts; every process started here is
stopped by PID (``Server.stop``), also when a benchmark fails.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import secrets
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from benchmarks.bench_ingest import GUNICORN, ROOT, free_port, process_tree

REQUEST_TIMEOUT = 30  # seconds, one request
TOOLS = ("search_orders", "fetch_invoice", "lookup_customer", "summarise", "web_search")


def _proc_kib(pids: list[int], file: str, field: str) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
                if line.startswith(field):
                    total += int(line.split()[1])
                    break
        except OSError:
            continue
    return total / 1024


def rss_mib(pids: list[int]) -> float:
    """Resident memory now (VmRSS), summed over the processes: pages the workers
    share with the master (gunicorn preloads the app) are counted once per process."""
    return _proc_kib(pids, "status", "VmRSS:")


def pss_mib(pids: list[int]) -> float:
    """Proportional set size now, summed: each shared page counted once in all, so
    this is the memory the server really takes."""
    return _proc_kib(pids, "smaps_rollup", "Pss:")


# --- the server -------------------------------------------------------------------


class ProcessGroup:
    """A command in its own process group (a gunicorn master and its workers, a Celery
    worker and its pool), so a SIGKILL takes all of it at once; stopped by its PID.
    Its stderr goes to ``log`` (a file path, appended to) or a temporary file."""

    def __init__(self, command: list[str], env: dict[str, str], *, log: Path | None = None) -> None:
        self.command, self.env, self.log_path = command, env, log
        self.process: subprocess.Popen | None = None
        self.log = open(log, "a+b") if log else tempfile.TemporaryFile()

    def spawn(self) -> None:
        self.process = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL,
                                        stderr=self.log, start_new_session=True)

    def exited(self) -> str | None:
        """None while it runs; else the end of what it wrote."""
        if self.process is None or self.process.poll() is None:
            return None
        return os.pread(self.log.fileno(), 2000, max(0, os.fstat(self.log.fileno()).st_size - 2000)).decode(
            errors="replace")

    def pids(self) -> list[int]:
        return process_tree(self.process.pid) if self.process and self.process.poll() is None else []

    def kill(self) -> None:
        """SIGKILL to the whole group at once: nothing gets to clean up."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)


class Server(ProcessGroup):
    """gunicorn with deploy/gunicorn.conf.py (2 workers x 4 threads by default) on a
    free loopback port (of BENCH_PORTS when set), in its own process group."""

    def __init__(self, env: dict[str, str], *, log: Path | None = None, options: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        super().__init__(  # options: gunicorn's, over the config file's (e.g. "-k", "gthread")
            [GUNICORN, "-c", str(ROOT / "deploy" / "gunicorn.conf.py"), *options, "dashboard.wsgi:application"],
            {**env, "OBSERVATORY_BIND": f"127.0.0.1:{self.port}", "WEB_ACCESS_LOG": "/dev/null", "WEB_LOG_LEVEL": "warning"},
            log=log,
        )

    def start(self, *, deadline: float = 60) -> float:
        """Start and wait until it answers; returns the seconds that took."""
        started = time.monotonic()
        self.spawn()
        while time.monotonic() - started < deadline:
            if (said := self.exited()) is not None:
                raise SystemExit(f"gunicorn exited during start-up:\n{said}")
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                connection.request("GET", "/accounts/login/")
                connection.getresponse().read()
                connection.close()
                return time.monotonic() - started
            except OSError:
                time.sleep(0.1)
        raise SystemExit(f"gunicorn did not answer within {deadline} s")


# --- agents -----------------------------------------------------------------------


@dataclass
class Acknowledged:
    """What the server acknowledged (HTTP 200), by the ids the agents generated."""

    span_ids: set[str] = field(default_factory=set)
    tool_call_ids: set[str] = field(default_factory=set)
    batches: int = 0
    retries: int = 0
    connection_errors: int = 0
    refused: int = 0  # 4xx other than 429: should stay 0
    first_refusal: str = ""
    acked_at: list[tuple[float, str, int]] = field(default_factory=list)  # (time, conversation, records) per batch
    lock: threading.Lock = field(default_factory=threading.Lock)


class Agent:
    """One sender: alternates OTLP span batches (GenAI tool spans naming a
    conversation, among plain spans) and record batches, each retried as an
    exporter does (Retry-After on 429/503, a short pause after a connection error)
    until acknowledged or the stop event is set.

    With ``also`` (other servers' ports), a port that refuses the connection is left
    for the next, as a load balancer takes a dead node out, and tried again
    HOME_AFTER seconds later."""

    HOME_AFTER = 10.0  # seconds on another server before trying its own again

    def __init__(self, port: int, key: str, acknowledged: Acknowledged, *, span_batch_sizes: tuple[int, ...],
                 records_per_batch: int, seed: int, records_every: int = 1, conversations: int = 20,
                 tool_every: int = 4, also: tuple[int, ...] = ()) -> None:
        self.port, self.key, self.acknowledged = port, key, acknowledged
        self.ports = [port, *(other for other in also if other != port)]
        self.home_at = 0.0  # when to go back to ports[0], having left it
        self.tool_every = tool_every  # one span in this many is a GenAI tool span
        self.span_batch_sizes, self.records_per_batch, self.records_every = span_batch_sizes, records_per_batch, records_every
        self.random = random.Random(seed)
        self.conversation_prefix = f"agent{seed}-conv"
        self.conversations = conversations
        self.connection: http.client.HTTPConnection | None = None

    def run(self, stop: threading.Event, *, spans_per_second: float = 0.0, turns: int | None = None) -> None:
        """Send until ``stop`` (or ``turns`` span batches): span batches of the sizes in
        turn, a record batch after every ``records_every`` of them; at most
        ``spans_per_second`` when given."""
        turn = 0
        while not stop.is_set() and (turns is None or turn < turns):
            started = time.monotonic()
            if self.port != self.ports[0] and started >= self.home_at:
                self._switch(self.ports[0])
            size = self.span_batch_sizes[turn % len(self.span_batch_sizes)]
            self._deliver(stop, *self._span_batch(size))
            if self.records_per_batch and turn % self.records_every == self.records_every - 1:
                self._deliver(stop, *self._record_batch())
            turn += 1
            if spans_per_second:
                stop.wait(max(0.0, size / spans_per_second - (time.monotonic() - started)))
        if self.connection:
            self.connection.close()

    def _switch(self, port: int) -> None:
        if self.connection:
            self.connection.close()
        self.connection, self.port = None, port

    def _conversation(self) -> str:
        return f"{self.conversation_prefix}-{self.random.randrange(self.conversations)}"

    def _span_batch(self, size: int) -> tuple[str, str, bytes, str, set[str], set[str], int]:
        request = ExportTraceServiceRequest()
        resource_spans = request.resource_spans.add()
        resource_spans.resource.attributes.add(key="service.name", value=AnyValue(string_value="chaos-agent"))
        spans = resource_spans.scope_spans.add().spans
        conversation = self._conversation()
        now = time.time_ns()
        span_ids: set[str] = set()
        trace_id = os.urandom(16)
        for index in range(size):
            span = spans.add()
            if index % 16 == 0:
                trace_id = os.urandom(16)
            span.trace_id, span.span_id = trace_id, os.urandom(8)
            span.name = "step"
            span.kind = 1
            span.start_time_unix_nano = now - 5_000_000 + index
            span.end_time_unix_nano = now
            if index % self.tool_every == 0:
                tool = TOOLS[index % len(TOOLS)]
                span.name = f"execute_tool {tool}"
                for key, value in (("gen_ai.conversation.id", conversation), ("gen_ai.tool.name", tool),
                                   ("gen_ai.tool.call.id", f"span-call-{uuid.uuid4().hex}")):
                    span.attributes.add(key=key, value=AnyValue(string_value=value))
                span.attributes.add(key="gen_ai.usage.input_tokens", value=AnyValue(int_value=100 + index))
                if index % 40 == 0:
                    span.status.code = 2
                    span.attributes.add(key="error.type", value=AnyValue(string_value="timeout"))
            span.attributes.add(key="code.function", value=AnyValue(string_value="run_tool"))
            span_ids.add(span.span_id.hex())
        return "/v1/traces", "application/x-protobuf", request.SerializeToString(), conversation, span_ids, set(), 0

    def _record_batch(self) -> tuple[str, str, bytes, str, set[str], set[str], int]:
        from pipeline import ToolExecutionResult, ToolResultRecord

        conversation = self._conversation()
        calls, records = set(), []
        for index in range(self.records_per_batch):
            call = f"rec-call-{uuid.uuid4().hex}"
            calls.add(call)
            record = ToolResultRecord(
                conversation_id=conversation, tool_name=TOOLS[index % len(TOOLS)], parameters={"q": index},
                model="gpt-4o",
                result=ToolExecutionResult(
                    tool_call_id=call, observation="ok " * 20, success=index % 10 != 0,
                    error_type=None if index % 10 else "timeout", retry_count=index % 2,
                    duration_ms=20.0 + index, observation_tokens=40,
                ),
            )
            records.append(record.model_dump(mode="json"))
        body = json.dumps({"records": records}).encode()
        return "/api/v1/records", "application/json", body, conversation, set(), calls, len(calls)

    def _deliver(self, stop: threading.Event, path: str, content_type: str, body: bytes, conversation: str,
                 span_ids: set[str], calls: set[str], items: int) -> None:
        headers = {"Content-Type": content_type, "Authorization": f"Bearer {self.key}"}
        acknowledged = self.acknowledged
        while not stop.is_set():
            reused = self.connection is not None
            try:
                if self.connection is None:
                    self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT)
                self.connection.request("POST", path, body=body, headers=headers)
                response = self.connection.getresponse()
                content = response.read()
            except (OSError, http.client.HTTPException):
                if self.connection:
                    self.connection.close()
                self.connection = None
                if reused:  # the server closed an idle keep-alive connection: just reconnect
                    continue
                with acknowledged.lock:
                    acknowledged.connection_errors += 1
                if len(self.ports) > 1:
                    self._switch(self.ports[(self.ports.index(self.port) + 1) % len(self.ports)])
                    self.home_at = time.monotonic() + self.HOME_AFTER
                stop.wait(0.5)
                continue
            if response.status == 200 and path == "/api/v1/records" and json.loads(content).get("rejected"):
                with acknowledged.lock:
                    acknowledged.refused += 1
                    acknowledged.first_refusal = acknowledged.first_refusal or f"rejected: {content[:200]!r}"
                return
            if response.status == 200:
                with acknowledged.lock:
                    acknowledged.span_ids |= span_ids
                    acknowledged.tool_call_ids |= calls
                    acknowledged.batches += 1
                    if items:  # records: each is a tool call of the conversation
                        acknowledged.acked_at.append((time.time(), conversation, items))
                return
            if response.status in (429, 503):
                with acknowledged.lock:
                    acknowledged.retries += 1
                stop.wait(min(float(response.getheader("Retry-After", "1") or 1), 5.0))
                continue
            with acknowledged.lock:
                acknowledged.refused += 1
                acknowledged.first_refusal = acknowledged.first_refusal or f"{path}: {response.status} {content[:200]!r}"
            return


# --- a reader ---------------------------------------------------------------------


class PageReader:
    """A logged-in user opening the overview, the conversation list and the tools
    page in turn; records each page's time (only answered pages count)."""

    def __init__(self, port: int, session_cookie: str, slug: str) -> None:
        self.port = port
        self.headers = {"Cookie": f"sessionid={session_cookie}"}
        self.paths = [f"/p/{slug}/", f"/p/{slug}/conversations/", f"/p/{slug}/tools/"]
        self.times: list[float] = []
        self.server: list[float] = []  # the pages' own time (Server-Timing), without waits for a thread
        self.by_path: dict[str, list[float]] = {path: [] for path in self.paths}
        self.failures = 0
        self.first_failure = ""

    def run(self, stop: threading.Event, *, pause: float = 0.2) -> None:
        turn = 0
        while not stop.is_set():
            path = self.paths[turn % len(self.paths)]
            turn += 1
            started = time.perf_counter()
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT)
                connection.request("GET", path, headers=self.headers)
                response = connection.getresponse()
                response.read()
                connection.close()
                if response.status == 200:
                    self.times.append(time.perf_counter() - started)
                    self.by_path[path].append(self.times[-1])
                    timing = response.getheader("Server-Timing", "")
                    if "dur=" in timing:
                        self.server.append(float(timing.split("dur=")[1]) / 1000)
                else:
                    self.failures += 1
                    self.first_failure = self.first_failure or f"{path}: {response.status}"
            except (OSError, http.client.HTTPException):
                self.failures += 1
            stop.wait(pause)

    def p95_ms(self) -> float:
        return percentile(self.times, 95) * 1000

    def summary(self) -> str:
        """Each page's p95, and the p95 of the pages' own time (the rest is waiting)."""
        pages = ", ".join(f"{path.rstrip('/').rsplit('/', 1)[-1] or 'overview'} {percentile(times, 95) * 1000:.0f}"
                          for path, times in self.by_path.items())
        return f"p95 by page (ms): {pages}; server time p95 {percentile(self.server, 95) * 1000:.0f} ms"


def load_average() -> str:
    """The machine's load averages (1, 5, 15 minutes), printed beside a figure."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(pct) - 1]


class RssSampler:
    """The servers' summed RSS and PSS every ``every`` seconds, and each process's
    peak RSS (the master first), so a report can say which process grew. Sums over
    every group given (several servers, or their Celery workers too)."""

    def __init__(self, *groups: ProcessGroup) -> None:
        self.groups = groups
        self.samples: list[tuple[float, float]] = []
        self.pss_samples: list[float] = []
        self.pss_timed: list[tuple[float, float]] = []
        self.process_peaks: dict[int, float] = {}
        self.leaders: set[int] = set()  # each group's first process (gunicorn's master, Celery's main)

    def run(self, stop: threading.Event, *, every: float = 0.5) -> None:
        while not stop.is_set():
            trees = [group.pids() for group in self.groups]
            self.leaders.update(tree[0] for tree in trees if tree)
            pids = [pid for tree in trees for pid in tree]
            if pids:
                now = time.time()
                self.samples.append((now, rss_mib(pids)))
                self.pss_samples.append(pss_mib(pids))
                self.pss_timed.append((now, self.pss_samples[-1]))
                for pid in pids:
                    self.process_peaks[pid] = max(self.process_peaks.get(pid, 0.0), rss_mib([pid]))
            stop.wait(every)

    def window_pss(self, since: float) -> float:
        return max((value for at, value in self.pss_timed if at >= since), default=0.0)

    def process_summary(self) -> str:
        """Peak RSS per process, the masters first: ``master 80, workers 150 160 …`` (MB)."""
        if not self.process_peaks:
            return "no processes sampled"
        masters = [rss for pid, rss in self.process_peaks.items() if pid in self.leaders]
        workers = [rss for pid, rss in self.process_peaks.items() if pid not in self.leaders]
        return (f"master{'s' if len(masters) > 1 else ''} {' '.join(f'{rss:.0f}' for rss in masters)}, "
                f"workers {' '.join(f'{rss:.0f}' for rss in workers)} (peak RSS each, MB)")

    @property
    def peak(self) -> float:
        return max((rss for _, rss in self.samples), default=0.0)

    @property
    def peak_pss(self) -> float:
        return max(self.pss_samples, default=0.0)


# --- the database side --------------------------------------------------------------


def django_env(workdir: Path, database_url: str = "") -> dict[str, str]:
    env = {
        **os.environ,
        "OBSERVATORY_DATA_DIR": str(workdir / "data"),
        "SECRET_KEY": secrets.token_urlsafe(48),
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DJANGO_SETTINGS_MODULE": "dashboard.settings",
    }
    env.pop("CELERY_BROKER_URL", None)  # the embedded mode: derivations in the web process
    if database_url:
        env["DATABASE_URL"] = database_url
    else:
        env.pop("DATABASE_URL", None)
    return env


@contextmanager
def fresh_django(prefix: str, database_url: str = "") -> Iterator[Path]:
    """This process's Django on a fresh SQLite data dir (or ``database_url``), migrated;
    the data dir removed afterwards. For the benchmarks that run in-process."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        setup_django(django_env(workdir, database_url))
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        yield workdir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def setup_django(env: dict[str, str]) -> None:
    """Point this process at the benchmark's database (same settings as the server)."""
    os.environ.update({key: value for key, value in env.items() if key.startswith(("OBSERVATORY_", "DATABASE_", "SECRET_", "DEBUG", "ALLOWED_", "DJANGO_"))})
    if "DATABASE_URL" not in env:
        os.environ.pop("DATABASE_URL", None)
    import django

    django.setup()


def project_key_and_session() -> tuple[Any, str, str]:
    """A project, an ingest key and a logged-in member's session key."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.contrib.sessions.backends.db import SessionStore

    from dashboard.accounts.services import apikey_create, membership_add, project_create

    project = project_create(name=f"chaos-{secrets.token_hex(3)}")
    user = get_user_model().objects.create_user(username=f"reader-{secrets.token_hex(3)}", password=secrets.token_urlsafe(16))
    membership_add(project=project, user=user)
    session = SessionStore()
    session["_auth_user_id"] = str(user.pk)
    session["_auth_user_backend"] = settings.AUTHENTICATION_BACKENDS[0]
    session["_auth_user_hash"] = user.get_session_auth_hash()
    session.create()
    return project, apikey_create(project=project)[1], session.session_key


def stored_ids(project_id: int) -> tuple[set[str], set[str], int, int]:
    """(span ids, tool call ids, span rows, tool execution rows) stored for the project;
    tool executions from records only (the ones derived from tool spans are not
    what the agents sent as records)."""
    from dashboard.observatory.models import Source, Span, ToolExecution

    spans = Span.objects.filter(project_id=project_id)
    executions = ToolExecution.objects.filter(project_id=project_id, source=Source.RECORD)
    span_ids = set(spans.values_list("span_id", flat=True).iterator(chunk_size=20_000))
    calls = set(executions.values_list("tool_call_id", flat=True).iterator(chunk_size=20_000))
    return span_ids, calls, spans.count(), executions.count()


def losses(project_id: int, *, span_ids: set[str], tool_call_ids: set[str]) -> dict[str, int]:
    """Of the acknowledged span ids and tool call ids, those not stored, and the rows
    stored twice (each should be 0); and the rows stored."""
    stored_spans, calls, span_rows, execution_rows = stored_ids(project_id)
    return {
        "stored_spans": span_rows,
        "stored_records": execution_rows,
        "lost_spans": len(span_ids - stored_spans),
        "lost_records": len(tool_call_ids - calls),
        "duplicate_spans": span_rows - len(stored_spans),
        "duplicate_records": execution_rows - len(calls),
    }


def divergence(project_id: int) -> dict[str, int]:
    """How far derived data is from the rows: each count is 0 when converged.

    - conversations whose stored tool call, error or message counts differ from a
      recount of their rows;
    - tool calls missing from (or extra in) the hourly rollups: a tool execution
      counts once, a tool span once unless a tool execution describes it;
    - tool spans naming a conversation and still unlinked to it;
    - tool executions whose span is stored (same tool call id) and still unlinked;
    - derivation notes parked for an admin (derived data that will not converge alone).
    """
    from django.db.models import Count, Exists, OuterRef, Q, Sum

    from dashboard.observatory.models import (
        Conversation, DerivationNote, Message, Span, ToolExecution, ToolHourlyRollup,
    )

    executions = ToolExecution.objects.filter(project_id=project_id)
    counted = {row["conversation_id"]: row for row in executions.values("conversation_id").order_by().annotate(
        n=Count("id"), errors=Count("id", filter=Q(success=False)))}
    messages = dict(Message.objects.filter(conversation__project_id=project_id).values("conversation_id").order_by()
                    .annotate(n=Count("id")).values_list("conversation_id", "n"))
    conversations_off = 0
    for conversation in Conversation.objects.filter(project_id=project_id).values("id", "tool_calls", "messages"):
        row = counted.get(conversation["id"], {"n": 0})
        if conversation["tool_calls"] != row["n"] or conversation["messages"] != messages.get(conversation["id"], 0):
            conversations_off += 1
    described = executions.filter(tool_call_id=OuterRef("tool_call_id"))
    tool_spans = Span.objects.filter(project_id=project_id).exclude(tool_name="")
    undescribed = tool_spans.annotate(described=Exists(described)).filter(Q(described=False) | Q(tool_call_id="")).count()
    rolled_up = ToolHourlyRollup.objects.filter(project_id=project_id).aggregate(n=Sum("calls"))["n"] or 0
    unlinked_spans = tool_spans.exclude(conversation_key="").filter(conversation__isnull=True).count()
    # The condition of the partial index on (project, tool_call_id), so the planner uses it.
    spans_of_call = Span.objects.filter(project_id=project_id, tool_call_id=OuterRef("tool_call_id")).exclude(tool_call_id="")
    unlinked_executions = executions.filter(linked_span__isnull=True).annotate(has=Exists(spans_of_call)).filter(has=True).count()
    return {
        "conversations": conversations_off,
        "rollup_calls": abs(rolled_up - (executions.count() + undescribed)),
        "unlinked_spans": unlinked_spans,
        "unlinked_executions": unlinked_executions,
        "parked_notes": DerivationNote.objects.filter(project_id=project_id, parked=True).count(),
    }


def wait_until_converged(project_id: int, *, timeout: float, every: float = 1.0,
                         report: float = 0.0) -> tuple[float | None, dict[str, int]]:
    """Seconds until the derived data agreed with the rows (None past the timeout),
    and the last divergence. With ``report`` (seconds), a line at most that often: how
    far off, and how many derivation notes are still waiting (so a slow drain and a
    wrong one differ).

    A check reads one snapshot (``_snapshot``): the time it reports is when the rows
    it compared were read, not when it ended. On a big database one check takes a
    while (77 s on the hour-long soak's 27M spans); read outside a transaction, the
    derivations moved under it and a check begun while notes still waited could only
    disagree, so the figure was the checks' length more than the drain's. Now a
    check begins once no note waits (one count a second), and the result says both
    when its snapshot was taken and how long reading it took."""
    from django.db import close_old_connections

    from dashboard.observatory.models import DerivationNote

    started = time.monotonic()
    reported = started
    while True:
        close_old_connections()
        began = time.monotonic()
        with _snapshot():
            waiting = DerivationNote.objects.filter(project_id=project_id, parked=False).count()
            off = {"notes_waiting": waiting} if waiting else divergence(project_id)
        now = time.monotonic()
        if not any(off.values()):
            if report:
                print(f"  the rows as they were {began - started:.1f} s after the load agreed (the check read them "
                      f"for {now - began:.1f} s)", flush=True)
            return began - started, off
        if report and now - reported >= report:
            reported = now
            print(f"  +{now - started:.0f} s: {waiting} notes waiting"
                  + ("" if waiting else f", off: {off}"), flush=True)
        if now - started > timeout:
            return None, off
        time.sleep(every)


def waiting_notes(project_id: int, limit: int = 10) -> list[str]:
    """The derivation notes still there, waiting or parked, one line each (what they
    are about, their attempts, when they are due, the last error): why a run did not
    converge."""
    from django.utils import timezone

    from dashboard.observatory.models import DerivationNote

    now = timezone.now()
    lines = []
    for note in DerivationNote.objects.filter(project_id=project_id).order_by("id")[:limit]:
        lease = f", leased for {(note.claimed_until - now).total_seconds():.0f} s" if note.claimed_until else ""
        state = "PARKED" if note.parked else f"due in {(note.available_at - now).total_seconds():.0f} s{lease}"
        lines.append(f"{note}; {note.attempts} attempts, {state}; last error: {note.last_error[:200] or '-'}")
    return lines


@contextmanager
def _snapshot() -> Iterator[None]:
    """One read transaction, all its reads from the database as it was at its first:
    SQLite's (WAL) does so by itself; PostgreSQL's needs REPEATABLE READ."""
    from django.db import connection, transaction

    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield


def conversation_tool_calls(project_id: int, external_ids: list[str]) -> dict[str, int]:
    """Stored tool-call totals of the named conversations (what the list page shows)."""
    from dashboard.observatory.models import Conversation

    rows = Conversation.objects.filter(project_id=project_id, external_id__in=external_ids)
    return dict(rows.values_list("external_id", "tool_calls"))


def acked_per_conversation(acknowledged: Acknowledged, *, before: float) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    with acknowledged.lock:
        for at, conversation, items in acknowledged.acked_at:
            if at <= before:
                counts[conversation] += items
    return counts


def check(project_id: int, acknowledged_file: Path) -> dict[str, Any]:
    """Compare the stored rows with the acknowledged ids in ``acknowledged_file`` (JSON
    ``{"span_ids": [...], "tool_call_ids": [...]}``) and measure ``divergence``."""
    acked = json.loads(acknowledged_file.read_text())
    found = losses(project_id, span_ids=set(acked["span_ids"]), tool_call_ids=set(acked["tool_call_ids"]))
    return {**{name: value for name, value in found.items() if not name.startswith("stored_")},
            "divergence": divergence(project_id)}


if __name__ == "__main__":
    # python -m benchmarks.load check PROJECT_ID ACKED.json: for a caller configured for
    # another database (the crash test); the environment names this one.
    import sys

    import django

    django.setup()
    print(json.dumps(check(int(sys.argv[2]), Path(sys.argv[3]))))
