"""A burst of GenAI spans, model calls and tool calls, to gunicorn as deployed on SQLite
with the embedded derivations: how fast it is acknowledged, and how fast it is stored
with everything derived from it (the sustained rate), with the server's CPU a span.

    .venv/bin/python -m benchmarks.bench_burst                              # 50 x 1,000 spans, 1 sender
    .venv/bin/python -m benchmarks.bench_burst --clients 4 --conversations 50
    .venv/bin/python -m benchmarks.bench_burst --root ../other-checkout     # that checkout's server

Each run: a fresh data dir, migrate, a project and key, gunicorn with the served
checkout's deploy/gunicorn.conf.py on a free loopback port, a warm-up, the burst, then
wait until the server is idle (the derivations drained, at most --drain-deadline s),
count the stored spans, stop the server. ``--root`` serves another checkout's code with
this checkout's sender, so the code before and after a change can be run alternately in
one sitting (A B A B: the machine's speed moves between runs). Printed, one line a run:
spans/s acknowledged (stored / sending time), spans/s sustained (stored / (sending +
draining)), CPU µs a span while sending and in all.

Where its figures came from first: the issue's regression (bisected to 91e1bcf, span
rows derived from spans; deploy/SCALING.md, 2026-11-28).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import sys
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from benchmarks import bench_ingest as bi

TOOLS = ("search_orders", "fetch_invoice", "lookup_customer", "summarise", "web_search", "read_file", "run_sql")
MODELS = ("gpt-4o", "claude-3-sonnet")


def genai_batches(count: int, size: int, conversations: int, tools_only: bool = False) -> list[bytes]:
    """``count`` protobuf batches of ``size`` spans, every one a GenAI span: per trace
    of 20 spans, 10 model calls ("chat <model>": request/response model, input/output
    tokens) each followed by a tool call ("execute_tool <tool>": tool name, call id,
    input tokens), all naming the trace's conversation. ``conversations``: 0 = five new
    conversations per batch; N = a pool of N conversations the batches keep returning to.
    ``tools_only``: every span a tool call (as OpenTelemetry-only agents send them)."""
    bodies = []
    start = time.time_ns()
    for batch in range(count):
        request = ExportTraceServiceRequest()
        rs = request.resource_spans.add()
        for key, value in (("service.name", "bench-agent"), ("service.version", "1.4.2")):
            rs.resource.attributes.add(key=key, value=AnyValue(string_value=value))
        ss = rs.scope_spans.add()
        ss.scope.name = "pipeline"
        trace_id = os.urandom(16)
        conv = ""
        for index in range(size):
            if index % 20 == 0:
                trace_id = os.urandom(16)
                trace_no = index // 20
                conv = (f"conv-{batch}-{trace_no % 5}" if not conversations
                        else f"conv-{(batch * 50 + trace_no) % conversations}")
            span = ss.spans.add()
            span.trace_id = trace_id
            span.span_id = os.urandom(8)
            span.parent_span_id = os.urandom(8)
            span.kind = 1
            span.start_time_unix_nano = start + (batch * size + index) * 1_000_000
            span.end_time_unix_nano = span.start_time_unix_nano + 3_500_000
            a = span.attributes
            a.add(key="gen_ai.conversation.id", value=AnyValue(string_value=conv))
            if index % 2 == 0 and not tools_only:
                model = MODELS[(index // 2) % len(MODELS)]
                span.name = f"chat {model}"
                a.add(key="gen_ai.operation.name", value=AnyValue(string_value="chat"))
                a.add(key="gen_ai.request.model", value=AnyValue(string_value=model))
                a.add(key="gen_ai.response.model", value=AnyValue(string_value=model))
                a.add(key="gen_ai.usage.input_tokens", value=AnyValue(int_value=1200 + index))
                a.add(key="gen_ai.usage.output_tokens", value=AnyValue(int_value=80 + index % 50))
            else:
                tool = TOOLS[index % len(TOOLS)]
                span.name = f"execute_tool {tool}"
                a.add(key="gen_ai.operation.name", value=AnyValue(string_value="execute_tool"))
                a.add(key="gen_ai.tool.name", value=AnyValue(string_value=tool))
                a.add(key="gen_ai.tool.call.id", value=AnyValue(string_value=f"call_{uuid.uuid4().hex}"))
                a.add(key="gen_ai.usage.input_tokens", value=AnyValue(int_value=300 + index % 900))
                if index % 40 == 1:
                    span.status.code = 2
                    a.add(key="error.type", value=AnyValue(string_value="timeout"))
            a.add(key="ba.output_level", value=AnyValue(string_value=("brief", "standard", "full")[index % 3]))
            a.add(key="ba.data_summary", value=AnyValue(string_value="orders for customer 4711, 2024-Q3: " + "x" * 120))
        bodies.append(request.SerializeToString())
    return bodies


def count_spans(env: dict[str, str]) -> int:
    out = bi.manage(env, "shell", "-c", "from dashboard.observatory.models import Span\nprint(Span.objects.count())")
    return int(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--spans-per-batch", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--conversations", type=int, default=0,
                        help="0: five new conversations a batch; N: a pool of N the batches keep returning to")
    parser.add_argument("--tools-only", action="store_true",
                        help="every span a tool call (OpenTelemetry-only tool spans, no model-call spans)")
    parser.add_argument("--drain-deadline", type=float, default=90.0)
    parser.add_argument("--root", default="", help="serve this checkout's code (default: this one)")
    parser.add_argument("--profile", default="", metavar="FILE",
                        help="py-spy the server (master and workers) while sending and draining: "
                             "collapsed stacks to FILE (py-spy must be installed)")
    parser.add_argument("--keep", action="store_true", help="keep the data dir (its path is printed) to look into")
    args = parser.parse_args(argv)
    if args.batches <= 0 or args.spans_per_batch <= 0 or args.clients <= 0 or args.conversations < 0:
        raise SystemExit("--batches, --spans-per-batch and --clients must be positive, --conversations not negative")
    if args.root:
        bi.ROOT = Path(args.root).resolve()
        if not (bi.ROOT / "manage.py").exists():
            raise SystemExit(f"--root {args.root}: no manage.py there")
    bodies = genai_batches(args.batches, args.spans_per_batch, args.conversations, args.tools_only)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=bi.ROOT, capture_output=True,
                            text=True).stdout.strip()
    workdir = Path(tempfile.mkdtemp(prefix="bench-burst-"))
    try:
        env = {**os.environ, "PYTHONPATH": str(bi.ROOT), "OBSERVATORY_DATA_DIR": str(workdir / "data"),
               "SECRET_KEY": secrets.token_urlsafe(48), "DEBUG": "0", "ALLOWED_HOSTS": "127.0.0.1,localhost",
               "DJANGO_SETTINGS_MODULE": "dashboard.settings", "WEB_ACCESS_LOG": "/dev/null"}
        env.pop("CELERY_BROKER_URL", None)
        env.pop("DATABASE_URL", None)
        bi.manage(env, "migrate", "--noinput")
        key = bi.create_project_and_key(env)
        port = bi.free_port()
        with bi.gunicorn(env, port, log=workdir / "gunicorn.log") as server:
            bi.warm_up(port, key, clients=max(args.clients, 4), records=False)
            bi.settle(server.pid, deadline=20)
            spy = subprocess.Popen(
                [shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy")), "record", "--subprocesses", "--nonblocking", "--format", "raw",
                 "--rate", "50", "-p", str(server.pid), "-o", args.profile],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if args.profile else None
            cpu_start = bi.cpu_seconds(bi.process_tree(server.pid))
            seconds, retries, failures = bi.send_all(port, "/v1/traces", "application/x-protobuf", key, bodies,
                                                     args.clients)
            cpu_sent = bi.cpu_seconds(bi.process_tree(server.pid))
            drained = bi.settle(server.pid, deadline=args.drain_deadline)
            cpu_end = bi.cpu_seconds(bi.process_tree(server.pid))
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
                spy.wait(timeout=60)
            log_tail = (workdir / "gunicorn.log").read_text()[-3000:]
        stored = count_spans(env)
        print(f"{commit}: {args.clients} sender(s), {stored:,} of {args.batches * args.spans_per_batch:,} spans stored; "
              f"acknowledged {stored / seconds:,.0f} spans/s, sustained {stored / (seconds + drained):,.0f} spans/s "
              f"(sending {seconds:.1f} s + draining {drained:.1f} s); CPU a span {(cpu_sent - cpu_start) / max(stored, 1) * 1e6:.0f} µs "
              f"sending, {(cpu_end - cpu_start) / max(stored, 1) * 1e6:.0f} µs in all; {retries} retried, {failures} failed; "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
        if "Traceback" in log_tail:
            print("server log tail:\n" + log_tail, flush=True)
    finally:
        bi.remove_unless_kept(workdir, args.keep, f"data kept in {workdir / 'data'}")


if __name__ == "__main__":
    main()
