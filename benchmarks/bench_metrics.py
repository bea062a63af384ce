"""Metrics collector: recording throughput (1 and 8 threads), the cost of
get_global_stats and of a conversation snapshot + report, and memory boundedness.

Run: .venv/bin/python -m benchmarks.bench_metrics
"""

from __future__ import annotations

from functools import partial
import random
import time
import tracemalloc

from benchmarks import run_threads
from pipeline import MetricsCollector, OutputLevel, ToolMetrics

TOOLS = ["query_database", "vector_search", "run_python", "web_search", "calculator"]


def calls(count: int, seed: int = 1) -> list[ToolMetrics]:
    rng = random.Random(seed)
    return [
        ToolMetrics(
            tool_name=rng.choice(TOOLS),
            duration_ms=rng.uniform(1, 900),
            input_tokens=rng.randint(0, 400),
            output_tokens=rng.randint(0, 3000),
            success=rng.random() > 0.1,
            retry_count=rng.choice([0, 0, 1]),
            output_level=rng.choice(list(OutputLevel)),
        )
        for _ in range(count)
    ]


def record_rate(threads: int, total: int = 200_000) -> float:
    collector = MetricsCollector()
    data = calls(total)
    parts = [data[n::threads] for n in range(threads)]

    def work(part: list[ToolMetrics], worker: int) -> None:
        for index, metrics in enumerate(part):
            collector.record_tool_call(metrics, f"conv-{(worker + index) % 100}")

    elapsed = run_threads([partial(work, parts[n], n) for n in range(threads)])
    assert collector.get_global_stats()["total_tool_calls"] == total
    return total / elapsed


def main() -> None:
    for threads in (1, 8):
        print(f"record_tool_call, {threads} thread(s): {record_rate(threads):12,.0f} calls/s")

    collector = MetricsCollector()
    for n, metrics in enumerate(calls(100_000, seed=2)):
        collector.record_tool_call(metrics, f"conv-{n % 10}")
    started = time.perf_counter()
    stats = collector.get_global_stats()
    print(f"get_global_stats after 100k calls: {(time.perf_counter() - started) * 1000:8.2f} ms "
          f"({len(stats['tools'])} tools)")
    started = time.perf_counter()
    snapshot = collector.get_conversation("conv-3")
    assert snapshot is not None
    report = snapshot.to_report()
    print(f"snapshot + to_report of a 10k-call conversation: {(time.perf_counter() - started) * 1000:8.2f} ms "
          f"({len(report)} chars)")

    tracemalloc.start()
    bounded = MetricsCollector(max_conversations=1000, window=1000)
    one_call = calls(1)[0]
    for n in range(50_000):
        bounded.record_tool_call(one_call, f"conv-{n}")
    first, _ = tracemalloc.get_traced_memory()
    for n in range(50_000, 100_000):
        bounded.record_tool_call(one_call, f"conv-{n}")
    second, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"memory after 50k / 100k distinct conversations (bound 1000): "
          f"{first / 1e6:6.1f} MB / {second / 1e6:6.1f} MB")


if __name__ == "__main__":
    main()
