"""Compression speed: 1,000 messages (~200k tokens: mixed roles, tool pairs, some
Chinese, a few verbose logs) compressed with EXTRACT to a 100k target.

The first call counts every message (tiktoken); later calls find each message's
analysis in the per-message cache, which is what an agent compressing a growing
conversation round after round sees. Target: warm call <= 50 ms.

Run: .venv/bin/python -m benchmarks.bench_compression
"""

from __future__ import annotations

import statistics
import time

from pipeline._compression import AdvancedContextManager, ContextCompressionConfig
from pipeline._compression_types import CompressionMode, MessageAction
from pipeline._tokens import DynamicTokenCounter

ENGLISH = (
    "Revenue for the {region} region rose {pct}% quarter on quarter, driven by enterprise "
    "renewals and a larger average deal size; churn stayed flat at 2.1%. "
)
CHINESE = "{region}区域本季度销售额环比增长{pct}%，主要来自企业客户续约和平均订单金额提升；流失率保持在2.1%。"


def build_conversation(rounds: int = 200) -> list[dict]:
    """About 5 messages a round: user, AI tool call, tool result, AI answer, and
    every fifth round a verbose log. Deterministic, so runs compare."""
    messages: list[dict] = [{"role": "system", "content": "You are a business-analysis agent. " * 20}]
    for r in range(rounds):
        region = ["north", "south", "east", "west"][r % 4]
        text = (CHINESE if r % 3 == 0 else ENGLISH).format(region=region, pct=r % 17)
        messages.append({"role": "user", "content": f"Round {r}: " + text * 2})
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"call_{r}", "type": "function", "function": {"name": "sql_query", "arguments": f'{{"q": "select * from sales where r={r}"}}'}}
                ],
            }
        )
        result = "Operation failed.\nError Type: Timeout" if r % 11 == 0 else "| region | month | revenue |\n" + (f"| {region} | 2024-{r % 12 + 1:02d} | {r * 1000} |\n" * 45)
        messages.append({"role": "tool", "tool_call_id": f"call_{r}", "content": result})
        messages.append({"role": "assistant", "content": text * 4})
        if r % 5 == 0:
            messages.append({"role": "assistant", "name": "log", "content": "DEBUG fetched page; " * 60})
        else:
            messages.append({"role": "user", "content": "Thanks, and compared to last year? " + text})
    return messages


def main() -> None:
    messages = build_conversation()
    counter = DynamicTokenCounter()
    manager = AdvancedContextManager(
        ContextCompressionConfig(max_tokens=200_000, strategy=CompressionMode.EXTRACT),
        token_counter=counter,
        model="claude-3-sonnet",
    )
    started = time.perf_counter()
    _, first = manager.compress_with_result(messages, target_tokens=100_000)
    first_ms = (time.perf_counter() - started) * 1000

    warm = []
    for _ in range(20):
        started = time.perf_counter()
        output, result = manager.compress_with_result(messages, target_tokens=100_000)
        warm.append((time.perf_counter() - started) * 1000)

    grown = messages + [{"role": "user", "content": f"one more question {i}"} for i in range(10)]
    started = time.perf_counter()
    manager.compress(grown, target_tokens=100_000)
    grown_ms = (time.perf_counter() - started) * 1000

    print(f"messages: {len(messages)}, tokens before: {first.tokens_before:,}, target: {first.target_tokens:,}")
    print(f"tokens after: {result.tokens_after:,}, messages after: {result.messages_after}, target met: {result.target_met}")
    print(
        "actions: "
        + ", ".join(f"{action.value}={result.count(action)}" for action in MessageAction)
    )
    print(f"first call (cold token cache): {first_ms:.1f} ms")
    print(f"warm call: median {statistics.median(warm):.1f} ms, max {max(warm):.1f} ms over {len(warm)} calls (target <= 50 ms)")
    print(f"grown by 10 messages (10 new counts): {grown_ms:.1f} ms")
    started = time.perf_counter()
    result.model_dump_json()
    print(f"result JSON for the dashboard: {len(result.model_dump_json()) / 1024:.0f} KiB, serialised in {(time.perf_counter() - started) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
