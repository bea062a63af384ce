"""Every observability and metrics form the design documents show, called as they
write it (v2.1 first, v2.0 for detail). docs/design-conformance.md
lists each one; this runs them, in a subprocess because the design's functions are
process-wide, against a real OTLP receiver on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.pipeline.otlp_collector import Collector

ROOT = Path(__file__).resolve().parents[2]

AS_WRITTEN = r'''
import json, sys
from datetime import datetime
from pipeline import (
    ConversationMetrics, MetricsCollector, ObservabilityConfig, ThreadSafeMetricsCollector, ToolMetrics,
    TraceSampling, configure_observability, execute_with_observability, get_observability_config,
)
URL = sys.argv[1]

# v2.0 §6: the 17 fields and their defaults
config = ObservabilityConfig()
assert (config.enable_tracing, config.enable_metrics, config.enable_logging) == (True, True, True)
assert config.trace_sampling == TraceSampling.MEDIUM
assert (config.trace_export_timeout_ms, config.trace_batch_size) == (5000, 100)
assert (config.metrics_export_interval_s, config.metrics_export_timeout_ms) == (60, 3000)
assert (config.log_level, config.log_format, config.log_output) == ("INFO", "json", ["stdout", "file"])
assert (config.otlp_endpoint, config.otlp_headers, config.otlp_compression) == (None, None, "gzip")
assert (config.service_name, config.environment, config.extra_tags) == ("ba-agent", "production", {})

# TraceSampling and get_sampling_rate()
sampling_map = {
    TraceSampling.ALWAYS: 1.0,
    TraceSampling.HIGH: 0.5,
    TraceSampling.MEDIUM: 0.1,
    TraceSampling.LOW: 0.01,
    TraceSampling.NEVER: 0.0,
}
for trace_sampling, rate in sampling_map.items():
    assert ObservabilityConfig(trace_sampling=trace_sampling).get_sampling_rate() == rate
assert TraceSampling("medium") is TraceSampling.MEDIUM and isinstance(TraceSampling.HIGH, str)

# to_dict / from_dict / validate, and the config-class usage example (json file)
data = config.to_dict()
assert data["trace_sampling"] == "medium"
with open("config.json", "w") as f:
    json.dump(data, f)
with open("config.json") as f:
    loaded = ObservabilityConfig.from_dict(json.load(f))
assert loaded == config and loaded.validate() is True
for bad in ({"log_level": "LOUD"}, {"log_format": "xml"}, {"metrics_export_interval_s": 0}):
    try:
        ObservabilityConfig(**bad).validate()
    except ValueError:
        pass
    else:
        raise AssertionError(f"validate() accepted {bad}")

# 全局可观测性配置
assert get_observability_config().trace_sampling == TraceSampling.MEDIUM
configure_observability(ObservabilityConfig(otlp_endpoint=URL, otlp_headers={"x-team": "ba"},
                                            trace_sampling=TraceSampling.ALWAYS, log_output=["stdout"]))
assert get_observability_config().otlp_endpoint == URL

# 集成到工具执行
def tool_func(region):
    return [region] * 3

wrapper = execute_with_observability(tool_func, "query_sales")
assert wrapper("East") == ["East", "East", "East"]

def broken_tool():
    raise RuntimeError("database unreachable")

try:
    execute_with_observability(broken_tool, "query_database")()
except RuntimeError:
    pass
else:
    raise AssertionError("the exception must propagate")

# 监控指标, v2.1 (positional order) and v2.0 (fields)
metrics = ToolMetrics("query_database", 120.0, 30, 400, True, 0, "STANDARD")
conversation = ConversationMetrics("conv-1", 0, 0, [])
conversation.add(metrics)
v20 = ToolMetrics(tool_name="query_database", start_time=datetime.now(), end_time=datetime.now(), duration_ms=80.0,
                  input_tokens=10, output_tokens=20, total_tokens=30, success=False, error_code="TIMEOUT",
                  retry_count=1, output_level="STANDARD")
collector = MetricsCollector()
conv = collector.get_or_create_conversation("conv-1")
collector.record_tool_call(metrics, "conv-1")
collector.record_tool_call(v20, "conv-1")
stats = conv.get_tool_stats()["query_database"]
for key in ("call_count", "avg_duration_ms", "avg_tokens", "success_rate", "error_rate"):
    assert key in stats, key
assert (stats["call_count"], stats["avg_duration_ms"], stats["avg_tokens"]) == (2, 100.0, 230.0)
assert (stats["success_rate"], stats["error_rate"]) == (0.5, 0.5)
report = conv.to_report()
assert "Conversation Metrics Report" in report and "Avg Tokens: 230" in report
global_stats = collector.get_global_stats()
assert {k: global_stats[k] for k in ("total_conversations", "total_tool_calls", "total_tokens")} == {
    "total_conversations": 1, "total_tool_calls": 2, "total_tokens": 460}
assert global_stats["total_duration_seconds"] == 0.2 and global_stats["avg_tokens_per_call"] == 230.0
ThreadSafeMetricsCollector().record_tool_call(metrics, "conv-1")
ConversationMetrics(conversation_id="conv-2", start_time=datetime.now())
print("ok")
'''


def test_it_runs_every_documented_form_as_written(tmp_path: Path) -> None:
    collector = Collector()
    try:
        run = subprocess.run([sys.executable, "-c", AS_WRITTEN, collector.url], cwd=tmp_path, capture_output=True,
                             text=True, timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    finally:
        collector.close()
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines()[-1] == "ok"
    spans = {s["name"]: s for s in collector.spans}  # exported at exit, within 2 s
    assert spans["execute_tool query_sales"]["attributes"]["tool.success"] is True
    assert spans["execute_tool query_database"]["attributes"]["tool.error"] == "database unreachable"
    assert all(r.get("x-team") == "ba" for r in collector.requests)
