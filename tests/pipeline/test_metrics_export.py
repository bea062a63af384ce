"""enable_metrics with an otlp_endpoint: the MetricsCollector's totals reach a real
OTLP/HTTP receiver on 127.0.0.1 as cumulative counters, checked against the calls."""

from __future__ import annotations

import logging
from typing import Any


from pipeline import MetricsCollector, ObservabilityConfig, ToolMetrics, configure_telemetry
from tests.pipeline.otlp_collector import Collector



def exported(collector: Collector) -> dict[tuple[str, tuple[tuple[str, Any], ...]], float]:
    """The last exported value of each (metric, attributes)."""
    values: dict[tuple[str, tuple[tuple[str, Any], ...]], float] = {}
    for request in collector.metrics:
        for resource_metrics in request.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    assert metric.sum.is_monotonic and metric.sum.aggregation_temporality == 2  # cumulative
                    for point in metric.sum.data_points:
                        attributes = tuple(sorted((kv.key, kv.value.string_value) for kv in point.attributes))
                        values[(metric.name, attributes)] = point.as_int or point.as_double
    return values


def test_it_exports_the_collectors_totals_per_tool(collector: Collector) -> None:
    metrics = MetricsCollector()
    calls = [ToolMetrics("query_sales", 10.0, 3, 40), ToolMetrics("query_sales", 30.5, 2, 60, success=False, retry_count=2),
             ToolMetrics("chart", 5.0, 1, 1, cache_hit=True)]
    for call in calls:
        metrics.record_tool_call(call, "conv-1")
    config = ObservabilityConfig(otlp_endpoint=collector.url, otlp_compression="gzip", metrics_export_interval_s=60,
                                 metrics_export_timeout_ms=2000, service_name="sales-agent", extra_tags={"team": "ba"})
    telemetry = configure_telemetry(config, shutdown_on_exit=False, metrics=metrics)
    telemetry.shutdown(5)  # a final collection is exported at shutdown
    values = exported(collector)
    tool = (("gen_ai.tool.name", "query_sales"),)
    assert values[("ba.tool.calls", tool)] == 2 and values[("ba.tool.errors", tool)] == 1
    assert values[("ba.tool.retries", tool)] == 2 and values[("ba.tool.duration", tool)] == 40.5
    assert values[("ba.tool.cache_hits", (("gen_ai.tool.name", "chart"),))] == 1
    assert values[("ba.tool.tokens", (("gen_ai.token.type", "output"), ("gen_ai.tool.name", "query_sales")))] == 100
    totals = metrics.tool_totals()["query_sales"]
    assert values[("ba.tool.tokens", (("gen_ai.token.type", "input"), ("gen_ai.tool.name", "query_sales")))] == totals["input_tokens"]
    resource = {kv.key: kv.value.string_value for kv in collector.metrics[0].resource_metrics[0].resource.attributes}
    assert resource["service.name"] == "sales-agent" and resource["team"] == "ba"
    assert collector.requests[-1]["content-encoding"] == "gzip"
    assert telemetry.metrics_poster.exports >= 1


def test_it_stops_asking_a_receiver_without_a_metrics_endpoint(collector: Collector, caplog: Any) -> None:
    collector.metrics_status = 404  # what the dashboard answers
    metrics = MetricsCollector()
    metrics.record_tool_call(ToolMetrics("t", 1.0), "c")
    telemetry = configure_telemetry(ObservabilityConfig(otlp_endpoint=collector.url), shutdown_on_exit=False,
                                    metrics=metrics)
    with caplog.at_level(logging.INFO, logger="pipeline.telemetry"):
        telemetry._meter_provider.force_flush(5_000)
        telemetry._meter_provider.force_flush(5_000)
        telemetry.shutdown(5)
    assert telemetry.metrics_poster.unsupported
    assert len([r for r in collector.requests if r["path"] == "/v1/metrics"]) == 1
    assert [r.levelname for r in caplog.records if "OTLP metrics" in r.getMessage()] == ["INFO"]


def test_it_keeps_metrics_in_process_without_an_endpoint_or_when_disabled() -> None:
    metrics = MetricsCollector()
    in_process = configure_telemetry(ObservabilityConfig(), shutdown_on_exit=False, metrics=metrics)
    assert in_process.metrics is metrics and in_process.metrics_poster is None
    off = configure_telemetry(ObservabilityConfig(enable_metrics=False), shutdown_on_exit=False, metrics=metrics)
    assert off.metrics is None
    in_process.shutdown(1)
    off.shutdown(1)
