"""Per-call overhead of ToolExecutor.execute() beyond the tool body and the token count.

For each call we time ``execute()`` of a trivial tool, then (interleaved, same data)
the direct work it cannot avoid: calling the tool and counting the observation's
tokens. The difference is the executor's overhead: the worker-thread hand-off for
the timeout, output-level resolution, encoding + hashing, the result model.
Target: median <= 100 us.

    .venv/bin/python -m benchmarks.bench_executor [calls]
"""

from __future__ import annotations

import statistics
import sys
import time

from pipeline import OutputLevel, ToolExecutor, ToolInvocationRequest, format_observation
from pipeline._tokens import DynamicTokenCounter

MODEL = "claude-3-sonnet"
ROWS = [{"id": i, "name": f"user{i}", "region": "扬州"} for i in range(10)]


def trivial_tool() -> list[dict]:
    return ROWS


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(executor: ToolExecutor, request: ToolInvocationRequest, counter, calls: int) -> dict[str, float]:
    observation = format_observation(trivial_tool(), request.output_level or OutputLevel.STANDARD)
    clock = time.perf_counter
    for _ in range(200):  # warm up: worker thread, encoder, caches
        executor.execute(request)
    totals, baselines, overheads = [], [], []
    for _ in range(calls):
        t0 = clock()
        executor.execute(request)
        t1 = clock()
        trivial_tool()
        counter.count_tokens(observation, MODEL)
        t2 = clock()
        totals.append((t1 - t0) * 1e6)
        baselines.append((t2 - t1) * 1e6)
        overheads.append((t1 - t0 - (t2 - t1)) * 1e6)
    return {
        "execute_median_us": statistics.median(totals),
        "baseline_median_us": statistics.median(baselines),
        "overhead_median_us": statistics.median(overheads),
        "overhead_p95_us": percentile(overheads, 0.95),
    }


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 5_000
    counter = DynamicTokenCounter()
    executor = ToolExecutor(token_counter=counter, model=MODEL)
    executor.register("rows", trivial_tool)
    executor.register("cached_rows", trivial_tool, cache_policy="cacheable")
    scenarios = {
        "standard (fresh run)": ToolInvocationRequest(tool_call_id="call_1", tool_name="rows"),
        "brief (fresh run)": ToolInvocationRequest(tool_call_id="call_1", tool_name="rows", output_level="brief"),
        "full (fresh run, no store)": ToolInvocationRequest(tool_call_id="call_1", tool_name="rows", output_level="full"),
        "standard (cache hit)": ToolInvocationRequest(tool_call_id="call_1", tool_name="cached_rows"),
    }
    print(f"ToolExecutor overhead beyond tool body + token count, {calls} calls per scenario")
    print(f"{'scenario':30} {'execute p50':>12} {'baseline p50':>13} {'overhead p50':>13} {'overhead p95':>13}")
    for name, request in scenarios.items():
        r = measure(executor, request, counter, calls)
        print(
            f"{name:30} {r['execute_median_us']:10.1f}us {r['baseline_median_us']:11.1f}us "
            f"{r['overhead_median_us']:11.1f}us {r['overhead_p95_us']:11.1f}us"
        )
    # Diagnostic: the same executor with the tool run inline (no timeout hand-off),
    # to show how much of the overhead, and of its tail, is the worker-thread hand-off.
    inline = ToolExecutor(token_counter=counter, model=MODEL, timeout_handler=_Inline())
    inline.register("rows", trivial_tool)
    r = measure(inline, scenarios["standard (fresh run)"], counter, calls)
    print(
        f"{'standard, no hand-off (diag.)':30} {r['execute_median_us']:10.1f}us {r['baseline_median_us']:11.1f}us "
        f"{r['overhead_median_us']:11.1f}us {r['overhead_p95_us']:11.1f}us"
    )
    print("target: overhead median <= 100us")


class _Inline:
    """Runs the tool on the calling thread without a timeout (diagnostic only)."""

    def execute_with_timeout(self, func, tool_call_id, timeout_ms):
        return func()


if __name__ == "__main__":
    main()
