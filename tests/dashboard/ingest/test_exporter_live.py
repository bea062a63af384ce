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
