"""Senders that cost the server's machine little: one thread drives every keep-alive
connection with non-blocking sockets, and a request is bytes built once.

The ingest benchmarks measure a server on the same 2 cores as its load. Sixteen
``http.client`` threads cost 0.15-0.18 ms of CPU a request and, taking turns at
the GIL, queued behind each other for their answers: at 1,500 requests/s that is a
quarter of a core and milliseconds of latency that no real fleet (senders on other
machines) would add. This loop costs a fraction of that, so what is measured is
the server. Each connection has one request in flight at a time, as an exporter's.
"""

from __future__ import annotations

import selectors
import socket
import time
from collections import deque
from dataclasses import dataclass, field

RETRY_STATUSES = (429, 503)


@dataclass
class Outcome:
    seconds: float = 0.0
    retries: int = 0
    failures: int = 0
    statuses: dict[int, int] = field(default_factory=dict)  # retried answers by status
    first_failure: str = ""
    latencies: list[float] = field(default_factory=list)  # seconds from a request's first byte sent to its answer


class _Sender:
    """One connection and the body it is sending until answered."""

    __slots__ = ("sock", "request", "sent", "received", "body", "due", "started")

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.request = b""
        self.sent = 0
        self.received = bytearray()
        self.body: bytes | None = None
        self.due = 0.0  # when to send (again): a Retry-After
        self.started = 0.0


def post_all(port: int, path: str, content_type: str, key: str, bodies: list[bytes], clients: int, *,
             expect: int = 200, request_timeout: float = 60.0, run_deadline: float = 600.0) -> Outcome:
    """POST every body over ``clients`` connections to 127.0.0.1:``port``; 429/503 are
    sent again after their Retry-After, a dropped connection is opened again and
    its request resent, as an exporter does. Returns when all are answered."""
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {content_type}\r\n"
            f"Authorization: Bearer {key}\r\nContent-Length: ").encode()
    work = deque(bodies)
    outcome = Outcome()
    selector = selectors.DefaultSelector()
    senders = [_Sender() for _ in range(max(1, min(clients, len(bodies))))]
    waiting: list[_Sender] = []  # not registered: to start, or after a Retry-After
    started = time.monotonic()
    deadline = started + run_deadline

    def start(sender: _Sender) -> None:
        if sender.body is None:
            if not work:
                _close(selector, sender)
                return
            sender.body = work.popleft()
            sender.request = head + str(len(sender.body)).encode() + b"\r\n\r\n" + sender.body
        if sender.sock is None:
            sender.sock = socket.create_connection(("127.0.0.1", port), timeout=request_timeout)
            sender.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sender.sock.setblocking(False)
            selector.register(sender.sock, selectors.EVENT_WRITE, sender)
        else:
            selector.modify(sender.sock, selectors.EVENT_WRITE, sender)
        sender.sent, sender.started = 0, time.monotonic()
        sender.received.clear()

    def dropped(sender: _Sender) -> None:
        _close(selector, sender)
        outcome.retries += 1
        waiting.append(sender)

    def answered(sender: _Sender, status: int, headers: dict[str, str], body: bytes) -> None:
        outcome.latencies.append(time.monotonic() - sender.started)
        if headers.get("connection", "").lower() == "close":
            _close(selector, sender)
        if status in RETRY_STATUSES:
            outcome.retries += 1
            outcome.statuses[status] = outcome.statuses.get(status, 0) + 1
            sender.due = time.monotonic() + float(headers.get("retry-after", "1"))
            if sender.sock is not None:
                selector.unregister(sender.sock)
                sender.sock.close()
                sender.sock = None
            waiting.append(sender)
            return
        if status != expect:
            outcome.failures += 1
            if not outcome.first_failure:
                outcome.first_failure = f"{path}: HTTP {status} {body[:300].decode('utf-8', 'replace')}"
        sender.body = None
        if sender.sock is None:
            waiting.append(sender)
        else:
            start(sender)

    waiting.extend(senders)
    try:
        while (waiting or selector.get_map()) and time.monotonic() < deadline:
            now = time.monotonic()
            for sender in [s for s in waiting if s.due <= now]:
                waiting.remove(sender)
                try:
                    start(sender)
                except OSError:
                    sender.due = now + 0.1
                    outcome.retries += 1
                    waiting.append(sender)
            timeout = min((s.due for s in waiting), default=now + 1.0) - now
            for selected, events in selector.select(timeout=max(0.0, min(timeout, 1.0))):
                sender = selected.data
                try:
                    if events & selectors.EVENT_WRITE:
                        sender.sent += sender.sock.send(memoryview(sender.request)[sender.sent:])
                        if sender.sent == len(sender.request):
                            selector.modify(sender.sock, selectors.EVENT_READ, sender)
                        continue
                    chunk = sender.sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    dropped(sender)
                    continue
                if not chunk:
                    dropped(sender)
                    continue
                sender.received += chunk
                parsed = _response(sender.received)
                if parsed is not None:
                    answered(sender, *parsed)
            now = time.monotonic()
            for key_ in list(selector.get_map().values()):
                sender = key_.data
                if now - sender.started > request_timeout:
                    dropped(sender)
    finally:
        for sender in senders:
            _close(selector, sender)
        selector.close()
    outcome.seconds = time.monotonic() - started
    outcome.failures += len(work) + sum(1 for sender in senders if sender.body is not None)  # never answered
    return outcome


def _close(selector: selectors.BaseSelector, sender: _Sender) -> None:
    if sender.sock is not None:
        try:
            selector.unregister(sender.sock)
        except (KeyError, ValueError):
            pass
        sender.sock.close()
        sender.sock = None


def _response(data: bytearray) -> tuple[int, dict[str, str], bytes] | None:
    """(status, headers lower-cased, body) once ``data`` holds a whole answer (by
    Content-Length or chunked), else None."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = bytes(data[:end]).decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    start = end + 4
    if "content-length" in headers:
        size = int(headers["content-length"])
        return (status, headers, bytes(data[start:start + size])) if len(data) >= start + size else None
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body, at = bytearray(), start
        while True:
            line_end = data.find(b"\r\n", at)
            if line_end < 0:
                return None
            size = int(bytes(data[at:line_end]).split(b";")[0], 16)
            if len(data) < line_end + 2 + size + 2:
                return None
            if size == 0:
                return status, headers, bytes(body)
            body += data[line_end + 2:line_end + 2 + size]
            at = line_end + 2 + size + 2
    return status, headers, b""  # no body (e.g. 204)
