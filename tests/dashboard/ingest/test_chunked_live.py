"""Bodies as exporters really send them, to a real gunicorn (deploy/gunicorn.conf.py):
``Transfer-Encoding: chunked`` read to its end under the same limits; a body that
ends early or stalls is refused (400 / 408) with nothing stored, never a 200."""

from __future__ import annotations

import gzip
import http.client
import socket
import time

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .interop import running_stack
from .test_otlp_logs import make_logs

MAX_BODY = 64 * 1024
READ_TIMEOUT = 2
START = 1_700_000_000_000_000_000


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with running_stack(
        tmp_path_factory.mktemp("chunked"),
        OBSERVATORY_MAX_BODY_BYTES=str(MAX_BODY),
        OBSERVATORY_MAX_DECODED_BYTES=str(4 * MAX_BODY),
        OBSERVATORY_BODY_READ_TIMEOUT=str(READ_TIMEOUT),
    ) as running:
        yield running


def spans_body(trace: str, count: int = 3, *, padding: int = 0) -> bytes:
    request = ExportTraceServiceRequest()
    scope_spans = request.resource_spans.add().scope_spans.add()
    for index in range(count):
        span = scope_spans.spans.add()
        span.trace_id, span.span_id = bytes.fromhex(trace), (index + 1).to_bytes(8, "big")
        span.name = "x" * padding if padding else f"chunked {index}"
        span.start_time_unix_nano, span.end_time_unix_nano = START, START + 1000
    return request.SerializeToString()


def stored(stack, trace: str) -> int:
    return stack.rows("SELECT count(*) FROM observatory_span WHERE trace_id = ?", (trace,))[0][0]


def post_chunked(stack, path: str, body: bytes, *, chunk: int = 1000, headers: dict | None = None):
    connection = http.client.HTTPConnection("127.0.0.1", stack.web.port, timeout=30)
    pieces = (body[start : start + chunk] for start in range(0, len(body), chunk))
    connection.request("POST", path, body=pieces, encode_chunked=True, headers={
        "Content-Type": "application/x-protobuf", "Authorization": f"Bearer {stack.key}", **(headers or {})})
    response = connection.getresponse()
    response.read()
    connection.close()
    return response.status


def raw(stack, head: str, payload: bytes, *, close_write: bool = True) -> tuple[bytes, float]:
    """Send bytes as they are; the status line and the seconds the answer took."""
    with socket.create_connection(("127.0.0.1", stack.web.port), timeout=30) as sock:
        sock.sendall((f"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-protobuf\r\n"
                      f"Authorization: Bearer {stack.key}\r\n{head}\r\n").encode() + payload)
        if close_write:
            sock.shutdown(socket.SHUT_WR)
        started = time.monotonic()
        answer = sock.recv(65536)
        return answer.split(b"\r\n", 1)[0], time.monotonic() - started


def drip(sock: socket.socket, body: bytes, *, every: float = 0.6) -> bytes:
    """Send ``body`` a byte at a time, one every ``every`` seconds; the answer that
    comes meanwhile (b"" if none came before the last byte or the server closed)."""
    sock.settimeout(every)
    for byte in body:
        try:
            sock.sendall(bytes([byte]))
            answer = sock.recv(65536)
            if answer:
                return answer
        except TimeoutError:
            continue
        except OSError:
            break
    return b""


def test_it_reads_a_chunked_protobuf_body_completely(stack):
    trace = "a1" * 16
    assert post_chunked(stack, "/v1/traces", spans_body(trace, 40)) == 200
    assert stored(stack, trace) == 40


def test_it_reads_a_chunked_gzip_body_completely(stack):
    trace = "a2" * 16
    assert post_chunked(stack, "/v1/traces", gzip.compress(spans_body(trace, 25)), chunk=7,
                        headers={"Content-Encoding": "gzip"}) == 200
    assert stored(stack, trace) == 25


def test_it_reads_chunked_logs(stack):
    before = stack.rows("SELECT count(*) FROM observatory_logrecord")[0][0]
    assert post_chunked(stack, "/v1/logs", make_logs(5).SerializeToString(), chunk=50) == 200
    assert stack.rows("SELECT count(*) FROM observatory_logrecord")[0][0] == before + 5


def test_it_refuses_a_chunked_body_over_the_limit(stack):
    trace = "a3" * 16
    assert post_chunked(stack, "/v1/traces", spans_body(trace, 2, padding=MAX_BODY)) == 413
    assert stored(stack, trace) == 0


def test_it_refuses_a_chunked_gzip_bomb(stack):
    trace = "a4" * 16
    bomb = gzip.compress(spans_body(trace, 1) + b"\x00" * (8 * MAX_BODY))
    assert len(bomb) < MAX_BODY
    assert post_chunked(stack, "/v1/traces", bomb, headers={"Content-Encoding": "gzip"}) == 413
    assert stored(stack, trace) == 0


def test_it_refuses_a_body_shorter_than_its_content_length(stack):
    trace = "a5" * 16
    body = spans_body(trace, 10)
    status, _ = raw(stack, f"Content-Length: {len(body) + 100}\r\n", body)
    assert status.startswith(b"HTTP/1.1 400")
    assert stored(stack, trace) == 0


def test_it_refuses_a_chunked_body_cut_mid_chunk(stack):
    trace = "a6" * 16
    body = spans_body(trace, 10)
    status, _ = raw(stack, "Transfer-Encoding: chunked\r\n", b"%x\r\n" % len(body) + body[: len(body) // 2])
    assert status.startswith(b"HTTP/1.1 400")
    assert stored(stack, trace) == 0


def test_it_refuses_a_malformed_chunk_size(stack):
    status, _ = raw(stack, "Transfer-Encoding: chunked\r\n", b"zz\r\nabc\r\n0\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 400")


def test_it_answers_408_to_a_sender_that_stalls_and_keeps_serving(stack):
    trace = "a7" * 16
    body = spans_body(trace, 10)
    started = time.monotonic()
    status, _ = raw(stack, "Transfer-Encoding: chunked\r\n", b"%x\r\n" % len(body) + body[:20], close_write=False)
    assert status.startswith(b"HTTP/1.1 408")
    assert time.monotonic() - started < READ_TIMEOUT + 5
    assert stored(stack, trace) == 0
    assert post_chunked(stack, "/v1/traces", spans_body("a8" * 16, 2)) == 200


def test_it_bounds_a_slow_drip_by_the_whole_read(stack):
    """One byte a second never restarts the clock: the whole body has READ_TIMEOUT."""
    trace = "a9" * 16
    body = spans_body(trace, 3)
    with socket.create_connection(("127.0.0.1", stack.web.port), timeout=30) as sock:
        sock.sendall((f"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-protobuf\r\n"
                      f"Authorization: Bearer {stack.key}\r\nContent-Length: {len(body)}\r\n\r\n").encode())
        started = time.monotonic()
        answer = drip(sock, body)
        assert answer.startswith(b"HTTP/1.1 408")
        assert time.monotonic() - started < READ_TIMEOUT + 5
    assert stored(stack, trace) == 0
