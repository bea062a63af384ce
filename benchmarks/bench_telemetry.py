"""What telemetry costs the agent.

1. RecordExporter.submit() on the agent thread: 100k ToolResultRecords submitted
   while the background thread sends to a local receiver (target: <= 20 us median/mean).
2. Tool spans per second through the pipeline's span processor (OTLP/HTTP protobuf)
   into a local receiver that decodes and counts them.

The receiver (benchmarks/receiver.py) runs in a child process on 127.0.0.1, so its
work does not share the agent's GIL.
Run: .venv/bin/python -m benchmarks.bench_telemetry [--port 18211]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from benchmarks.receiver import DEFAULT_PORT, Receiver

RECORDS = 100_000
SPANS = 20_000


def bench_submit(receiver: Receiver) -> None:
    from pipeline import RecordExporter, ToolExecutionResult, ToolInvocationRequest, records_for_result

    request = ToolInvocationRequest(tool_call_id="toolu_01", tool_name="query_sales", parameters={"region": "north"})
    result = ToolExecutionResult(tool_call_id="toolu_01", observation="3 rows: north 10, south 12, east 9", success=True)
    records = [records_for_result(request, result, conversation_id="bench", round_id=f"r{i % 50}") for i in range(RECORDS)]

    # The 100k records built above are the benchmark's, not the exporter's: keep the
    # collector from scanning them in the middle of the timed loop.
    gc.collect()
    gc.freeze()
    exporter = RecordExporter(receiver.url, "bench-key", batch_size=500, flush_interval_ms=100, max_queue=RECORDS,
                              max_queue_bytes=512 * 1024 * 1024)
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
          f"receiver counted {receiver.counts()['distinct_records']:,} distinct")


def bench_spans(receiver: Receiver) -> None:
    from pipeline import ObservabilityConfig, ToolExecutionResult, ToolInvocationRequest, TraceSampling, configure_telemetry

    config = ObservabilityConfig(
        otlp_endpoint=receiver.url,
        otlp_compression="none",
        trace_sampling=TraceSampling.ALWAYS,
        enable_metrics=False,
        max_queue_size=SPANS,
        trace_batch_size=512,
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
    received = receiver.counts()["distinct_spans"]
    print(f"tool spans x {SPANS:,} (16 attributes each, SpanDeliveryProcessor -> OTLP/HTTP protobuf -> local receiver)")
    print(f"  created {SPANS / created:,.0f} spans/s on the agent thread ({created / SPANS * 1e6:.1f} us/span)")
    print(f"  end to end {received / total:,.0f} spans/s exported; receiver got {received:,}/{SPANS:,} distinct")


def main() -> None:
    parser = argparse.ArgumentParser(description="What telemetry costs the agent")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT + 1, help="the receiver's port on 127.0.0.1")
    args = parser.parse_args()
    with Receiver(args.port) as receiver:
        bench_submit(receiver)
        bench_spans(receiver)


if __name__ == "__main__":
    main()
