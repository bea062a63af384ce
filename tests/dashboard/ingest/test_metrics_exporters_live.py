"""The real OpenTelemetry SDK metric exporters (OTLP/HTTP protobuf and OTLP/gRPC)
against a live dashboard: cumulative exports (the SDK's default) repeated, each
counted once; the totals stored equal what the app recorded."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from dashboard.accounts.services import apikey_create, project_create
from dashboard.ingest.grpc_server import METRICS_SERVICE, grpc_server_build
from dashboard.metrics.models import MetricHour, OtherMetric

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture
def project_key():
    project = project_create(name="Metered agents")
    return project, apikey_create(project=project)[1]


def _record_and_export(exporter) -> MeterProvider:
    """What an instrumented app records, exported three times (cumulative: each
    export repeats the totals so far)."""
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(resource=Resource.create({"service.name": "agent"}), metric_readers=[reader])
    meter = provider.get_meter("opentelemetry.instrumentation.openai_v2")
    tokens = meter.create_histogram("gen_ai.client.token.usage", unit="{token}")
    duration = meter.create_histogram("gen_ai.client.operation.duration", unit="s")
    calls = provider.get_meter("pipeline").create_counter("ba.tool.calls", unit="{call}")
    other = meter.create_counter("http.client.requests")
    model = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o-mini"}
    tokens.record(100, {**model, "gen_ai.token.type": "input"})
    tokens.record(20, {**model, "gen_ai.token.type": "output"})
    duration.record(0.5, model)
    calls.add(2, {"gen_ai.tool.name": "query_sales"})
    other.add(1)
    assert provider.force_flush()
    tokens.record(50, {**model, "gen_ai.token.type": "input"})
    duration.record(1.5, model)
    calls.add(1, {"gen_ai.tool.name": "query_sales"})
    assert provider.force_flush()
    assert provider.force_flush()  # nothing new: the same totals again
    provider.shutdown()
    return provider


def _check_stored(project) -> None:
    rows = MetricHour.objects.filter(project=project)
    assert {(r.name, r.model, r.token_type): r.value for r in rows.filter(name="gen_ai.client.token.usage")} == {
        ("gen_ai.client.token.usage", "gpt-4o-mini", "input"): 150.0,
        ("gen_ai.client.token.usage", "gpt-4o-mini", "output"): 20.0,
    }
    duration = rows.get(name="gen_ai.client.operation.duration")
    assert (duration.value, duration.count) == (2.0, 2)
    assert rows.get(name="ba.tool.calls", tool_name="query_sales").value == 3.0
    # the counter was exported 3 times (its total, 1, each time): other metrics count points
    assert OtherMetric.objects.get(project=project, name="http.client.requests").points >= 1


def test_the_sdk_http_exporter_stores_each_increment_once(live_server, project_key):
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    project, key = project_key
    exporter = OTLPMetricExporter(endpoint=f"{live_server.url}/v1/metrics", headers={"Authorization": f"Bearer {key}"},
                                  compression=Compression.Gzip, timeout=10)
    _record_and_export(exporter)
    _check_stored(project)


def test_the_sdk_grpc_exporter_stores_each_increment_once(settings, project_key):
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    project, key = project_key
    server, port = grpc_server_build(port=0, threads=2)
    server.start()
    try:
        exporter = OTLPMetricExporter(endpoint=f"127.0.0.1:{port}", insecure=True,
                                      headers=(("authorization", f"Bearer {key}"),), timeout=10)
        _record_and_export(exporter)
    finally:
        server.stop(0).wait()
    _check_stored(project)
    assert METRICS_SERVICE == "opentelemetry.proto.collector.metrics.v1.MetricsService"


def test_the_pipelines_own_metrics_are_taken(live_server, project_key):
    """The demo agent's poster was answered 404 and stopped sending; now it is stored."""
    from pipeline._metrics_export import OtlpMetricPoster

    project, key = project_key
    poster = OtlpMetricPoster(f"{live_server.url}/v1/metrics", headers={"Authorization": f"Bearer {key}"},
                              gzip_body=True, timeout_s=10)
    reader = PeriodicExportingMetricReader(poster, export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader])
    counter = provider.get_meter("pipeline").create_counter("ba.tool.errors")
    counter.add(4, {"gen_ai.tool.name": "file_reader"})
    assert provider.force_flush() and provider.force_flush()
    provider.shutdown()
    assert not poster.unsupported and poster.exports >= 2
    assert MetricHour.objects.get(project=project, name="ba.tool.errors", tool_name="file_reader").value == 4.0
