"""The span processor configure_telemetry installs: retries while it has room, spools,
and builds the hook's spans off the agent thread exactly as the SDK would. Spans go
to a real OTLP/HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import time
from typing import Any, Sequence

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

from pipeline import (
    ObservabilityConfig,
    RecordExporter,
    SpanDeliveryProcessor,
    ToolExecutionResult,
    ToolInvocationRequest,
    ToolResultHook,
    TraceSampling,
    configure_telemetry,
)
from tests.pipeline.delivery_helpers import FakeClock, free_port, wait_until
from tests.pipeline.otlp_collector import Collector



def provider_with(processor: SpanDeliveryProcessor) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": "agent"}), shutdown_on_exit=False)
    provider.add_span_processor(processor)
    return provider


def make_spans(provider: TracerProvider, n: int, prefix: str = "span") -> None:
    tracer = provider.get_tracer("test")
    for i in range(n):
        with tracer.start_as_current_span(f"{prefix} {i}"):
            pass


def fast(**options: Any) -> dict[str, Any]:
    return {"schedule_delay_s": 0.02, "backoff_s": 0.05, "max_backoff_s": 0.2, **options}


def test_it_delivers_every_span_once_through_refusal_and_503() -> None:
    port = free_port()
    processor = SpanDeliveryProcessor(traces_url=f"http://127.0.0.1:{port}/v1/traces", gzip_body=False, **fast())
    provider = provider_with(processor)
    make_spans(provider, 20, "before")
    assert wait_until(lambda: processor.stats().retries >= 2)
    collector = Collector(port)
    collector.script.extend(["503:0.2", "503:0.2"])
    try:
        make_spans(provider, 20, "after")
        assert processor.force_flush(10_000)
        stats = processor.stats()
    finally:
        provider.shutdown()
        collector.close()
    names = sorted(s["name"] for s in collector.spans)
    assert len(names) == len(set(collector.span_ids())) == 40
    assert names == sorted([f"before {i}" for i in range(20)] + [f"after {i}" for i in range(20)])
    assert (stats.sent, stats.dropped, stats.failures) == (40, 0, 0)


def test_it_survives_a_five_minute_outage_at_ten_spans_a_second_with_fake_clock() -> None:
    clock = FakeClock()
    port = free_port()
    processor = SpanDeliveryProcessor(traces_url=f"http://127.0.0.1:{port}/v1/traces", schedule_delay_s=1.0,
                                      monotonic=clock.monotonic, wait=clock.wait)
    provider = provider_with(processor)
    tracer = provider.get_tracer("test")
    for i in range(3_000):
        with tracer.start_as_current_span(f"s{i}"):
            pass
        clock.advance(0.1)
    assert processor.stats().sent == 0 and processor.stats().dropped == 0
    collector = Collector(port)
    try:
        assert wait_until(lambda: processor.stats().queue_depth == 0, 30, step=lambda: clock.advance(1.0))
    finally:
        provider.shutdown()
        collector.close()
    assert len(set(collector.span_ids())) == 3_000
    assert processor.stats().sent == 3_000


class FlakyExporter(SpanExporter):
    """Someone else's exporter: fails its first calls, like a backend restarting."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.exported: list[ReadableSpan] = []
        self.shut = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.failures:
            self.failures -= 1
            return SpanExportResult.FAILURE
        self.exported.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shut = True


def test_it_retries_another_exporters_failures() -> None:
    flaky = FlakyExporter(failures=3)
    processor = SpanDeliveryProcessor(exporter=flaky, **fast())
    provider = provider_with(processor)
    make_spans(provider, 10)
    assert processor.force_flush(10_000)
    provider.shutdown()
    assert sorted(s.name for s in flaky.exported) == sorted(f"span {i}" for i in range(10))
    assert processor.stats().retries == 3 and flaky.shut


def test_it_keeps_spans_in_the_spool_across_a_restart(tmp_path: Any) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/traces"
    first = SpanDeliveryProcessor(traces_url=url, spool_dir=str(tmp_path), **fast(backoff_s=5.0))
    provider = provider_with(first)
    make_spans(provider, 15)
    assert wait_until(lambda: first.stats().spooled == 15)
    first.shutdown(0.3)
    assert first.stats().kept_in_spool == 15
    collector = Collector(port)
    try:
        second = SpanDeliveryProcessor(traces_url=url, spool_dir=str(tmp_path), **fast())
        assert wait_until(lambda: second.stats().replayed == 15)
        assert second.force_flush(10_000)
        second.shutdown(2)
    finally:
        collector.close()
    assert sorted(s["name"] for s in collector.spans) == sorted(f"span {i}" for i in range(15))
    assert collector.resources[0]["service.name"] == "agent"


def test_it_drops_a_refused_batch_with_its_reason_and_counts_partial_rejections(collector: Collector) -> None:
    collector.script.extend(["400", "partial:2"])
    processor = SpanDeliveryProcessor(traces_url=f"{collector.url}/v1/traces", **fast(batch_size=5))
    provider = provider_with(processor)
    make_spans(provider, 5, "refused")
    assert processor.force_flush(10_000)
    make_spans(provider, 5, "partly")
    assert processor.force_flush(10_000)
    provider.shutdown()
    stats = processor.stats()
    assert stats.reasons == {"http_400": 5, "rejected_by_receiver": 2}
    assert (stats.failures, stats.rejected, stats.sent) == (5, 2, 3)


def test_it_halves_a_batch_the_receiver_finds_too_large(collector: Collector) -> None:
    collector.script.append("413")
    processor = SpanDeliveryProcessor(traces_url=f"{collector.url}/v1/traces", start=False, **fast(batch_size=8))
    provider = provider_with(processor)
    make_spans(provider, 8)
    processor.start()  # all 8 queued: the first batch is all of them
    assert processor.force_flush(10_000)
    provider.shutdown()
    assert len(collector.spans) == 8 and processor.stats().failures == 0
    assert len(collector.requests) == 3  # 8 refused, then 4 + 4


def test_it_drops_the_oldest_spans_beyond_its_queue() -> None:
    port = free_port()
    processor = SpanDeliveryProcessor(traces_url=f"http://127.0.0.1:{port}/v1/traces", max_queue=30,
                                      **fast(batch_size=10))
    provider = provider_with(processor)
    make_spans(provider, 100)
    assert wait_until(lambda: processor.stats().dropped == 70)
    collector = Collector(port)
    try:
        assert processor.force_flush(10_000)
    finally:
        provider.shutdown()
        collector.close()
    assert sorted(s["name"] for s in collector.spans) == sorted(f"span {i}" for i in range(70, 100))


# --- the hook's spans, built on the exporter's thread -------------------------------


def request(call_id: str = "toolu_01") -> ToolInvocationRequest:
    return ToolInvocationRequest(tool_call_id=call_id, tool_name="query_sales", parameters={"region": "north"})


def result(call_id: str = "toolu_01", **fields: Any) -> ToolExecutionResult:
    data: dict[str, Any] = {"tool_call_id": call_id, "observation": "3 rows", "success": True, "duration_ms": 12.5,
                            "observation_tokens": 4, "retry_count": 1}
    return ToolExecutionResult(**{**data, **fields})


def config_for(collector: Collector, **fields: Any) -> ObservabilityConfig:
    return ObservabilityConfig(otlp_endpoint=collector.url, otlp_compression="none", schedule_delay_ms=20,
                               enable_metrics=False, **fields)


def test_it_builds_the_hooks_span_exactly_as_the_sdk_does(collector: Collector) -> None:
    telemetry = configure_telemetry(config_for(collector, trace_sampling=TraceSampling.ALWAYS), shutdown_on_exit=False)
    hook = ToolResultHook(conversation_id="conv-1", telemetry=telemetry, round_id="r1")
    assert telemetry._deferrable()
    with telemetry.agent_span("conv-1", "r1") as parent:
        hook(request(), result(), [])
        hook(request("toolu_02"), result("toolu_02", success=False, error_type="TIMEOUT", error_message="slow"), [])
    eager = telemetry.record_tool_span(request(), result(), "conv-1", "r1")  # the SDK's own span, for comparison
    telemetry.shutdown(5)
    ok, failed, sdk = (s for s in collector.spans if s["name"] == "execute_tool query_sales")
    assert ok["parent_span_id"] == failed["parent_span_id"] == parent.span_id
    assert ok["trace_id"] == parent.trace_id and ok["kind"] == sdk["kind"] == 1
    assert ok["attributes"] == sdk["attributes"]
    assert (ok["status"], failed["status"], failed["status_message"]) == (1, 2, "slow")
    assert failed["attributes"]["error.type"] == "TIMEOUT"
    assert ok["duration_ns"] == 12_500_000 and sdk["span_id"] == eager.span_id


def test_it_samples_the_hooks_spans_by_trace_id_like_the_sdk(collector: Collector) -> None:
    telemetry = configure_telemetry(config_for(collector, sample_ratio=0.5), shutdown_on_exit=False)
    exporter = RecordExporter(collector.url, "key", flush_interval_ms=20)
    hook = ToolResultHook(conversation_id="conv-1", telemetry=telemetry, exporter=exporter)
    for i in range(200):
        hook(request(f"call_{i}"), result(f"call_{i}"), [])
    assert exporter.flush(10)
    exporter.shutdown(2)
    telemetry.shutdown(5)
    bound = TraceIdRatioBased.get_bound_for_rate(0.5)
    records = collector.records
    assert len(records) == 200 and all(r["trace_id"] and r["span_id"] for r in records)  # every record has ids
    expected = {r["span_id"] for r in records if int(r["trace_id"], 16) & TraceIdRatioBased.TRACE_ID_LIMIT < bound}
    assert set(collector.span_ids()) == expected and 0 < len(expected) < 200
    assert telemetry.stats().filtered == 200 - len(expected)


def test_it_keeps_only_errors_and_slow_hook_spans_when_asked(collector: Collector) -> None:
    telemetry = configure_telemetry(
        config_for(collector, trace_sampling=TraceSampling.ERRORS_AND_SLOW, slow_threshold_ms=1000),
        shutdown_on_exit=False,
    )
    hook = ToolResultHook(conversation_id="conv-1", telemetry=telemetry)
    hook(request("fast"), result("fast"), [])
    hook(request("failed"), result("failed", success=False, error_type="TIMEOUT"), [])
    hook(request("slow"), result("slow", duration_ms=2_500), [])
    telemetry.shutdown(5)
    assert sorted(s["attributes"]["gen_ai.tool.call.id"] for s in collector.spans) == ["failed", "slow"]


def test_it_makes_real_sdk_spans_when_someone_added_a_processor(collector: Collector) -> None:
    telemetry = configure_telemetry(config_for(collector, trace_sampling=TraceSampling.ALWAYS), shutdown_on_exit=False)
    theirs = InMemorySpanExporter()
    telemetry.provider.add_span_processor(SimpleSpanProcessor(theirs))
    assert not telemetry._deferrable()
    ToolResultHook(conversation_id="conv-1", telemetry=telemetry)(request(), result(), [])
    telemetry.shutdown(5)
    (seen,) = theirs.get_finished_spans()
    assert seen.name == "execute_tool query_sales"
    assert [s["span_id"] for s in collector.spans] == [format(seen.context.span_id, "016x")]


def test_it_sends_no_span_but_still_gives_records_ids_when_sampling_never(collector: Collector) -> None:
    telemetry = configure_telemetry(config_for(collector, trace_sampling=TraceSampling.NEVER), shutdown_on_exit=False)
    exporter = RecordExporter(collector.url, "key", flush_interval_ms=20)
    ToolResultHook(conversation_id="conv-1", telemetry=telemetry, exporter=exporter)(request(), result(), [])
    assert exporter.flush(10)
    exporter.shutdown(2)
    telemetry.shutdown(5)
    (record,) = collector.records
    assert len(record["trace_id"]) == 32 and collector.spans == []


def test_it_shuts_down_within_its_bound_while_the_receiver_is_down() -> None:
    processor = SpanDeliveryProcessor(traces_url=f"http://127.0.0.1:{free_port()}/v1/traces", **fast(backoff_s=5.0))
    provider = provider_with(processor)
    make_spans(provider, 5)
    started = time.monotonic()
    assert processor.shutdown(0.5) is False
    assert time.monotonic() - started < 3
    assert processor.stats().failures == 5 and processor.stats().reasons == {"shutdown": 5}
    provider.shutdown()


def test_it_needs_a_url_or_an_exporter() -> None:
    with pytest.raises(ValueError):
        SpanDeliveryProcessor(start=False)
    with pytest.raises(ValueError):
        SpanDeliveryProcessor(traces_url="http://x/v1/traces", exporter=InMemorySpanExporter(), start=False)


def test_it_sends_the_rest_when_a_spooled_span_does_not_decode(collector: Collector, tmp_path: Any) -> None:
    from pipeline._spool import Spool

    spool = Spool(tmp_path)
    spool.open()
    spool.append([b"\xff\xfe not protobuf at all"])  # intact on disk, junk inside
    spool.close()
    processor = SpanDeliveryProcessor(traces_url=f"{collector.url}/v1/traces", spool_dir=str(tmp_path), **fast())
    provider = provider_with(processor)
    make_spans(provider, 3)
    assert processor.force_flush(10_000)
    provider.shutdown()
    stats = processor.stats()
    assert sorted(s["name"] for s in collector.spans) == ["span 0", "span 1", "span 2"]
    assert (stats.replayed, stats.rejected, stats.failures, stats.queue_depth) == (1, 1, 0, 0)
