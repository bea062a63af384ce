"""OTLP/gRPC (dashboard.ingest.grpc_server): the server runs in this process on a free
loopback port; clients are real gRPC channels sending the bytes an exporter sends.
Storing, partial success, gzip, and every refusal (a gRPC status, nothing stored)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from dashboard.accounts.models import Project
from dashboard.accounts.services import apikey_create, project_create
from dashboard.ingest import common
from dashboard.ingest.common import IngestError
from dashboard.ingest.grpc_server import LOGS_SERVICE, METRICS_SERVICE, TRACE_SERVICE, grpc_server_build, status_of
from dashboard.observatory.models import IngestTransport, LogRecord, Span

from .conftest import alive, spans_stored, until_gone
from .database_faults import broken_reports, broken_table, busy_database, faults, names_nothing_internal
from .test_otlp_logs import make_logs

pytestmark = pytest.mark.django_db(transaction=True)
TRACES = f"/{TRACE_SERVICE}/Export"
LOGS = f"/{LOGS_SERVICE}/Export"
METRICS = f"/{METRICS_SERVICE}/Export"
START = 1_700_000_000_000_000_000


@pytest.fixture
def key():
    project = project_create(name="gRPC agents")
    return apikey_create(project=project)[1]


@pytest.fixture
def server(settings):
    settings.OBSERVATORY_MAX_CONCURRENT_INGEST = 2
    running, port = grpc_server_build(port=0, threads=2)
    running.start()
    yield port
    running.stop(0).wait()


def channel_to(port: int, compression=None, *, fresh: bool = False):
    # fresh: a connection of its own (not one of the process-wide pool's, which other channels share)
    options = [("grpc.use_local_subchannel_pool", 1)] if fresh else []
    return grpc.insecure_channel(f"127.0.0.1:{port}", compression=compression, options=options)


def call(port: int, method: str, body: bytes, key: str | None, *, compression=None, timeout: float = 20,
         fresh: bool = False):
    metadata = (("authorization", f"Bearer {key}"),) if key else ()
    with channel_to(port, compression, fresh=fresh) as channel:
        return channel.unary_unary(method)(body, metadata=metadata, timeout=timeout)


def spans_request(count: int = 3, *, name: str = "chat", big: str = "") -> bytes:
    request = ExportTraceServiceRequest()
    scope_spans = request.resource_spans.add().scope_spans.add()
    for index in range(count):
        span = scope_spans.spans.add()
        span.trace_id = bytes.fromhex("ab" * 16)
        span.span_id = (index + 1).to_bytes(8, "big")
        span.name = name
        span.start_time_unix_nano, span.end_time_unix_nano = START, START + 1000
        if big:
            span.attributes.append(KeyValue(key="big", value=AnyValue(string_value=big)))
    return request.SerializeToString()


def refusal(port, method, body, key, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(port, method, body, key, **kwargs)
    return caught.value


def test_it_stores_spans_and_answers_after_commit(server, key):
    answer = ExportTraceServiceResponse.FromString(call(server, TRACES, spans_request(3), key))
    assert answer == ExportTraceServiceResponse()
    assert Span.objects.count() == 3


def test_it_stores_a_retried_batch_once(server, key):
    call(server, TRACES, spans_request(3), key)
    call(server, TRACES, spans_request(3), key)
    assert Span.objects.count() == 3


def test_it_takes_gzip(server, key):
    call(server, TRACES, spans_request(5), key, compression=grpc.Compression.Gzip)
    assert Span.objects.count() == 5


def test_it_answers_partial_success(server, key):
    request = ExportTraceServiceRequest.FromString(spans_request(2))
    request.resource_spans[0].scope_spans[0].spans[0].trace_id = bytes(16)
    answer = ExportTraceServiceResponse.FromString(call(server, TRACES, request.SerializeToString(), key))
    assert answer.partial_success.rejected_spans == 1
    assert "trace_id is all zeros" in answer.partial_success.error_message
    assert Span.objects.count() == 1


def test_it_stores_logs(server, key):
    answer = ExportLogsServiceResponse.FromString(call(server, LOGS, make_logs(4).SerializeToString(), key))
    assert answer == ExportLogsServiceResponse()
    assert LogRecord.objects.count() == 4


def test_it_stores_metrics_and_refuses_them_malformed_or_without_a_key(server, key):
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

    from dashboard.metrics.models import MetricHour

    from .test_otlp_metrics import MINUTE, START as METRIC_START, tool_calls

    body = tool_calls([(METRIC_START + MINUTE, 6)]).SerializeToString()
    assert refusal(port=server, method=METRICS, body=body, key=None).code() == grpc.StatusCode.UNAUTHENTICATED
    assert refusal(port=server, method=METRICS, body=b"\x0a\xff\xff", key=key).code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not MetricHour.objects.exists()
    answer = ExportMetricsServiceResponse.FromString(call(server, METRICS, body, key))
    assert answer == ExportMetricsServiceResponse()
    assert MetricHour.objects.get(name="ba.tool.calls").value == 6.0


@pytest.mark.parametrize("header", [None, "po_0123456789abcdef_" + "x" * 43])
def test_it_refuses_a_wrong_or_missing_key(server, header):
    error = refusal(server, TRACES, spans_request(1), header)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert not Span.objects.exists()


@pytest.mark.parametrize("body", [b"\x0a\xff\xff\xff\xff\x0f", b"garbage \xff\xfe not protobuf"])
@pytest.mark.parametrize("method", [TRACES, LOGS])
def test_it_refuses_malformed_protobuf(server, key, body, method):
    error = refusal(server, method, body, key)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "invalid protobuf" in error.details()
    assert not Span.objects.exists() and not LogRecord.objects.exists()


@pytest.mark.parametrize("method", [f"/{TRACE_SERVICE}/Nope", f"/{METRICS_SERVICE}/Nope",
                                    "/no.such.Service/Export"])
def test_it_answers_unimplemented_for_unknown_services_and_methods(server, key, method):
    assert refusal(server, method, spans_request(1), key).code() == grpc.StatusCode.UNIMPLEMENTED


def test_it_refuses_an_oversize_message_before_decoding(settings, key):
    settings.OBSERVATORY_MAX_DECODED_BYTES = 64 * 1024
    running, port = grpc_server_build(port=0, threads=1)
    running.start()
    try:
        error = refusal(port, TRACES, spans_request(1, big="x" * 100_000), key)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # A gzip bomb: 100 KB of 'x' is ~200 bytes on the wire, refused once inflated.
        bomb = refusal(port, TRACES, spans_request(1, big="x" * 100_000), key, compression=grpc.Compression.Gzip)
        assert bomb.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        running.stop(0).wait()
    assert not Span.objects.exists()


def test_it_refuses_a_batch_over_the_memory_budget_for_good(settings, server, key):
    settings.OBSERVATORY_INGEST_MEMORY_BYTES = 1024 * 1024
    error = refusal(server, TRACES, spans_request(2000, big="y" * 500), key)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _retry_delay(error) is None  # too large is not retried
    assert not Span.objects.exists()


def test_it_answers_retry_info_when_it_cannot_take_a_batch_now(settings, server, key):
    settings.OBSERVATORY_MAX_CONCURRENT_INGEST = 1
    with common.ingest_gate():  # another export holds the only place
        error = refusal(server, TRACES, spans_request(1), key)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _retry_delay(error) == 1
    assert not Span.objects.exists()


def test_it_maps_busy_database_to_unavailable_with_retry_info():
    code, details = status_of(IngestError(503, "database busy, retry later", retry_after=2))
    assert code == grpc.StatusCode.UNAVAILABLE
    status = status_pb2.Status.FromString(details)
    info = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(info) and info.retry_delay.seconds == 2


def test_it_serves_others_while_a_sender_stalls_mid_message(settings, key):
    running, port = grpc_server_build(port=0, threads=1)
    running.start()
    stalled = socket.create_connection(("127.0.0.1", port))
    try:
        # An HTTP/2 preface and half a frame header, then nothing: gRPC buffers it
        # at the transport; no handler thread is taken.
        stalled.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00")
        time.sleep(0.5)
        call(port, TRACES, spans_request(2), key, timeout=10)
    finally:
        stalled.close()
        running.stop(0).wait()
    assert Span.objects.count() == 2


def test_it_lets_the_sdk_exporter_retry_after_backpressure(settings, server, key):
    """The real gRPC exporter reads RetryInfo, waits, sends again: stored once."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("t").start_as_current_span("retried"):
        pass
    settings.OBSERVATORY_MAX_CONCURRENT_INGEST = 1
    held, release = threading.Event(), threading.Event()

    def hold_the_gate():
        with common.ingest_gate():
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold_the_gate)
    holder.start()
    held.wait(5)
    threading.Timer(0.5, release.set).start()
    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{server}", insecure=True,
                                headers=(("authorization", f"Bearer {key}"),), timeout=20)
    try:
        assert exporter.export(memory.get_finished_spans()) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
        release.set()
        holder.join()
    assert list(Span.objects.values_list("name", flat=True)) == ["retried"]


def _retry_delay(error: grpc.RpcError) -> int | None:
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.RetryInfo()
                if detail.Unpack(info):
                    return info.retry_delay.seconds
    return None


# --- a busy database and a broken one, for real ------------------------------------

def test_a_really_busy_database_is_unavailable_with_retry_info(server, key, monkeypatch, caplog):
    with busy_database(monkeypatch, "observatory_span"):
        error = refusal(server, TRACES, spans_request(2), key)
    assert (error.code(), error.details()) == (grpc.StatusCode.UNAVAILABLE, "database busy, retry later")
    assert _retry_delay(error) == 2
    assert not Span.objects.exists() and not broken_reports(caplog)


def test_a_broken_database_is_internal_without_retry_info_logged_and_counted_once(server, key, caplog):
    """INTERNAL is not among OTLP's retryable codes: the exporter drops the batch
    instead of sending it forever; the status names nothing of the database."""
    with broken_table("observatory_span"):
        error = refusal(server, TRACES, spans_request(4), key)
    assert error.code() == grpc.StatusCode.INTERNAL and _retry_delay(error) is None
    assert names_nothing_internal(error.details())
    assert not Span.objects.exists()
    project = Project.objects.get(name="gRPC agents")
    (report,) = broken_reports(caplog)
    assert f"project {project.pk}" in report.getMessage() and "4 spans" in report.getMessage()
    assert faults(IngestTransport.OTLP_GRPC, project) == 1


def _manage_otlp_grpc(env) -> tuple[subprocess.Popen, int, list[str]]:
    """``manage.py otlp_grpc --processes 2`` on a free port; (it, the port, its processes' pids)."""
    from benchmarks.bench_ingest import free_port

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "manage.py", "otlp_grpc", "--port", str(port), "--processes", "2"],
        cwd=Path(__file__).resolve().parents[3], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    pids = [process.stdout.readline().split("process ")[1].rstrip(")\n") for _ in range(2)]
    return process, port, pids


def _span(index: int) -> bytes:
    request = ExportTraceServiceRequest.FromString(spans_request(1))
    request.resource_spans[0].scope_spans[0].spans[0].span_id = (index + 1).to_bytes(8, "big")
    return request.SerializeToString()


def _stop_all(process: subprocess.Popen, pids: list[str]) -> None:
    """Whatever a failed test left running: the parent and its processes (killing the
    parent alone leaves them serving)."""
    for pid in pids:
        if alive(pid):
            os.kill(int(pid), signal.SIGKILL)
    if process.poll() is None:
        process.kill()
        process.wait()


def test_manage_otlp_grpc_serves_one_port_from_several_processes_and_stops_on_sigterm(own_database):
    """``manage.py otlp_grpc --processes 2``: two processes on the port (SO_REUSEPORT),
    each storing; SIGTERM to the parent stops both."""
    env, own_key = own_database
    process, port, pids = _manage_otlp_grpc(env)
    try:
        assert len(set(pids)) == 2  # two processes listening on one port
        for index in range(6):
            call(port, TRACES, _span(index), own_key)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert not any(alive(pid) for pid in pids)
    finally:
        _stop_all(process, pids)
    assert spans_stored(env) == 6


def _as_an_exporter(send, attempts: int = 3):
    """Send as OpenTelemetry's exporters do: UNAVAILABLE is retried (a connection the kernel
    had handed to the killed process's listener is reset)."""
    for attempt in range(attempts):
        try:
            return send()
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE or attempt == attempts - 1:
                raise
            time.sleep(0.2)


def test_manage_otlp_grpc_keeps_serving_when_a_process_is_killed(own_database):
    """A process killed with -9: the other one takes the port's new connections,
    every batch sent after is stored once; SIGTERM then stops the rest, and the
    parent says one failed (exit status 1)."""
    env, own_key = own_database
    process, port, pids = _manage_otlp_grpc(env)
    try:
        call(port, TRACES, _span(0), own_key, fresh=True)
        os.kill(int(pids[0]), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while alive(pids[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        for index in range(1, 7):  # a new connection each: the kernel picks a listener each time
            _as_an_exporter(lambda: call(port, TRACES, _span(index), own_key, fresh=True))
        assert alive(pids[1])
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 1
        assert not alive(pids[1])
    finally:
        _stop_all(process, pids)
    assert spans_stored(env) == 7


def test_manage_otlp_grpc_s_processes_stop_when_their_parent_is_killed(own_database):
    """kill -9 of ``manage.py otlp_grpc --processes 2``: its processes do not go on
    serving the port unsupervised (the kernel stops them: PR_SET_PDEATHSIG)."""
    env, _ = own_database
    process, _, pids = _manage_otlp_grpc(env)
    try:
        process.kill()
        process.wait()
        until_gone(pids, "processes still serving after their parent was killed")
    finally:
        _stop_all(process, pids)
