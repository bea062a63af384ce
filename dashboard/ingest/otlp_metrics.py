"""Decode OTLP metric exports (``ExportMetricsServiceRequest``) into the points the
dashboard keeps, and a count of the others.

The metrics twin of ``otlp`` and ``otlp_logs``, with their rules: a body that cannot
be read is ``OtlpDecodeError`` (400); too many data points is ``OtlpTooManyPoints``
(413), counted before any is read; a point wrong on its own (a time outside the
accepted years, a value that is not a finite number) is rejected and counted
(``partial_success``); attribute values are read under the same limits
(``otlp._ProtobufReader``).

Kept (``MetricPoint``): the GenAI client metrics (``gen_ai.client.token.usage``,
``gen_ai.client.operation.duration``: histograms) and the pipeline's own counters
(``ba.tool.*``: sums, see ``pipeline._metrics_export``), each with its model, tool and
token type read through the conventions table. Every other metric, or one of those
names in a shape we do not read (a gauge, an exponential histogram), is only counted
by name (``others``).

The JSON encoding (the OTLP JSON mapping) is read by protobuf's own JSON parser into
the same message, so both encodings take one path: the mapping's keys, enums as
integers and 64-bit integers as strings are what that parser reads; the only fields it
would misread are exemplars' hex ids, and exemplars are dropped before it runs.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from dashboard.observatory.conventions import text_of
from dashboard.priority import yield_to_pages

from .common import memory_reserve
from .otlp import (
    _ATTRIBUTE_BYTES,
    JSON,
    PROTOBUF,
    OtlpDecodeError,
    Rejections,
    _ProtobufReader,
    check_time,
    json_document,
)

MAX_POINTS = 20_000  # data points per request, as spans
_POINT_BYTES = 600  # what one decoded point costs, with its series key
_YIELD_EVERY = 256
NAME_MAX = 200

TOKEN_USAGE = "gen_ai.client.token.usage"
OPERATION_DURATION = "gen_ai.client.operation.duration"
# The GenAI client metrics are histograms; the pipeline's are cumulative sums
# (pipeline._metrics_export.INSTRUMENTS, and ba.tool.tokens by gen_ai.token.type).
HISTOGRAMS = (TOKEN_USAGE, OPERATION_DURATION)
PIPELINE_SUMS = ("ba.tool.calls", "ba.tool.errors", "ba.tool.retries", "ba.tool.cache_hits", "ba.tool.duration",
                 "ba.tool.tokens")
TOKEN_TYPE = "gen_ai.token.type"
DELTA = 1  # AggregationTemporality
CUMULATIVE = 2


class OtlpTooManyPoints(OtlpDecodeError):
    """More data points in one request than MAX_POINTS (answered 413)."""


class _PointRejected(ValueError):
    """One point is invalid on its own; the rest of the batch is kept."""


@dataclass(slots=True)
class MetricPoint:
    """One data point of a kept metric: a sum's value, or a histogram's count and sum."""

    name: str
    series: str  # what identifies its series (resource, scope, name, attributes), hashed
    cumulative: bool  # the value is the total since ``start_time_unix_nano`` (else: since the previous point)
    start_time_unix_nano: int
    time_unix_nano: int
    value: float
    count: int  # a histogram's observations; 0 for a sum
    model: str
    tool_name: str
    token_type: str


@dataclass(slots=True)
class DecodedMetrics(Rejections):
    """The kept points of one export request, the others counted by metric name, and what was rejected."""

    points: list[MetricPoint] = field(default_factory=list)
    others: Counter[str] = field(default_factory=Counter)
    item_name: ClassVar[str] = "data point(s)"

    @property
    def accepted(self) -> int:
        return len(self.points) + sum(self.others.values())


def decode_metrics_request(body: bytes, content_type: str) -> DecodedMetrics:
    if content_type == PROTOBUF:
        return decode_metrics_protobuf(body)
    if content_type == JSON:
        return decode_metrics_json(body)
    raise ValueError(f"unsupported content type {content_type!r}")


def decode_metrics_protobuf(body: bytes) -> DecodedMetrics:
    memory_reserve(len(body), "the protobuf message")
    try:
        request = ExportMetricsServiceRequest.FromString(body)
    except (DecodeError, RecursionError, ValueError) as exc:
        raise OtlpDecodeError(f"invalid protobuf: {str(exc)[:100] or type(exc).__name__}") from None
    return _decoded(request)


def decode_metrics_json(body: bytes) -> DecodedMetrics:
    document = json_document(body)
    _drop_exemplars(document)
    request = ExportMetricsServiceRequest()
    try:
        json_format.ParseDict(document, request, ignore_unknown_fields=True)
    except (json_format.ParseError, RecursionError, ValueError, TypeError, AttributeError) as exc:
        raise OtlpDecodeError(f"invalid OTLP JSON: {str(exc)[:100] or type(exc).__name__}") from None
    return _decoded(request)


def _drop_exemplars(document: Any) -> None:
    """Exemplars name their span in hex, which protobuf's JSON parser would read as
    base64; the dashboard does not keep them."""
    for resource_metrics in _items(document, "resourceMetrics", "resource_metrics"):
        for scope_metrics in _items(resource_metrics, "scopeMetrics", "scope_metrics"):
            for metric in _items(scope_metrics, "metrics", "metrics"):
                if not isinstance(metric, dict):
                    continue
                for kind in metric.values():
                    for point in _items(kind, "dataPoints", "data_points"):
                        if isinstance(point, dict):
                            point.pop("exemplars", None)


def _items(parent: Any, camel: str, snake: str) -> list[Any]:
    if not isinstance(parent, dict):
        return []
    value = parent.get(camel, parent.get(snake))
    return value if isinstance(value, list) else []


def _points_of(metric: Any) -> Any:
    kind = metric.WhichOneof("data")
    return getattr(metric, kind).data_points if kind else ()


def _decoded(request: ExportMetricsServiceRequest) -> DecodedMetrics:
    count = attributes = 0
    for resource_metrics in request.resource_metrics:
        attributes += len(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                points = _points_of(metric)
                count += len(points)
                attributes += sum(len(point.attributes) for point in points)
    if count > MAX_POINTS:
        raise OtlpTooManyPoints(f"{count} data points in one request; send at most {MAX_POINTS}")
    memory_reserve(_POINT_BYTES * count + _ATTRIBUTE_BYTES * attributes, "the data points")
    reader = _ProtobufReader()
    batch = DecodedMetrics()
    for resource_metrics in request.resource_metrics:
        reader.start_span()
        resource = reader.attributes(resource_metrics.resource.attributes)
        resource_key = json.dumps(resource, sort_keys=True, default=str)
        for scope_metrics in resource_metrics.scope_metrics:
            scope = scope_metrics.scope.name
            for metric in scope_metrics.metrics:
                name = metric.name[:NAME_MAX]
                kind = metric.WhichOneof("data")
                points = _points_of(metric)
                if not _kept(name, kind):
                    if points:
                        batch.others[name or "(no name)"] += len(points)
                    continue
                data = getattr(metric, kind)
                cumulative = data.aggregation_temporality == CUMULATIVE
                for point in points:
                    if (len(batch.points) + 1) % _YIELD_EVERY == 0:
                        yield_to_pages()
                    reader.start_span()
                    try:
                        batch.points.append(_point(name, kind, cumulative, point, reader, resource,
                                                   resource_key, scope))
                    except _PointRejected as exc:
                        batch.reject(str(exc))
    return batch


def _kept(name: str, kind: str | None) -> bool:
    return (name in HISTOGRAMS and kind == "histogram") or (name in PIPELINE_SUMS and kind == "sum")


def _point(name: str, kind: str, cumulative: bool, point: Any, reader: _ProtobufReader, resource: dict[str, Any],
           resource_key: str, scope: str) -> MetricPoint:
    time, start = point.time_unix_nano, point.start_time_unix_nano
    check_time(time, reader.window, "time", _PointRejected)
    if start:
        check_time(start, reader.window, "start time", _PointRejected)
    if kind == "histogram":
        value, count = (point.sum if point.HasField("sum") else 0.0), point.count
    else:
        value = float(point.as_int) if point.WhichOneof("value") == "as_int" else point.as_double
        count = 0
    if not math.isfinite(value) or value < 0:
        raise _PointRejected("a point's value must be a finite number, not negative")
    attributes = reader.attributes(point.attributes)
    series = hashlib.sha256(
        json.dumps([resource_key, scope, name, attributes], sort_keys=True, default=str).encode("utf-8", "replace")
    ).hexdigest()[:32]
    token_type = attributes.get(TOKEN_TYPE)
    return MetricPoint(
        name=name, series=series, cumulative=cumulative, start_time_unix_nano=start, time_unix_nano=time,
        value=value, count=count,
        model=text_of("model", attributes, resource)[:NAME_MAX],
        tool_name=text_of("tool_name", attributes)[:NAME_MAX],
        token_type=token_type[:16] if isinstance(token_type, str) else "",
    )
