"""Refusals as a real gunicorn (deploy/gunicorn.conf.py) sends them, over real sockets:

- ``PUT /api/v1/artifacts/<id>`` under the body deadline of every ingest path: a body
  that ends before its Content-Length is a 400 and stores nothing (even when its
  hash matches what arrived), a stalled or dripped body is a 408 within the
  deadline, nothing stored;
- a batch refused with 429 while the derivations are behind is refused cleanly: its
  body is read first, so the sender's keep-alive connection carries its next
  request (an exporter sees a 429 with Retry-After, never a broken connection).
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import socket
import time

import pytest

from benchmarks.bench_ingest import manage

from .interop import running_stack
from .test_chunked_live import drip, spans_body
from .test_otlp_logs import make_logs

MAX_BODY = 1024 * 1024
READ_TIMEOUT = 2
BIG = 300 * 1024  # past what gunicorn drains by itself (64 KiB) after an answer


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with running_stack(
        tmp_path_factory.mktemp("refusals"),
        OBSERVATORY_MAX_BODY_BYTES=str(MAX_BODY),
        OBSERVATORY_MAX_DECODED_BYTES=str(4 * MAX_BODY),
        OBSERVATORY_BODY_READ_TIMEOUT=str(READ_TIMEOUT),
        OBSERVATORY_DERIVE_BACKLOG_SECONDS="10",
    ) as running:
        yield running


def artifacts_stored(stack, artifact_id: str) -> int:
    return stack.rows("SELECT count(*) FROM observatory_artifact WHERE artifact_id = ?", (artifact_id,))[0][0]


def put_head(stack, artifact_id: str, *, length: int, sha: str) -> bytes:
    return (f"PUT /api/v1/artifacts/{artifact_id} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
            f"Authorization: Bearer {stack.key}\r\nX-Content-SHA256: {sha}\r\nContent-Length: {length}\r\n\r\n").encode()


def status_of(answer: bytes) -> bytes:
    return answer.split(b"\r\n", 1)[0]


def answer_of(sock: socket.socket) -> bytes:
    """The whole answer (Django's are chunked here), which may come in several reads."""
    answer = b""
    while not answer.endswith(b"\r\n0\r\n\r\n"):
        part = sock.recv(65536)
        if not part:
            break
        answer += part
    return answer


# --- artifacts: the body deadline ---------------------------------------------------------

def test_it_stores_an_artifact_sent_whole(stack):
    data = b"whole artifact\n" * 100
    with socket.create_connection(("127.0.0.1", stack.web.port), timeout=30) as sock:
        sock.sendall(put_head(stack, "artifact_" + "10" * 8, length=len(data), sha=hashlib.sha256(data).hexdigest())
                     + data)
        assert status_of(sock.recv(65536)) == b"HTTP/1.1 201 Created"
    assert artifacts_stored(stack, "artifact_" + "10" * 8) == 1


def test_an_artifact_shorter_than_its_content_length_stores_nothing(stack):
    """The hash is of the bytes that arrived: only the length can tell the body was cut."""
    artifact_id = "artifact_" + "11" * 8
    data = b"cut short\n" * 100
    with socket.create_connection(("127.0.0.1", stack.web.port), timeout=30) as sock:
        sock.sendall(put_head(stack, artifact_id, length=len(data) + 100, sha=hashlib.sha256(data).hexdigest()) + data)
        sock.shutdown(socket.SHUT_WR)
        started = time.monotonic()
        answer = answer_of(sock)
    assert status_of(answer).startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"ended after" in answer
    assert time.monotonic() - started < READ_TIMEOUT + 5
    assert artifacts_stored(stack, artifact_id) == 0


def test_an_artifact_that_stalls_gets_408_and_stores_nothing(stack):
    artifact_id = "artifact_" + "12" * 8
    data = b"stalled\n" * 100
    with socket.create_connection(("127.0.0.1", stack.web.port), timeout=30) as sock:
        sock.sendall(put_head(stack, artifact_id, length=len(data), sha=hashlib.sha256(data).hexdigest()) + data[:50])
        started = time.monotonic()
        answer = sock.recv(65536)
        took = time.monotonic() - started
    assert status_of(answer).startswith(b"HTTP/1.1 408"), answer[:200]
    assert took < READ_TIMEOUT + 5
    assert artifacts_stored(stack, artifact_id) == 0


def test_an_artifact_dripped_a_byte_at_a_time_gets_408_within_the_deadline(stack):
    """Each byte in time never restarts the clock: the whole body has READ_TIMEOUT."""
    artifact_id = "artifact_" + "13" * 8
    data = b"drip" * 20
    with socket.create_connection(("127.0.0.1", stack.web.port), timeout=30) as sock:
        sock.sendall(put_head(stack, artifact_id, length=len(data), sha=hashlib.sha256(data).hexdigest()))
        started = time.monotonic()
        answer = drip(sock, data)
        assert status_of(answer).startswith(b"HTTP/1.1 408"), answer[:200]
        assert time.monotonic() - started < READ_TIMEOUT + 5
    assert artifacts_stored(stack, artifact_id) == 0


def test_a_gzipped_artifact_cut_short_stores_nothing(stack):
    artifact_id = "artifact_" + "14" * 8
    data = b"gzipped and cut\n" * 1000
    sent = gzip.compress(data)
    head = put_head(stack, artifact_id, length=len(sent), sha=hashlib.sha256(data).hexdigest())
    head = head.replace(b"\r\n\r\n", b"\r\nContent-Encoding: gzip\r\n\r\n")
    with socket.create_connection(("127.0.0.1", stack.web.port), timeout=30) as sock:
        sock.sendall(head + sent[: len(sent) // 2])
        sock.shutdown(socket.SHUT_WR)
        answer = sock.recv(65536)
    assert status_of(answer).startswith(b"HTTP/1.1 400"), answer[:200]
    assert artifacts_stored(stack, artifact_id) == 0


# --- 429 while the derivations are behind: a clean refusal ------------------------------

@pytest.fixture(scope="module")
def behind(stack):
    """A derivation note due for an hour and leased by a drainer: the derivations are
    an hour behind (``backlog_seconds``), and no drainer takes the leased note."""
    code = (
        "from datetime import timedelta\n"
        "from django.utils import timezone\n"
        "from dashboard.accounts.models import Project\n"
        "from dashboard.observatory.models import DerivationNote\n"
        "now = timezone.now()\n"
        f"note = DerivationNote.objects.create(project=Project.objects.get(slug={stack.project_slug!r}),\n"
        "    available_at=now - timedelta(hours=1), claimed_until=now + timedelta(hours=1))\n"
        "print(note.pk)\n"
    )
    note = manage(stack.env, "shell", "-c", code).strip().splitlines()[-1]
    yield
    manage(stack.env, "shell", "-c",
           f"from dashboard.observatory.models import DerivationNote; DerivationNote.objects.filter(pk={note}).delete()")
    time.sleep(1.2)  # each process reuses what it read of the backlog for a second (BACKLOG_READ_EVERY)


def _records_body() -> bytes:
    record = {"type": "message", "record_id": "00000000-0000-4000-8000-000000000000", "text": "x" * BIG}
    return json.dumps({"records": [record]}).encode()


def _padded_logs() -> bytes:
    request = make_logs(1)
    request.resource_logs[0].scope_logs[0].log_records[0].body.string_value = "x" * BIG
    return request.SerializeToString()


@pytest.mark.parametrize("path, content_type, body", [
    ("/v1/traces", "application/x-protobuf", lambda: spans_body("b1" * 16, 1, padding=BIG)),
    ("/v1/logs", "application/x-protobuf", _padded_logs),
    ("/api/v1/records", "application/json", _records_body),
], ids=["traces", "logs", "records"])
@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
def test_a_429_for_the_backlog_keeps_the_connection(stack, behind, path, content_type, body, chunked):
    data = body()
    assert len(data) > BIG
    connection = http.client.HTTPConnection("127.0.0.1", stack.web.port, timeout=30)
    try:
        headers = {"Content-Type": content_type, "Authorization": f"Bearer {stack.key}"}
        seen = []
        for _ in range(2):
            sent = (data[start : start + 16384] for start in range(0, len(data), 16384)) if chunked else data
            connection.request("POST", path, body=sent, headers=headers, encode_chunked=chunked)
            response = connection.getresponse()
            response.read()
            seen.append((response.status, response.getheader("Retry-After"), response.getheader("Connection"),
                         connection.sock.getsockname() if connection.sock else None))
        assert [status for status, *_ in seen] == [429, 429]
        assert all(retry_after == "2" for _, retry_after, _, _ in seen)
        # One connection carried both, and the server never said it would close it.
        assert seen[0][3] is not None and seen[0][3] == seen[1][3]
        assert all((said or "").lower() != "close" for _, _, said, _ in seen)
    finally:
        connection.close()
