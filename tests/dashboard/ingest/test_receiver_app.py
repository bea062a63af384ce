"""The OTLP/HTTP receiver's ASGI app (dashboard.ingest.receiver_app): served by
uvicorn from a thread of this process on a free loopback port (its loop, its own
database connection), spoken to over real sockets with the bytes an exporter sends;
the group commit driven through the ASGI interface itself (a client at that edge);
and ``manage.py otlp_http --server granian`` in processes of its own."""

from __future__ import annotations

import asyncio
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
from dashboard.ingest import receiver_app
from dashboard.ingest import spans as spans_module
from dashboard.observatory.models import IngestTransport, LogRecord, Span

from .conftest import spans_stored, until_gone
from .database_faults import broken_table, busy_database, faults, names_nothing_internal, poisoned_spans
from .test_grpc_server import spans_request
from .test_otlp_logs import make_logs

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[3]
PROTOBUF = "application/x-protobuf"


@pytest.fixture
def key():
    return apikey_create(project=project_create(name="receiver agents"))[1]


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


def raw(port: int, data: bytes, *, timeout: float = 15) -> bytes:
    """Send bytes as they are; what came back until the server closed (or the timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
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


class Uvicorn:
    """The app (made now: the limits as the settings are) served by uvicorn on a thread."""

    def __init__(self, monkeypatch, **config) -> None:
        import uvicorn

        monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # what the served process sets for itself
        self.app = receiver_app.ReceiverApp()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        options = {"http": "httptools", "loop": "asyncio", "ws": "none", "lifespan": "on", "access_log": False,
                   "log_level": "warning", "timeout_keep_alive": 2, **config}
        self.server = uvicorn.Server(uvicorn.Config(self.app, **options))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        finally:
            connection.close()

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()


@pytest.fixture
def served(settings, monkeypatch):
    settings.OBSERVATORY_BODY_READ_TIMEOUT = 2
    running = Uvicorn(monkeypatch)
    yield running
    running.close()


def test_it_stores_spans_and_answers_after_the_commit(served, key):
    status, headers, body = post(served.port, spans_request(3), key)
    assert (status, headers["content-type"]) == (200, PROTOBUF)
    assert ExportTraceServiceResponse.FromString(body) == ExportTraceServiceResponse()
    assert Span.objects.count() == 3  # committed when the answer came


def test_groups_reuse_the_process_s_database_connection(served, key):
    from django.db.backends.signals import connection_created

    opened = []
    connection_created.connect(lambda **kwargs: opened.append(kwargs["connection"]), weak=False,
                               dispatch_uid="receiver-app-test")
    try:
        for index in range(8):
            request = ExportTraceServiceRequest.FromString(spans_request(1))
            request.resource_spans[0].scope_spans[0].spans[0].span_id = (index + 1).to_bytes(8, "big")
            assert post(served.port, request.SerializeToString(), key)[0] == 200
    finally:
        connection_created.disconnect(dispatch_uid="receiver-app-test")
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
    assert status == 200 and ExportTraceServiceResponse.FromString(body).partial_success.rejected_spans == 1
    assert Span.objects.count() == 1


def test_a_database_error_is_a_503_with_retry_after_and_stores_nothing_fake_database(served, key, monkeypatch):
    def locked(*args, **kwargs):
        raise OperationalError("database is locked")

    monkeypatch.setattr(spans_module, "_insert", locked)
    status, headers, body = post(served.port, spans_request(2), key)
    assert (status, headers["retry-after"]) == (503, "2")
    assert status_pb2.Status.FromString(body).message == "database busy, retry later"
    assert not Span.objects.exists()


def test_a_really_busy_database_is_a_503_with_retry_after(served, key, monkeypatch):
    with busy_database(monkeypatch, "observatory_span"):
        status, headers, _ = post(served.port, spans_request(2), key)
    assert (status, headers["retry-after"]) == (503, "2")
    assert not Span.objects.exists()


def test_a_broken_database_is_a_500_naming_nothing(served, key):
    with broken_table("observatory_span"):
        status, headers, body = post(served.port, spans_request(3), key)
    assert status == 500 and "retry-after" not in headers
    assert names_nothing_internal(status_pb2.Status.FromString(body).message)
    assert not Span.objects.exists()
    from dashboard.accounts.models import Project

    assert faults(IngestTransport.OTLP_RECEIVER, Project.objects.get(name="receiver agents")) == 1


@pytest.mark.parametrize("data, status", [
    (b"GET /v1/traces HTTP/1.1\r\nHost: x\r\n\r\n", 405),
    (b"POST /v1/profiles HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 404),
    (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi", 415),
    (b"this is not HTTP at all\r\n\r\n", 400),
    (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400),
    (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
])
def test_it_refuses_malformed_and_hostile_requests(served, data, status):
    got = raw(served.port, data)
    assert got.startswith(b"HTTP/1.1 %d " % status)
    assert not Span.objects.exists()


def test_it_refuses_a_wrong_key_malformed_protobuf_and_a_bad_encoding(served, key):
    assert post(served.port, spans_request(1), "po_0123456789abcdef_" + "x" * 43)[0] == 401
    assert post(served.port, b"\x0a\xff\xff\xff\xff\x0f", key)[0] == 400
    assert post(served.port, spans_request(1), key, headers={"Content-Encoding": "br"})[0] == 415
    assert post(served.port, b"not gzip", key, headers={"Content-Encoding": "gzip"})[0] == 400
    assert not Span.objects.exists()


def test_json_refusals_are_json(served):
    status, headers, body = post(served.port, b"{}", None, content_type="application/json")
    assert (status, headers["content-type"]) == (401, "application/json")
    assert json.loads(body)["message"] == "missing API key"


def test_it_refuses_an_oversize_body_as_it_arrives_and_closes(settings, monkeypatch, key):
    settings.OBSERVATORY_MAX_BODY_BYTES = 64 * 1024
    settings.OBSERVATORY_MAX_DECODED_BYTES = 64 * 1024
    running = Uvicorn(monkeypatch)  # the limits are read when the app is made
    try:
        big = spans_request(1, big="x" * 100_000)
        status, headers, _ = post(running.port, big, key)
        assert (status, headers["connection"]) == (413, "close")  # its declared length is over the limit
        chunk = b"%x\r\n" % len(big) + big + b"\r\n0\r\n\r\n"
        head = (f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTOBUF}\r\nAuthorization: Bearer {key}\r\n"
                "Transfer-Encoding: chunked\r\n\r\n").encode()
        assert raw(running.port, head + chunk).startswith(b"HTTP/1.1 413 ")  # counted as it came
        bomb = gzip.compress(big)  # small on the wire, over the limit once inflated
        assert len(bomb) < 64 * 1024 and post(running.port, bomb, key, headers={"Content-Encoding": "gzip"})[0] == 413
    finally:
        running.close()
    assert not Span.objects.exists()


def test_bodies_held_at_once_stay_within_the_memory_budget(settings, monkeypatch, key):
    settings.OBSERVATORY_INGEST_MEMORY_BYTES = 1024 * 1024
    running = Uvicorn(monkeypatch)
    small = spans_request(1, big="s" * 100_000)
    try:
        with socket.create_connection(("127.0.0.1", running.port), timeout=15) as holder:
            held = request_bytes(spans_request(1, big="h" * 1_000_000), key)
            holder.sendall(held[:-10])  # about 1 MB held, not complete
            time.sleep(0.3)
            status, headers, _ = post(running.port, small, key)
            assert (status, headers["retry-after"]) == (503, "2")
            never_fits = request_bytes(spans_request(1, big="l" * 1_200_000), key)
            head = never_fits[:never_fits.index(b"\r\n\r\n") + 4]  # (uvicorn resets under a body sent on)
            assert raw(running.port, head).startswith(b"HTTP/1.1 413 ")  # never fits
            holder.sendall(held[-10:])
            assert answers(holder.recv(65536))[0][0] == 413  # decoded under its own budget: too big
        assert post(running.port, small, key)[0] == 200  # room again
        assert running.app.held == 0
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
    assert Span.objects.count() == 3 and served.app.held == 0


def test_a_429_comes_after_the_body_is_read_and_keeps_the_connection(served, key, settings, monkeypatch):
    """The derivations behind: a 429 with Retry-After, answered once the body was read
    whole, so the connection stays usable for the batch sent again; nothing stored."""
    from dashboard.accounts.models import Project
    from dashboard.ingest import common

    from .test_backlog import backlog

    settings.OBSERVATORY_DERIVE_BACKLOG_SECONDS = 10
    monkeypatch.setattr(common, "BACKLOG_READ_EVERY", 0.0)
    waiting = backlog(Project.objects.get(name="receiver agents"), waited=30)
    client = http.client.HTTPConnection("127.0.0.1", served.port, timeout=15)
    headers = {"Content-Type": PROTOBUF, "Authorization": f"Bearer {key}"}
    try:
        client.request("POST", "/v1/traces", body=spans_request(2, big="b" * 200_000), headers=headers)
        response = client.getresponse()
        response.read()
        assert (response.status, response.getheader("Retry-After"), response.getheader("Connection")) == (
            429, str(common.BACKLOG_RETRY_AFTER), None)
        waiting.delete()  # caught up
        client.request("POST", "/v1/traces", body=spans_request(2), headers=headers)  # the same connection
        response = client.getresponse()
        response.read()
        assert response.status == 200
    finally:
        client.close()
    assert Span.objects.count() == 2 and served.app.held == 0


# --- the group commit, through the ASGI interface (the client faked at that edge) --------


def _call(app, body: bytes, key: str, client: tuple[str, int]):
    """One request to ``app`` as a server makes it; its (status, headers, body)."""
    scope = {"type": "http", "method": "POST", "path": "/v1/traces", "client": client,
             "headers": [(b"content-type", PROTOBUF.encode()), (b"authorization", f"Bearer {key}".encode()),
                         (b"content-length", str(len(body)).encode())]}
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent = []

    async def receive():
        return messages.pop(0) if messages else await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    async def run():
        await app(scope, receive, send)
        return sent[0]["status"], dict(sent[0]["headers"]), sent[1]["body"]

    return run()


def test_requests_that_arrive_together_are_one_group_each_with_its_answer_fake_asgi_client(monkeypatch, key):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    app = receiver_app.ReceiverApp()
    good_a = ExportTraceServiceRequest.FromString(spans_request(2, name="a"))
    good_b = ExportTraceServiceRequest.FromString(spans_request(3, name="b"))
    for index, span in enumerate(good_b.resource_spans[0].scope_spans[0].spans):
        span.span_id = (100 + index).to_bytes(8, "big")
    bodies = [(good_a.SerializeToString(), key), (spans_request(1), "po_0123456789abcdef_" + "x" * 43),
              (b"garbage \xff\xfe not protobuf", key), (good_b.SerializeToString(), key)]

    async def together():
        return await asyncio.gather(*(_call(app, body, sender, ("127.0.0.1", 1000 + index))
                                      for index, (body, sender) in enumerate(bodies)))

    got = asyncio.run(together())
    connection.close()
    assert [status for status, _, _ in got] == [200, 401, 400, 200]
    assert status_pb2.Status.FromString(got[1][2]).message == "invalid API key"
    assert (app.groups, app.requests) == (1, 4)
    assert sorted(Span.objects.values_list("name", flat=True)) == ["a", "a", "b", "b", "b"]


def test_a_request_the_database_fails_for_good_fails_alone_in_its_group_fake_asgi_client(monkeypatch, key):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    app = receiver_app.ReceiverApp()
    requests = []
    for offset, name in ((0, "a"), (100, "poison"), (200, "b")):
        request = ExportTraceServiceRequest.FromString(spans_request(2, name=name))
        for index, span in enumerate(request.resource_spans[0].scope_spans[0].spans):
            span.span_id = (offset + index + 1).to_bytes(8, "big")
        requests.append(request.SerializeToString())

    async def together():
        return await asyncio.gather(*(_call(app, body, key, ("127.0.0.1", 2000 + index))
                                      for index, body in enumerate(requests)))

    with poisoned_spans("poison"):
        got = asyncio.run(together())
    connection.close()
    assert [status for status, _, _ in got] == [200, 500, 200]
    assert app.groups == 1
    assert sorted(Span.objects.values_list("name", flat=True)) == ["a", "a", "b", "b"]


def test_a_group_waits_for_the_client_answered_before_it_fake_asgi_client(monkeypatch, key):
    """B was answered just before: A's request waits (at most GATHER_WAIT) for B's next
    one, and both are stored as one group as soon as it comes."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    monkeypatch.setattr(receiver_app, "GATHER_WAIT", 3.0)
    monkeypatch.setattr(receiver_app, "GATHER_RECENT", 60.0)
    app = receiver_app.ReceiverApp()
    fresh = iter(range(5000, 6000))

    def body() -> bytes:
        request = ExportTraceServiceRequest.FromString(spans_request(1))
        request.resource_spans[0].scope_spans[0].spans[0].span_id = next(fresh).to_bytes(8, "big")
        return request.SerializeToString()

    async def scenario():
        a, b = ("127.0.0.1", 1), ("127.0.0.1", 2)
        assert (await _call(app, body(), key, b))[0] == 200
        groups, started = app.groups, time.monotonic()
        first = asyncio.ensure_future(_call(app, body(), key, a))
        await asyncio.sleep(0.3)
        assert app.groups == groups  # A waits for B
        second = await _call(app, body(), key, b)
        assert (await first)[0] == 200 and second[0] == 200
        assert time.monotonic() - started < 2.0 and app.groups == groups + 1

    asyncio.run(scenario())
    connection.close()
    assert Span.objects.count() == 3


def test_a_lone_sender_is_not_kept_waiting_fake_asgi_client(monkeypatch, key):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    monkeypatch.setattr(receiver_app, "GATHER_WAIT", 3.0)
    monkeypatch.setattr(receiver_app, "GATHER_RECENT", 60.0)
    app = receiver_app.ReceiverApp()

    async def scenario():
        for index in range(3):
            request = ExportTraceServiceRequest.FromString(spans_request(1))
            request.resource_spans[0].scope_spans[0].spans[0].span_id = (7000 + index).to_bytes(8, "big")
            started = time.monotonic()
            assert (await _call(app, request.SerializeToString(), key, ("127.0.0.1", 1)))[0] == 200
            assert time.monotonic() - started < 2.0  # not the 3 s wait

    asyncio.run(scenario())
    connection.close()
    assert Span.objects.count() == 3


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


# --- manage.py otlp_http --server granian ---------------------------------------------------


def _otlp_http(env: dict[str, str], port: int, server: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "manage.py", "otlp_http", "--port", str(port), "--processes", "2",
                             "--server", server], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def _until_listening(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert time.monotonic() < deadline, "not listening"
        time.sleep(0.2)


def test_granian_serves_replaces_a_killed_worker_and_stops_on_sigterm(own_database):
    from benchmarks.bench_ingest import free_port

    env, own_key = own_database
    port = free_port()
    process = _otlp_http(env, port, "granian")
    try:
        _until_listening(port)
        workers = _children(process.pid, 2)
        assert post(port, spans_request(2), own_key)[0] == 200
        os.kill(workers[0], signal.SIGKILL)
        _children(process.pid, 2, without=workers[0], timeout=30)
        request = ExportTraceServiceRequest.FromString(spans_request(2))
        for index, span in enumerate(request.resource_spans[0].scope_spans[0].spans):
            span.span_id = (50 + index).to_bytes(8, "big")
        for _ in range(4):  # whichever process takes the connection
            assert post(port, request.SerializeToString(), own_key)[0] == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert spans_stored(env) == 4


@pytest.mark.parametrize("server", ["granian"])  # uvicorn's workers outlive it by over 30 s still
def test_the_workers_stop_when_the_server_s_main_process_is_killed(own_database, server):
    """kill -9 of ``manage.py otlp_http``: its workers do not go on serving unsupervised."""
    from benchmarks.bench_ingest import free_port

    env, _ = own_database
    port = free_port()
    process = _otlp_http(env, port, server)
    try:
        _until_listening(port)
        workers = _children(process.pid, 2, timeout=60)
    finally:
        process.kill()
        process.wait()
    until_gone(workers, "workers still serving after their main process was killed")

