"""POST /v1/traces: storing, linking, and every refusal (short 4xx, nothing half-stored)."""

from __future__ import annotations

import gzip
import json
import os
import uuid

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from dashboard.accounts.services import apikey_create, apikey_revoke, project_create
from dashboard.ingest import common, spans as spans_module
from dashboard.ingest.otlp import MAX_SPANS, MAX_VALUE_CHARS, TRUNCATION_MARKER
from dashboard.observatory.derive.drain import outbox_drain_all
from dashboard.observatory.derive.notes import wake
from dashboard.observatory.models import Conversation, DerivationNote, IngestTransport, Span, ToolExecution

from .database_faults import broken_reports, broken_table, busy_database, faults, names_nothing_internal

pytestmark = pytest.mark.django_db

URL = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
START = 1_700_000_000_000_000_000


@pytest.fixture
def project_key():
    project = project_create(name="Agents")
    _, key = apikey_create(project=project)
    return project, key


@pytest.fixture
def project(project_key):
    return project_key[0]


@pytest.fixture
def auth(project_key):
    return {"Authorization": f"Bearer {project_key[1]}"}


def make_request(
    count: int = 3,
    *,
    attributes: dict[str, AnyValue] | None = None,
    resource: dict[str, AnyValue] | None = None,
    trace_id: bytes | None = None,
) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.add(key="service.name", value=AnyValue(string_value="agent"))
    for key, value in (resource or {}).items():
        resource_spans.resource.attributes.add(key=key, value=value)
    scope_spans = resource_spans.scope_spans.add()
    trace_id = trace_id or os.urandom(16)
    for index in range(count):
        span = scope_spans.spans.add()
        span.trace_id = trace_id
        span.span_id = (index + 1).to_bytes(8, "big")
        span.name = f"step {index}"
        span.kind = 1
        span.start_time_unix_nano = START + index * 1_000_000
        span.end_time_unix_nano = START + index * 1_000_000 + 250_000_000
        for key, value in (attributes or {}).items():
            span.attributes.add(key=key, value=value)
    return request


def post(client, body: bytes, headers: dict, content_type: str = PROTOBUF, **extra):
    return client.post(URL, data=body, content_type=content_type, headers={**headers, **extra})


def status_of(response) -> status_pb2.Status:
    assert response["Content-Type"] == PROTOBUF
    return status_pb2.Status.FromString(response.content)


def genai(**values: str | int) -> dict[str, AnyValue]:
    out = {}
    for key, value in values.items():
        key = key.replace("__", ".")
        out[key] = AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
    return out


def store_tool_execution(project, tool_call_id: str) -> ToolExecution:
    """A tool execution as the records API stores it (the record came first)."""
    conversation, _ = Conversation.objects.get_or_create(project=project, external_id="conv-1")
    return ToolExecution.objects.create(
        record_id=uuid.uuid4(),
        project=project,
        conversation=conversation,
        occurred_at=timezone.now(),
        tool_name="search",
        tool_call_id=tool_call_id,
        output_level="standard",
        success=True,
    )


# --- storing --------------------------------------------------------------------


def test_it_stores_a_protobuf_batch_and_answers_in_protobuf(client, auth, project):
    request = make_request(3, attributes={"ba.output_level": AnyValue(string_value="brief")})
    response = post(client, request.SerializeToString(), auth)
    assert response.status_code == 200
    assert response["Content-Type"] == PROTOBUF
    assert not ExportTraceServiceResponse.FromString(response.content).HasField("partial_success")
    rows = list(Span.objects.filter(project=project).order_by("span_id"))
    assert [row.span_id for row in rows] == ["0000000000000001", "0000000000000002", "0000000000000003"]
    first = rows[0]
    assert first.trace_id == request.resource_spans[0].scope_spans[0].spans[0].trace_id.hex()
    assert (first.name, first.kind, first.service_name, first.parent_span_id) == ("step 0", 1, "agent", "")
    assert first.start_time.timestamp() == START / 1e9
    assert first.duration_ms == 250.0
    assert first.attributes == {"ba.output_level": "brief"}
    assert first.resource == {"service.name": "agent"}
    assert first.events == []
    assert first.conversation is None
    assert first.truncated is False


def test_it_stores_a_json_batch_and_answers_in_json(client, auth, project):
    body = json.dumps(
        {
            "resourceSpans": [
                {
                    "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "js"}}]},
                    "scopeSpans": [
                        {
                            "spans": [
                                {
                                    "traceId": "5b8efff798038103d269b633813fc60c",
                                    "spanId": "eee19b7ec3c1b174",
                                    "parentSpanId": "eee19b7ec3c1b173",
                                    "name": "I'm a server span",
                                    "startTimeUnixNano": "1544712660000000000",
                                    "endTimeUnixNano": "1544712661000000000",
                                    "kind": 2,
                                    "status": {"code": 2, "message": "failed"},
                                    "events": [{"name": "exception", "timeUnixNano": "1544712660500000000"}],
                                    "attributes": [{"key": "my.count", "value": {"intValue": "42"}}],
                                }
                            ]
                        }
                    ],
                }
            ]
        }
    ).encode()
    response = post(client, body, auth, content_type=JSON)
    assert response.status_code == 200
    assert response["Content-Type"] == JSON
    assert json.loads(response.content) == {}
    row = Span.objects.get(project=project)
    assert (row.trace_id, row.span_id, row.parent_span_id) == (
        "5b8efff798038103d269b633813fc60c",
        "eee19b7ec3c1b174",
        "eee19b7ec3c1b173",
    )
    assert (row.kind, row.status_code, row.status_message, row.duration_ms) == (2, 2, "failed", 1000.0)
    assert row.attributes == {"my.count": 42}
    assert row.events == [{"name": "exception", "time_unix_nano": 1544712660500000000, "attributes": {}}]


def test_it_accepts_a_gzipped_body(client, auth, project):
    body = gzip.compress(make_request(5).SerializeToString())
    response = post(client, body, auth, **{"Content-Encoding": "gzip"})
    assert response.status_code == 200
    assert Span.objects.filter(project=project).count() == 5


def test_it_stores_no_duplicate_when_a_batch_is_retried(client, auth, project):
    body = make_request(4).SerializeToString()
    assert post(client, body, auth).status_code == 200
    again = post(client, body, auth)
    assert again.status_code == 200
    assert not ExportTraceServiceResponse.FromString(again.content).HasField("partial_success")
    assert Span.objects.filter(project=project).count() == 4


def test_it_stores_only_the_new_spans_of_a_partly_retried_batch(client, auth, project):
    """On PostgreSQL the batch is COPied straight into the table; a conflict
    undoes that and the batch goes through the conflict-skipping staging insert."""
    request = make_request(5)
    first_two = make_request(0, trace_id=request.resource_spans[0].scope_spans[0].spans[0].trace_id)
    first_two.resource_spans[0].scope_spans[0].spans.extend(request.resource_spans[0].scope_spans[0].spans[:2])
    assert post(client, first_two.SerializeToString(), auth).status_code == 200
    assert post(client, request.SerializeToString(), auth).status_code == 200
    assert post(client, request.SerializeToString(), auth).status_code == 200
    assert sorted(Span.objects.filter(project=project).values_list("span_id", flat=True)) == [
        f"{i:016x}" for i in range(1, 6)
    ]


def test_it_stores_a_span_repeated_inside_one_batch_once(client, auth, project):
    request = make_request(1)
    request.resource_spans[0].scope_spans[0].spans.append(request.resource_spans[0].scope_spans[0].spans[0])
    assert post(client, request.SerializeToString(), auth).status_code == 200
    assert Span.objects.filter(project=project).count() == 1


def test_it_answers_partial_success_and_keeps_the_good_spans(client, auth, project):
    request = make_request(3)
    spans = request.resource_spans[0].scope_spans[0].spans
    spans[1].span_id = b"\x00" * 8
    spans[2].trace_id = b"\x01" * 15
    response = post(client, request.SerializeToString(), auth)
    assert response.status_code == 200
    partial = ExportTraceServiceResponse.FromString(response.content).partial_success
    assert partial.rejected_spans == 2
    assert "all zeros" in partial.error_message and "must be 16 bytes" in partial.error_message
    assert list(Span.objects.filter(project=project).values_list("name", flat=True)) == ["step 0"]


def test_it_answers_partial_success_in_json_for_invalid_hex_ids(client, auth, project):
    good = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "good"}
    bad = {"traceId": "not-hex-at-all-not-hex-at-all-!!", "spanId": "cd" * 8, "name": "bad"}
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [good, bad]}]}]}).encode()
    response = post(client, body, auth, content_type=JSON)
    assert response.status_code == 200
    assert json.loads(response.content)["partialSuccess"]["rejectedSpans"] == "1"
    assert list(Span.objects.filter(project=project).values_list("name", flat=True)) == ["good"]


def test_it_cuts_a_10_mb_attribute_and_marks_the_row(client, auth, project):
    request = make_request(1, attributes={"huge": AnyValue(string_value="x" * (10 * 1024 * 1024))})
    response = post(client, gzip.compress(request.SerializeToString()), auth, **{"Content-Encoding": "gzip"})
    assert response.status_code == 200
    row = Span.objects.get(project=project)
    assert row.attributes["huge"] == "x" * MAX_VALUE_CHARS + TRUNCATION_MARKER
    assert row.truncated is True


def test_it_cuts_names_and_ids_to_their_columns(client, auth, project):
    request = make_request(
        1,
        attributes=genai(
            gen_ai__conversation__id="c" * 5000, gen_ai__tool__name="t" * 5000, gen_ai__tool__call__id="i" * 5000
        ),
    )
    request.resource_spans[0].scope_spans[0].spans[0].name = "n\x00" * 5000
    assert post(client, request.SerializeToString(), auth).status_code == 200
    row = Span.objects.get(project=project)
    assert len(row.name) == Span._meta.get_field("name").max_length
    assert row.truncated is True
    assert "\x00" not in row.name
    assert row.conversation_key == "c" * Span._meta.get_field("conversation_key").max_length
    assert row.tool_call_id == "i" * Span._meta.get_field("tool_call_id").max_length
    assert row.conversation.external_id == row.conversation_key


# --- linking --------------------------------------------------------------------


def test_it_links_spans_to_a_new_conversation_by_gen_ai_conversation_id(client, auth, project):
    request = make_request(3, attributes=genai(gen_ai__conversation__id="conv-42", gen_ai__usage__input_tokens=10))
    assert post(client, request.SerializeToString(), auth).status_code == 200
    conversation = Conversation.objects.get(project=project, external_id="conv-42")
    assert Span.objects.filter(conversation=conversation).count() == 3
    assert conversation.started_at.timestamp() == START / 1e9


def test_it_links_spans_by_openinference_session_id_on_the_resource(client, auth, project):
    request = make_request(2, resource=genai(session__id="sess-7"))
    assert post(client, request.SerializeToString(), auth).status_code == 200
    conversation = Conversation.objects.get(project=project, external_id="sess-7")
    assert set(Span.objects.filter(project=project).values_list("conversation", flat=True)) == {conversation.pk}


def test_it_prefers_the_span_attribute_to_the_resource(client, auth, project):
    request = make_request(1, attributes=genai(gen_ai__conversation__id="span-level"), resource=genai(session__id="resource-level"))
    assert post(client, request.SerializeToString(), auth).status_code == 200
    assert Span.objects.get(project=project).conversation.external_id == "span-level"


def test_it_reuses_an_existing_conversation(client, auth, project):
    existing = Conversation.objects.create(project=project, external_id="conv-1")
    request = make_request(2, attributes=genai(gen_ai__conversation__id="conv-1"))
    assert post(client, request.SerializeToString(), auth).status_code == 200
    assert Conversation.objects.filter(project=project).count() == 1
    assert set(Span.objects.values_list("conversation", flat=True)) == {existing.pk}


def test_it_links_many_conversations_in_one_batch(client, auth, project):
    request = make_request(1200)
    for index, span in enumerate(request.resource_spans[0].scope_spans[0].spans):
        span.attributes.add(key="gen_ai.conversation.id", value=AnyValue(string_value=f"conv-{index}"))
    assert post(client, request.SerializeToString(), auth).status_code == 200
    assert Conversation.objects.filter(project=project).count() == 1200
    assert Span.objects.filter(project=project, conversation__isnull=True).count() == 0


def test_it_links_a_stored_tool_execution_by_tool_call_id(client, auth, project):
    store_tool_execution(project, "call_abc")
    request = make_request(1, attributes=genai(gen_ai__tool__name="search", gen_ai__tool__call__id="call_abc"))
    assert post(client, request.SerializeToString(), auth).status_code == 200
    span = Span.objects.get(project=project)
    assert (span.tool_name, span.tool_call_id) == ("search", "call_abc")
    assert ToolExecution.objects.get(tool_call_id="call_abc").linked_span_id == span.pk


def test_it_gives_a_span_without_a_key_the_conversation_of_its_tool_execution(client, auth, project):
    execution = store_tool_execution(project, "call_conv")
    request = make_request(1, attributes=genai(gen_ai__tool__name="search", gen_ai__tool__call__id="call_conv"))
    assert post(client, request.SerializeToString(), auth).status_code == 200
    assert Span.objects.get(project=project).conversation_id == execution.conversation_id


def test_it_gives_a_span_without_a_key_the_conversation_of_its_trace(client, auth, project):
    request = make_request(3)
    spans = request.resource_spans[0].scope_spans[0].spans
    spans[1].attributes.add(key="gen_ai.conversation.id", value=AnyValue(string_value="conv-trace"))
    other_trace = make_request(1).resource_spans[0].scope_spans[0].spans[0]
    other_trace.span_id = b"\x09" * 8
    spans.append(other_trace)
    assert post(client, request.SerializeToString(), auth).status_code == 200
    conversation = Conversation.objects.get(external_id="conv-trace")
    linked = dict(Span.objects.values_list("span_id", "conversation_id"))
    assert linked == {
        "0000000000000001": conversation.pk,
        "0000000000000002": conversation.pk,
        "0000000000000003": conversation.pk,
        "0909090909090909": None,
    }


def _plain_span_later(trace_id: bytes, start_ns: int) -> bytes:
    """One plain span of ``trace_id`` starting at ``start_ns``, in a batch of its own."""
    request = make_request(1, trace_id=trace_id)
    span = request.resource_spans[0].scope_spans[0].spans[0]
    span.span_id = b"\x07" * 8
    span.start_time_unix_nano = start_ns
    span.end_time_unix_nano = start_ns + 1_000_000
    return request.SerializeToString()


def test_a_plain_span_in_a_later_batch_takes_the_conversation_its_trace_has_in_the_store(client, auth, project):
    named = make_request(1, attributes=genai(gen_ai__conversation__id="conv-stored"))
    named_span = named.resource_spans[0].scope_spans[0].spans[0]
    assert post(client, named.SerializeToString(), auth).status_code == 200
    hours = 3_600 * 10**9
    later = _plain_span_later(named_span.trace_id, named_span.start_time_unix_nano + 20 * hours)
    with CaptureQueriesContext(connection) as queries:
        assert post(client, later, auth).status_code == 200
    conversation = Conversation.objects.get(external_id="conv-stored")
    assert Span.objects.get(span_id="0707070707070707").conversation_id == conversation.pk
    # Found in the traces' table, not among the spans (every day partition on PostgreSQL).
    span_reads = [query["sql"] for query in queries if query["sql"].startswith("SELECT") and "observatory_span" in query["sql"]]
    assert span_reads == []


def test_it_keeps_the_tool_call_id_when_no_tool_execution_exists_yet(client, auth, project):
    request = make_request(1, attributes=genai(gen_ai__tool__name="search", gen_ai__tool__call__id="call_later"))
    assert post(client, request.SerializeToString(), auth).status_code == 200
    assert Span.objects.get(project=project).tool_call_id == "call_later"


def test_it_does_not_link_another_projects_tool_execution(client, auth, project):
    other = project_create(name="Other")
    store_tool_execution(other, "call_x")
    request = make_request(1, attributes=genai(gen_ai__tool__name="search", gen_ai__tool__call__id="call_x"))
    assert post(client, request.SerializeToString(), auth).status_code == 200
    assert ToolExecution.objects.get(tool_call_id="call_x").linked_span_id is None


def _notified(callbacks: list) -> list:
    """The drainer told after commit (among the callbacks: also a key's last use written)."""
    return [callback for callback in callbacks if callback is wake]


def test_it_enqueues_derivations_once_per_batch_with_genai_spans(client, auth, django_capture_on_commit_callbacks):
    request = make_request(50, attributes=genai(gen_ai__conversation__id="c1", gen_ai__usage__output_tokens=5))
    with django_capture_on_commit_callbacks() as callbacks:
        assert post(client, request.SerializeToString(), auth).status_code == 200
    assert len(_notified(callbacks)) == 1


def test_it_enqueues_nothing_for_plain_spans_or_a_retried_batch(client, auth, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        assert post(client, make_request(5).SerializeToString(), auth).status_code == 200
    assert _notified(callbacks) == []
    body = make_request(5, attributes=genai(gen_ai__conversation__id="c1")).SerializeToString()
    post(client, body, auth)
    with django_capture_on_commit_callbacks() as callbacks:
        assert post(client, body, auth).status_code == 200
    assert _notified(callbacks) == []


def test_it_uses_a_constant_number_of_queries_whatever_the_batch_size(client, auth):
    def queries_for(count: int) -> int:
        attributes = genai(gen_ai__conversation__id="conv-q", gen_ai__tool__name="t", gen_ai__tool__call__id="c")
        body = make_request(count, attributes=attributes).SerializeToString()
        with CaptureQueriesContext(connection) as captured:
            assert post(client, body, auth).status_code == 200
        return len(captured)

    queries_for(1)  # the conversation exists from here on, like in steady traffic
    assert queries_for(10) == queries_for(1000)


# --- refusals -------------------------------------------------------------------


def assert_nothing_stored():
    assert Span.objects.count() == 0
    assert Conversation.objects.count() == 0


def test_it_refuses_truncated_protobuf(client, auth):
    body = make_request(20, attributes=genai(gen_ai__conversation__id="c1")).SerializeToString()
    response = post(client, body[:-7], auth)
    assert response.status_code == 400
    assert "invalid protobuf" in status_of(response).message
    assert_nothing_stored()


def test_it_refuses_invalid_json_with_a_json_status(client, auth):
    response = post(client, b'{"resourceSpans": [', auth, content_type=JSON)
    assert response.status_code == 400
    assert response["Content-Type"] == JSON
    assert json.loads(response.content)["code"] == 3
    assert_nothing_stored()


def test_it_refuses_invalid_utf8_in_json(client, auth):
    response = post(client, b'{"resourceSpans": [], "junk": "\xc3\x28"}', auth, content_type=JSON)
    assert response.status_code == 400
    assert_nothing_stored()


def test_it_refuses_deeply_nested_kvlists(client, auth):
    value: dict = {"stringValue": "bottom"}
    for _ in range(200):
        value = {"kvlistValue": {"values": [{"key": "k", "value": value}]}}
    span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "deep", "attributes": [{"key": "d", "value": value}]}
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()
    response = post(client, body, auth, content_type=JSON)
    assert response.status_code == 400
    assert "too deep" in json.loads(response.content)["message"]
    assert_nothing_stored()


@pytest.mark.parametrize("content_type", ["text/plain", "application/grpc", "multipart/form-data; boundary=x", ""])
def test_it_refuses_other_content_types(client, auth, content_type):
    response = post(client, make_request(1).SerializeToString(), auth, content_type=content_type)
    assert response.status_code == 415
    assert response["Content-Type"].startswith("text/plain")
    assert_nothing_stored()


def test_it_accepts_content_type_parameters(client, auth, project):
    response = post(client, b"{}", auth, content_type="application/json; charset=utf-8")
    assert response.status_code == 200


@pytest.mark.parametrize("method", ["get", "put", "delete", "patch"])
def test_it_refuses_other_methods(client, auth, method):
    response = getattr(client, method)(URL, headers=auth)
    assert response.status_code == 405
    assert response["Allow"] == "POST"


def test_it_refuses_a_body_over_the_limit(client, auth, settings):
    settings.OBSERVATORY_MAX_BODY_BYTES = 10_000
    response = post(client, make_request(200).SerializeToString(), auth)
    assert response.status_code == 413
    assert status_of(response).message.startswith("body larger")
    assert_nothing_stored()


def test_it_refuses_a_gzip_bomb(client, auth, settings):
    settings.OBSERVATORY_MAX_DECODED_BYTES = 1024 * 1024
    bomb = gzip.compress(b"\x00" * (10 * 1024 * 1024))
    assert len(bomb) < 20_000
    response = post(client, bomb, auth, **{"Content-Encoding": "gzip"})
    assert response.status_code == 413
    assert "decoded body larger" in status_of(response).message
    assert_nothing_stored()


def test_it_refuses_a_small_gzip_of_too_many_spans(client, auth):
    request = ExportTraceServiceRequest()
    scope_spans = request.resource_spans.add().scope_spans.add()
    for index in range(MAX_SPANS + 1):
        scope_spans.spans.add(trace_id=b"\x01" * 16, span_id=index.to_bytes(8, "big"), name="s")
    body = gzip.compress(request.SerializeToString())
    response = post(client, body, auth, **{"Content-Encoding": "gzip"})
    assert response.status_code == 413
    assert "spans in one request" in status_of(response).message
    assert_nothing_stored()


def test_it_refuses_corrupt_gzip(client, auth):
    response = post(client, b"\x1f\x8b\x08\x00garbage", auth, **{"Content-Encoding": "gzip"})
    assert response.status_code == 400
    assert_nothing_stored()


def test_it_refuses_an_unknown_content_encoding(client, auth):
    response = post(client, make_request(1).SerializeToString(), auth, **{"Content-Encoding": "br"})
    assert response.status_code == 415
    assert_nothing_stored()


@pytest.mark.parametrize(
    "header, message",
    [
        ({}, "missing API key"),
        ({"Authorization": "Bearer po_0123456789abcdef_" + "x" * 43}, "invalid API key"),
        ({"Authorization": "Bearer not-a-key"}, "invalid API key"),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, "missing API key"),
    ],
)
def test_it_refuses_a_missing_or_wrong_key(client, header, message):
    response = post(client, make_request(2).SerializeToString(), header)
    assert response.status_code == 401
    assert status_of(response).message == message
    assert_nothing_stored()


def test_it_refuses_a_revoked_key(client, project):
    key, text = apikey_create(project=project, name="old")
    apikey_revoke(key=key)
    response = post(client, make_request(2).SerializeToString(), {"Authorization": f"Bearer {text}"})
    assert response.status_code == 401
    assert status_of(response).message == "revoked API key"
    assert_nothing_stored()


def test_it_stores_spans_in_the_keys_project_only(client, auth, project):
    other = project_create(name="Other")
    _, other_key = apikey_create(project=other)
    Conversation.objects.create(project=project, external_id="shared-id")
    request = make_request(2, attributes=genai(gen_ai__conversation__id="shared-id"))
    assert post(client, request.SerializeToString(), {"Authorization": f"Bearer {other_key}"}).status_code == 200
    assert Span.objects.filter(project=project).count() == 0
    other_conversation = Conversation.objects.get(project=other, external_id="shared-id")
    assert set(Span.objects.filter(project=other).values_list("conversation", flat=True)) == {other_conversation.pk}


def test_it_answers_429_with_retry_after_when_too_many_requests_are_in_flight(client, auth, settings):
    settings.OBSERVATORY_MAX_CONCURRENT_INGEST = 1
    with common.ingest_gate():  # the one slot is taken by a request in flight
        response = post(client, make_request(2).SerializeToString(), auth)
    assert response.status_code == 429
    assert response["Retry-After"] == "1"
    assert status_of(response).code == 8
    assert_nothing_stored()


def test_it_answers_503_when_the_database_is_locked_with_fake_database(client, auth, monkeypatch):
    def locked(rows):
        raise OperationalError("database is locked")

    monkeypatch.setattr(spans_module, "_insert", locked)
    response = post(client, make_request(2, attributes=genai(gen_ai__conversation__id="c1")).SerializeToString(), auth)
    assert response.status_code == 503
    assert int(response["Retry-After"]) > 0
    assert_nothing_stored()  # the conversation created before the failure was rolled back too


def test_it_links_plain_spans_of_a_trace_a_stored_span_links_at_once(client, auth, project):
    named = make_request(1, attributes=genai(gen_ai__conversation__id="c-late"), trace_id=b"\x08" * 16)
    assert post(client, named.SerializeToString(), auth).status_code == 200
    notes = DerivationNote.objects.filter(project=project).count()
    plain = make_request(3, trace_id=b"\x08" * 16)
    for index, span in enumerate(plain.resource_spans[0].scope_spans[0].spans):
        span.span_id = (100 + index).to_bytes(8, "big")
    assert post(client, plain.SerializeToString(), auth).status_code == 200
    conversation = Conversation.objects.get(project=project, external_id="c-late")
    assert Span.objects.filter(project=project, conversation=conversation).count() == 4  # at ingest
    # Only the conversation's totals (activity times) to refresh; no trace to link.
    (note,) = DerivationNote.objects.filter(project=project).order_by("id")[notes:]
    assert (note.conversation_ids, note.trace_ids) == ([conversation.pk], [])


def test_it_stores_span_links_and_an_unnamed_span(client, auth, project):
    request = make_request(1, trace_id=b"\x05" * 16)
    span = request.resource_spans[0].scope_spans[0].spans[0]
    span.name = ""
    link = span.links.add()
    link.trace_id = b"\x06" * 16
    link.span_id = b"\x07" * 8
    link.attributes.add(key="why", value=AnyValue(string_value="batch"))
    assert post(client, request.SerializeToString(), auth).status_code == 200
    (stored,) = Span.objects.filter(project=project)
    assert stored.name == ""
    assert stored.links == [{"trace_id": "06" * 16, "span_id": "07" * 8, "attributes": {"why": "batch"}}]


@pytest.mark.parametrize("attributes, expected", [
    (genai(session__id="oi-1"), ("oi-1", "", "", "")),
    (genai(traceloop__association__properties__session_id="tl-1"), ("tl-1", "", "", "")),
    ({"openinference.span.kind": AnyValue(string_value="TOOL"), "tool.name": AnyValue(string_value="search")},
     ("", "search", "", "execute_tool")),
    ({"traceloop.span.kind": AnyValue(string_value="tool"), "traceloop.entity.name": AnyValue(string_value="s")},
     ("", "s", "", "execute_tool")),
    (genai(gen_ai__operation__name="chat", gen_ai__request__model="m"), ("", "", "", "chat")),
])
def test_it_copies_what_the_conventions_say_to_columns(client, auth, project, attributes, expected):
    assert post(client, make_request(1, attributes=attributes).SerializeToString(), auth).status_code == 200
    (stored,) = Span.objects.filter(project=project)
    assert (stored.conversation_key, stored.tool_name, stored.tool_call_id, stored.operation) == expected
    if expected[0]:
        assert stored.conversation.external_id == expected[0]


def test_it_links_a_plain_span_days_after_its_trace_was_named_at_ingest(client, auth, project):
    # A batch of plain spans notes nothing for the outbox, so the stored span that
    # names the trace must be found at ingest however long ago it started.
    named = make_request(1, attributes=genai(gen_ai__conversation__id="c-days"), trace_id=b"\x09" * 16)
    assert post(client, named.SerializeToString(), auth).status_code == 200
    outbox_drain_all()
    later = make_request(1, trace_id=b"\x09" * 16)
    span = later.resource_spans[0].scope_spans[0].spans[0]
    span.span_id = (200).to_bytes(8, "big")
    span.start_time_unix_nano += 3 * 86_400 * 10**9
    span.end_time_unix_nano += 3 * 86_400 * 10**9
    assert post(client, later.SerializeToString(), auth).status_code == 200
    late = Span.objects.get(project=project, span_id=f"{200:016x}")
    assert late.conversation.external_id == "c-days"


def test_its_note_holds_when_the_batchs_spans_were_received(client, auth, project, monkeypatch):
    from dashboard.observatory.derive import notes

    monkeypatch.setattr(notes, "_wakers", [])  # no drainer woken  # the note stays to be read
    response = post(client, make_request(2, attributes=genai(gen_ai__conversation__id="c1")).SerializeToString(), auth)
    assert response.status_code == 200
    note = DerivationNote.objects.get(project=project)
    received = set(Span.objects.filter(project=project).values_list("received_at", flat=True))
    assert received == {note.rows_from} and note.rows_from <= note.created_at


def test_its_note_names_the_minutes_of_the_batchs_tool_spans(client, auth, project, monkeypatch):
    """The tool rollups of those minutes are recomputed, not of their hours."""
    from datetime import datetime, timezone as dt_timezone

    from dashboard.observatory.derive import notes

    monkeypatch.setattr(notes, "_wakers", [])  # no drainer woken  # the note stays to be read
    request = make_request(3, attributes=genai(gen_ai__operation__name="execute_tool", gen_ai__tool__name="search"))
    request.resource_spans[0].scope_spans[0].spans[2].start_time_unix_nano += 90 * 10**9  # a minute and a half on
    assert post(client, request.SerializeToString(), auth).status_code == 200
    note = DerivationNote.objects.get(project=project)
    minute = START // 10**9 // 60 * 60
    assert note.minutes == [datetime.fromtimestamp(second, dt_timezone.utc).isoformat()
                            for second in (minute, minute + 60)]
    assert note.hours == []


# --- a busy database and a broken one, for real ------------------------------------

@pytest.mark.django_db(transaction=True)
def test_it_answers_503_with_retry_after_when_the_database_is_really_busy(client, auth, project, monkeypatch, caplog):
    """Another connection holds the write lock past ingest's wait: send again later."""
    request = make_request(2, attributes=genai(gen_ai__conversation__id="c-busy"))
    with busy_database(monkeypatch, "observatory_span"):
        response = post(client, request.SerializeToString(), auth)
    assert (response.status_code, response["Retry-After"]) == (503, "2")
    assert status_of(response).message == "database busy, retry later"
    assert_nothing_stored()
    assert not broken_reports(caplog) and faults(IngestTransport.OTLP_HTTP, project) == 0
    assert post(client, request.SerializeToString(), auth).status_code == 200  # the retry is stored


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("content_type", [PROTOBUF, JSON])
def test_it_answers_500_naming_nothing_when_the_database_is_broken_and_logs_and_counts_it_once(
        client, auth, project, caplog, content_type):
    """A deterministic database error (the span table gone): a 500 the exporter does not
    retry, not a 503 it would retry forever; the conversation made before the failing
    insert is rolled back with it."""
    request = make_request(3, attributes=genai(gen_ai__conversation__id="c-broken"))
    body = request.SerializeToString() if content_type == PROTOBUF else json_body(request)
    with broken_table("observatory_span"):
        response = post(client, body, auth, content_type=content_type)
    assert response.status_code == 500 and "Retry-After" not in response
    text = status_of(response).message if content_type == PROTOBUF else response.content.decode()
    assert names_nothing_internal(text) and names_nothing_internal(response.content.decode("latin-1"))
    assert_nothing_stored()
    (report,) = broken_reports(caplog)
    assert f"project {project.pk}" in report.getMessage() and "3 spans" in report.getMessage()
    assert faults(IngestTransport.OTLP_HTTP, project) == 1


def json_body(request: ExportTraceServiceRequest) -> bytes:
    """The request in the OTLP JSON mapping (ids in hex, where protobuf's own is base64)."""
    from google.protobuf.json_format import MessageToDict

    data = MessageToDict(request)
    for resource, resource_spans in zip(data["resourceSpans"], request.resource_spans):
        for scope, scope_spans in zip(resource["scopeSpans"], resource_spans.scope_spans):
            for span, proto in zip(scope["spans"], scope_spans.spans):
                span["traceId"], span["spanId"] = proto.trace_id.hex(), proto.span_id.hex()
    return json.dumps(data).encode()
