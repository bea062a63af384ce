"""What telemetry costs the agent.

1. RecordExporter.submit() on the agent thread: 100k ToolResultRecords submitted
   while the background thread sends to a local sink (target: <= 20 us median/mean).
2. Tool spans per second through the SDK (BatchSpanProcessor + OTLP/HTTP protobuf
   exporter) into a local sink that decodes and counts them.

The sink runs in a child process so its work does not share the agent's GIL.
Run: .venv/bin/python -m benchmarks.bench_telemetry
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

RECORDS = 100_000
SPANS = 20_000


def _sink(port_out: Any) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    counts = {"records": 0, "spans": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps(counts).encode()
            self._answer(body, "application/json")

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/v1/traces":
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                counts["spans"] += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
                return self._answer(b"", "application/x-protobuf")
            n = len(json.loads(body)["records"])
            counts["records"] += n
            self._answer(json.dumps({"accepted": n, "duplicates": 0, "rejected": []}).encode(), "application/json")

        def _answer(self, body: bytes, content_type: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port_out.put(server.server_address[1])
    server.serve_forever()


def _counts(url: str) -> dict[str, int]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def bench_submit(url: str) -> None:
    from pipeline import RecordExporter, ToolExecutionResult, ToolInvocationRequest, records_for_result

    request = ToolInvocationRequest(tool_call_id="toolu_01", tool_name="query_sales", parameters={"region": "north"})
    result = ToolExecutionResult(tool_call_id="toolu_01", observation="3 rows: north 10, south 12, east 9", success=True)
    records = [records_for_result(request, result, conversation_id="bench", round_id=f"r{i % 50}") for i in range(RECORDS)]

    exporter = RecordExporter(url, "bench-key", batch_size=500, flush_interval_ms=100, max_queue=RECORDS)
    clock = time.perf_counter_ns
    durations = []
    started = clock()
    for record in records:
        t0 = clock()
        exporter.submit(record)
        durations.append(clock() - t0)
    loop_ns = clock() - started
    exporter.flush(120)
    drained_s = (clock() - started) / 1e9
    exporter.shutdown(5)
    stats = exporter.stats()
    durations.sort()
    print(f"submit() x {RECORDS:,} ToolResultRecords (agent thread, sender running)")
    print(f"  median {statistics.median(durations) / 1000:.2f} us   mean {loop_ns / RECORDS / 1000:.2f} us "
          f"(loop incl. timer)   p99 {durations[int(len(durations) * 0.99)] / 1000:.2f} us   "
          f"max {durations[-1] / 1000:.0f} us")
    print(f"  sent {stats.sent:,}  dropped {stats.dropped:,}  failures {stats.failures:,}  "
          f"all delivered in {drained_s:.2f} s ({stats.sent / drained_s:,.0f} records/s to the sink); "
          f"sink counted {_counts(url)['records']:,}")


def bench_spans(url: str) -> None:
    from pipeline import ObservabilityConfig, ToolExecutionResult, ToolInvocationRequest, configure_telemetry

    config = ObservabilityConfig(
        otlp_endpoint=url,
        compression="none",
        max_queue_size=SPANS,
        max_export_batch_size=512,
        schedule_delay_ms=100,
    )
    telemetry = configure_telemetry(config, shutdown_on_exit=False)
    request = ToolInvocationRequest(tool_call_id="toolu_01", tool_name="query_sales")
    result = ToolExecutionResult(
        tool_call_id="toolu_01", observation="ok", success=True, retry_count=1, observation_tokens=12, duration_ms=3.2
    )
    started = time.perf_counter()
    for i in range(SPANS):
        with telemetry.tool_span(request, "bench", round_id=f"r{i % 50}") as span:
            span.record_tool_result(result)
    created = time.perf_counter() - started
    telemetry.force_flush(60)
    total = time.perf_counter() - started
    telemetry.shutdown(10)
    received = _counts(url)["spans"]
    print(f"tool spans x {SPANS:,} (14 attributes each, BatchSpanProcessor -> OTLP/HTTP protobuf -> local sink)")
    print(f"  created {SPANS / created:,.0f} spans/s on the agent thread ({created / SPANS * 1e6:.1f} us/span)")
    print(f"  end to end {received / total:,.0f} spans/s exported; sink received {received:,}/{SPANS:,}")


def main() -> None:
    ports: Any = multiprocessing.Queue()
    sink = multiprocessing.Process(target=_sink, args=(ports,), daemon=True)
    sink.start()
    try:
        url = f"http://127.0.0.1:{ports.get(timeout=30)}"
        bench_submit(url)
        bench_spans(url)
    finally:
        sink.terminate()
        sink.join(5)


if __name__ == "__main__":
    main()
