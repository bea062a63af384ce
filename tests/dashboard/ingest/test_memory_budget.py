"""Ingest memory bounded per request and per process (dashboard.ingest.common.memory_reserve).

What decoding allocates is counted before it is allocated: a hostile-but-valid
request (many spans, hundreds of attributes each, a small gzipped body) is refused
with 413 before its rows exist; requests that fit but find the process's budget
taken get 503 with Retry-After; the reservation is released however a request ends.
"""

from __future__ import annotations

import gzip
import json
import os
import threading
import time
import tracemalloc

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from dashboard.ingest import common
from dashboard.ingest.common import IngestError, ingest_gate, json_decode_cost, memory_in_use, memory_reserve
from dashboard.observatory.models import Span, ToolExecution

pytestmark = pytest.mark.django_db

MiB = 1024 * 1024


def wide_spans(spans: int, attributes: int) -> bytes:
    request = ExportTraceServiceRequest()
    scope_spans = request.resource_spans.add().scope_spans.add()
    start = time.time_ns()
    for index in range(spans):
        span = scope_spans.spans.add()
        span.trace_id, span.span_id, span.name = os.urandom(16), os.urandom(8), "wide"
        span.start_time_unix_nano, span.end_time_unix_nano = start + index, start + index + 1
        for number in range(attributes):
            span.attributes.add(key=f"k{number}", value=AnyValue(int_value=number))
    return request.SerializeToString()


def post_spans(client, auth, body: bytes, **headers):
    return client.post("/v1/traces", body, content_type="application/x-protobuf", **auth, **headers)


def test_it_refuses_a_request_whose_rows_would_pass_the_budget_before_making_them(client, auth, settings):
    settings.OBSERVATORY_INGEST_MEMORY_BYTES = 16 * MiB
    body = wide_spans(2000, 256)  # 3.6 MiB decoded, ~80 MiB as rows
    compressed = gzip.compress(body)
    tracemalloc.start()
    try:
        response = post_spans(client, auth, compressed, HTTP_CONTENT_ENCODING="gzip")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 413
    assert b"send smaller batches" in response.content
    assert Span.objects.count() == 0
    # The worker grew by a few times the decoded size, not by the rows' ~80 MiB.
    assert peak < 4 * len(body), (peak, len(body))
    assert memory_in_use() == 0


def test_it_takes_the_same_request_when_the_budget_allows_it(client, auth, settings):
    settings.OBSERVATORY_INGEST_MEMORY_BYTES = 256 * MiB
    response = post_spans(client, auth, gzip.compress(wide_spans(200, 256)), HTTP_CONTENT_ENCODING="gzip")
    assert response.status_code == 200
    assert Span.objects.count() == 200
    assert memory_in_use() == 0


def test_it_answers_503_with_retry_after_while_other_requests_hold_the_budget(client, auth, settings):
    settings.OBSERVATORY_INGEST_MEMORY_BYTES = 8 * MiB
    holding, release = threading.Event(), threading.Event()

    def in_flight() -> None:  # another request of this process, mid-decode
        with ingest_gate():
            memory_reserve(8 * MiB - 64 * 1024, "a big batch")
            holding.set()
            release.wait(10)

    other = threading.Thread(target=in_flight)
    other.start()
    try:
        assert holding.wait(10)
        response = post_spans(client, auth, wide_spans(50, 20))
        assert response.status_code == 503
        assert response["Retry-After"]
        assert Span.objects.count() == 0
    finally:
        release.set()
        other.join(10)
    assert memory_in_use() == 0
    assert post_spans(client, auth, wide_spans(50, 20)).status_code == 200  # the budget came back


def test_it_counts_a_gzip_bomb_as_it_inflates(client, auth, settings):
    settings.OBSERVATORY_INGEST_MEMORY_BYTES = 4 * MiB
    bomb = gzip.compress(b"\x00" * (32 * MiB))  # 32 KiB on the wire
    response = post_spans(client, auth, bomb, HTTP_CONTENT_ENCODING="gzip")
    assert response.status_code == 413
    assert memory_in_use() == 0


def test_it_bounds_json_records_the_same_way(client, auth, settings):
    settings.OBSERVATORY_INGEST_MEMORY_BYTES = 2 * MiB
    records = [{"kind": "tool_result", "conversation_id": "c", "values": list(range(200))} for _ in range(200)]
    response = client.post("/api/v1/records", json.dumps({"records": records}), content_type="application/json", **auth)
    assert response.status_code == 413
    assert "send smaller batches" in response.json()["error"]
    assert ToolExecution.objects.count() == 0
    assert memory_in_use() == 0


def test_it_bounds_otlp_json_the_same_way(client, auth, settings):
    settings.OBSERVATORY_INGEST_MEMORY_BYTES = 2 * MiB
    span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "x", "startTimeUnixNano": "1", "endTimeUnixNano": "2",
            "attributes": [{"key": f"k{n}", "value": {"intValue": str(n)}} for n in range(100)]}
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span] * 300}]}]})
    response = client.post("/v1/traces", body, content_type="application/json", **auth)
    assert response.status_code == 413
    assert Span.objects.count() == 0


def test_it_releases_the_reservation_when_a_request_fails(settings):
    settings.OBSERVATORY_INGEST_MEMORY_BYTES = 8 * MiB
    with pytest.raises(IngestError):
        with ingest_gate():
            memory_reserve(3 * MiB, "x")
            raise IngestError(400, "bad")
    assert memory_in_use() == 0


def test_it_counts_nothing_outside_the_gate(settings):
    settings.OBSERVATORY_INGEST_MEMORY_BYTES = 1 * MiB
    memory_reserve(10 * MiB, "a management command's batch")  # no request: not bounded here
    assert memory_in_use() == 0


def test_it_estimates_json_at_least_what_parsing_allocates():
    body = json.dumps([{"key": f"k{n}", "value": {"intValue": str(n)}} for n in range(20_000)]).encode()
    tracemalloc.start()
    try:
        json.loads(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert json_decode_cost(body) >= peak


def test_it_limits_concurrent_ingest_below_the_thread_count():
    from dashboard import settings as project_settings

    assert project_settings.OBSERVATORY_MAX_CONCURRENT_INGEST < int(os.environ.get("WEB_THREADS", "4"))
    assert common.settings.OBSERVATORY_INGEST_MEMORY_BYTES >= MiB
