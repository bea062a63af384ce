"""The OTLP decoder alone: both wire encodings, the limits, and hostile bodies."""

from __future__ import annotations

import base64
import json

import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList

from dashboard.ingest import otlp
from dashboard.ingest.otlp import (
    JSON,
    MAX_ATTRIBUTES,
    MAX_EVENTS,
    MAX_ITEMS,
    MAX_VALUE_CHARS,
    PROTOBUF,
    TRUNCATION_MARKER,
    OtlpDecodeError,
    decode_json,
    decode_protobuf,
)

TRACE_ID = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
SPAN_ID = bytes.fromhex("b7ad6b7169203331")
PARENT_ID = bytes.fromhex("00f067aa0ba902b7")


def every_kind_value() -> dict[str, AnyValue]:
    return {
        "s": AnyValue(string_value="héllo"),
        "b": AnyValue(bool_value=True),
        "i": AnyValue(int_value=-(2**62)),
        "d": AnyValue(double_value=2.5),
        "bytes": AnyValue(bytes_value=b"\x00\xffdata"),
        "arr": AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=1), AnyValue(string_value="two")])),
        "kv": AnyValue(
            kvlist_value=KeyValueList(
                values=[
                    KeyValue(key="inner", value=AnyValue(bool_value=False)),
                    KeyValue(
                        key="deeper",
                        value=AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key="x", value=AnyValue(double_value=1.0))])),
                    ),
                ]
            )
        ),
        "empty": AnyValue(),
    }


EXPECTED_VALUES = {
    "s": "héllo",
    "b": True,
    "i": -(2**62),
    "d": 2.5,
    "bytes": base64.b64encode(b"\x00\xffdata").decode(),
    "arr": [1, "two"],
    "kv": {"inner": False, "deeper": {"x": 1.0}},
    "empty": None,
}


def make_request(*, spans: int = 1, attributes: dict[str, AnyValue] | None = None, **span_fields) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.add(key="service.name", value=AnyValue(string_value="agent"))
    resource_spans.resource.attributes.add(key="session.id", value=AnyValue(string_value="conv-1"))
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = "pipeline"
    scope_spans.scope.version = "1.2"
    for index in range(spans):
        span = scope_spans.spans.add()
        span.trace_id = TRACE_ID
        span.span_id = (int.from_bytes(SPAN_ID, "big") + index).to_bytes(8, "big")
        span.parent_span_id = PARENT_ID
        span.name = "execute_tool search"
        span.kind = 3
        span.start_time_unix_nano = 1_700_000_000_000_000_000
        span.end_time_unix_nano = 1_700_000_000_250_000_000
        span.status.code = 2
        span.status.message = "boom"
        for key, value in (attributes or {}).items():
            span.attributes.add(key=key, value=value)
        event = span.events.add()
        event.name = "retry"
        event.time_unix_nano = 1_700_000_000_100_000_000
        event.attributes.add(key="attempt", value=AnyValue(int_value=2))
        for field, value in span_fields.items():
            setattr(span, field, value)
    return request


def to_otlp_json(request: ExportTraceServiceRequest) -> dict:
    """The OTLP JSON mapping: protobuf JSON, but trace and span ids as hex."""
    document = json_format.MessageToDict(request)
    for resource_spans in document.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return document


def json_body(document: dict) -> bytes:
    return json.dumps(document).encode()


def json_span(**fields) -> dict:
    span = {
        "traceId": TRACE_ID.hex(),
        "spanId": SPAN_ID.hex(),
        "name": "s",
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000001000000",
    }
    span.update(fields)
    return span


def json_request(*spans: dict, resource_attributes: list | None = None) -> bytes:
    return json_body(
        {
            "resourceSpans": [
                {
                    "resource": {"attributes": resource_attributes or []},
                    "scopeSpans": [{"scope": {"name": "manual"}, "spans": list(spans)}],
                }
            ]
        }
    )


# --- both encodings -------------------------------------------------------------


def test_it_decodes_every_anyvalue_kind_from_protobuf():
    batch = decode_protobuf(make_request(attributes=every_kind_value()).SerializeToString())
    (span,) = batch.spans
    assert {key: span.attributes[key] for key in EXPECTED_VALUES} == EXPECTED_VALUES
    assert span.trace_id == TRACE_ID.hex()
    assert span.span_id == SPAN_ID.hex()
    assert span.parent_span_id == PARENT_ID.hex()
    assert (span.kind, span.status_code, span.status_message) == (3, 2, "boom")
    assert span.start_time_unix_nano == 1_700_000_000_000_000_000
    assert span.events == [{"name": "retry", "time_unix_nano": 1_700_000_000_100_000_000, "attributes": {"attempt": 2}}]
    assert span.resource == {"service.name": "agent", "session.id": "conv-1"}
    assert span.service_name == "agent"
    assert span.attributes["otel.scope.name"] == "pipeline"
    assert span.truncated is False
    assert batch.rejected == 0


def test_it_decodes_the_same_rows_from_the_json_mapping():
    request = make_request(spans=3, attributes=every_kind_value())
    from_protobuf = decode_protobuf(request.SerializeToString()).spans
    from_json = decode_json(json_body(to_otlp_json(request))).spans
    assert from_json == from_protobuf


def test_it_decodes_every_anyvalue_kind_written_by_hand_in_json():
    attributes = [
        {"key": "s", "value": {"stringValue": "héllo"}},
        {"key": "b", "value": {"boolValue": True}},
        {"key": "i", "value": {"intValue": str(-(2**62))}},
        {"key": "i_number", "value": {"intValue": 7}},
        {"key": "d", "value": {"doubleValue": 2.5}},
        {"key": "d_int", "value": {"doubleValue": 3}},
        {"key": "nan", "value": {"doubleValue": "NaN"}},
        {"key": "bytes", "value": {"bytesValue": base64.b64encode(b"\x00\xffdata").decode()}},
        {"key": "arr", "value": {"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "two"}]}}},
        {"key": "kv", "value": {"kvlistValue": {"values": [{"key": "inner", "value": {"boolValue": False}}]}}},
        {"key": "empty", "value": {}},
    ]
    (span,) = decode_json(json_request(json_span(attributes=attributes))).spans
    assert span.attributes == {
        "s": "héllo",
        "b": True,
        "i": -(2**62),
        "i_number": 7,
        "d": 2.5,
        "d_int": 3.0,
        "nan": "NaN",
        "bytes": base64.b64encode(b"\x00\xffdata").decode(),
        "arr": [1, "two"],
        "kv": {"inner": False},
        "empty": None,
        "otel.scope.name": "manual",
    }


def test_it_accepts_snake_case_keys_and_enum_names_in_json():
    document = {
        "resource_spans": [
            {
                "scope_spans": [
                    {
                        "spans": [
                            {
                                "trace_id": TRACE_ID.hex().upper(),
                                "span_id": SPAN_ID.hex(),
                                "parent_span_id": "",
                                "name": "n",
                                "kind": "SPAN_KIND_SERVER",
                                "start_time_unix_nano": 5,
                                "end_time_unix_nano": "9",
                                "status": {"code": "STATUS_CODE_OK"},
                                "attributes": [{"key": "k", "value": {"string_value": "v", "int_value": 1}}],
                            }
                        ]
                    }
                ]
            }
        ]
    }
    (span,) = decode_json(json_body(document)).spans
    assert (span.trace_id, span.parent_span_id) == (TRACE_ID.hex(), "")
    assert (span.kind, span.status_code) == (2, 1)
    assert (span.start_time_unix_nano, span.end_time_unix_nano) == (5, 9)
    assert span.attributes == {"k": "v"}


def test_it_reads_unknown_enum_numbers_as_unspecified():
    (span,) = decode_protobuf(make_request(kind=99).SerializeToString()).spans
    assert span.kind == 0
    (span,) = decode_json(json_request(json_span(kind=70000, status={"code": -4}))).spans
    assert (span.kind, span.status_code) == (0, 0)


def test_it_decodes_an_empty_request_in_both_encodings():
    assert decode_protobuf(b"").spans == []
    assert decode_json(b"{}").spans == []


def test_it_keeps_non_finite_doubles_as_strings():
    values = {"inf": AnyValue(double_value=float("inf")), "nan": AnyValue(double_value=float("nan"))}
    (span,) = decode_protobuf(make_request(attributes=values).SerializeToString()).spans
    assert (span.attributes["inf"], span.attributes["nan"]) == ("Infinity", "NaN")


# --- rejected spans (partial success) -------------------------------------------


@pytest.mark.parametrize(
    "fields, reason",
    [
        ({"trace_id": b"\x01" * 15}, "trace_id must be 16 bytes"),
        ({"trace_id": b"\x00" * 16}, "trace_id is all zeros"),
        ({"span_id": b"\x01" * 9}, "span_id must be 8 bytes"),
        ({"span_id": b"\x00" * 8}, "span_id is all zeros"),
        ({"parent_span_id": b"\x01" * 3}, "parent_span_id must be 8 bytes"),
    ],
)
def test_it_rejects_only_the_bad_span_in_protobuf(fields, reason):
    request = make_request(spans=2)
    bad = request.resource_spans[0].scope_spans[0].spans[1]
    for field, value in fields.items():
        setattr(bad, field, value)
    batch = decode_protobuf(request.SerializeToString())
    assert [span.span_id for span in batch.spans] == [SPAN_ID.hex()]
    assert batch.rejected == 1
    assert reason in batch.error_message


@pytest.mark.parametrize(
    "fields",
    [
        {"traceId": "zz" * 16},
        {"traceId": base64.b64encode(TRACE_ID).decode()},  # base64 is the protobuf JSON habit, not OTLP's
        {"traceId": "0" * 32},
        {"traceId": "ab cd" * 6 + "ab"},  # 32 characters, but spaces are not hex
        {"spanId": "abc"},
        {"spanId": 12345},
        {"parentSpanId": "xyz"},
    ],
)
def test_it_rejects_only_the_bad_span_in_json(fields):
    batch = decode_json(json_request(json_span(), json_span(**{"spanId": "1" * 16, **fields})))
    assert [span.span_id for span in batch.spans] == [SPAN_ID.hex()]
    assert batch.rejected == 1


def test_it_counts_every_rejection_but_names_each_reason_once():
    spans = [json_span(spanId=f"{index:016x}", traceId="0" * 32) for index in range(1, 20)]
    batch = decode_json(json_request(*spans))
    assert batch.rejected == 19
    assert batch.error_message == "19 span(s) rejected: trace_id is all zeros"


def test_it_keeps_a_span_with_an_empty_name_in_both_encodings():
    # OTLP: an empty name means unknown; the span is still a span.
    request = make_request(spans=1)
    request.resource_spans[0].scope_spans[0].spans[0].name = ""
    (span,) = decode_protobuf(request.SerializeToString()).spans
    assert span.name == ""
    (span,) = decode_json(json_request(json_span(name=""))).spans
    assert span.name == ""


# --- malformed bodies (400) -----------------------------------------------------


def test_it_refuses_truncated_protobuf():
    body = make_request(spans=5, attributes=every_kind_value()).SerializeToString()
    with pytest.raises(OtlpDecodeError, match="invalid protobuf"):
        decode_protobuf(body[: len(body) // 2])


def test_it_refuses_random_bytes_as_protobuf():
    with pytest.raises(OtlpDecodeError):
        decode_protobuf(b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01")


def test_it_refuses_invalid_json():
    with pytest.raises(OtlpDecodeError, match="invalid JSON"):
        decode_json(b'{"resourceSpans": [')


def test_it_refuses_invalid_utf8_in_json():
    with pytest.raises(OtlpDecodeError, match="UTF-8"):
        decode_json(b'{"resourceSpans": [], "x": "\xff\xfe"}')


def test_it_refuses_an_unpaired_surrogate_escape_in_json():
    body = json_request(json_span(attributes=[{"key": "k", "value": {"stringValue": "\\ud800"}}]))
    body = body.replace(b"\\\\ud800", b"\\ud800")
    with pytest.raises(OtlpDecodeError, match="surrogate"):
        decode_json(body)


def test_it_accepts_a_paired_surrogate_escape_in_json():
    body = json_request(json_span(attributes=[{"key": "k", "value": {"stringValue": "\U0001f600"}}]))
    assert b"\\ud83d\\ude00" in body
    (span,) = decode_json(body).spans
    assert span.attributes["k"] == "\U0001f600"


def test_it_refuses_json_nested_deeper_than_the_parser_allows():
    with pytest.raises(OtlpDecodeError, match="too deep"):
        decode_json(b'{"resourceSpans": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")


def _nested_json_kvlist(depth: int) -> dict:
    value: dict = {"stringValue": "bottom"}
    for _ in range(depth):
        value = {"kvlistValue": {"values": [{"key": "k", "value": value}]}}
    return value


def test_it_refuses_kvlist_nesting_too_deep_in_json():
    body = json_request(json_span(attributes=[{"key": "deep", "value": _nested_json_kvlist(50)}]))
    with pytest.raises(OtlpDecodeError, match="nesting too deep"):
        decode_json(body)


def test_it_accepts_kvlist_nesting_within_the_limit():
    body = json_request(json_span(attributes=[{"key": "deep", "value": _nested_json_kvlist(otlp.MAX_VALUE_DEPTH)}]))
    (span,) = decode_json(body).spans
    value = span.attributes["deep"]
    for _ in range(otlp.MAX_VALUE_DEPTH):
        value = value["k"]
    assert value == "bottom"


def _nested_protobuf_kvlist(depth: int) -> bytes:
    request = make_request()
    value = request.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="deep").value
    for _ in range(depth):
        value = value.kvlist_value.values.add(key="k").value
    value.string_value = "bottom"
    return request.SerializeToString()


@pytest.mark.parametrize("depth", [otlp.MAX_VALUE_DEPTH + 1, 50])  # ours, then upb's own limit
def test_it_refuses_kvlist_nesting_too_deep_in_protobuf(depth):
    with pytest.raises(OtlpDecodeError):
        decode_protobuf(_nested_protobuf_kvlist(depth))


@pytest.mark.parametrize(
    "document",
    [
        [],
        "text",
        {"resourceSpans": {}},
        {"resourceSpans": [1]},
        {"resourceSpans": [{"scopeSpans": [{"spans": "x"}]}]},
        {"resourceSpans": [{"scopeSpans": 5}]},
        {"resourceSpans": [{"scopeSpans": [{"spans": 5}]}]},
        {"resourceSpans": [{"resource": [], "scopeSpans": []}]},
        {"resourceSpans": [{"scopeSpans": [{"spans": [json_span(attributes=[{"key": "k", "value": "bare"}])]}]}]},
        {"resourceSpans": [{"scopeSpans": [{"spans": [json_span(attributes=[{"key": 1, "value": {}}])]}]}]},
        {"resourceSpans": [{"scopeSpans": [{"spans": [json_span(startTimeUnixNano="soon")]}]}]},
        {"resourceSpans": [{"scopeSpans": [{"spans": [json_span(startTimeUnixNano=str(2**70))]}]}]},
        {"resourceSpans": [{"scopeSpans": [{"spans": [json_span(kind=True)]}]}]},
        {"resourceSpans": [{"scopeSpans": [{"spans": [json_span(startTimeUnixNano=" 12")]}]}]},
        {"resourceSpans": [{"scopeSpans": [{"spans": [json_span(endTimeUnixNano="1_000")]}]}]},
        {"resourceSpans": [{"scopeSpans": [{"spans": [json_span(name=["n"])]}]}]},
        {"resourceSpans": [{"scopeSpans": [{"spans": [json_span(attributes=[{"key": "b", "value": {"bytesValue": "!!"}}])]}]}]},
        {"resourceSpans": [{"scopeSpans": [{"spans": [json_span(attributes=[{"key": "d", "value": {"doubleValue": "x"}}])]}]}]},
    ],
)
def test_it_refuses_wrong_json_shapes(document):
    with pytest.raises(OtlpDecodeError):
        decode_json(json_body(document))


def test_it_refuses_more_spans_than_one_request_may_hold_before_reading_them():
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    for _ in range(otlp.MAX_SPANS + 1):
        spans.add()
    with pytest.raises(otlp.OtlpTooManySpans):
        decode_protobuf(request.SerializeToString())
    document = {"resourceSpans": [{"scopeSpans": [{"spans": [{}] * (otlp.MAX_SPANS + 1)}]}]}
    with pytest.raises(otlp.OtlpTooManySpans):
        decode_json(json_body(document))


# --- limits ---------------------------------------------------------------------


def test_it_cuts_a_10_mb_attribute_to_the_value_limit():
    huge = "x" * (10 * 1024 * 1024)
    (span,) = decode_protobuf(make_request(attributes={"huge": AnyValue(string_value=huge), "small": AnyValue(string_value="ok")}).SerializeToString()).spans
    assert span.attributes["huge"] == "x" * MAX_VALUE_CHARS + TRUNCATION_MARKER
    assert span.attributes["small"] == "ok"
    assert span.truncated is True


def test_it_cuts_a_10_mb_attribute_in_json_too():
    huge = "y" * (10 * 1024 * 1024)
    body = json_request(json_span(attributes=[{"key": "huge", "value": {"stringValue": huge}}]))
    (span,) = decode_json(body).spans
    assert len(span.attributes["huge"]) == MAX_VALUE_CHARS + len(TRUNCATION_MARKER)
    assert span.truncated is True


def test_it_cuts_huge_bytes_and_long_arrays():
    values = {
        "blob": AnyValue(bytes_value=b"\x01" * (1024 * 1024)),
        "many": AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=n) for n in range(5000)])),
    }
    (span,) = decode_protobuf(make_request(attributes=values).SerializeToString()).spans
    assert span.attributes["blob"].endswith(TRUNCATION_MARKER)
    assert len(span.attributes["blob"]) <= MAX_VALUE_CHARS + len(TRUNCATION_MARKER)
    assert span.attributes["many"] == list(range(MAX_ITEMS))
    assert span.truncated is True


def test_it_keeps_at_most_the_attribute_limit():
    values = {f"a{n:04d}": AnyValue(int_value=n) for n in range(MAX_ATTRIBUTES + 50)}
    (span,) = decode_protobuf(make_request(attributes=values).SerializeToString()).spans
    assert len([key for key in span.attributes if key.startswith("a")]) == MAX_ATTRIBUTES
    assert span.truncated is True


def test_it_keeps_at_most_the_event_limit():
    request = make_request()
    span_message = request.resource_spans[0].scope_spans[0].spans[0]
    for n in range(MAX_EVENTS + 10):
        span_message.events.add(name=f"e{n}")
    (span,) = decode_protobuf(request.SerializeToString()).spans
    assert len(span.events) == MAX_EVENTS
    assert span.truncated is True


def test_it_cuts_a_huge_attribute_key():
    (span,) = decode_protobuf(make_request(attributes={"k" * 100_000: AnyValue(int_value=1)}).SerializeToString()).spans
    (key,) = [key for key in span.attributes if key.startswith("k")]
    assert key == "k" * otlp.MAX_KEY_CHARS + TRUNCATION_MARKER
    assert span.truncated is True


def test_it_marks_spans_whose_sender_dropped_attributes():
    (span,) = decode_protobuf(make_request(dropped_attributes_count=3).SerializeToString()).spans
    assert span.truncated is True


def test_it_replaces_nul_characters_the_database_cannot_hold():
    (span,) = decode_protobuf(
        make_request(name="a\x00b", attributes={"k\x00": AnyValue(string_value="v\x00")}).SerializeToString()
    ).spans
    assert span.name == "a\ufffdb"
    assert span.attributes["k\ufffd"] == "v\ufffd"


# --- answers --------------------------------------------------------------------


def test_it_encodes_partial_success_in_protobuf():
    batch = otlp.DecodedBatch(rejected=2, reasons=["span without a name"])
    response = ExportTraceServiceResponse.FromString(otlp.encode_export_response(batch, PROTOBUF))
    assert response.partial_success.rejected_spans == 2
    assert "span without a name" in response.partial_success.error_message


def test_it_encodes_full_success_as_an_empty_response():
    assert otlp.encode_export_response(otlp.DecodedBatch(), PROTOBUF) == b""
    assert json.loads(otlp.encode_export_response(otlp.DecodedBatch(), JSON)) == {}


def test_it_encodes_partial_success_in_json_with_the_int64_as_a_string():
    batch = otlp.DecodedBatch(rejected=3, reasons=["trace_id is all zeros"])
    document = json.loads(otlp.encode_export_response(batch, JSON))
    assert document["partialSuccess"]["rejectedSpans"] == "3"
    assert "all zeros" in document["partialSuccess"]["errorMessage"]


def test_it_encodes_errors_as_a_google_rpc_status():
    status = status_pb2.Status.FromString(otlp.encode_status(401, "invalid API key", PROTOBUF))
    assert (status.code, status.message) == (16, "invalid API key")
    assert json.loads(otlp.encode_status(400, "bad", JSON)) == {"code": 3, "message": "bad"}


# --- span links -------------------------------------------------------------------


def test_it_decodes_span_links_from_protobuf():
    request = make_request(spans=1)
    span = request.resource_spans[0].scope_spans[0].spans[0]
    link = span.links.add()
    link.trace_id = b"\x0a" * 16
    link.span_id = b"\x0b" * 8
    link.attributes.add(key="link.kind", value=AnyValue(string_value="follows"))
    bad = span.links.add()  # a link with a short id: dropped, and the span says it lost something
    bad.trace_id = b"\x0a" * 3
    bad.span_id = b"\x0b" * 8
    (row,) = decode_protobuf(request.SerializeToString()).spans
    assert row.links == [{"trace_id": "0a" * 16, "span_id": "0b" * 8, "attributes": {"link.kind": "follows"}}]
    assert row.truncated


def test_it_decodes_span_links_from_json():
    links = [
        {"traceId": "0a" * 16, "spanId": "0b" * 8, "attributes": [{"key": "n", "value": {"intValue": "3"}}]},
        {"traceId": "zz", "spanId": "0b" * 8},
    ]
    (row,) = decode_json(json_request(json_span(links=links))).spans
    assert row.links == [{"trace_id": "0a" * 16, "span_id": "0b" * 8, "attributes": {"n": 3}}]
    assert row.truncated


def test_it_bounds_the_links_of_a_span():
    links = [{"traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}"} for i in range(otlp.MAX_LINKS + 5)]
    (row,) = decode_json(json_request(json_span(links=links))).spans
    assert len(row.links) == otlp.MAX_LINKS
    assert row.truncated


@pytest.mark.parametrize("links", ["nope", [1], {"traceId": "0a"}])
def test_it_refuses_links_of_the_wrong_shape(links):
    with pytest.raises(otlp.OtlpDecodeError):
        decode_json(json_request(json_span(links=links)))


# --- times outside the accepted years (OBSERVATORY_TIMESTAMP_MIN_YEAR / _MAX_YEAR) ------

YEAR_2300 = 10_413_792_000 * 10**9  # 2300-01-01 in nanoseconds since the epoch


@pytest.mark.parametrize("field", ["start_time_unix_nano", "end_time_unix_nano"])
def test_it_rejects_only_the_span_with_a_time_past_the_accepted_years_in_protobuf(field):
    request = make_request(spans=2)
    setattr(request.resource_spans[0].scope_spans[0].spans[1], field, YEAR_2300)
    batch = decode_protobuf(request.SerializeToString())
    assert [span.span_id for span in batch.spans] == [SPAN_ID.hex()]
    assert batch.rejected == 1 and "outside the accepted years" in batch.error_message


@pytest.mark.parametrize("fields", [
    {"startTimeUnixNano": str(YEAR_2300)},
    {"endTimeUnixNano": str(2**64 - 1)},
    {"startTimeUnixNano": "-1"},  # before 1970: int64 allows it, the accepted years do not
    {"startTimeUnixNano": str(-(2**63))},
])
def test_it_rejects_only_the_span_with_a_time_outside_the_accepted_years_in_json(fields):
    batch = decode_json(json_request(json_span(), json_span(**{"spanId": "1" * 16, **fields})))
    assert [span.span_id for span in batch.spans] == [SPAN_ID.hex()]
    assert batch.rejected == 1 and "outside the accepted years" in batch.error_message


def test_it_follows_the_configured_years(settings):
    settings.OBSERVATORY_TIMESTAMP_MAX_YEAR = 2020  # 1_700_000_000 s is in 2023
    batch = decode_protobuf(make_request(spans=1).SerializeToString())
    assert batch.spans == [] and batch.rejected == 1


def test_it_keeps_a_span_at_the_first_instant_of_the_accepted_years():
    batch = decode_json(json_request(json_span(startTimeUnixNano="0", endTimeUnixNano="0")))
    assert batch.rejected == 0 and batch.spans[0].start_time_unix_nano == 0
