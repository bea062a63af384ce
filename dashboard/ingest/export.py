"""One OTLP export, whatever carried it: the store path below every transport.

OTLP/HTTP (``otlp_views``) and OTLP/gRPC (``grpc_server``) both call
``otlp_export`` with the Authorization value, a function that reads the bounded
body, and the wire encoding. Inside the concurrency gate it authenticates,
reads, decodes with the signal's decoder and stores with the signal's store
function, all in one place; the transport's only job is to turn the returned
``ExportOutcome`` (or the ``IngestError`` it raises) into an HTTP answer or a gRPC
status. It returns after the commit, so an acknowledged batch is never lost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from .common import IngestError, authenticate_header, derivations_keep_up, ingest_gate
from .logs import logs_store
from .otlp import JSON, OtlpDecodeError, OtlpTooManySpans, decode_request
from .otlp_logs import OtlpTooManyLogs, decode_logs_request
from .spans import spans_store

TRACES = "traces"
LOGS = "logs"


@dataclass(frozen=True, slots=True)
class ExportOutcome:
    """What one export did: the items kept and stored (``stored`` new ones; the
    rest were already there, a retried batch), and the ones rejected on their own
    with the reasons (``partial_success``)."""

    signal: str
    accepted: int
    stored: int
    rejected: int
    error_message: str

    def response_protobuf(self) -> bytes:
        """The Export*ServiceResponse, with partial_success when items were rejected."""
        if self.signal == TRACES:
            response: Any = ExportTraceServiceResponse()
            if self.rejected:
                response.partial_success.rejected_spans = self.rejected
        else:
            response = ExportLogsServiceResponse()
            if self.rejected:
                response.partial_success.rejected_log_records = self.rejected
        if self.rejected:
            response.partial_success.error_message = self.error_message
        return response.SerializeToString()

    def response_json(self) -> bytes:
        if not self.rejected:
            return b"{}"
        key = "rejectedSpans" if self.signal == TRACES else "rejectedLogRecords"
        return json.dumps(
            {"partialSuccess": {key: str(self.rejected), "errorMessage": self.error_message}}
        ).encode()

    def response(self, content_type: str) -> bytes:
        return self.response_json() if content_type == JSON else self.response_protobuf()


def otlp_export(*, signal: str, authorization: str, read_body: Callable[[], bytes], content_type: str) -> ExportOutcome:
    """Authenticate, read, decode and store one export request of ``signal``.

    Raises IngestError (with its HTTP status) for every refusal; nothing is stored
    then. ``read_body`` runs inside the gate, after the key is checked, and returns
    the decoded (inflated, bounded) body.
    """
    with ingest_gate():
        project, _ = authenticate_header(authorization)
        derivations_keep_up()
        body = read_body()
        if signal == TRACES:
            batch = _decoded(decode_request, body, content_type, OtlpTooManySpans)
            stored = spans_store(project=project, spans=batch.spans).inserted
            return ExportOutcome(signal, len(batch.spans), stored, batch.rejected, batch.error_message)
        if signal == LOGS:
            batch = _decoded(decode_logs_request, body, content_type, OtlpTooManyLogs)
            stored = logs_store(project=project, logs=batch.logs).inserted
            return ExportOutcome(signal, len(batch.logs), stored, batch.rejected, batch.error_message)
    raise ValueError(f"unknown signal {signal!r}")


def _decoded(decode: Callable[[bytes, str], Any], body: bytes, content_type: str, too_many: type) -> Any:
    try:
        return decode(body, content_type)
    except too_many as exc:
        raise IngestError(413, str(exc)) from None
    except OtlpDecodeError as exc:
        raise IngestError(400, str(exc)) from None
