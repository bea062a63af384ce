"""Tool metrics: per-conversation statistics, the bounded thread-safe collector, and
aggregates checked against a recomputation from the raw calls."""

from __future__ import annotations

import math
import random
import threading
from collections import defaultdict, deque
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline import ConversationMetrics, MetricsCollector, OutputLevel, ToolExecutionResult, ToolMetrics
from pipeline._exceptions import ConfigError
from pipeline._metrics import percentile

TOOLS = ["query_database", "vector_search", "run_python"]


def make_calls(count: int, seed: int = 7) -> list[ToolMetrics]:
    rng = random.Random(seed)
    calls = []
    for _ in range(count):
        success = rng.random() > 0.2
        calls.append(
            ToolMetrics(
                tool_name=rng.choice(TOOLS),
                duration_ms=round(rng.uniform(1, 900), 3),
                input_tokens=rng.randint(0, 400),
                output_tokens=rng.randint(0, 3000),
                success=success,
                retry_count=rng.choice([0, 0, 0, 1, 2]),
                output_level=rng.choice(list(OutputLevel)),
                error_type=None if success else rng.choice(["timeout", "rate_limit"]),
                cache_hit=rng.random() < 0.1,
            )
        )
    return calls


def recompute(calls: list[ToolMetrics]) -> dict[str, dict[str, Any]]:
    """The expected per-tool statistics, straight from the raw calls."""
    by_tool: dict[str, list[ToolMetrics]] = defaultdict(list)
    for call in calls:
        by_tool[call.tool_name].append(call)
    expected = {}
    for name, group in by_tool.items():
        successes = sum(1 for c in group if c.success)
        expected[name] = {
            "calls": len(group),
            "successes": successes,
            "failures": len(group) - successes,
            "success_rate": successes / len(group),
            "avg_duration_ms": sum(c.duration_ms for c in group) / len(group),
            "input_tokens": sum(c.input_tokens for c in group),
            "output_tokens": sum(c.output_tokens for c in group),
            "total_tokens": sum(c.input_tokens + c.output_tokens for c in group),
            "retries": sum(c.retry_count for c in group),
            "cache_hits": sum(1 for c in group if c.cache_hit),
        }
    return expected


def assert_is_percentile(values: list[float], value: float, pct: float) -> None:
    """Nearest rank by definition: the smallest observed value with at least pct% of
    the values at or below it."""
    n = len(values)
    assert value in values
    assert sum(v <= value for v in values) >= pct / 100 * n
    assert sum(v < value for v in values) < pct / 100 * n


def assert_matches(stats: dict[str, dict[str, Any]], calls: list[ToolMetrics]) -> None:
    expected = recompute(calls)
    assert set(stats) == set(expected)
    for name, want in expected.items():
        got = stats[name]
        for key, value in want.items():
            assert got[key] == pytest.approx(value), (name, key)
        durations = [c.duration_ms for c in calls if c.tool_name == name]
        assert_is_percentile(durations, got["p50_duration_ms"], 50)
        assert_is_percentile(durations, got["p95_duration_ms"], 95)


# --- ToolMetrics ---------------------------------------------------------------------


def test_it_builds_metrics_from_an_execution_result() -> None:
    result = ToolExecutionResult(
        tool_call_id="call_1",
        observation="timed out",
        output_level=OutputLevel.BRIEF,
        success=False,
        error_type="timeout",
        retry_count=2,
        duration_ms=1234.5,
        observation_tokens=17,
        cache_hit=False,
    )
    metrics = ToolMetrics.from_result("query_database", result, input_tokens=40)
    assert metrics.tool_name == "query_database"
    assert (metrics.duration_ms, metrics.input_tokens, metrics.output_tokens) == (1234.5, 40, 17)
    assert metrics.total_tokens == 57
    assert (metrics.success, metrics.retry_count, metrics.error_type) == (False, 2, "timeout")
    assert metrics.output_level is OutputLevel.BRIEF and metrics.cache_hit is False


# --- percentile ----------------------------------------------------------------------


@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=200))
def test_it_computes_nearest_rank_percentiles(values: list[float]) -> None:
    for pct in (50, 95, 99, 100):
        assert_is_percentile(values, percentile(values, pct), pct)


def test_it_gives_zero_percentile_for_no_values() -> None:
    assert percentile([], 95) == 0.0


# --- ConversationMetrics -------------------------------------------------------------


def test_it_computes_tool_stats_that_match_a_recomputation() -> None:
    calls = make_calls(500)
    conversation = ConversationMetrics(conversation_id="conv-1")
    for call in calls:
        conversation.add(call)
    assert_matches(conversation.get_tool_stats(), calls)
    assert conversation.total_calls == 500
    assert conversation.successful_calls == sum(c.success for c in calls)
    assert conversation.failed_calls == sum(not c.success for c in calls)
    assert conversation.retried_calls == sum(c.retry_count > 0 for c in calls)
    assert conversation.total_tokens == sum(c.total_tokens for c in calls)
    errors = conversation.get_tool_stats()["query_database"]["error_types"]
    assert sum(errors.values()) == sum(1 for c in calls if c.tool_name == "query_database" and not c.success)


def test_it_keeps_totals_exact_beyond_the_call_window() -> None:
    calls = make_calls(50)
    conversation = ConversationMetrics(conversation_id="conv-1", window=10)
    for call in calls:
        conversation.add(call)
    assert list(conversation.tool_calls) == calls[-10:]
    stats = conversation.get_tool_stats()
    expected = recompute(calls)
    for name in expected:
        assert stats[name]["calls"] == expected[name]["calls"]
        assert stats[name]["avg_duration_ms"] == pytest.approx(expected[name]["avg_duration_ms"])
        recent = [c.duration_ms for c in calls if c.tool_name == name][-10:]
        assert_is_percentile(recent, stats[name]["p95_duration_ms"], 95)


def test_it_writes_a_readable_report() -> None:
    conversation = ConversationMetrics(conversation_id="conv-42")
    for call in [
        ToolMetrics("query_database", 100.0, 10, 200),
        ToolMetrics("query_database", 300.0, 10, 100, success=False, error_type="timeout", retry_count=1),
        ToolMetrics("run_python", 50.0, 5, 5, cache_hit=True),
    ]:
        conversation.add(call)
    conversation.add_skill_activation("sales-report")
    conversation.add_skill_activation("sales-report")
    report = conversation.to_report()
    assert "Conversation ID: conv-42" in report
    assert "  - Total: 330" in report  # tokens
    assert "  - Failed: 1" in report and "  - Retried: 1" in report
    assert report.index("query_database:") < report.index("run_python:")  # most calls first
    assert "Avg Duration: 200.0ms (p50 100.0ms, p95 300.0ms)" in report
    assert "Avg Tokens: 160 (320 in all)" in report
    assert "Success Rate: 50.0%" in report and "timeout x1" in report
    assert "1 cache hits" in report
    assert "  - Total: 2" in report and "Skills: sales-report" in report


def test_it_reports_a_conversation_without_calls() -> None:
    report = ConversationMetrics(conversation_id="conv-empty").to_report()
    assert "(no tool calls)" in report and "Skills: None" in report


# --- MetricsCollector ----------------------------------------------------------------


def test_it_records_results_skills_and_compressions() -> None:
    collector = MetricsCollector()
    result = ToolExecutionResult(tool_call_id="c1", observation="ok", success=True, observation_tokens=9)
    metrics = collector.record_result("run_python", result, "conv-1", input_tokens=3)
    assert metrics.total_tokens == 12
    collector.record_skill_activation("sales-report", "conv-1")
    collector.record_compression("conv-1")
    conversation = collector.get_conversation("conv-1")
    assert conversation is not None
    assert conversation.total_calls == 1 and conversation.total_tokens == 12
    assert conversation.unique_skills == ["sales-report"] and conversation.compression_events == 1
    assert collector.get_conversation("conv-unknown") is None


def test_it_aggregates_across_threads_without_losing_calls() -> None:
    collector = MetricsCollector()
    calls = make_calls(1600, seed=11)
    per_conversation: dict[str, list[ToolMetrics]] = defaultdict(list)
    plan = [(f"conv-{i % 5}", call) for i, call in enumerate(calls)]
    for conversation_id, call in plan:
        per_conversation[conversation_id].append(call)
    reports: list[str] = []

    def worker(part: list[tuple[str, ToolMetrics]]) -> None:
        for conversation_id, call in part:
            collector.record_tool_call(call, conversation_id)
            if len(reports) < 50:  # read while others write
                snapshot = collector.get_conversation(conversation_id)
                assert snapshot is not None
                reports.append(snapshot.to_report())

    threads = [threading.Thread(target=worker, args=(plan[n::8],)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(reports) >= 50
    for conversation_id, own in per_conversation.items():
        conversation = collector.get_conversation(conversation_id)
        assert conversation is not None and conversation.total_calls == len(own)
        assert sorted(conversation.tool_calls, key=id) == sorted(own, key=id)
        assert_matches(conversation.get_tool_stats(), own)
    stats = collector.get_global_stats()
    assert stats["total_conversations"] == 5 and stats["dropped_conversations"] == 0
    assert stats["total_tool_calls"] == 1600
    assert stats["successful_calls"] == sum(c.success for c in calls)
    assert stats["total_tokens"] == sum(c.total_tokens for c in calls)
    assert stats["total_duration_seconds"] == pytest.approx(sum(c.duration_ms for c in calls) / 1000)
    assert stats["avg_tokens_per_call"] == pytest.approx(stats["total_tokens"] / 1600)
    assert_matches(stats["tools"], calls)


def test_it_drops_the_least_recently_active_conversation_past_the_bound() -> None:
    collector = MetricsCollector(max_conversations=3)
    call = ToolMetrics("run_python", 10.0, 1, 1)
    for conversation_id in ["conv-1", "conv-2", "conv-3"]:
        collector.record_tool_call(call, conversation_id)
    collector.record_tool_call(call, "conv-1")  # conv-1 is active again
    collector.record_tool_call(call, "conv-4")
    collector.record_tool_call(call, "conv-5")
    assert collector.conversation_ids() == ["conv-1", "conv-4", "conv-5"]
    assert collector.get_conversation("conv-2") is None
    stats = collector.get_global_stats()
    assert stats["total_conversations"] == 3 and stats["dropped_conversations"] == 2
    assert stats["total_tool_calls"] == 6  # global totals keep what dropped conversations did


def test_it_stays_bounded_for_a_long_running_agent() -> None:
    collector = MetricsCollector(max_conversations=50, window=20)
    for n, call in enumerate(make_calls(3000, seed=3)):
        collector.record_tool_call(call, f"conv-{n}")
    assert len(collector.conversation_ids()) == 50
    assert collector.get_global_stats()["total_tool_calls"] == 3000


def test_it_hands_out_snapshots_not_live_state() -> None:
    collector = MetricsCollector()
    collector.record_tool_call(ToolMetrics("run_python", 10.0), "conv-1")
    snapshot = collector.get_conversation("conv-1")
    assert snapshot is not None
    snapshot.add(ToolMetrics("run_python", 99.0))
    collector.record_tool_call(ToolMetrics("query_database", 20.0), "conv-1")
    assert snapshot.total_calls == 2 and set(snapshot.get_tool_stats()) == {"run_python"}
    fresh = collector.get_conversation("conv-1")
    assert fresh is not None and fresh.total_calls == 2
    assert fresh.get_tool_stats()["run_python"]["calls"] == 1


def test_it_gives_empty_global_stats_before_any_call() -> None:
    stats = MetricsCollector().get_global_stats()
    assert stats["total_tool_calls"] == 0 and stats["avg_tokens_per_call"] == 0.0
    assert stats["success_rate"] == 0.0 and stats["tools"] == {}


@pytest.mark.parametrize("field", ["max_conversations", "window"])
def test_it_refuses_a_bound_below_one(field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        MetricsCollector(**{field: 0})


def test_it_rounds_percentiles_to_observed_values() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile([5.0], 95) == 5.0
    assert math.isclose(percentile([1.0, 2.0], 50), 1.0)


# --- the design's shapes (v2.1 order, v2.0 fields) -------------------------------------


def test_it_takes_tool_metrics_in_the_designs_shapes() -> None:
    from datetime import datetime, timezone

    v21 = ToolMetrics("query_database", 120.0, 30, 400, True, 1, "STANDARD")  # v2.1, positionally
    assert (v21.output_level, v21.total_tokens, v21.retry_count) == (OutputLevel.STANDARD, 430, 1)
    assert (v21.start_time, v21.end_time) == (None, None) and v21.recorded_at > 0
    start = datetime(2025, 2, 6, 10, 0, tzinfo=timezone.utc)
    end = datetime(2025, 2, 6, 10, 0, 1, tzinfo=timezone.utc)
    v20 = ToolMetrics(tool_name="run_python", start_time=start, end_time=end, duration_ms=1000.0, input_tokens=5,
                      output_tokens=7, total_tokens=20, success=False, error_code="E_TIMEOUT", output_level="brief")
    assert (v20.start_time, v20.end_time, v20.total_tokens, v20.error_code) == (start, end, 20, "E_TIMEOUT")
    assert v20.output_level is OutputLevel.BRIEF
    with pytest.raises(ValueError):
        ToolMetrics("t", 1.0, output_level="LOUD")


def test_it_builds_conversation_metrics_in_the_designs_shapes() -> None:
    from datetime import datetime, timezone

    started = datetime(2025, 2, 6, tzinfo=timezone.utc)
    v20 = ConversationMetrics(conversation_id="conv-1", start_time=started)
    assert (v20.start_time, v20.end_time, v20.messages_count, v20.tool_calls) == (started, None, 0, deque())
    v21 = ConversationMetrics("conv-2", 10, 20, [ToolMetrics("t", 1.0)])  # v2.1 order
    assert (v21.total_input_tokens, v21.total_output_tokens, len(v21.tool_calls), v21.total_tokens) == (10, 20, 1, 30)
    assert v20.started_at == started.timestamp()


def test_it_gives_the_designs_tool_stats_keys_checked_against_the_calls() -> None:
    conversation = ConversationMetrics(conversation_id="conv-1")
    calls = [ToolMetrics("q", 100.0, 10, 30), ToolMetrics("q", 300.0, 0, 20, success=False), ToolMetrics("r", 5.0)]
    for call in calls:
        conversation.add(call)
    q = conversation.get_tool_stats()["q"]
    assert q["call_count"] == 2 == q["calls"]
    assert q["avg_duration_ms"] == 200.0 and q["avg_tokens"] == (40 + 20) / 2
    assert (q["success_rate"], q["error_rate"]) == (0.5, 0.5)
    report = conversation.to_report()
    for line in ("Duration: 0.4s", "Avg Duration: 200.0ms", "Avg Tokens: 30", "Unique: 0", "Context Management:",
                 "Messages: 0", "Compressions: 0"):
        assert line in report


def test_it_offers_the_designs_collector_methods() -> None:
    from pipeline import ThreadSafeMetricsCollector, get_metrics_collector

    collector = ThreadSafeMetricsCollector()
    live = collector.get_or_create_conversation("conv-1")
    collector.record_tool_call(ToolMetrics("q", 10.0, 1, 2), "conv-1")
    collector.record_message("conv-1", 3)
    collector.end_conversation("conv-1")
    assert live is collector.get_or_create_conversation("conv-1") and live.total_calls == 1
    assert live.messages_count == 3 and live.end_time is not None
    stats = collector.get_global_stats()
    assert {"total_conversations", "total_tool_calls", "total_tokens", "total_duration_seconds",
            "avg_tokens_per_call"} <= set(stats)
    assert collector.tool_totals() == {"q": {"calls": 1, "errors": 0, "retries": 0, "cache_hits": 0,
                                             "input_tokens": 1, "output_tokens": 2, "duration_ms": 10.0}}
    assert get_metrics_collector() is get_metrics_collector()
    assert isinstance(get_metrics_collector(), MetricsCollector)
