"""Decode OTLP/HTTP trace exports into plain span rows, and encode the answers.

Any OpenTelemetry exporter can send spans here, in either wire encoding of
``ExportTraceServiceRequest``: protobuf (``application/x-protobuf``, decoded by the
upb-backed generated classes) or the OTLP JSON mapping (``application/json``: hex ids,
lowerCamelCase keys, enums as integers, 64-bit integers as strings or numbers; we
also accept snake_case keys and enum names, leniently, because hand-written senders
use them).

Pure Python, no Django: the view feeds it bytes and stores the rows it returns.
The rules of the contract live here:

- a body that cannot be read at all (truncated protobuf, invalid JSON or UTF-8,
  nesting too deep, wrong shapes) raises ``OtlpDecodeError`` -> 400;
- a span that is wrong on its own (bad or all-zero ids, a start or end time outside
  the accepted years: ``common.timestamp_bounds``) is rejected and counted,
  the others are kept -> ``partial_success``; an empty name is kept (OTLP: unknown);
- attribute values are bounded (``MAX_VALUE_CHARS`` per value, ``MAX_ATTRIBUTES``
  per span, ``MAX_SPAN_CHARS`` per span, ``MAX_EVENTS``, ``MAX_LINKS``), so a 10 MB attribute cannot
  bloat the database; a span that lost data says so in ``SpanRow.truncated``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable

from google.protobuf.message import DecodeError
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from dashboard.observatory.conventions import TRUNCATION_MARKER
from dashboard.priority import yield_to_pages

from .common import json_decode_cost, memory_reserve, timestamp_window_nanos

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
CONTENT_TYPES = (PROTOBUF, JSON)

MAX_SPANS = 20_000  # per request; SDKs send 512, collectors 8,192 by default
MAX_ATTRIBUTES = 256  # per span, per resource, per event
MAX_EVENTS = 128  # per span
MAX_LINKS = 128  # per span
MAX_VALUE_CHARS = 16 * 1024  # one attribute value, all its strings together
MAX_SPAN_CHARS = 256 * 1024  # all attribute and event values of one span
MAX_KEY_CHARS = 256  # an attribute key
MAX_ITEMS = 256  # items of one array / kvlist value
MAX_VALUE_DEPTH = 16  # arrays and kvlists inside each other
# A scalar or a container item costs this much of a budget, so long arrays of
# small numbers are bounded too.
_ITEM_COST = 8
_SHORT_TEXT = 1024  # strings shorter than this take the fast path (still charged)
_MAX_REJECT_REASONS = 5
_YIELD_EVERY = 64  # spans decoded between two chances for a page to take the CPU

_SPAN_KINDS = {
    "SPAN_KIND_UNSPECIFIED": 0,
    "SPAN_KIND_INTERNAL": 1,
    "SPAN_KIND_SERVER": 2,
    "SPAN_KIND_CLIENT": 3,
    "SPAN_KIND_PRODUCER": 4,
    "SPAN_KIND_CONSUMER": 5,
}
_STATUS_CODES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
_ZERO_TRACE_ID = "0" * 32
_ZERO_SPAN_ID = "0" * 16
_ZERO_16 = bytes(16)
_ZERO_8 = bytes(8)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_HEX = re.compile(r"[0-9a-fA-F]+")
_DECIMAL = re.compile(r"-?[0-9]+")  # int() alone would take " 12" and "1_000"


class OtlpDecodeError(ValueError):
    """The body is not a readable ExportTraceServiceRequest (answered 400)."""


class OtlpTooManySpans(OtlpDecodeError):
    """More spans in one request than MAX_SPANS (answered 413).

    Checked before any span becomes a Python object: a small gzipped body of
    minimal spans would otherwise expand to gigabytes of rows in memory.
    """


class _SpanRejected(ValueError):
    """One span is invalid on its own; the rest of the batch is kept."""


@dataclass(slots=True)
class SpanRow:
    """One span, flattened to what the database stores.

    ``resource`` is the same dict object for all spans of one ResourceSpans, so
    the store can encode it to JSON once per resource, not once per span.
    """

    trace_id: str  # 32 lowercase hex
    span_id: str  # 16 lowercase hex
    parent_span_id: str  # "" for a root span
    name: str
    kind: int  # SpanKind number, 0..5
    start_time_unix_nano: int
    end_time_unix_nano: int
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    attributes: dict[str, Any]
    events: list[dict[str, Any]]
    resource: dict[str, Any]
    service_name: str
    truncated: bool  # some attribute, event, link or value was cut to the limits
    # [{"trace_id", "span_id", "attributes"}]; a link with malformed ids is dropped (and truncated set)
    links: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class Rejections:
    """What an export request had rejected, item by item: the count and the first
    few distinct reasons, for ``partial_success``."""

    rejected: int = 0
    reasons: list[str] = field(default_factory=list)
    item_name: ClassVar[str] = "item(s)"

    def reject(self, reason: str) -> None:
        self.rejected += 1
        if len(self.reasons) < _MAX_REJECT_REASONS and reason not in self.reasons:
            self.reasons.append(reason)

    @property
    def error_message(self) -> str:
        """The ``partial_success.error_message``: the distinct reasons, briefly."""
        if not self.rejected:
            return ""
        return f"{self.rejected} {self.item_name} rejected: " + "; ".join(self.reasons)


@dataclass(slots=True)
class DecodedBatch(Rejections):
    """The spans of one export request that are kept, and what was rejected."""

    spans: list[SpanRow] = field(default_factory=list)
    item_name: ClassVar[str] = "span(s)"


def decode_request(body: bytes, content_type: str) -> DecodedBatch:
    """Decode an export request body in the given wire encoding."""
    if content_type == PROTOBUF:
        return decode_protobuf(body)
    if content_type == JSON:
        return decode_json(body)
    raise ValueError(f"unsupported content type {content_type!r}")


# --- values, with their limits -------------------------------------------------


class _Bounded:
    """Reads attribute values under the limits and remembers when it cut something.

    One instance per request; ``start_span`` resets the per-span state. Both wire
    encodings share the budget logic (``_text``, ``_spend``); only the shape of an
    AnyValue differs.
    """

    __slots__ = ("truncated", "span_budget", "budget", "window")

    def __init__(self) -> None:
        self.truncated = False
        self.window = timestamp_window_nanos()  # [low, high) nanoseconds a time may take
        self.span_budget = MAX_SPAN_CHARS
        self.budget = MAX_VALUE_CHARS

    def start_span(self) -> None:
        self.truncated = False
        self.span_budget = MAX_SPAN_CHARS

    def _start_value(self) -> None:
        self.budget = min(MAX_VALUE_CHARS, self.span_budget)

    def _end_value(self) -> None:
        self.span_budget -= min(MAX_VALUE_CHARS, self.span_budget) - self.budget

    def _text(self, text: str) -> str:
        size = len(text)
        if size > self.budget:
            self.truncated = True
            text = text[: max(self.budget, 0)] + TRUNCATION_MARKER
            self.budget = 0
        else:
            self.budget -= size
        return _clean(text)

    def _key(self, key: str) -> str:
        if len(key) > MAX_KEY_CHARS:
            self.truncated = True
            key = key[:MAX_KEY_CHARS] + TRUNCATION_MARKER
        return _clean(key)

    def name(self, text: str) -> str:
        """Text outside the attributes (an event name, a status message): a value
        of its own, under the same limits."""
        self._start_value()
        text = self._text(text)
        self._end_value()
        return text

    def _spend(self) -> bool:
        """Charge one scalar or item; False once the value's budget is gone."""
        if self.budget <= 0:
            self.truncated = True
            return False
        self.budget -= _ITEM_COST
        return True

    def _bytes(self, data: bytes) -> str:
        # Bytes are stored as base64 text, as the OTLP JSON mapping writes them.
        limit = max(self.budget, 0) * 3 // 4
        if len(data) > limit:
            self.truncated = True
            self.budget = 0
            return base64.b64encode(data[:limit]).decode("ascii") + TRUNCATION_MARKER
        encoded = base64.b64encode(data).decode("ascii")
        self.budget -= len(encoded)
        return encoded

    def _items(self, items: Iterable[Any]) -> Iterable[Any]:
        """Yield at most MAX_ITEMS items while the budget lasts."""
        for count, item in enumerate(items):
            if count >= MAX_ITEMS or not self._spend():
                self.truncated = True
                return
            yield item


def _finite(number: float) -> float | str:
    # JSON has no NaN/Infinity; the OTLP JSON mapping writes them as strings.
    if math.isfinite(number):
        return number
    return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")


# --- protobuf -------------------------------------------------------------------


class _ProtobufReader(_Bounded):
    __slots__ = ()

    def value(self, value: Any, depth: int = 0) -> Any:
        kind = value.WhichOneof("value")
        if kind == "string_value":
            return self._text(value.string_value)
        if kind == "int_value":
            self._spend()
            return value.int_value
        if kind == "double_value":
            self._spend()
            return _finite(value.double_value)
        if kind == "bool_value":
            self._spend()
            return value.bool_value
        if kind == "bytes_value":
            return self._bytes(value.bytes_value)
        if kind in ("array_value", "kvlist_value"):
            if depth >= MAX_VALUE_DEPTH:
                raise OtlpDecodeError("attribute value nesting too deep")
            if kind == "array_value":
                return [self.value(item, depth + 1) for item in self._items(value.array_value.values)]
            return {
                self._key(kv.key): self.value(kv.value, depth + 1)
                for kv in self._items(value.kvlist_value.values)
            }
        return None  # empty AnyValue (or a profiles-only string index)

    def attributes(self, key_values: Any) -> dict[str, Any]:
        if len(key_values) > MAX_ATTRIBUTES:
            self.truncated = True
            key_values = key_values[:MAX_ATTRIBUTES]
        out: dict[str, Any] = {}
        budget = self.span_budget  # held in a local; written back around the general path
        for kv in key_values:
            key = kv.key
            if len(key) > MAX_KEY_CHARS or "\x00" in key:
                key = self._key(key)
            value = kv.value
            kind = value.WhichOneof("value")
            # The common cases (a short string, a number, a flag) skip the general
            # path: this loop runs ten times per span on the ingest hot path.
            if kind == "string_value":
                text = value.string_value
                size = len(text)
                if size < _SHORT_TEXT and size < budget and "\x00" not in text:
                    budget -= size
                    out[key] = text
                    continue
            elif kind == "int_value" or kind == "bool_value":
                if budget > _ITEM_COST:
                    budget -= _ITEM_COST
                    out[key] = getattr(value, kind)
                    continue
            elif kind == "double_value":
                if budget > _ITEM_COST:
                    budget -= _ITEM_COST
                    out[key] = _finite(value.double_value)
                    continue
            self.span_budget = budget
            self._start_value()
            out[key] = self.value(value)
            self._end_value()
            budget = self.span_budget
        self.span_budget = budget
        return out


def decode_protobuf(body: bytes) -> DecodedBatch:
    """Decode a protobuf ExportTraceServiceRequest."""
    memory_reserve(len(body), "the protobuf message")
    try:
        request = ExportTraceServiceRequest.FromString(body)
    except (DecodeError, RecursionError, ValueError) as exc:
        raise OtlpDecodeError(f"invalid protobuf: {str(exc)[:100] or type(exc).__name__}") from None
    _check_span_count(
        sum(len(scope_spans.spans) for resource_spans in request.resource_spans for scope_spans in resource_spans.scope_spans)
    )
    memory_reserve(_protobuf_rows_cost(request, len(body)), "the spans")
    reader = _ProtobufReader()
    batch = DecodedBatch()
    rows = batch.spans
    count = 0
    for resource_spans in request.resource_spans:
        reader.start_span()
        resource = reader.attributes(resource_spans.resource.attributes)
        resource_truncated = reader.truncated
        service_name = _service_name(resource)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope
            scope_name, scope_version = scope.name, scope.version  # read once a scope, not once a span
            for span in scope_spans.spans:
                if count % _YIELD_EVERY == 0:
                    yield_to_pages()
                count += 1
                reader.start_span()
                try:
                    row = _protobuf_span(span, reader, resource, service_name)
                except _SpanRejected as exc:
                    batch.reject(str(exc))
                    continue
                _add_scope(row.attributes, scope_name, scope_version)
                row.truncated = reader.truncated or resource_truncated
                rows.append(row)
    return batch


# Measured: a decoded span row costs ~1.5 KB besides its attributes, an attribute
# ~120 bytes besides its text; the text is held again as the rows' JSON.
_ROW_BYTES = 1500
_ATTRIBUTE_BYTES = 160
_EVENT_BYTES = 400


def _protobuf_rows_cost(request: Any, body_bytes: int) -> int:
    """What turning a parsed request into rows will allocate, counted on the parsed
    message (lengths only, no value is read) before any row exists."""
    spans = attributes = events = 0
    for resource_spans in request.resource_spans:
        attributes += len(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans += 1
                attributes += len(span.attributes)
                if span.events:
                    events += len(span.events)
                    attributes += sum(len(event.attributes) for event in span.events)
                if span.links:  # a link costs about what an event does
                    events += len(span.links)
                    attributes += sum(len(link.attributes) for link in span.links)
    return body_bytes + _ROW_BYTES * spans + _ATTRIBUTE_BYTES * attributes + _EVENT_BYTES * events


def _protobuf_span(span: Any, reader: _ProtobufReader, resource: dict[str, Any], service_name: str) -> SpanRow:
    # The valid case is tested inline (this runs once a span); the checks' functions
    # only run to name what is wrong.
    trace_id = span.trace_id
    trace_id = trace_id.hex() if len(trace_id) == 16 and trace_id != _ZERO_16 else _checked_id(trace_id, 16, "trace_id")
    span_id = span.span_id
    span_id = span_id.hex() if len(span_id) == 8 and span_id != _ZERO_8 else _checked_id(span_id, 8, "span_id")
    parent = span.parent_span_id
    if len(parent) == 8 and parent != _ZERO_8:
        parent_span_id = parent.hex()
    else:  # none (a root span), zeros (the same), or wrong
        parent_span_id = "" if not any(parent) else _checked_id(parent, 8, "parent_span_id")
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    low, high = reader.window
    if not (low <= start < high and low <= end < high):
        check_time(start, reader.window, "start time")
        check_time(end, reader.window, "end time")
    name = span.name  # may be empty: OTLP says that means unknown
    if "\x00" in name:
        name = _clean(name)
    status = span.status
    message = status.message
    attributes = reader.attributes(span.attributes)  # before events: they share the span's budget
    events = [
        {
            "name": reader.name(event.name),
            "time_unix_nano": event.time_unix_nano,
            "attributes": reader.attributes(event.attributes),
        }
        for event in _capped_events(span.events, reader)
    ] if span.events else []
    links = []
    if span.links:
        for link in _capped_links(span.links, reader):
            try:
                linked = {"trace_id": _checked_id(link.trace_id, 16, "link trace_id"),
                          "span_id": _checked_id(link.span_id, 8, "link span_id")}
            except _SpanRejected:
                reader.truncated = True  # a link to nothing we could name: dropped, said
                continue
            linked["attributes"] = reader.attributes(link.attributes)
            links.append(linked)
    if span.dropped_attributes_count or span.dropped_events_count or span.dropped_links_count:
        reader.truncated = True  # the sender already dropped some
    kind = span.kind
    code = status.code
    return SpanRow(
        trace_id,
        span_id,
        parent_span_id,
        name,
        kind if 0 <= kind <= 5 else 0,
        start,
        end,
        code if 0 <= code <= 2 else 0,
        reader.name(message) if message else "",
        attributes,
        events,
        resource,
        service_name,
        False,
        links,
    )


def check_time(unix_nano: int, window: tuple[int, int], what: str, error: type[ValueError] = _SpanRejected) -> None:
    """Refuse one item whose time is outside the configured years (timestamp_bounds)."""
    if not window[0] <= unix_nano < window[1]:
        raise error(f"{what} outside the accepted years (OBSERVATORY_TIMESTAMP_MIN_YEAR to _MAX_YEAR)")


def _checked_id(raw: bytes, size: int, what: str) -> str:
    if len(raw) != size:
        raise _SpanRejected(f"{what} must be {size} bytes")
    if not any(raw):
        raise _SpanRejected(f"{what} is all zeros")
    return raw.hex()


def _capped_events(events: Any, reader: _Bounded) -> Any:
    if len(events) > MAX_EVENTS:
        reader.truncated = True
        return events[:MAX_EVENTS]
    return events


def _capped_links(links: Any, reader: _Bounded) -> Any:
    if len(links) > MAX_LINKS:
        reader.truncated = True
        return links[:MAX_LINKS]
    return links


# --- JSON -----------------------------------------------------------------------


class _JsonReader(_Bounded):
    __slots__ = ()

    def value(self, value: Any, depth: int = 0) -> Any:
        if not isinstance(value, dict):
            raise OtlpDecodeError("an attribute value must be an AnyValue object")
        for key, item in value.items():
            if key in ("stringValue", "string_value"):
                return self._text(_expect(item, str, "stringValue"))
            if key in ("intValue", "int_value"):
                self._spend()
                return _int64(item, "intValue")
            if key in ("doubleValue", "double_value"):
                self._spend()
                return _double(item)
            if key in ("boolValue", "bool_value"):
                self._spend()
                return _expect(item, bool, "boolValue")
            if key in ("bytesValue", "bytes_value"):
                try:
                    data = base64.b64decode(_expect(item, str, "bytesValue"), validate=True)
                except binascii.Error:
                    raise OtlpDecodeError("bytesValue is not base64") from None
                return self._bytes(data)
            if key in ("arrayValue", "array_value", "kvlistValue", "kvlist_value"):
                if depth >= MAX_VALUE_DEPTH:
                    raise OtlpDecodeError("attribute value nesting too deep")
                values = _list(_object(item, key).get("values", []), "values")
                if key in ("arrayValue", "array_value"):
                    return [self.value(each, depth + 1) for each in self._items(values)]
                out = {}
                for kv in self._items(values):
                    kv = _object(kv, "kvlistValue.values")
                    out[self._key(_expect(kv.get("key", ""), str, "key"))] = self.value(
                        kv.get("value", {}), depth + 1
                    )
                return out
        return None  # {} is an empty AnyValue

    def attributes(self, key_values: Any) -> dict[str, Any]:
        key_values = _list(key_values, "attributes")
        if len(key_values) > MAX_ATTRIBUTES:
            self.truncated = True
            key_values = key_values[:MAX_ATTRIBUTES]
        out: dict[str, Any] = {}
        for kv in key_values:
            kv = _object(kv, "attributes")
            key = self._key(_expect(kv.get("key", ""), str, "key"))
            self._start_value()
            out[key] = self.value(kv.get("value", {}))
            self._end_value()
        return out


def decode_json(body: bytes) -> DecodedBatch:
    """Decode an ExportTraceServiceRequest in the OTLP JSON mapping."""
    document = json_document(body)
    all_resource_spans = _list(_field(document, "resourceSpans", "resource_spans", []), "resourceSpans")
    _check_span_count(_json_span_count(all_resource_spans))
    reader = _JsonReader()
    batch = DecodedBatch()
    for resource_spans in all_resource_spans:
        resource_spans = _object(resource_spans, "resourceSpans")
        reader.start_span()
        resource_obj = _object(_field(resource_spans, "resource", "resource", {}), "resource")
        resource = reader.attributes(resource_obj.get("attributes", []))
        resource_truncated = reader.truncated
        service_name = _service_name(resource)
        for scope_spans in _list(_field(resource_spans, "scopeSpans", "scope_spans", []), "scopeSpans"):
            scope_spans = _object(scope_spans, "scopeSpans")
            scope = _object(scope_spans.get("scope", {}), "scope")
            scope_name = _expect(scope.get("name", ""), str, "scope.name")
            scope_version = _expect(scope.get("version", ""), str, "scope.version")
            for span in _list(scope_spans.get("spans", []), "spans"):
                if len(batch.spans) % _YIELD_EVERY == 0:
                    yield_to_pages()
                reader.start_span()
                try:
                    row = _json_span(_object(span, "spans"), reader, resource, service_name)
                except _SpanRejected as exc:
                    batch.reject(str(exc))
                    continue
                _add_scope(row.attributes, scope_name, scope_version)
                row.truncated = reader.truncated or resource_truncated
                batch.spans.append(row)
    return batch


def json_document(body: bytes) -> dict[str, Any]:
    """An export request body in the OTLP JSON mapping, parsed (any signal): strict
    UTF-8, no unpaired surrogate, counted against the memory budget."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise OtlpDecodeError("body is not valid UTF-8") from None
    if _has_lone_surrogate_escape(text):
        raise OtlpDecodeError("JSON string holds an unpaired surrogate escape")
    # The parsed document, then the rows made from it.
    memory_reserve(2 * json_decode_cost(body), "the JSON body")
    try:
        document = json.loads(text)
    except RecursionError:
        raise OtlpDecodeError("JSON nesting too deep") from None
    except ValueError as exc:
        raise OtlpDecodeError(f"invalid JSON: {str(exc)[:100]}") from None
    return _object(document, "request")


def _json_span_count(all_resource_spans: list[Any]) -> int:
    """Spans in the document, counted before reading any (wrong shapes count 0;
    the reading pass refuses them)."""
    count = 0
    for resource_spans in all_resource_spans:
        scope_list = _field(resource_spans, "scopeSpans", "scope_spans", []) if isinstance(resource_spans, dict) else []
        for scope_spans in scope_list if isinstance(scope_list, list) else []:
            spans = scope_spans.get("spans") if isinstance(scope_spans, dict) else None
            count += len(spans) if isinstance(spans, list) else 0
    return count


def _json_span(span: dict[str, Any], reader: _JsonReader, resource: dict[str, Any], service_name: str) -> SpanRow:
    trace_id = _hex_id(_field(span, "traceId", "trace_id", ""), 32, "trace_id")
    span_id = _hex_id(_field(span, "spanId", "span_id", ""), 16, "span_id")
    parent = _field(span, "parentSpanId", "parent_span_id", "")
    parent_span_id = "" if parent in ("", _ZERO_SPAN_ID) else _hex_id(parent, 16, "parent_span_id")
    name = span.get("name", "")
    if not isinstance(name, str):
        raise OtlpDecodeError("span name must be a string")
    start_time = _int64(_field(span, "startTimeUnixNano", "start_time_unix_nano", 0), "startTimeUnixNano")
    end_time = _int64(_field(span, "endTimeUnixNano", "end_time_unix_nano", 0), "endTimeUnixNano")
    check_time(start_time, reader.window, "start time")
    check_time(end_time, reader.window, "end time")
    status = _object(span.get("status", {}), "status")
    attributes = reader.attributes(span.get("attributes", []))  # before events: they share the span's budget
    raw_events = _list(span.get("events", []), "events")
    if len(raw_events) > MAX_EVENTS:
        reader.truncated = True
        raw_events = raw_events[:MAX_EVENTS]
    events = []
    for event in raw_events:
        event = _object(event, "events")
        events.append(
            {
                "name": reader.name(_expect(event.get("name", ""), str, "event name")),
                "time_unix_nano": _int64(_field(event, "timeUnixNano", "time_unix_nano", 0), "timeUnixNano"),
                "attributes": reader.attributes(event.get("attributes", [])),
            }
        )
    links = []
    for link in _capped_links(_list(span.get("links", []), "links"), reader):
        link = _object(link, "links")
        try:
            linked = {"trace_id": _hex_id(_field(link, "traceId", "trace_id", ""), 32, "link trace_id"),
                      "span_id": _hex_id(_field(link, "spanId", "span_id", ""), 16, "link span_id")}
        except _SpanRejected:
            reader.truncated = True
            continue
        linked["attributes"] = reader.attributes(link.get("attributes", []))
        links.append(linked)
    if (
        _int64(_field(span, "droppedAttributesCount", "dropped_attributes_count", 0), "droppedAttributesCount")
        or _int64(_field(span, "droppedEventsCount", "dropped_events_count", 0), "droppedEventsCount")
        or _int64(_field(span, "droppedLinksCount", "dropped_links_count", 0), "droppedLinksCount")
    ):
        reader.truncated = True
    return SpanRow(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent_span_id,
        name=_clean(name),
        kind=_enum(span.get("kind", 0), _SPAN_KINDS, "kind", upper=5),
        start_time_unix_nano=start_time,
        end_time_unix_nano=end_time,
        status_code=_enum(status.get("code", 0), _STATUS_CODES, "status.code", upper=2),
        status_message=reader.name(_expect(status.get("message", ""), str, "status.message")),
        attributes=attributes,
        events=events,
        resource=resource,
        service_name=service_name,
        truncated=False,
        links=links,
    )


def _field(obj: dict[str, Any], camel: str, snake: str, default: Any) -> Any:
    value = obj.get(camel)
    if value is None:
        value = obj.get(snake, default)
    return default if value is None else value


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise OtlpDecodeError(f"{what} must be a JSON object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise OtlpDecodeError(f"{what} must be a JSON array")
    return value


def _expect(value: Any, kind: type, what: str) -> Any:
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise OtlpDecodeError(f"{what} must be a {kind.__name__}")
    return value


def _int64(value: Any, what: str) -> int:
    # The mapping writes 64-bit integers as decimal strings; numbers are accepted too.
    if isinstance(value, bool):
        raise OtlpDecodeError(f"{what} must be an integer")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and len(value) <= 21 and _DECIMAL.fullmatch(value):
        number = int(value)
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    else:
        raise OtlpDecodeError(f"{what} must be an integer")
    if not -(2**63) <= number < 2**64:
        raise OtlpDecodeError(f"{what} is out of the 64-bit range")
    return number


def _double(value: Any) -> float | str:
    if isinstance(value, bool):
        raise OtlpDecodeError("doubleValue must be a number")
    if isinstance(value, (int, float)):
        return _finite(float(value))
    if value in ("NaN", "Infinity", "-Infinity"):
        return value
    raise OtlpDecodeError("doubleValue must be a number")


def _enum(value: Any, names: dict[str, int], what: str, *, upper: int) -> int:
    if isinstance(value, str) and value in names:
        return names[value]
    number = _int64(value, what)
    return number if 0 <= number <= upper else 0  # unknown values read as unspecified


def _hex_id(value: Any, size: int, what: str) -> str:
    if not isinstance(value, str) or len(value) != size:
        raise _SpanRejected(f"{what} must be {size} hex characters")
    if _HEX.fullmatch(value) is None:  # bytes.fromhex would let spaces through
        raise _SpanRejected(f"{what} is not hex")
    if not value.strip("0"):
        raise _SpanRejected(f"{what} is all zeros")
    return value.lower()


def _has_lone_surrogate_escape(text: str) -> bool:
    r"""True when a ``\uD800``-``\uDFFF`` escape is not part of a valid pair.

    json.loads would turn it into a str that cannot be encoded to UTF-8, which the
    database refuses later; refusing it here keeps that a 400, not a 500.
    """
    if _SURROGATE_ESCAPE.search(text) is None:
        return False
    try:
        json.dumps(json.loads(text), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    except (ValueError, RecursionError):
        return False  # the real parse reports it
    return False


# --- shared ---------------------------------------------------------------------


def _check_span_count(count: int) -> None:
    if count > MAX_SPANS:
        raise OtlpTooManySpans(f"{count} spans in one request; send at most {MAX_SPANS}")


def _service_name(resource: dict[str, Any]) -> str:
    name = resource.get("service.name", "")
    return name if isinstance(name, str) else str(name)


def _add_scope(attributes: dict[str, Any], name: str, version: str) -> None:
    # The instrumentation scope has no column; keep it the way Jaeger/Zipkin do.
    if name:
        attributes.setdefault("otel.scope.name", _clean(name))
    if version:
        attributes.setdefault("otel.scope.version", _clean(version))


def _clean(text: str) -> str:
    """PostgreSQL text and jsonb refuse NUL: store U+FFFD in its place."""
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


# --- answers --------------------------------------------------------------------

# google.rpc.Code numbers for the HTTP statuses we answer; OTLP/HTTP says clients
# need not read Status.code, but a meaningful one helps whoever debugs the sender.
_RPC_CODES = {400: 3, 401: 16, 403: 7, 404: 5, 405: 12, 413: 8, 415: 3, 429: 8, 500: 13, 503: 14}


def encode_export_response(batch: DecodedBatch, content_type: str) -> bytes:
    """ExportTraceServiceResponse, with partial_success when spans were rejected."""
    if content_type == JSON:
        if not batch.rejected:
            return b"{}"
        return json.dumps(
            {"partialSuccess": {"rejectedSpans": str(batch.rejected), "errorMessage": batch.error_message}}
        ).encode()
    response = ExportTraceServiceResponse()
    if batch.rejected:
        response.partial_success.rejected_spans = batch.rejected
        response.partial_success.error_message = batch.error_message
    return response.SerializeToString()


def encode_status(http_status: int, message: str, content_type: str) -> bytes:
    """The google.rpc.Status body OTLP/HTTP asks for on every 4xx/5xx answer.

    ``google.rpc.Status`` comes from googleapis-common-protos, which the
    OpenTelemetry exporters depend on anyway.
    """
    code = _RPC_CODES.get(http_status, 2)  # 2 = UNKNOWN
    if content_type == JSON:
        return json.dumps({"code": code, "message": message}).encode()
    return status_pb2.Status(code=code, message=message).SerializeToString()
