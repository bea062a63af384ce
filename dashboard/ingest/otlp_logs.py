"""Decode OTLP log exports (``ExportLogsServiceRequest``) into plain log rows.

The logs twin of ``otlp``, with the same rules and the same value-bounding code
(``otlp._ProtobufReader`` / ``otlp._JsonReader``): a body that cannot be read is
``OtlpDecodeError`` (400); too many records is ``OtlpTooManyLogs`` (413), counted
before any row exists; a record wrong on its own (an id of the wrong size) is
rejected and counted (``partial_success``); attribute values are cut to the same
limits. A record's body gets a budget of its own (``MAX_BODY_CHARS``) because
GenAI instrumentations put whole prompts and completions there.

Trace and span ids are optional on a log record (all zeros or empty = none).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from dashboard.priority import yield_to_pages

from .common import memory_reserve
from .otlp import (
    _ATTRIBUTE_BYTES,
    _ROW_BYTES,
    JSON,
    PROTOBUF,
    OtlpDecodeError,
    Rejections,
    _HEX,
    _add_scope,
    _Bounded,
    _clean,
    _expect,
    _field,
    _int64,
    json_document,
    _JsonReader,
    _list,
    _object,
    _ProtobufReader,
    _service_name,
    check_time,
)

MAX_LOGS = 20_000  # per request, as spans
MAX_BODY_CHARS = 64 * 1024  # one record's body, all its strings together
MAX_SEVERITY_TEXT = 32
_YIELD_EVERY = 64
_SEVERITY_NUMBERS = {f"SEVERITY_NUMBER_{name}": number for number, name in enumerate(
    ["UNSPECIFIED", "TRACE", "TRACE2", "TRACE3", "TRACE4", "DEBUG", "DEBUG2", "DEBUG3", "DEBUG4",
     "INFO", "INFO2", "INFO3", "INFO4", "WARN", "WARN2", "WARN3", "WARN4", "ERROR", "ERROR2", "ERROR3",
     "ERROR4", "FATAL", "FATAL2", "FATAL3", "FATAL4"])}


class OtlpTooManyLogs(OtlpDecodeError):
    """More log records in one request than MAX_LOGS (answered 413)."""


class _LogRejected(ValueError):
    """One record is invalid on its own; the rest of the batch is kept."""


def _check_times(time_unix_nano: int, observed_time_unix_nano: int, window: tuple[int, int]) -> None:
    # 0 means unknown (OTLP); any other time must lie in the accepted years.
    if time_unix_nano:
        check_time(time_unix_nano, window, "time", _LogRejected)
    if observed_time_unix_nano:
        check_time(observed_time_unix_nano, window, "observed time", _LogRejected)


@dataclass(slots=True)
class LogRow:
    """One log record, flattened to what the database stores. ``resource`` is
    shared by the records of one ResourceLogs (encoded once by the store)."""

    trace_id: str  # 32 lowercase hex, or "" when the record names no trace
    span_id: str  # 16 lowercase hex, or ""
    time_unix_nano: int
    observed_time_unix_nano: int
    severity_number: int  # 0..24
    severity_text: str
    body: Any  # the AnyValue as JSON: str, number, bool, list, dict or None
    attributes: dict[str, Any]
    resource: dict[str, Any]
    service_name: str
    event_name: str
    truncated: bool


@dataclass(slots=True)
class DecodedLogs(Rejections):
    """The log records of one export request that are kept, and what was rejected."""

    logs: list[LogRow] = field(default_factory=list)
    item_name: ClassVar[str] = "log record(s)"


def decode_logs_request(body: bytes, content_type: str) -> DecodedLogs:
    if content_type == PROTOBUF:
        return decode_logs_protobuf(body)
    if content_type == JSON:
        return decode_logs_json(body)
    raise ValueError(f"unsupported content type {content_type!r}")


def _body(reader: _Bounded, read: Any, value: Any) -> Any:
    """A record's body under its own budget (cut like an attribute value)."""
    reader.budget = MAX_BODY_CHARS
    body = read(value)
    reader.budget = 0
    return body


def _check_count(count: int) -> None:
    if count > MAX_LOGS:
        raise OtlpTooManyLogs(f"{count} log records in one request; send at most {MAX_LOGS}")


def _event_name(name: str, attributes: dict[str, Any], reader: _Bounded) -> str:
    # Older GenAI instrumentations name the event in an attribute.
    if not name:
        name = attributes.get("event.name", "")
        name = name if isinstance(name, str) else ""
    return reader._key(name) if name else ""


def _severity(number: int, text: str, reader: _Bounded) -> tuple[int, str]:
    if len(text) > MAX_SEVERITY_TEXT:
        reader.truncated = True
        text = text[:MAX_SEVERITY_TEXT]
    return (number if 0 <= number <= 24 else 0), _clean(text)


# --- protobuf -------------------------------------------------------------------


def decode_logs_protobuf(body: bytes) -> DecodedLogs:
    memory_reserve(len(body), "the protobuf message")
    try:
        request = ExportLogsServiceRequest.FromString(body)
    except (DecodeError, RecursionError, ValueError) as exc:
        raise OtlpDecodeError(f"invalid protobuf: {str(exc)[:100] or type(exc).__name__}") from None
    count = attributes = 0
    for resource_logs in request.resource_logs:
        attributes += len(resource_logs.resource.attributes)
        for scope_logs in resource_logs.scope_logs:
            count += len(scope_logs.log_records)
            attributes += sum(len(record.attributes) for record in scope_logs.log_records)
    _check_count(count)
    memory_reserve(len(body) + _ROW_BYTES * count + _ATTRIBUTE_BYTES * attributes, "the log records")
    reader = _ProtobufReader()
    batch = DecodedLogs()
    for resource_logs in request.resource_logs:
        reader.start_span()
        resource = reader.attributes(resource_logs.resource.attributes)
        resource_truncated = reader.truncated
        service_name = _service_name(resource)
        for scope_logs in resource_logs.scope_logs:
            scope = scope_logs.scope
            for record in scope_logs.log_records:
                if len(batch.logs) % _YIELD_EVERY == 0:
                    yield_to_pages()
                reader.start_span()
                try:
                    trace_id = _bytes_id(record.trace_id, 16, "trace_id")
                    span_id = _bytes_id(record.span_id, 8, "span_id")
                    _check_times(record.time_unix_nano, record.observed_time_unix_nano, reader.window)
                except _LogRejected as exc:
                    batch.reject(str(exc))
                    continue
                attributes_of = reader.attributes(record.attributes)
                body_value = _body(reader, reader.value, record.body) if record.HasField("body") else None
                number, text = _severity(record.severity_number, record.severity_text, reader)
                if record.dropped_attributes_count:
                    reader.truncated = True
                _add_scope(attributes_of, scope.name, scope.version)
                batch.logs.append(
                    LogRow(
                        trace_id=trace_id,
                        span_id=span_id,
                        time_unix_nano=record.time_unix_nano,
                        observed_time_unix_nano=record.observed_time_unix_nano,
                        severity_number=number,
                        severity_text=text,
                        body=body_value,
                        attributes=attributes_of,
                        resource=resource,
                        service_name=service_name,
                        event_name=_event_name(record.event_name, attributes_of, reader),
                        truncated=reader.truncated or resource_truncated,
                    )
                )
    return batch


def _bytes_id(raw: bytes, size: int, what: str) -> str:
    if not raw or not any(raw):
        return ""  # a log record need not belong to a span
    if len(raw) != size:
        raise _LogRejected(f"{what} must be {size} bytes")
    return raw.hex()


# --- JSON -----------------------------------------------------------------------


def decode_logs_json(body: bytes) -> DecodedLogs:
    document = json_document(body)
    all_resource_logs = _list(_field(document, "resourceLogs", "resource_logs", []), "resourceLogs")
    _check_count(_json_count(all_resource_logs))
    reader = _JsonReader()
    batch = DecodedLogs()
    for resource_logs in all_resource_logs:
        resource_logs = _object(resource_logs, "resourceLogs")
        reader.start_span()
        resource_obj = _object(_field(resource_logs, "resource", "resource", {}), "resource")
        resource = reader.attributes(resource_obj.get("attributes", []))
        resource_truncated = reader.truncated
        service_name = _service_name(resource)
        for scope_logs in _list(_field(resource_logs, "scopeLogs", "scope_logs", []), "scopeLogs"):
            scope_logs = _object(scope_logs, "scopeLogs")
            scope = _object(scope_logs.get("scope", {}), "scope")
            scope_name = _expect(scope.get("name", ""), str, "scope.name")
            scope_version = _expect(scope.get("version", ""), str, "scope.version")
            for record in _list(_field(scope_logs, "logRecords", "log_records", []), "logRecords"):
                if len(batch.logs) % _YIELD_EVERY == 0:
                    yield_to_pages()
                record = _object(record, "logRecords")
                reader.start_span()
                try:
                    trace_id = _hex_id(_field(record, "traceId", "trace_id", ""), 32, "trace_id")
                    span_id = _hex_id(_field(record, "spanId", "span_id", ""), 16, "span_id")
                    time_unix_nano = _int64(_field(record, "timeUnixNano", "time_unix_nano", 0), "timeUnixNano")
                    observed_time_unix_nano = _int64(
                        _field(record, "observedTimeUnixNano", "observed_time_unix_nano", 0), "observedTimeUnixNano"
                    )
                    _check_times(time_unix_nano, observed_time_unix_nano, reader.window)
                except _LogRejected as exc:
                    batch.reject(str(exc))
                    continue
                attributes_of = reader.attributes(record.get("attributes", []))
                raw_body = record.get("body")
                body_value = _body(reader, reader.value, raw_body) if raw_body is not None else None
                number, text = _severity(
                    _severity_number(_field(record, "severityNumber", "severity_number", 0)),
                    _expect(_field(record, "severityText", "severity_text", ""), str, "severityText"),
                    reader,
                )
                if _int64(_field(record, "droppedAttributesCount", "dropped_attributes_count", 0), "droppedAttributesCount"):
                    reader.truncated = True
                _add_scope(attributes_of, scope_name, scope_version)
                batch.logs.append(
                    LogRow(
                        trace_id=trace_id,
                        span_id=span_id,
                        time_unix_nano=time_unix_nano,
                        observed_time_unix_nano=observed_time_unix_nano,
                        severity_number=number,
                        severity_text=text,
                        body=body_value,
                        attributes=attributes_of,
                        resource=resource,
                        service_name=service_name,
                        event_name=_event_name(
                            _expect(_field(record, "eventName", "event_name", ""), str, "eventName"), attributes_of, reader
                        ),
                        truncated=reader.truncated or resource_truncated,
                    )
                )
    return batch


def _json_count(all_resource_logs: list[Any]) -> int:
    count = 0
    for resource_logs in all_resource_logs:
        scope_list = _field(resource_logs, "scopeLogs", "scope_logs", []) if isinstance(resource_logs, dict) else []
        for scope_logs in scope_list if isinstance(scope_list, list) else []:
            records = _field(scope_logs, "logRecords", "log_records", None) if isinstance(scope_logs, dict) else None
            count += len(records) if isinstance(records, list) else 0
    return count


def _severity_number(value: Any) -> int:
    if isinstance(value, str) and value in _SEVERITY_NUMBERS:
        return _SEVERITY_NUMBERS[value]
    return _int64(value, "severityNumber")


def _hex_id(value: Any, size: int, what: str) -> str:
    if not isinstance(value, str):
        raise _LogRejected(f"{what} must be a hex string")
    if not value or not value.strip("0"):
        return ""  # a log record need not belong to a span
    if len(value) != size:
        raise _LogRejected(f"{what} must be {size} hex characters")
    if _HEX.fullmatch(value) is None:
        raise _LogRejected(f"{what} is not hex")
    return value.lower()
