"""A real OTLP/HTTP receiver on 127.0.0.1 for the telemetry tests: decodes spans and
metrics with opentelemetry-proto, stores records and artifacts, and follows a script
of answers ("503:<retry-after>", "400", "413", "partial:<n>") for its next requests."""

from __future__ import annotations

import gzip
import json
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.pipeline.delivery_helpers import LocalServer

STATUS_OK, STATUS_ERROR = 1, 2  # OTLP status codes


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class Collector(LocalServer):
    """An OTLP/HTTP receiver (and a records endpoint, for the executor hook)."""

    def __init__(self, port: int = 0) -> None:
        self.script: deque[str] = deque()
        self.spans: list[dict[str, Any]] = []
        self.resources: list[dict[str, Any]] = []
        self.requests: list[dict[str, str]] = []
        self.records: list[dict[str, Any]] = []
        self.artifacts: dict[str, bytes] = {}
        self.metrics: list[Any] = []  # decoded ExportMetricsServiceRequest bodies
        self.metrics_status = 200
        self.hang = threading.Event()
        super().__init__(port)

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        body = handler.rfile.read(int(handler.headers.get("Content-Length", 0)))
        self.requests.append({k.lower(): v for k, v in handler.headers.items()} | {"path": handler.path})
        if self.hang.is_set():
            self.release.wait(30)
            return
        step = self.script.popleft() if self.script and handler.path == "/v1/traces" else "ok"
        if step.startswith("503:"):
            return self.reply(handler, 503, b"busy", "text/plain", {"Retry-After": step[4:]})
        if step in ("400", "413"):
            return self.reply(handler, int(step), b"no", "text/plain")
        if handler.path == "/api/v1/records":
            records = json.loads(body)["records"]
            self.records.extend(records)
            answer = json.dumps({"accepted": len(records), "duplicates": 0, "rejected": []}).encode()
            return self.reply(handler, 200, answer, "application/json")
        if handler.path.startswith("/api/v1/artifacts/"):
            self.artifacts[handler.path.rsplit("/", 1)[1]] = body
            return self.reply(handler, 201, b"{}", "application/json")
        if handler.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if handler.path == "/v1/metrics":
            if self.metrics_status != 200:
                return self.reply(handler, self.metrics_status, b"no", "text/plain")
            self.metrics.append(ExportMetricsServiceRequest.FromString(body))
            return self.reply(handler, 200, b"", "application/x-protobuf")
        assert handler.path == "/v1/traces"
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            self.resources.append(resource)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "attributes": {kv.key: _value(kv.value) for kv in span.attributes},
                            "status": span.status.code,
                            "status_message": span.status.message,
                            "duration_ns": span.end_time_unix_nano - span.start_time_unix_nano,
                            "kind": span.kind,
                        }
                    )
        response = ExportTraceServiceResponse()
        if step.startswith("partial:"):
            response.partial_success.rejected_spans = int(step[8:])
            response.partial_success.error_message = "some spans were junk"
        self.reply(handler, 200, response.SerializeToString(), "application/x-protobuf")

    def span_ids(self) -> list[str]:
        return [s["span_id"] for s in self.spans]

    def named(self, name: str) -> dict[str, Any]:
        matches = [s for s in self.spans if s["name"] == name]
        assert len(matches) == 1, f"{name}: {[s['name'] for s in self.spans]}"
        return matches[0]
