"""End to end: the pipeline's RecordExporter sends records and an artifact to a live
dashboard over HTTP, and they are stored and derived."""

from __future__ import annotations

import hashlib

import pytest

from dashboard.observatory.models import Artifact, Conversation, ToolExecution, ToolHourlyRollup
from pipeline import RecordExporter, parse_record

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_stores_what_the_record_exporter_sends(live_server, api_key, records, project):
    artifact_id = "artifact_" + "e" * 32
    data = b"id,total\n1,10\n" * 100
    exporter = RecordExporter(live_server.url, api_key, batch_size=10, flush_interval_ms=50, compress=True)
    try:
        batch = [records.round(user_message="Sales by region?"), records.message(content="Sales by region?")]
        batch += [records.tool_result(result={"artifact_id": artifact_id, "data_size_bytes": len(data)})]
        batch += [records.tool_result(tool="chart", duration_ms=float(i)) for i in range(20)]
        for item in batch:
            assert exporter.submit(parse_record(item))
        assert exporter.upload_artifact(artifact_id, data, "text/csv")
        assert exporter.flush(timeout=20)
    finally:
        exporter.shutdown(timeout=5)
    stats = exporter.stats()
    assert stats.to_dict().get("dropped", 0) == 0
    assert ToolExecution.objects.count() == 21
    conversation = Conversation.objects.get(project=project)
    assert (conversation.title, conversation.tool_calls) == ("Sales by region?", 21)
    artifact = Artifact.objects.get(project=project, artifact_id=artifact_id)
    assert artifact.sha256 == hashlib.sha256(data).hexdigest() and artifact.tool_execution is not None
    assert sum(ToolHourlyRollup.objects.values_list("calls", flat=True)) == 21


def test_it_stores_everything_once_after_the_dashboard_refused_load_for_a_while(
    live_server, api_key, records, project, settings
):
    """The dashboard's own overload answer (429 + Retry-After) for a few seconds: the
    exporters keep retrying and nothing is lost or stored twice, spans included."""
    from dashboard.observatory.models import Span
    from pipeline import ObservabilityConfig, ToolExecutionResult, ToolInvocationRequest, ToolResultHook, TraceSampling
    from pipeline import configure_telemetry
    from tests.pipeline.delivery_helpers import wait_until

    settings.OBSERVATORY_MAX_CONCURRENT_INGEST = 0  # every ingest request: 429, Retry-After 1
    exporter = RecordExporter(live_server.url, api_key, batch_size=10, flush_interval_ms=50, backoff_s=0.2,
                              max_backoff_s=1.0)
    telemetry = configure_telemetry(
        ObservabilityConfig(otlp_endpoint=live_server.url, otlp_headers={"Authorization": f"Bearer {api_key}"},
                            trace_sampling=TraceSampling.ALWAYS, schedule_delay_ms=50, enable_metrics=False),
        shutdown_on_exit=False,
    )
    hook = ToolResultHook(conversation_id="conv-outage", telemetry=telemetry, exporter=exporter, round_id="r1")
    try:
        exporter.submit(parse_record(records.round(conversation="conv-outage", round_id="r1", user_message="Sales?")))
        for i in range(20):
            request = ToolInvocationRequest(tool_call_id=f"call_{i}", tool_name="query_sales")
            hook(request, ToolExecutionResult(tool_call_id=f"call_{i}", observation="ok", success=True), [])
        assert wait_until(lambda: exporter.stats().retries >= 2 and telemetry.stats().retries >= 2, 20)
        assert ToolExecution.objects.count() == 0
        settings.OBSERVATORY_MAX_CONCURRENT_INGEST = 8  # the dashboard can take load again
        assert exporter.flush(timeout=20)
        assert telemetry.force_flush(20)
    finally:
        exporter.shutdown(timeout=5)
        telemetry.shutdown(5)
    stats = exporter.stats()
    assert (stats.sent, stats.dropped, stats.failures) == (21, 0, 0)
    assert ToolExecution.objects.filter(conversation__external_id="conv-outage").count() == 20
    assert Span.objects.filter(project=project, name="execute_tool query_sales").count() == 20


def test_it_sends_what_an_agent_left_in_its_spool_to_the_live_dashboard(live_server, api_key, records, settings,
                                                                          tmp_path):
    """A redeploy: the agent stops while the dashboard refuses load; the next agent on
    the same spool directory delivers what the first one had queued."""
    from tests.pipeline.delivery_helpers import wait_until

    settings.OBSERVATORY_MAX_CONCURRENT_INGEST = 0
    first = RecordExporter(live_server.url, api_key, spool_dir=str(tmp_path), backoff_s=5.0)
    batch = [records.tool_result(conversation="conv-spool", duration_ms=float(i)) for i in range(15)]
    for item in batch:
        first.submit(parse_record(item))
    assert wait_until(lambda: first.stats().spooled == 15 and first.stats().retries >= 1, 20)
    first.shutdown(timeout=0.5)
    assert first.stats().kept_in_spool == 15
    settings.OBSERVATORY_MAX_CONCURRENT_INGEST = 8
    second = RecordExporter(live_server.url, api_key, spool_dir=str(tmp_path), flush_interval_ms=50)
    try:
        assert wait_until(lambda: second.stats().replayed == 15, 20)
        # flush waits for what this process queued, not for the spool's replay: wait for the acks
        assert wait_until(lambda: second.stats().sent == 15, 20)
        assert second.flush(timeout=20)
    finally:
        second.shutdown(timeout=5)
    assert ToolExecution.objects.filter(conversation__external_id="conv-spool").count() == 15
