"""The OTLP/HTTP receiver (dashboard.ingest.receiver): served from a thread of this
process on a free loopback port (its loop, its own database connection), spoken to
over real sockets with the bytes an exporter sends. Storing, pipelined requests
stored as one group with each its own answer, and every refusal: a short 4xx,
nothing stored. The forked processes of ``manage.py otlp_http`` and the real
exporters are in test_interop_python.py / test_interop_js.py and below."""

from __future__ import annotations

import asyncio
import copy
import gzip
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import OperationalError, connection
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from dashboard.accounts.services import apikey_create, project_create
from dashboard.ingest import receiver as receiver_module
from dashboard.ingest import spans as spans_module
from dashboard.observatory.models import IngestTransport, LogRecord, Span

from .database_faults import (
    broken_reports,
    broken_table,
    busy_database,
    faults,
    names_nothing_internal,
    poisoned_spans,
)
from .test_grpc_server import spans_request
from .test_otlp_logs import make_logs

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[3]
PROTOBUF = "application/x-protobuf"


@pytest.fixture
def key():
    return apikey_create(project=project_create(name="receiver agents"))[1]


class Running:
    """serve_socket on a thread of its own (limits as the settings are now), stopped
    gracefully at the end."""

    def __init__(self, monkeypatch, *, sock: socket.socket | None = None,
                 balance: receiver_module.Balance | None = None) -> None:
        monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # what the served process sets for itself
        self.sock = sock or receiver_module.listening_socket("127.0.0.1", 0)
        self.balance = balance
        self.port = self.sock.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.receiver = receiver_module.Receiver(self.loop)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.loop.run_until_complete(
                receiver_module.serve_socket(self.sock, self.stop, grace=5, receiver=self.receiver,
                                             balance=self.balance))
        finally:
            connection.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(15)
        self.sock.close()


@pytest.fixture
def served(settings, monkeypatch):
    settings.OBSERVATORY_BODY_READ_TIMEOUT = 2
    settings.OBSERVATORY_OTLP_HTTP_IDLE_TIMEOUT = 2
    running = Running(monkeypatch)
    yield running
    running.close()


def post(port: int, body: bytes, key: str | None, *, path: str = "/v1/traces", content_type: str = PROTOBUF,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        sent = {"Content-Type": content_type, **({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
        client.request("POST", path, body=body, headers=sent)
        response = client.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        client.close()


def raw(port: int, data: bytes, *, read_until_closed: bool = True, timeout: float = 15) -> bytes:
    """Send bytes as they are; what came back until the server closed (or the timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        while read_until_closed:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        return received


def request_bytes(body: bytes, key: str, *, path: str = "/v1/traces", content_type: str = PROTOBUF) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def answers(data: bytes) -> list[tuple[int, bytes]]:
    """The (status, body) of each HTTP/1.1 answer in ``data``, in order."""
    found = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length"))
        found.append((status, rest[:length]))
        data = rest[length:]
    return found


def test_it_stores_spans_and_answers_after_the_commit(served, key):
    status, headers, body = post(served.port, spans_request(3), key)
    assert (status, headers["content-type"]) == (200, PROTOBUF)
    assert ExportTraceServiceResponse.FromString(body) == ExportTraceServiceResponse()
    assert Span.objects.count() == 3  # committed when the answer came


def test_groups_reuse_the_process_s_database_connections(served, key):
    """The loop runs each callback in a copied context and Django keeps connections in a
    context variable: each group opened (and leaked) a connection of its own until the
    receiver ran them in one context. Now: one."""
    from django.db.backends.signals import connection_created

    opened = []
    connection_created.connect(lambda **kwargs: opened.append(kwargs["connection"]), weak=False,
                               dispatch_uid="receiver-test")
    try:
        for index in range(8):
            request = ExportTraceServiceRequest.FromString(spans_request(1))
            request.resource_spans[0].scope_spans[0].spans[0].span_id = (index + 1).to_bytes(8, "big")
            assert post(served.port, request.SerializeToString(), key)[0] == 200
    finally:
        connection_created.disconnect(dispatch_uid="receiver-test")
    assert Span.objects.count() == 8 and len(opened) <= 1


def test_it_stores_logs_json_and_gzip(served, key):
    status, _, body = post(served.port, make_logs(4).SerializeToString(), key, path="/v1/logs")
    assert status == 200 and ExportLogsServiceResponse.FromString(body) == ExportLogsServiceResponse()
    as_json = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "ab" * 16, "spanId": f"{index:016x}", "name": "json",
         "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000000000001000"}
        for index in (1, 2)]}]}]}).encode()
    status, headers, body = post(served.port, gzip.compress(as_json), key, content_type="application/json",
                                 headers={"Content-Encoding": "gzip"})
    assert (status, headers["content-type"], body) == (200, "application/json", b"{}")
    assert LogRecord.objects.count() == 4 and Span.objects.count() == 2


def test_it_stores_metrics_and_refuses_a_wrong_key_for_them(served, key):
    from dashboard.metrics.models import MetricHour

    from .test_otlp_metrics import MINUTE, START, tool_calls

    body = gzip.compress(tool_calls([(START + MINUTE, 5)]).SerializeToString())
    assert post(served.port, body, None, path="/v1/metrics", headers={"Content-Encoding": "gzip"})[0] == 401
    assert not MetricHour.objects.exists()
    status, _, answer = post(served.port, body, key, path="/v1/metrics", headers={"Content-Encoding": "gzip"})
    assert status == 200 and ExportMetricsServiceResponse.FromString(answer) == ExportMetricsServiceResponse()
    assert MetricHour.objects.get(name="ba.tool.calls").value == 5.0


def test_it_takes_a_chunked_body(served, key):
    body = spans_request(5)
    chunks = b"".join(f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in (body[:100], body[100:]))
    head = (f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTOBUF}\r\nAuthorization: Bearer {key}\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode()
    assert [status for status, _ in answers(raw(served.port, head + chunks + b"0\r\n\r\n"))] == [200]
    assert Span.objects.count() == 5


def test_it_answers_partial_success(served, key):
    request = ExportTraceServiceRequest.FromString(spans_request(2))
    request.resource_spans[0].scope_spans[0].spans[0].trace_id = bytes(16)
    status, _, body = post(served.port, request.SerializeToString(), key)
    answer = ExportTraceServiceResponse.FromString(body)
    assert status == 200 and answer.partial_success.rejected_spans == 1
    assert Span.objects.count() == 1


def test_requests_sent_together_are_stored_as_one_group_each_with_its_answer(served, key):
    """Four pipelined requests in one packet: one group, answered in order; the bad
    ones refused alone, the good ones of the same group stored."""
    good_a = ExportTraceServiceRequest.FromString(spans_request(2, name="a"))
    good_b = ExportTraceServiceRequest.FromString(spans_request(3, name="b"))
    for index, span in enumerate(good_b.resource_spans[0].scope_spans[0].spans):
        span.span_id = (100 + index).to_bytes(8, "big")
    data = (request_bytes(good_a.SerializeToString(), key)
            + request_bytes(spans_request(1), "po_0123456789abcdef_" + "x" * 43)
            + request_bytes(b"garbage \xff\xfe not protobuf", key)
            + request_bytes(good_b.SerializeToString(), key).replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n"))
    before = served.receiver.groups
    got = answers(raw(served.port, data))
    assert [status for status, _ in got] == [200, 401, 400, 200]
    assert status_pb2.Status.FromString(got[1][1]).message == "invalid API key"
    assert "invalid protobuf" in status_pb2.Status.FromString(got[2][1]).message
    assert sorted(Span.objects.values_list("name", flat=True)) == ["a", "a", "b", "b", "b"]
    assert served.receiver.groups - before == 1


def test_a_revoked_key_is_refused_from_the_next_request(served):
    """Requests of one group share one check of their key; a revocation still holds at once."""
    from dashboard.accounts.services import apikey_revoke

    api_key, text = apikey_create(project=project_create(name="revoked"))
    together = request_bytes(spans_request(1), text) + request_bytes(spans_request(2), text).replace(
        b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n")
    assert [status for status, _ in answers(raw(served.port, together))] == [200, 200]
    apikey_revoke(key=api_key)
    status, _, body = post(served.port, spans_request(3), text)
    assert (status, status_pb2.Status.FromString(body).message) == (401, "revoked API key")
    assert Span.objects.count() == 2


def test_a_malformed_request_after_a_pipelined_one_is_refused_after_its_answer(served, key):
    got = answers(raw(served.port, request_bytes(spans_request(2), key) + b"NOT HTTP\r\n\r\n"))
    assert [status for status, _ in got] == [200, 400]  # in the order sent, then closed
    assert Span.objects.count() == 2


def test_a_database_error_is_a_503_with_retry_after_and_stores_nothing_fake_database(served, key, monkeypatch):
    """The database failing under the write (faked at that edge: the insert raises
    what a locked SQLite raises) is a 503 the exporter retries, nothing half-stored."""
    def locked(*args, **kwargs):
        raise OperationalError("database is locked")

    monkeypatch.setattr(spans_module, "_insert", locked)
    status, headers, body = post(served.port, spans_request(2), key)
    assert (status, headers["retry-after"]) == (503, "2")
    assert status_pb2.Status.FromString(body).message == "database busy, retry later"
    assert not Span.objects.exists()


def test_a_429_for_the_backlog_keeps_the_keep_alive_connection(served, key, settings, monkeypatch):
    """The receiver reads a request whole before it stores it, so a batch refused
    because the derivations are behind (``derivations_keep_up``) leaves the
    connection clean: the next request on it is answered too, on the same socket."""
    from datetime import timedelta

    from django.utils import timezone

    from dashboard.accounts.models import Project
    from dashboard.ingest import common
    from dashboard.observatory.models import DerivationNote

    settings.OBSERVATORY_DERIVE_BACKLOG_SECONDS = 10
    monkeypatch.setattr(common, "BACKLOG_READ_EVERY", 0.0)
    now = timezone.now()
    DerivationNote.objects.create(project=Project.objects.get(), available_at=now - timedelta(hours=1),
                                  claimed_until=now + timedelta(hours=1))  # an hour behind, a drainer at work
    body = ExportTraceServiceRequest.FromString(spans_request(1))
    body.resource_spans[0].scope_spans[0].spans[0].name = "x" * 300_000  # more than one read of the socket
    client = http.client.HTTPConnection("127.0.0.1", served.port, timeout=15)
    try:
        seen = []
        for _ in range(2):
            client.request("POST", "/v1/traces", body=body.SerializeToString(),
                           headers={"Content-Type": PROTOBUF, "Authorization": f"Bearer {key}"})
            response = client.getresponse()
            response.read()
            seen.append((response.status, response.getheader("Retry-After"), response.getheader("Connection"),
                         client.sock.getsockname() if client.sock else None))
    finally:
        client.close()
    assert [(status, retry_after, said) for status, retry_after, said, _ in seen] == [(429, "2", None)] * 2
    assert seen[0][3] is not None and seen[0][3] == seen[1][3]  # one connection carried both
    assert not Span.objects.exists()


def test_a_really_busy_database_is_a_503_with_retry_after(served, key, monkeypatch, caplog):
    with busy_database(monkeypatch, "observatory_span"):
        status, headers, body = post(served.port, spans_request(2), key)
    assert (status, headers["retry-after"]) == (503, "2")
    assert status_pb2.Status.FromString(body).message == "database busy, retry later"
    assert not Span.objects.exists() and not broken_reports(caplog)


def test_a_broken_database_is_a_500_naming_nothing_logged_and_counted_once(served, key, caplog):
    with broken_table("observatory_span"):
        status, headers, body = post(served.port, spans_request(3), key)
    assert status == 500 and "retry-after" not in headers
    assert names_nothing_internal(status_pb2.Status.FromString(body).message)
    assert not Span.objects.exists()
    (report,) = broken_reports(caplog)
    assert "3 spans" in report.getMessage()
    assert faults(IngestTransport.OTLP_RECEIVER, _receiver_project()) == 1


def test_a_request_the_database_fails_for_good_fails_alone_in_its_group(served, key, caplog):
    """Three pipelined requests, one group; the database refuses the spans of the
    middle one (a trigger): that one gets the 500, logged and counted once (not once
    for the group's try and once alone), and the two others of its group are stored."""
    good_a = ExportTraceServiceRequest.FromString(spans_request(2, name="a"))
    poisoned = ExportTraceServiceRequest.FromString(spans_request(1, name="poison"))
    good_b = ExportTraceServiceRequest.FromString(spans_request(3, name="b"))
    for offset, request in ((100, poisoned), (200, good_b)):
        for index, span in enumerate(request.resource_spans[0].scope_spans[0].spans):
            span.span_id = (offset + index).to_bytes(8, "big")
    data = (request_bytes(good_a.SerializeToString(), key) + request_bytes(poisoned.SerializeToString(), key)
            + request_bytes(good_b.SerializeToString(), key).replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n"))
    before = served.receiver.groups
    with poisoned_spans("poison"):
        got = answers(raw(served.port, data))
    assert [status for status, _ in got] == [200, 500, 200]
    assert served.receiver.groups - before == 1
    assert names_nothing_internal(status_pb2.Status.FromString(got[1][1]).message)
    assert sorted(Span.objects.values_list("name", flat=True)) == ["a", "a", "b", "b", "b"]
    (report,) = broken_reports(caplog)
    assert "1 spans" in report.getMessage()
    assert faults(IngestTransport.OTLP_RECEIVER, _receiver_project()) == 1


def _receiver_project():
    from dashboard.accounts.models import Project

    return Project.objects.get(name="receiver agents")


@pytest.mark.parametrize("data, status", [
    (b"GET /v1/traces HTTP/1.1\r\nHost: x\r\n\r\n", 405),
    (b"POST /v1/profiles HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 404),
    (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi", 415),
    (b"this is not HTTP at all\r\n\r\n", 400),
    (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400),
    (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nUpgrade: h2c\r\n"
     b"Connection: Upgrade\r\nContent-Length: 0\r\n\r\n", 400),
    (b"POST /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    (b"POST /v1/traces HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(101)) + b"\r\n", 431),
    (b"POST /v1/traces HTTP/1.1\r\nX-Big: " + b"y" * 70_000 + b"\r\n\r\n", 431),
], ids=["get", "unknown-path", "content-type", "not-http", "negative-length", "length-and-chunked", "upgrade",
        "long-url", "many-headers", "huge-header"])
def test_it_refuses_malformed_and_hostile_requests_and_closes(served, data, status):
    got = answers(raw(served.port, data))  # read until the server closed
    assert [code for code, _ in got] == [status]
    assert not Span.objects.exists()


def test_it_refuses_a_wrong_key_malformed_protobuf_and_a_bad_encoding(served, key):
    assert post(served.port, spans_request(1), None)[0] == 401
    assert post(served.port, spans_request(1), "po_0123456789abcdef_" + "x" * 43)[0] == 401
    assert post(served.port, b"\x0a\xff\xff\xff\xff\x0f", key)[0] == 400
    assert post(served.port, spans_request(1), key, headers={"Content-Encoding": "br"})[0] == 415
    assert post(served.port, b"not gzip", key, headers={"Content-Encoding": "gzip"})[0] == 400
    assert not Span.objects.exists()


def test_it_refuses_an_oversize_body_as_it_arrives(settings, monkeypatch, key):
    settings.OBSERVATORY_MAX_BODY_BYTES = 64 * 1024
    settings.OBSERVATORY_MAX_DECODED_BYTES = 64 * 1024
    running = Running(monkeypatch)  # the limits are read when it starts
    try:
        big = spans_request(1, big="x" * 100_000)
        assert post(running.port, big, key)[0] == 413  # its declared length is over the limit
        chunk = b"%x\r\n" % len(big) + big + b"\r\n0\r\n\r\n"
        head = (f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTOBUF}\r\nAuthorization: Bearer {key}\r\n"
                "Transfer-Encoding: chunked\r\n\r\n").encode()
        assert [code for code, _ in answers(raw(running.port, head + chunk))] == [413]  # counted as it came
        bomb = gzip.compress(big)  # small on the wire, over the limit once inflated
        assert len(bomb) < 64 * 1024 and post(running.port, bomb, key, headers={"Content-Encoding": "gzip"})[0] == 413
    finally:
        running.close()
    assert not Span.objects.exists()


def test_bodies_held_at_once_stay_within_the_memory_budget(settings, monkeypatch, key):
    """1,024 senders of 8 MiB would be 8 GiB: what all connections hold unanswered is
    bounded; past it a request is refused (503, retry; 413 when it alone is larger)."""
    settings.OBSERVATORY_INGEST_MEMORY_BYTES = 1024 * 1024
    running = Running(monkeypatch)
    small = spans_request(1, big="s" * 100_000)
    try:
        with socket.create_connection(("127.0.0.1", running.port), timeout=15) as holder:
            held = request_bytes(spans_request(1, big="h" * 1_000_000), key)
            holder.sendall(held[:-10])  # about 1 MB held, not complete
            time.sleep(0.3)
            status, headers, _ = post(running.port, small, key)
            assert (status, headers["retry-after"]) == (503, "2")
            assert post(running.port, spans_request(1, big="l" * 1_200_000), key)[0] == 413  # never fits
            holder.sendall(held[-10:])
            # Complete, it is decoded under the request's own budget (twice its size): too big.
            assert answers(holder.recv(65536))[0][0] == 413
        assert post(running.port, small, key)[0] == 200  # room again
        assert running.receiver.held == 0
    finally:
        running.close()
    assert Span.objects.count() == 1


def test_a_stalled_sender_gets_408_while_others_are_served(served, key):
    with socket.create_connection(("127.0.0.1", served.port), timeout=15) as stalled:
        stalled.sendall(request_bytes(spans_request(2), key)[:-10])  # all but the last 10 bytes
        assert post(served.port, spans_request(3), key)[0] == 200  # served meanwhile
        started = time.monotonic()
        got = b""
        while chunk := stalled.recv(65536):
            got += chunk
        assert answers(got)[0][0] == 408 and time.monotonic() - started < 10
    assert Span.objects.count() == 3


def test_an_idle_connection_is_closed_after_its_timeout(served, key):
    with socket.create_connection(("127.0.0.1", served.port), timeout=15) as idle:
        idle.sendall(request_bytes(spans_request(1), key))
        first = idle.recv(65536)
        assert answers(first)[0][0] == 200
        started = time.monotonic()
        assert idle.recv(65536) == b""  # closed by the server, not before the idle timeout
        assert 1.5 < time.monotonic() - started < 10


def test_connections_past_the_limit_get_503_and_are_closed(settings, monkeypatch, key):
    settings.OBSERVATORY_OTLP_HTTP_MAX_CONNECTIONS = 2
    running = Running(monkeypatch)
    try:
        held = [socket.create_connection(("127.0.0.1", running.port), timeout=15) for _ in range(2)]
        time.sleep(0.2)
        got = answers(raw(running.port, b""))
        assert got[0][0] == 503
        for sock in held:
            sock.close()
        time.sleep(0.2)
        assert post(running.port, spans_request(1), key)[0] == 200  # a place again
    finally:
        running.close()


def test_stopping_answers_the_requests_already_read(settings, monkeypatch, key):
    """Stop while a request waits for its group: it is stored and answered, then closed."""
    running = Running(monkeypatch)
    inside, release = threading.Event(), threading.Event()
    original = spans_module._insert

    def slow_insert(rows):
        inside.set()
        assert release.wait(10)
        return original(rows)

    monkeypatch.setattr(spans_module, "_insert", slow_insert)
    outcome = {}
    sender = threading.Thread(target=lambda: outcome.update(status=post(running.port, spans_request(2), key)[0]))
    sender.start()
    assert inside.wait(10)
    running.loop.call_soon_threadsafe(running.stop.set)
    release.set()
    sender.join(15)
    running.thread.join(15)
    running.sock.close()
    assert outcome == {"status": 200} and Span.objects.count() == 2
    with pytest.raises(OSError):
        post(running.port, spans_request(1), key)  # no longer listening


@pytest.fixture
def own_database(tmp_path):
    """A database file of its own (the served processes are other processes), its key."""
    from benchmarks.bench_ingest import manage
    from benchmarks.load import django_env

    env = {**django_env(tmp_path, ""), "OBSERVATORY_DERIVE_INLINE": "0"}
    env.pop("PYTEST_CURRENT_TEST", None)
    manage(env, "migrate", "--noinput")
    code = ("from dashboard.accounts.services import project_create, apikey_create\n"
            "print(apikey_create(project=project_create(name='p'))[1])\n")
    return env, manage(env, "shell", "-c", code).strip().splitlines()[-1]


def _otlp_http(env: dict[str, str], port: int) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "manage.py", "otlp_http", "--port", str(port), "--processes", "2"],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert "listening" in process.stdout.readline()
    return process


def test_the_served_processes_survive_kill_9_of_one_and_stop_on_sigterm(own_database):
    """``manage.py otlp_http --processes 2``: a child killed with -9 is replaced and the
    port keeps answering; SIGTERM stops them all."""
    from benchmarks.bench_ingest import free_port, manage

    env, own_key = own_database
    port = free_port()
    process = _otlp_http(env, port)
    try:
        children = _children(process.pid, 2)
        assert post(port, spans_request(2), own_key)[0] == 200
        os.kill(children[0], signal.SIGKILL)
        replaced = _children(process.pid, 2, without=children[0])
        request = ExportTraceServiceRequest.FromString(spans_request(2))
        for index, span in enumerate(request.resource_spans[0].scope_spans[0].spans):
            span.span_id = (50 + index).to_bytes(8, "big")
        for _ in range(4):  # whichever process takes the connection
            assert post(port, request.SerializeToString(), own_key)[0] == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert all(not Path(f"/proc/{pid}").exists() for pid in replaced)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    count = manage(env, "shell", "-c", "from dashboard.observatory.models import Span; print(Span.objects.count())")
    assert count.strip().splitlines()[-1] == "4"


def test_the_served_processes_stop_when_their_parent_is_killed(own_database):
    from benchmarks.bench_ingest import free_port

    env, _ = own_database
    process = _otlp_http(env, free_port())
    children = _children(process.pid, 2)
    process.kill()
    process.wait()
    deadline = time.monotonic() + 20
    while any(Path(f"/proc/{pid}").exists() and "zombie" not in _state(pid) for pid in children):
        assert time.monotonic() < deadline, "children still serving after their parent was killed"
        time.sleep(0.1)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


def _children(pid: int, count: int, *, without: int | None = None, timeout: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = [int(child) for task in os.listdir(f"/proc/{pid}/task")
                     for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            found = []
        if len(found) == count and without not in found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"children of {pid}: {found}")
        time.sleep(0.1)


def test_json_refusals_are_json(served):
    status, headers, body = post(served.port, b"{}", None, content_type="application/json")
    assert (status, headers["content-type"]) == (401, "application/json")
    assert json.loads(body)["message"] == "missing API key"


def _balance_views(processes: int) -> list[receiver_module.Balance]:
    """One Balance as each of ``processes`` children sees it (its own slot, the counts shared)."""
    shared = receiver_module.Balance(processes)
    views = [copy.copy(shared) for _ in range(processes)]
    for slot, view in enumerate(views):
        view.take(slot)
    return views


def _until(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_children_share_connections_that_arrive_together_evenly(monkeypatch):
    """16 senders connecting at once: each of two children gets about half (asyncio's
    own accept gave the first child to wake nearly all)."""
    sock = receiver_module.listening_socket("127.0.0.1", 0)
    children = [Running(monkeypatch, sock=sock, balance=view) for view in _balance_views(2)]
    senders = [socket.create_connection(("127.0.0.1", children[0].port), timeout=10) for _ in range(16)]
    try:
        _until(lambda: sum(len(child.receiver.connections) for child in children) == 16, "16 connections")
        assert sorted(len(child.receiver.connections) for child in children)[0] >= 6
    finally:
        for sender in senders:
            sender.close()
        for child in children:
            child.close()


def test_a_child_takes_the_connections_a_busy_or_dead_one_leaves(monkeypatch, key):
    """The other child (its slot says no connections) never accepts: after the wait,
    this one takes each connection itself, and serves it."""
    sock = receiver_module.listening_socket("127.0.0.1", 0)
    alone, _ = _balance_views(2)
    child = Running(monkeypatch, sock=sock, balance=alone)
    try:
        statuses = [post(child.port, ExportTraceServiceRequest().SerializeToString(), key)[0] for _ in range(5)]
        assert statuses == [200] * 5
    finally:
        child.close()


# --- gathering: a group waits a moment for the senders answered just before it ----------

_sent = iter(range(1000, 10**6))


def _fresh_request() -> bytes:
    """A one-span request with a span id of its own (so no group meets a stored span)."""
    request = ExportTraceServiceRequest.FromString(spans_request(1))
    request.resource_spans[0].scope_spans[0].spans[0].span_id = next(_sent).to_bytes(8, "big")
    return request.SerializeToString()


def _send(client: http.client.HTTPConnection, key: str) -> None:
    client.request("POST", "/v1/traces", body=_fresh_request(),
                   headers={"Content-Type": PROTOBUF, "Authorization": f"Bearer {key}"})


def _answered(client: http.client.HTTPConnection) -> int:
    response = client.getresponse()
    response.read()
    return response.status


@pytest.fixture
def gathering(served, monkeypatch):
    """The receiver with a long gathering wait (3 s): a request answered well before it
    was not kept waiting for the timer."""
    monkeypatch.setattr(receiver_module, "GATHER_WAIT", 3.0)
    monkeypatch.setattr(receiver_module, "GATHER_RECENT", 60.0)
    served.receiver.idle_timeout = 30.0  # an idle sender's connection stays open past the wait
    return served


def _clients(port: int, count: int) -> list[http.client.HTTPConnection]:
    return [http.client.HTTPConnection("127.0.0.1", port, timeout=15) for _ in range(count)]


def test_a_group_waits_for_the_sender_answered_before_it_and_goes_when_it_comes(gathering, key):
    """B was answered just before; A's request waits for B's next one (a busy sender
    sends again at once), and both are stored as one group as soon as it comes, not
    when the wait is over."""
    a, b = _clients(gathering.port, 2)
    try:
        _send(b, key)
        assert _answered(b) == 200
        groups = gathering.receiver.groups
        started = time.monotonic()
        _send(a, key)
        time.sleep(0.3)
        assert gathering.receiver.groups == groups  # A waits for B
        _send(b, key)
        assert _answered(a) == 200 and _answered(b) == 200
        assert time.monotonic() - started < 2.0  # not the 3 s wait
        assert gathering.receiver.groups == groups + 1  # together
        assert Span.objects.count() == 3
    finally:
        a.close()
        b.close()


def _answered_at_once(client: http.client.HTTPConnection, key: str) -> None:
    """Sent and answered well before the 3 s wait is over."""
    started = time.monotonic()
    _send(client, key)
    assert _answered(client) == 200
    assert time.monotonic() - started < 2.0


def test_a_lone_sender_is_not_kept_waiting(gathering, key):
    """The only sender answered is the one sending again: nobody to wait for."""
    (client,) = _clients(gathering.port, 1)
    try:
        for _ in range(3):
            _answered_at_once(client, key)
    finally:
        client.close()


@pytest.mark.parametrize("then", ["closes", "stays idle past GATHER_RECENT"])
def test_a_sender_not_sending_again_is_not_waited_for(gathering, key, monkeypatch, then):
    """B was answered before A's request but closed since, or was answered longer ago
    than GATHER_RECENT (not a sender in a loop): A does not wait for it."""
    a, b = _clients(gathering.port, 2)
    try:
        _send(b, key)
        assert _answered(b) == 200
        if then == "closes":
            b.close()
            _until(lambda: not gathering.receiver.connections, "B's connection closed")
        else:
            monkeypatch.setattr(receiver_module, "GATHER_RECENT", 0.1)
            time.sleep(0.3)
        _answered_at_once(a, key)
    finally:
        a.close()
        b.close()
