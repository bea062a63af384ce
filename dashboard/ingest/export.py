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
from typing import Any, Callable, Sequence

from django.db import DatabaseError

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from dashboard.observatory.models import IngestTransport

from .evaluations import EVALUATION_EVENT, Evaluations, evaluations_attach, log_evaluations, span_evaluations
from .common import (
    IngestBatch,
    IngestError,
    KeyCheck,
    authenticate_deferred,
    database_refusal,
    derivations_keep_up,
    ingest_gate,
    key_check_run,
)
from .group_commit import Pending, pending_store, pending_store_all
from .logs import logs_prepare
from .metrics import metrics_prepare
from .otlp import JSON, OtlpDecodeError, OtlpTooManySpans, decode_request
from .otlp_logs import OtlpTooManyLogs, decode_logs_request
from .otlp_metrics import OtlpTooManyPoints, decode_metrics_request
from .spans import spans_prepare

TRACES = "traces"
_MAX_REASONS = 5
LOGS = "logs"
METRICS = "metrics"
# The partial_success field counting rejected items, per signal (JSON name).
_REJECTED_KEYS = {TRACES: "rejectedSpans", LOGS: "rejectedLogRecords", METRICS: "rejectedDataPoints"}


@dataclass(frozen=True, slots=True)
class ExportOutcome:
    """What one export did: the items kept and stored (``stored`` new ones; the
    rest were already there, a retried batch), and the ones rejected on their own
    with the reasons (``partial_success``; a message alone is a warning: the
    evaluation events of stored spans that made no score)."""

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
        elif self.signal == LOGS:
            response = ExportLogsServiceResponse()
            if self.rejected:
                response.partial_success.rejected_log_records = self.rejected
        else:
            response = ExportMetricsServiceResponse()
            if self.rejected:
                response.partial_success.rejected_data_points = self.rejected
        if self.error_message:  # a warning when nothing was rejected (OTLP allows it)
            response.partial_success.error_message = self.error_message
        return response.SerializeToString()

    def response_json(self) -> bytes:
        if not self.rejected and not self.error_message:
            return b"{}"
        key = _REJECTED_KEYS[self.signal]
        return json.dumps(
            {"partialSuccess": {key: str(self.rejected), "errorMessage": self.error_message}}
        ).encode()

    def response(self, content_type: str) -> bytes:
        return self.response_json() if content_type == JSON else self.response_protobuf()


def otlp_export(*, signal: str, authorization: str, read_body: Callable[[], bytes], content_type: str,
                transport: str = IngestTransport.OTLP_HTTP) -> ExportOutcome:
    """Authenticate, read, decode and store one export request of ``signal``.

    Raises IngestError (with its HTTP status) for every refusal; nothing is stored
    then. ``read_body`` runs inside the gate, after the key is checked, and returns
    the decoded (inflated, bounded) body. ``transport`` (IngestTransport) is what a
    batch a broken database failed is counted by.
    """
    batch = IngestBatch(transport, signal=signal)
    with ingest_gate(batch):
        prepared = _prepare(ExportRequest(signal, authorization, read_body, content_type), batch)
        return prepared.outcome(pending_store(prepared.pending))


@dataclass(frozen=True, slots=True)
class ExportRequest:
    """One export as a transport received it (the arguments of ``otlp_export``)."""

    signal: str
    authorization: str
    read_body: Callable[[], bytes]
    content_type: str


def otlp_export_all(requests: Sequence[ExportRequest]) -> list[ExportOutcome | BaseException]:
    """Several export requests received together on one thread (the OTLP/HTTP
    receiver), stored together: each is checked, read and decoded in the gate on
    its own (a refusal is its outcome, an IngestError), then the writes of all run
    in group transactions (``pending_store_all``). Returns each request's outcome
    once they committed: an ExportOutcome, an IngestError (a database error is the
    503 or 500 ``database_refusal`` makes of it, the 500 reported with its request's
    batch), or the exception a write raised. A write that fails alone fails its own
    request only: the group commit runs the others again without it."""
    transport = IngestTransport.OTLP_RECEIVER
    prepared: list[_Prepared | BaseException] = []
    # A key is authenticated once for the requests that came together (for spans, a key
    # seen before is then checked by the group's span write, in its transaction; for
    # logs, read once now); one that fails is tried again by each request.
    keys: dict[tuple[str, str], Any] = {}

    def authenticate(header: str, signal: str) -> Any:
        found = keys.get((header, signal))
        if found is None:
            found = keys[header, signal] = _authenticate(header, signal)
        return found

    for request in requests:
        batch = IngestBatch(transport, signal=request.signal)
        try:
            with ingest_gate(batch):
                prepared.append(_prepare(request, batch, authenticate))
        except IngestError as exc:
            prepared.append(exc)
    ready = [item for item in prepared if isinstance(item, _Prepared)]
    with ingest_gate(IngestBatch(transport)):
        stored = iter(pending_store_all([item.pending for item in ready]))
    outcomes: list[ExportOutcome | BaseException] = []
    for item in prepared:
        if not isinstance(item, _Prepared):
            outcomes.append(item)
            continue
        result, error = next(stored)
        if error is None:
            outcomes.append(item.outcome(result))
        else:
            outcomes.append(database_refusal(error, item.batch) if isinstance(error, DatabaseError) else error)
    return outcomes


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A request checked and decoded, its write not yet run."""

    signal: str
    accepted: int
    rejected: int
    error_message: str
    pending: Pending[Any]
    batch: IngestBatch

    def outcome(self, stored: Any) -> ExportOutcome:
        return ExportOutcome(self.signal, self.accepted, stored.inserted, self.rejected, self.error_message)


def _authenticate(header: str, signal: str) -> tuple[Any, int, KeyCheck | None]:
    """The sender's project and key id; a key seen before is checked by the span
    write, in its transaction (``authenticate_deferred``), the other signals' now."""
    project, key_id, check = authenticate_deferred(header)
    if check is not None and signal != TRACES:
        key_check_run(check)
        check = None
    return project, key_id, check


def _prepare(request: ExportRequest, batch: IngestBatch,
             authenticate: Callable[[str, str], Any] = _authenticate) -> _Prepared:
    """Inside the gate: authenticate, read, decode, and prepare the write; what is
    learnt of the batch is written into ``batch`` as it goes."""
    project, key_id, check = authenticate(request.authorization, request.signal)
    batch.project_id = project.pk
    derivations_keep_up()
    body = request.read_body()
    batch.nbytes = len(body)
    if request.signal == TRACES:
        decoded = _decoded(decode_request, body, request.content_type, OtlpTooManySpans)
        batch.items, batch.item_name = len(decoded.spans), "spans"
        evaluations = span_evaluations(project, decoded.spans)
        pending = spans_prepare(project=project, spans=decoded.spans, key_check=check)
        pending = evaluations_attach(pending, project=project, key_id=key_id, evaluations=evaluations)
        # The spans are stored: their events that made no score are a warning, not rejected spans.
        message = "; ".join(filter(None, [decoded.error_message, _evaluations_message(evaluations, "span event(s)")]))
        return _Prepared(TRACES, len(decoded.spans), decoded.rejected, message, pending, batch)
    if request.signal == LOGS:
        decoded = _decoded(decode_logs_request, body, request.content_type, OtlpTooManyLogs)
        evaluations = log_evaluations(project, decoded.logs)
        if evaluations.refused:  # a log record that is an evaluation making no score is rejected
            refused = evaluations.refused_positions()
            decoded.logs = [log for position, log in enumerate(decoded.logs) if position not in refused]
            for _, _, reason in evaluations.refused:
                decoded.reject(f"{EVALUATION_EVENT} {reason}")
        batch.items, batch.item_name = len(decoded.logs), "log records"
        pending = logs_prepare(project=project, logs=decoded.logs)
        pending = evaluations_attach(pending, project=project, key_id=key_id, evaluations=evaluations)
        return _Prepared(LOGS, len(decoded.logs), decoded.rejected, decoded.error_message, pending, batch)
    if request.signal == METRICS:
        decoded = _decoded(decode_metrics_request, body, request.content_type, OtlpTooManyPoints)
        batch.items, batch.item_name = decoded.accepted, "data points"
        pending = metrics_prepare(project=project, metrics=decoded)
        return _Prepared(METRICS, decoded.accepted, decoded.rejected, decoded.error_message, pending, batch)
    raise ValueError(f"unknown signal {request.signal!r}")


def _evaluations_message(evaluations: Evaluations, what: str) -> str:
    if not evaluations.refused:
        return ""
    return f"{len(evaluations.refused)} {EVALUATION_EVENT} {what} made no score: " + "; ".join(
        evaluations.reasons()[:_MAX_REASONS])


def _decoded(decode: Callable[[bytes, str], Any], body: bytes, content_type: str, too_many: type) -> Any:
    try:
        return decode(body, content_type)
    except too_many as exc:
        raise IngestError(413, str(exc)) from None
    except OtlpDecodeError as exc:
        raise IngestError(400, str(exc)) from None
