"""An agent through a dashboard outage: what was sent, delivered, dropped, duplicated.

The agent makes ``--rate`` tool calls a second through ``ToolResultHook`` (a record
and a span each) to a dashboard-like receiver on 127.0.0.1 (benchmarks/receiver.py,
its own process). After ``--before`` seconds the receiver goes down for ``--outage``
seconds (connection refused; ``--mode 503`` answers 503 with Retry-After instead),
then comes back; the agent keeps calling for ``--after`` seconds and the exporters get
``--drain`` seconds to deliver the rest. ``--restart`` stops the agent's exporters in
the middle of the outage and starts new ones on the same spool (a redeploy).

``--speedup N`` runs the exporters on a clock N times faster than real time (their
waits and backoffs shrink, the call rate grows N times) so a 5-minute outage takes
15 s at N=20; the default, 1, is real time.

    .venv/bin/python -m benchmarks.bench_outage --outage 300 --rate 10 [--speedup 20] [--spool DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from typing import Any, Callable

from benchmarks.receiver import DEFAULT_PORT, Receiver
from pipeline import (
    ObservabilityConfig,
    RecordExporter,
    SpanDeliveryProcessor,
    Telemetry,
    ToolExecutionResult,
    ToolInvocationRequest,
    ToolResultHook,
    TraceSampling,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON


class ScaledClock:
    """Monotonic time running ``speed`` times faster than the real one."""

    def __init__(self, speed: float) -> None:
        self.speed = speed
        self._real0 = time.monotonic()

    def monotonic(self) -> float:
        return (time.monotonic() - self._real0) * self.speed

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(seconds / self.speed)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds / self.speed)


def agent(receiver: Receiver, clock: ScaledClock, spool: str) -> tuple[ToolResultHook, Callable[[], Any]]:
    """A hook wired to a record exporter and a span processor on ``clock``."""
    timing: dict[str, Any] = {"monotonic": clock.monotonic, "wait": clock.wait}
    exporter = RecordExporter(receiver.url, "bench-key", spool_dir=f"{spool}/records", **timing)
    processor = SpanDeliveryProcessor(traces_url=f"{receiver.url}/v1/traces", spool_dir=f"{spool}/spans",
                                      schedule_delay_s=1.0, **timing)
    provider = TracerProvider(resource=Resource.create({"service.name": "bench-outage"}), sampler=ALWAYS_ON,
                              shutdown_on_exit=False)
    provider.add_span_processor(processor)
    config = ObservabilityConfig(trace_sampling=TraceSampling.ALWAYS, enable_metrics=False)
    telemetry = Telemetry(config, provider, processor)
    hook = ToolResultHook(conversation_id="outage", telemetry=telemetry, exporter=exporter, round_id="r1")

    def stop(timeout: float) -> dict[str, Any]:
        exporter.shutdown(timeout)
        telemetry.shutdown(timeout)
        return {"records": exporter.delivery_stats()[0], "spans": processor.stats()}

    return hook, stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outage", type=float, default=300.0, help="seconds the dashboard is down")
    parser.add_argument("--rate", type=float, default=10.0, help="tool calls (records and spans) a second")
    parser.add_argument("--before", type=float, default=10.0, help="seconds of normal service first")
    parser.add_argument("--after", type=float, default=30.0, help="seconds of calls after the outage")
    parser.add_argument("--drain", type=float, default=120.0, help="most seconds given to deliver the rest")
    parser.add_argument("--mode", choices=("refuse", "503"), default="refuse")
    parser.add_argument("--restart", action="store_true", help="restart the exporters mid-outage (needs the spool)")
    parser.add_argument("--spool", default=None, help="spool directory (default: a temporary one)")
    parser.add_argument("--speedup", type=float, default=1.0, help="run the clock this many times faster")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT + 2, help="the receiver's port on 127.0.0.1")
    args = parser.parse_args()

    clock = ScaledClock(args.speedup)
    spool = args.spool or tempfile.mkdtemp(prefix="bench-outage-")
    total = args.before + args.outage + args.after
    print(f"outage of {args.outage:g} s ({args.mode}) at {args.rate:g} calls/s, {args.before:g} s before, "
          f"{args.after:g} s after; clock x{args.speedup:g} ({total / args.speedup:.1f} s of calls in real time); "
          f"spool {'restarted mid-outage' if args.restart else 'kept'}")
    with Receiver(args.port) as receiver:
        hook, stop = agent(receiver, clock, spool)
        finished: list[dict[str, Any]] = []
        calls = 0
        start = clock.monotonic()
        phase = "before"
        while (now := clock.monotonic() - start) < total:
            if phase == "before" and now >= args.before:
                receiver.down() if args.mode == "refuse" else receiver.unavailable(retry_after=5)
                phase = "outage"
            elif phase == "outage" and args.restart and now >= args.before + args.outage / 2 and not finished:
                finished.append(stop(2.0))  # the old agent: what it could not send stays in the spool
                hook, stop = agent(receiver, clock, spool)
            elif phase == "outage" and now >= args.before + args.outage:
                receiver.up() if args.mode == "refuse" else receiver.ok()
                phase = "after"
            request = ToolInvocationRequest(tool_call_id=f"call_{calls}", tool_name="query_sales")
            hook(request, ToolExecutionResult(tool_call_id=f"call_{calls}", observation="12 rows", success=True,
                                              duration_ms=3.0), [])
            calls += 1
            next_call = start + calls / args.rate
            clock.sleep(max(0.0, next_call - clock.monotonic()))
        deadline = time.monotonic() + args.drain / args.speedup
        while time.monotonic() < deadline:
            got = receiver.counts()
            if got["distinct_records"] >= calls and got["distinct_spans"] >= calls:
                break
            time.sleep(0.05)
        finished.append(stop(5.0))
        got = receiver.counts()
    for kind, received, distinct in (("records", got["records"], got["distinct_records"]),
                                     ("spans", got["spans"], got["distinct_spans"])):
        dropped = sum(s[kind].dropped + s[kind].failures for s in finished)
        retries = sum(s[kind].retries for s in finished)
        lag = max(s[kind].spool_lag_ms_max for s in finished)
        print(f"{kind:8} sent {calls:>7,}  delivered {distinct:>7,}  dropped {dropped:>5,}  "
              f"duplicates {received - distinct:>5,}  lost {calls - distinct:>5,}  retries {retries:>4,}  "
              f"longest submit-to-spool {lag:6.1f} ms")
    if args.speedup != 1:
        print(f"(times on the exporters' clock, {args.speedup:g}x real time)")


if __name__ == "__main__":
    main()
