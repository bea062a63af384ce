"""Telemetry: spans go through the real OTLP/HTTP exporter to a real receiver on
127.0.0.1 that decodes them with opentelemetry-proto."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

from pipeline import (
    CompressionMode,
    CompressionResult,
    MessageAction,
    MessageChange,
    MessagePriority,
    ObservabilityConfig,
    RecordExporter,
    ToolExecutionResult,
    ToolInvocationRequest,
    ToolResultHook,
    TraceSampling,
    configure_telemetry,
    hook_executor,
    parse_otlp_headers,
)
from pipeline._exceptions import ConfigError
from tests.pipeline.otlp_collector import STATUS_ERROR, STATUS_OK, Collector





def telemetry_for(collector: Collector, **overrides: Any) -> Any:
    options: dict[str, Any] = {
        "otlp_endpoint": collector.url,
        "otlp_compression": "none",
        "service_name": "sales-agent",
        "environment": "test",
        "schedule_delay_ms": 50,
        "trace_sampling": TraceSampling.ALWAYS,
        "enable_metrics": False,
    }
    options.update(overrides)
    return configure_telemetry(ObservabilityConfig(**options), shutdown_on_exit=False)


def request(tool: str = "query_sales", call_id: str = "toolu_01") -> ToolInvocationRequest:
    return ToolInvocationRequest(tool_call_id=call_id, tool_name=tool, parameters={"region": "north"})


def ok_result(**overrides: Any) -> ToolExecutionResult:
    data: dict[str, Any] = {
        "tool_call_id": "toolu_01",
        "observation": "3 rows",
        "success": True,
        "retry_count": 1,
        "artifact_id": "artifact_" + "ab" * 8,
        "cache_hit": False,
        "observation_tokens": 12,
        "duration_ms": 42.5,
    }
    data.update(overrides)
    return ToolExecutionResult(**data)


def failed_result(**overrides: Any) -> ToolExecutionResult:
    data: dict[str, Any] = {
        "tool_call_id": "toolu_01",
        "observation": "Error: timed out",
        "success": False,
        "error_type": "TIMEOUT",
        "error_message": "query_sales timed out after 5000 ms",
        "retry_count": 2,
    }
    data.update(overrides)
    return ToolExecutionResult(**data)


def test_it_sends_a_tool_span_with_genai_and_ba_attributes(collector: Collector) -> None:
    telemetry = telemetry_for(collector)
    with telemetry.tool_span(request(), "conv-1", round_id="r1") as span:
        span.record_tool_result(ok_result())
    assert telemetry.shutdown(5)

    sent = collector.named("execute_tool query_sales")
    assert (sent["trace_id"], sent["span_id"]) == (span.trace_id, span.span_id)
    assert len(span.trace_id) == 32 and span.trace_id == span.trace_id.lower()
    assert sent["attributes"] == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "query_sales",
        "gen_ai.tool.call.id": "toolu_01",
        "gen_ai.tool.type": "function",
        "gen_ai.conversation.id": "conv-1",
        "session.id": "conv-1",
        "ba.tool.version": "1.0.0",
        "ba.round_id": "r1",
        "ba.output_level": "standard",
        "ba.success": True,
        "ba.retry_count": 1,
        "ba.cache_hit": False,
        "ba.observation_tokens": 12,
        "ba.duration_ms": 42.5,
        "ba.artifact_id": "artifact_" + "ab" * 8,
    }
    assert sent["status"] == STATUS_OK
    assert collector.resources[0]["service.name"] == "sales-agent"
    assert collector.resources[0]["deployment.environment"] == "test"
    assert collector.requests[0]["content-type"] == "application/x-protobuf"


def test_it_marks_a_failed_tool_span_as_error(collector: Collector) -> None:
    telemetry = telemetry_for(collector)
    with telemetry.tool_span(request(), "conv-1") as span:
        span.record_tool_result(failed_result())
    telemetry.shutdown(5)
    sent = collector.named("execute_tool query_sales")
    assert sent["status"] == STATUS_ERROR
    assert sent["status_message"] == "query_sales timed out after 5000 ms"
    assert sent["attributes"]["ba.error_type"] == "TIMEOUT"
    assert sent["attributes"]["error.type"] == "TIMEOUT"
    assert sent["attributes"]["ba.success"] is False
    assert "ba.artifact_id" not in sent["attributes"]


def test_it_marks_a_span_as_error_when_an_exception_escapes(collector: Collector) -> None:
    telemetry = telemetry_for(collector)
    with pytest.raises(RuntimeError):
        with telemetry.tool_span(request(), "conv-1"):
            raise RuntimeError("tool crashed")
    telemetry.shutdown(5)
    assert collector.named("execute_tool query_sales")["status"] == STATUS_ERROR


def test_it_nests_chat_tool_compression_and_skill_spans_under_invoke_agent(collector: Collector) -> None:
    telemetry = telemetry_for(collector)
    result = CompressionResult(
        mode=CompressionMode.TRUNCATE,
        requested_mode=CompressionMode.SUMMARIZE,
        target_tokens=100,
        tokens_before=400,
        tokens_after=90,
        messages_before=3,
        messages_after=1,
        target_met=True,
        changes=[
            MessageChange(index=i, role="user", priority=MessagePriority.MEDIUM, action=action, tokens_before=10, tokens_after=0)
            for i, action in enumerate([MessageAction.DROPPED, MessageAction.DROPPED, MessageAction.KEPT])
        ],
    )
    with telemetry.agent_span("conv-1", "r1") as agent:
        with telemetry.chat_span("claude-3-5-sonnet", "conv-1", "r1", provider_name="anthropic") as chat:
            chat.record_usage(input_tokens=1200, output_tokens=80)
        with telemetry.tool_span(request(), "conv-1", "r1") as tool:
            tool.record_tool_result(ok_result())
        with telemetry.compression_span("conv-1", CompressionMode.SUMMARIZE, "r1", tokens_before=400) as compression:
            compression.record_compression(result)
        with telemetry.skill_span("sales-analysis", "conv-1", level=2, depth=1) as skill:
            skill.record_skill(tokens_loaded=420)
    telemetry.shutdown(5)

    root = collector.named("invoke_agent ba-agent")
    assert root["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    for handle, name in [
        (chat, "chat claude-3-5-sonnet"),
        (tool, "execute_tool query_sales"),
        (compression, "compress_context"),
        (skill, "activate_skill sales-analysis"),
    ]:
        sent = collector.named(name)
        assert sent["parent_span_id"] == agent.span_id
        assert sent["trace_id"] == agent.trace_id == handle.trace_id
    chat_attrs = collector.named("chat claude-3-5-sonnet")["attributes"]
    assert chat_attrs["gen_ai.operation.name"] == "chat"
    assert chat_attrs["gen_ai.request.model"] == "claude-3-5-sonnet"
    assert chat_attrs["gen_ai.provider.name"] == "anthropic"
    assert (chat_attrs["gen_ai.usage.input_tokens"], chat_attrs["gen_ai.usage.output_tokens"]) == (1200, 80)
    assert collector.named("chat claude-3-5-sonnet")["kind"] == 3  # SPAN_KIND_CLIENT
    comp = collector.named("compress_context")["attributes"]
    assert comp["ba.compression.mode"] == "truncate"
    assert comp["ba.compression.requested_mode"] == "summarize"
    assert (comp["ba.compression.tokens_before"], comp["ba.compression.tokens_after"]) == (400, 90)
    assert comp["ba.compression.dropped"] == 2
    skill_attrs = collector.named("activate_skill sales-analysis")["attributes"]
    assert (skill_attrs["ba.skill.name"], skill_attrs["ba.skill.level"], skill_attrs["ba.skill.tokens_loaded"]) == (
        "sales-analysis",
        2,
        420,
    )


def test_it_gzips_spans_when_configured(collector: Collector) -> None:
    telemetry = telemetry_for(collector, otlp_compression="gzip")
    with telemetry.tool_span(request(), "conv-1") as span:
        span.record_tool_result(ok_result())
    telemetry.shutdown(5)
    assert collector.requests[0]["content-encoding"] == "gzip"
    assert collector.named("execute_tool query_sales")["span_id"] == span.span_id


def test_it_sends_the_configured_headers(collector: Collector) -> None:
    telemetry = telemetry_for(collector, otlp_headers="Authorization=Bearer%20key-1,x-team=ba")
    with telemetry.tool_span(request(), "conv-1"):
        pass
    telemetry.shutdown(5)
    assert collector.requests[0]["authorization"] == "Bearer key-1"
    assert collector.requests[0]["x-team"] == "ba"


def test_it_records_a_finished_execution_with_its_real_duration(collector: Collector) -> None:
    telemetry = telemetry_for(collector)
    handle = telemetry.record_tool_span(request(), ok_result(duration_ms=1500.0), "conv-1", "r1")
    telemetry.shutdown(5)
    sent = collector.named("execute_tool query_sales")
    assert sent["span_id"] == handle.span_id
    assert sent["duration_ns"] == 1_500_000_000


def test_it_exports_nothing_with_sampling_none_but_still_gives_trace_ids(collector: Collector) -> None:
    telemetry = telemetry_for(collector, sampling="none")
    with telemetry.tool_span(request(), "conv-1") as span:
        span.record_tool_result(ok_result())
    telemetry.shutdown(5)
    assert collector.spans == []
    assert span.trace_id is not None and len(span.trace_id) == 32


def test_it_samples_a_ratio_of_traces_by_trace_id(collector: Collector) -> None:
    telemetry = telemetry_for(collector, sampling="ratio", sample_ratio=0.5)
    handles = []
    for i in range(200):
        with telemetry.tool_span(request(call_id=f"call_{i}"), "conv-1") as span:
            handles.append(span)
    telemetry.shutdown(5)
    bound = TraceIdRatioBased.get_bound_for_rate(0.5)
    expected = {h.span_id for h in handles if int(h.trace_id, 16) & TraceIdRatioBased.TRACE_ID_LIMIT < bound}
    assert {s["span_id"] for s in collector.spans} == expected
    assert 0 < len(expected) < 200


def test_it_keeps_only_errors_and_slow_spans_when_asked(collector: Collector) -> None:
    telemetry = telemetry_for(collector, sampling="errors_and_slow", slow_threshold_ms=1000)
    telemetry.record_tool_span(request("fast_ok"), ok_result(duration_ms=5), "conv-1")
    telemetry.record_tool_span(request("fast_error"), failed_result(duration_ms=5), "conv-1")
    telemetry.record_tool_span(request("slow_ok"), ok_result(duration_ms=2500), "conv-1")
    telemetry.shutdown(5)
    assert sorted(s["name"] for s in collector.spans) == ["execute_tool fast_error", "execute_tool slow_ok"]


def test_it_shuts_down_within_its_bound_when_the_collector_hangs(collector: Collector) -> None:
    collector.hang.set()
    telemetry = telemetry_for(collector, export_timeout_ms=30_000)
    with telemetry.tool_span(request(), "conv-1"):
        pass
    started = time.monotonic()
    assert telemetry.shutdown(0.5) is False
    assert time.monotonic() - started < 5  # bounded by our timeout, not the 30 s export timeout


def test_it_leaves_the_global_tracer_provider_alone_by_default(collector: Collector) -> None:
    before = trace.get_tracer_provider()
    first = telemetry_for(collector)
    second = telemetry_for(collector, service_name="other-agent")
    assert trace.get_tracer_provider() is before
    assert first.provider is not second.provider
    first.shutdown(2)
    second.shutdown(2)


def test_it_gives_no_ids_and_sends_nothing_when_disabled(collector: Collector) -> None:
    telemetry = telemetry_for(collector, enabled=False)
    with telemetry.tool_span(request(), "conv-1") as span:
        span.record_tool_result(failed_result())
    handle = telemetry.record_tool_span(request(), ok_result(), "conv-1")
    assert telemetry.shutdown(1)
    assert (span.trace_id, span.span_id, handle.trace_id) == (None, None, None)
    assert collector.requests == []


def test_it_hooks_a_real_executor_to_spans_records_and_artifacts(collector: Collector, tmp_path: Any) -> None:
    from pipeline._artifacts import ArtifactStore
    from pipeline._executor import ToolExecutor

    store = ArtifactStore(tmp_path)
    executor = ToolExecutor(artifact_store=store)

    def query_sales(region: str) -> dict[str, Any]:
        return {"region": region, "rows": [{"month": m, "revenue": m * 10} for m in range(1, 4)]}

    executor.register("query_sales", query_sales)
    telemetry = telemetry_for(collector)
    exporter = RecordExporter(collector.url, "key", flush_interval_ms=20)
    hook = hook_executor(executor, telemetry=telemetry, exporter=exporter, conversation_id="conv-9", round_id="r1")
    assert isinstance(hook, ToolResultHook) and hook in executor.on_result

    full = ToolInvocationRequest(
        tool_call_id="toolu_01", tool_name="query_sales", parameters={"region": "north"}, output_level="full"
    )
    result = executor.execute(full)
    assert exporter.flush(5)
    telemetry.shutdown(5)
    exporter.shutdown(2)

    assert result.success
    span = collector.named("execute_tool query_sales")
    assert span["attributes"]["gen_ai.conversation.id"] == "conv-9"
    (record,) = collector.records
    assert record["type"] == "tool_result" and record["conversation_id"] == "conv-9"
    assert (record["trace_id"], record["span_id"]) == (span["trace_id"], span["span_id"])
    assert record["result"]["tool_call_id"] == "toolu_01"
    assert result.artifact_id and record["result"]["artifact_id"] == result.artifact_id
    assert span["attributes"]["ba.artifact_id"] == result.artifact_id
    assert collector.artifacts[result.artifact_id] == store.retrieve(result.artifact_id)


def test_it_never_raises_from_the_hook() -> None:
    class BrokenExporter:
        def submit(self, record: Any) -> bool:
            raise RuntimeError("broken")

    hook = ToolResultHook(conversation_id="conv-1", exporter=BrokenExporter())  # type: ignore[arg-type]
    hook(request(), ok_result())
    hook("junk")
    hook(request(), ok_result(), ["not renderings"])


def test_it_refuses_an_executor_without_on_result() -> None:
    with pytest.raises(TypeError):
        hook_executor(object(), conversation_id="c")


@pytest.mark.parametrize(
    "field, value",
    [
        ("otlp_endpoint", "localhost:4318"),
        ("otlp_endpoint", "ftp://collector"),
        ("otlp_compression", "brotli"),
        ("trace_sampling", "sometimes"),
        ("trace_sampling", 3),
        ("sample_ratio", 1.5),
        ("sample_ratio", -0.1),
        ("sample_ratio", True),
        ("slow_threshold_ms", -1),
        ("trace_export_timeout_ms", 0),
        ("trace_batch_size", 20_000),
        ("metrics_export_interval_s", 0),
        ("metrics_export_timeout_ms", -3),
        ("max_queue_size", -5),
        ("max_queue_bytes", 0),
        ("service_name", ""),
        ("service_name", "agent\n"),
        ("environment", "x" * 201),
        ("otlp_headers", {"bad header": "v"}),
        ("otlp_headers", {"x-ok": "line\r\nInjected: 1"}),
        ("otlp_headers", ["not", "a", "mapping"]),
        ("enable_tracing", "yes"),
        ("enable_metrics", 1),
        ("enable_logging", None),
        ("log_level", "LOUD"),
        ("log_level", 10),
        ("log_format", "xml"),
        ("log_output", ["stdout", "syslog"]),
        ("log_output", "stdout"),
        ("extra_tags", {"team": 7}),
        ("extra_tags", {"": "x"}),
        ("spool_dir", ""),
        ("spool_fsync", "sometimes"),
        ("log_file", ""),
    ],
)
def test_it_names_the_field_of_an_invalid_config(field: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        ObservabilityConfig.from_dict({field: value})
    assert info.value.field == field


@pytest.mark.parametrize(
    "earlier, value, field",
    [
        ("compression", "brotli", "otlp_compression"),
        ("export_timeout_ms", 0, "trace_export_timeout_ms"),
        ("max_export_batch_size", 20_000, "trace_batch_size"),
        ("enabled", "yes", "enable_tracing"),
        ("sampling", "sometimes", "trace_sampling"),
    ],
)
def test_it_names_the_documented_field_for_an_earlier_name(earlier: str, value: Any, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        ObservabilityConfig.from_dict({earlier: value})
    assert info.value.field == field


def test_it_accepts_the_earlier_names_and_reads_them_back() -> None:
    config = ObservabilityConfig(enabled=False, compression="none", export_timeout_ms=1234, max_export_batch_size=7,
                                 sampling="errors_and_slow")
    assert (config.enable_tracing, config.otlp_compression, config.trace_export_timeout_ms, config.trace_batch_size) == (
        False, "none", 1234, 7)
    assert (config.enabled, config.compression, config.export_timeout_ms, config.max_export_batch_size) == (
        False, "none", 1234, 7)
    assert config.trace_sampling is TraceSampling.ERRORS_AND_SLOW and config.sampling == "errors_and_slow"
    assert ObservabilityConfig(sampling="all").trace_sampling is TraceSampling.ALWAYS
    assert ObservabilityConfig(sampling="none").get_sampling_rate() == 0.0
    assert ObservabilityConfig(sampling="ratio", sample_ratio=0.25).get_sampling_rate() == 0.25
    assert ObservabilityConfig.from_dict({"enabled": False, "compression": "none"}) == ObservabilityConfig(
        enable_tracing=False, otlp_compression="none")
    config.export_timeout_ms = 99
    assert config.trace_export_timeout_ms == 99
    # dataclasses.replace() must not undo its own change through the earlier names
    assert dataclasses.replace(config, enable_tracing=True).enable_tracing is True


def test_it_refuses_an_earlier_name_given_with_the_documented_one() -> None:
    with pytest.raises(TypeError, match="not both"):
        ObservabilityConfig(compression="gzip", otlp_compression="none")
    with pytest.raises(ConfigError, match="not both"):
        ObservabilityConfig.from_dict({"enabled": True, "enable_tracing": False})


def test_it_refuses_unknown_config_fields() -> None:
    with pytest.raises(ConfigError, match="trace_samplin"):
        ObservabilityConfig.from_dict({"trace_samplin": "high"})


def test_it_round_trips_the_config_through_a_dict() -> None:
    config = ObservabilityConfig(
        otlp_endpoint="https://obs.example.com", otlp_headers={"x-k": "v"}, trace_sampling=TraceSampling.HIGH,
        sample_ratio=0.25, extra_tags={"team": "ba"}, log_output=["stderr"], spool_dir="/var/spool/agent",
    )
    data = config.to_dict()
    assert data["trace_sampling"] == "high" and data["log_output"] == ["stderr"]
    assert ObservabilityConfig.from_dict(data) == config
    assert ObservabilityConfig.from_dict(json.loads(json.dumps(data))) == config
    assert config.traces_url == "https://obs.example.com/v1/traces"
    assert config.metrics_url == "https://obs.example.com/v1/metrics"


def test_it_parses_otel_exporter_otlp_headers() -> None:
    assert parse_otlp_headers("Authorization=Bearer%20abc, x-a = 1 ,,k=v=w") == {
        "Authorization": "Bearer abc",
        "x-a": "1",
        "k": "v=w",
    }
    with pytest.raises(ConfigError, match="otlp_headers"):
        parse_otlp_headers("novalue")
    with pytest.raises(ConfigError, match="otlp_headers"):
        parse_otlp_headers("=value")


def test_it_reads_the_standard_otel_environment_variables() -> None:
    env = {
        "OTEL_SERVICE_NAME": "billing-agent",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20k",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "none",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
    }
    config = ObservabilityConfig.from_env(env, environment="staging")
    assert (config.service_name, config.otlp_endpoint, config.compression, config.export_timeout_ms) == (
        "billing-agent",
        "http://127.0.0.1:4318",
        "none",
        2500,
    )
    assert config.otlp_headers == {"authorization": "Bearer k"} and config.environment == "staging"
    assert ObservabilityConfig.from_env({"OTEL_SDK_DISABLED": "true"}).enabled is False
    with pytest.raises(ConfigError, match="export_timeout_ms"):
        ObservabilityConfig.from_env({"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"})


@pytest.mark.parametrize(
    "sampler, argument, expected",
    [
        ("always_on", "", (TraceSampling.ALWAYS, None)),
        ("parentbased_always_off", "", (TraceSampling.NEVER, None)),
        ("parentbased_traceidratio", "0.25", (TraceSampling.MEDIUM, 0.25)),
        ("traceidratio", "", (TraceSampling.MEDIUM, 1.0)),
    ],
)
def test_it_reads_the_otel_sampler_variables(sampler: str, argument: str, expected: tuple[Any, Any]) -> None:
    config = ObservabilityConfig.from_env({"OTEL_TRACES_SAMPLER": sampler, "OTEL_TRACES_SAMPLER_ARG": argument})
    assert (config.trace_sampling, config.sample_ratio) == expected


@pytest.mark.parametrize(
    "env, field",
    [
        ({"OTEL_TRACES_SAMPLER": "jaeger_remote"}, "trace_sampling"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"}, "sample_ratio"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "7"}, "sample_ratio"),
        ({"OTEL_METRIC_EXPORT_INTERVAL": "often"}, "metrics_export_interval_s"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "novalue"}, "extra_tags"),
    ],
)
def test_it_names_the_field_of_a_bad_otel_variable(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        ObservabilityConfig.from_env(env)
    assert info.value.field == field


def test_it_reads_resource_attributes_and_the_metric_interval_from_the_environment() -> None:
    config = ObservabilityConfig.from_env({
        "OTEL_RESOURCE_ATTRIBUTES": "team=ba,deployment.environment=staging,region=cn%2Deast",
        "OTEL_METRIC_EXPORT_INTERVAL": "15000",
        "OTEL_SDK_DISABLED": "true",
    })
    assert config.extra_tags == {"team": "ba", "region": "cn-east"} and config.environment == "staging"
    assert config.metrics_export_interval_s == 15
    assert (config.enable_tracing, config.enable_metrics) == (False, False)
