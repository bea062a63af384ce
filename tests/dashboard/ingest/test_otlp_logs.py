"""POST /v1/logs: storing log records, linking them to conversations through their
span (either arrival order), retries, and every refusal (short 4xx, nothing stored)."""

from __future__ import annotations

import gzip
import json

import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from django.utils.timezone import now as dj_now

from dashboard.ingest.otlp_logs import MAX_BODY_CHARS, MAX_LOGS
from dashboard.observatory.derive.drain import outbox_drain_all
from dashboard.observatory.models import Conversation, IngestTransport, LogRecord, Span

from .database_faults import broken_reports, broken_table, busy_database, faults, names_nothing_internal

pytestmark = pytest.mark.django_db

URL = "/v1/logs"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
TIME = 1_700_000_000_000_000_000
TRACE = "ab" * 16
SPAN = "cd" * 8


def make_logs(count: int = 2, *, trace_id: str = TRACE, span_id: str = SPAN, body: AnyValue | None = None,
              attributes: dict[str, str] | None = None, event_name: str = "gen_ai.user.message") -> ExportLogsServiceRequest:
    request = ExportLogsServiceRequest()
    resource_logs = request.resource_logs.add()
    resource_logs.resource.attributes.add(key="service.name", value=AnyValue(string_value="agent"))
    scope_logs = resource_logs.scope_logs.add()
    scope_logs.scope.name = "opentelemetry.instrumentation.openai_v2"
    for index in range(count):
        record = scope_logs.log_records.add()
        record.time_unix_nano = TIME + index * 1000
        record.observed_time_unix_nano = TIME + index * 1000 + 5000
        record.severity_number = 9
        record.severity_text = "INFO"
        record.event_name = event_name
        if trace_id:
            record.trace_id = bytes.fromhex(trace_id)
        if span_id:
            record.span_id = bytes.fromhex(span_id)
        record.body.CopyFrom(body or AnyValue(string_value=f"<b>hello {index}</b>"))
        for key, value in (attributes or {}).items():
            record.attributes.add(key=key, value=AnyValue(string_value=value))
    return request


def post(client, auth, body: bytes, content_type: str = PROTOBUF, **extra):
    return client.post(URL, data=body, content_type=content_type, **auth, **extra)


def test_it_stores_protobuf_log_records(client, auth, project):
    response = post(client, auth, make_logs(2).SerializeToString())
    assert response.status_code == 200
    assert ExportLogsServiceResponse.FromString(response.content) == ExportLogsServiceResponse()
    rows = list(LogRecord.objects.filter(project=project).order_by("time"))
    assert [row.body for row in rows] == ["<b>hello 0</b>", "<b>hello 1</b>"]
    first = rows[0]
    assert (first.trace_id, first.span_id, first.severity_number, first.severity_text) == (TRACE, SPAN, 9, "INFO")
    assert first.event_name == "gen_ai.user.message"
    assert first.service_name == "agent"
    assert first.attributes["otel.scope.name"] == "opentelemetry.instrumentation.openai_v2"
    assert first.observed_time > first.time


def test_it_stores_a_retried_batch_once(client, auth, project):
    body = make_logs(3).SerializeToString()
    assert post(client, auth, body).status_code == 200
    assert post(client, auth, body).status_code == 200
    assert LogRecord.objects.filter(project=project).count() == 3


def test_it_stores_json_with_structured_bodies_and_no_span(client, auth, project):
    document = {
        "resourceLogs": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "js-agent"}}]},
            "scopeLogs": [{"logRecords": [{
                "timeUnixNano": str(TIME),
                "severityNumber": "SEVERITY_NUMBER_WARN",
                "eventName": "gen_ai.choice",
                "body": {"kvlistValue": {"values": [
                    {"key": "message", "value": {"kvlistValue": {"values": [
                        {"key": "content", "value": {"stringValue": "It is 42."}}]}}},
                ]}},
                "attributes": [{"key": "gen_ai.conversation.id", "value": {"stringValue": "conv-logs"}}],
            }]}],
        }]
    }
    response = post(client, auth, json.dumps(document).encode(), JSON)
    assert response.status_code == 200, response.content
    assert response.json() == {}
    row = LogRecord.objects.get(project=project)
    assert row.body == {"message": {"content": "It is 42."}}
    assert (row.trace_id, row.span_id, row.severity_number) == ("", "", 13)
    assert row.conversation == Conversation.objects.get(project=project, external_id="conv-logs")


def test_it_links_a_log_to_the_conversation_of_its_stored_span(client, auth, project):
    span_request = _span_request("conv-span")
    assert client.post("/v1/traces", data=span_request, content_type=PROTOBUF, **auth).status_code == 200
    assert post(client, auth, make_logs(1).SerializeToString()).status_code == 200
    conversation = Conversation.objects.get(project=project, external_id="conv-span")
    assert LogRecord.objects.get(project=project).conversation == conversation


def test_it_links_a_log_that_arrived_before_its_span_through_the_outbox(client, auth, project):
    assert post(client, auth, make_logs(1).SerializeToString()).status_code == 200
    assert LogRecord.objects.get(project=project).conversation is None
    assert client.post("/v1/traces", data=_span_request("conv-late"), content_type=PROTOBUF, **auth).status_code == 200
    outbox_drain_all()  # inline under tests already; draining again changes nothing
    conversation = Conversation.objects.get(project=project, external_id="conv-late")
    assert LogRecord.objects.get(project=project).conversation == conversation


def test_it_answers_partial_success_for_records_with_bad_ids(client, auth, project):
    request = make_logs(2)
    request.resource_logs[0].scope_logs[0].log_records[0].span_id = b"\x01\x02"
    response = post(client, auth, request.SerializeToString())
    assert response.status_code == 200
    answer = ExportLogsServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_log_records == 1
    assert "span_id must be 8 bytes" in answer.partial_success.error_message
    assert LogRecord.objects.filter(project=project).count() == 1


def test_it_cuts_a_huge_body_to_its_budget(client, auth, project):
    request = make_logs(1, body=AnyValue(string_value="x" * (MAX_BODY_CHARS * 2)))
    assert post(client, auth, request.SerializeToString()).status_code == 200
    row = LogRecord.objects.get(project=project)
    assert row.truncated and len(row.body) < MAX_BODY_CHARS + 20


def test_it_escapes_nothing_at_ingest_and_keeps_text_as_sent(client, auth, project):
    assert post(client, auth, make_logs(1).SerializeToString()).status_code == 200
    assert LogRecord.objects.get(project=project).body == "<b>hello 0</b>"  # escaping is the pages' job


@pytest.mark.parametrize(
    "body, content_type, status",
    [
        (b"\x0a\xff\xff\xff\xff\x0f", PROTOBUF, 400),  # truncated protobuf
        (b"garbage that is not protobuf \xff", PROTOBUF, 400),
        (b"{not json", JSON, 400),
        (b'{"resourceLogs": 7}', JSON, 400),
        (b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"timeUnixNano": "soon"}]}]}]}', JSON, 400),
    ],
)
def test_it_refuses_malformed_bodies(client, auth, project, body, content_type, status):
    response = post(client, auth, body, content_type)
    assert response.status_code == status
    if content_type == PROTOBUF:
        assert status_pb2.Status.FromString(response.content).message
    assert not LogRecord.objects.exists()


def test_it_refuses_too_many_records(client, auth, project):
    response = post(client, auth, make_logs(MAX_LOGS + 1).SerializeToString())
    assert response.status_code == 413
    assert not LogRecord.objects.exists()


def test_it_refuses_a_gzip_bomb(client, auth, project, settings):
    settings.OBSERVATORY_MAX_DECODED_BYTES = 64 * 1024
    bomb = gzip.compress(make_logs(1).SerializeToString() + b"\x00" * (1024 * 1024))
    response = post(client, auth, bomb, HTTP_CONTENT_ENCODING="gzip")
    assert response.status_code == 413
    assert not LogRecord.objects.exists()


def test_it_takes_gzip(client, auth, project):
    response = post(client, auth, gzip.compress(make_logs(2).SerializeToString()), HTTP_CONTENT_ENCODING="gzip")
    assert response.status_code == 200
    assert LogRecord.objects.filter(project=project).count() == 2


@pytest.mark.parametrize("header", [None, "Bearer po_0123456789abcdef_" + "x" * 43, "Basic abc"])
def test_it_refuses_a_wrong_key(client, header):
    extra = {"HTTP_AUTHORIZATION": header} if header else {}
    response = client.post(URL, data=make_logs(1).SerializeToString(), content_type=PROTOBUF, **extra)
    assert response.status_code == 401
    assert not LogRecord.objects.exists()


def test_it_refuses_other_methods_and_content_types(client, auth):
    assert client.get(URL, **auth).status_code == 405
    assert client.post(URL, data=b"x", content_type="text/plain", **auth).status_code == 415


def _span_request(conversation: str) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = bytes.fromhex(TRACE), bytes.fromhex(SPAN), "chat gpt-4o"
    span.start_time_unix_nano, span.end_time_unix_nano = TIME, TIME + 1_000_000
    span.attributes.append(KeyValue(key="gen_ai.conversation.id", value=AnyValue(string_value=conversation)))
    return request.SerializeToString()


def test_it_keeps_spans_and_logs_apart(client, auth, project):
    assert client.post("/v1/traces", data=_span_request("c"), content_type=PROTOBUF, **auth).status_code == 200
    assert post(client, auth, make_logs(1).SerializeToString()).status_code == 200
    assert Span.objects.filter(project=project).count() == 1
    assert LogRecord.objects.filter(project=project).count() == 1


def test_it_links_late_logs_in_the_beat_pass_too(client, auth, project):
    """A record stored after its span's own link pass (a race between two
    transactions) is linked by the hourly pass over recent unlinked records."""
    from dashboard.observatory import tasks

    conversation = Conversation.objects.create(project=project, external_id="conv-beat", started_at=dj_now())
    assert post(client, auth, make_logs(2).SerializeToString()).status_code == 200
    assert client.post("/v1/traces", data=_span_request("conv-beat"), content_type=PROTOBUF, **auth).status_code == 200
    LogRecord.objects.update(conversation=None)  # as if the record had committed after the span's pass
    counts = tasks.links_refresh(project.pk)
    assert counts["log_records"] == 2
    assert set(LogRecord.objects.values_list("conversation", flat=True)) == {conversation.pk}


def test_it_purges_log_records_with_the_spans(client, auth, project):
    from datetime import timedelta

    from dashboard.observatory.services import retention_purge

    assert post(client, auth, make_logs(2).SerializeToString()).status_code == 200
    assert retention_purge(project=project).log_records == 0
    outcome = retention_purge(project=project, now=dj_now() + timedelta(days=400))
    assert outcome.log_records == 2 and not LogRecord.objects.exists()


def test_it_answers_partial_success_in_json_too(client, auth, project):
    document = {"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"traceId": "zz" * 16, "body": {"stringValue": "bad id"}},
        {"traceId": TRACE, "spanId": SPAN, "body": {"stringValue": "kept"}},
    ]}]}]}
    response = post(client, auth, json.dumps(document).encode(), JSON)
    assert response.status_code == 200
    assert response.json() == {"partialSuccess": {
        "rejectedLogRecords": "1", "errorMessage": "1 log record(s) rejected: trace_id is not hex"}}
    assert list(LogRecord.objects.values_list("body", flat=True)) == ["kept"]


YEAR_2300 = 10_413_792_000 * 10**9  # 2300-01-01 in nanoseconds since the epoch


@pytest.mark.parametrize("field", ["time_unix_nano", "observed_time_unix_nano"])
def test_it_rejects_only_the_record_with_a_time_past_the_accepted_years(client, auth, project, field):
    request = make_logs(2)
    setattr(request.resource_logs[0].scope_logs[0].log_records[0], field, YEAR_2300)
    response = post(client, auth, request.SerializeToString())
    assert response.status_code == 200
    answer = ExportLogsServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_log_records == 1
    assert "outside the accepted years" in answer.partial_success.error_message
    assert list(LogRecord.objects.filter(project=project).values_list("body", flat=True)) == ["<b>hello 1</b>"]


def test_it_keeps_a_record_whose_times_are_unknown(client, auth, project):
    # OTLP: 0 means the time is unknown; the record is still a record.
    request = make_logs(1)
    record = request.resource_logs[0].scope_logs[0].log_records[0]
    record.time_unix_nano = 0
    record.observed_time_unix_nano = 0
    assert post(client, auth, request.SerializeToString()).status_code == 200
    assert LogRecord.objects.filter(project=project).count() == 1


def test_it_rejects_a_negative_time_in_json(client, auth, project):
    document = {"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"traceId": TRACE, "spanId": SPAN, "timeUnixNano": "-5", "body": {"stringValue": "poison"}},
        {"traceId": TRACE, "spanId": SPAN, "body": {"stringValue": "kept"}},
    ]}]}]}
    response = post(client, auth, json.dumps(document).encode(), JSON)
    assert response.json()["partialSuccess"]["rejectedLogRecords"] == "1"
    assert list(LogRecord.objects.values_list("body", flat=True)) == ["kept"]


# --- a busy database and a broken one, for real ------------------------------------

@pytest.mark.django_db(transaction=True)
def test_it_answers_503_with_retry_after_when_the_database_is_really_busy(client, auth, project, monkeypatch):
    with busy_database(monkeypatch, "observatory_logrecord"):
        response = post(client, auth, make_logs(2).SerializeToString())
    assert (response.status_code, response["Retry-After"]) == (503, "2")
    assert not LogRecord.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_it_answers_500_naming_nothing_when_the_database_is_broken_and_logs_and_counts_it_once(
        client, auth, project, caplog):
    request = make_logs(2, attributes={"gen_ai.conversation.id": "c-broken"})
    with broken_table("observatory_logrecord"):
        response = post(client, auth, request.SerializeToString())
    assert response.status_code == 500 and "Retry-After" not in response
    assert names_nothing_internal(status_pb2.Status.FromString(response.content).message)
    assert not LogRecord.objects.exists() and not Conversation.objects.exists()
    (report,) = broken_reports(caplog)
    assert f"project {project.pk}" in report.getMessage() and "2 log records" in report.getMessage()
    assert faults(IngestTransport.OTLP_HTTP, project) == 1
