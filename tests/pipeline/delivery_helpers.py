"""Helpers of the delivery tests (exporter, span export, spool): a local HTTP server
base for the network peers, a fake clock for the exporters' waits (time is a true
edge), free ports, bounded polling."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Mapping, Optional


class LocalServer:
    """A threaded HTTP server on 127.0.0.1 that hands every GET, POST and PUT to
    ``handle(handler)``; ``release`` frees requests a test left hanging."""

    def __init__(self, port: int = 0) -> None:
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server.handle(self)

            do_POST = do_PUT = do_GET

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def handle(self, handler: BaseHTTPRequestHandler) -> None:  # pragma: no cover - subclasses answer
        raise NotImplementedError

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    @staticmethod
    def reply(handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str,
              headers: Optional[Mapping[str, str]] = None) -> None:
        handler.send_response(status)
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)


class FakeClock:
    """Virtual monotonic time. The exporter's threads wait on it (``wait``) and the
    test moves it on (``advance``), which returns once the threads it woke are
    waiting again (so virtual time never runs ahead of their work); an event set by
    the exporter still wakes a wait."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start
        self._moved = threading.Condition()
        self._deadlines: list[float] = []  # of the threads waiting now

    def monotonic(self) -> float:
        with self._moved:
            return self.now

    def wait(self, event: threading.Event, seconds: float) -> bool:
        with self._moved:
            deadline = self.now + seconds
            self._deadlines.append(deadline)
            try:
                while not event.is_set() and self.now < deadline:
                    self._moved.wait(0.005)  # real time: events are not tied to our condition
            finally:
                self._deadlines.remove(deadline)
                self._moved.notify_all()
        return event.is_set()

    def advance(self, seconds: float, settle: float = 2.0) -> None:
        with self._moved:
            waiting = len(self._deadlines)
            self.now += seconds
            self._moved.notify_all()
            end = time.monotonic() + settle
            while time.monotonic() < end and (
                any(d <= self.now for d in self._deadlines) or len(self._deadlines) < waiting
            ):
                self._moved.wait(0.002)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition: Callable[[], bool], timeout: float = 10.0, *, step: Callable[[], None] = lambda: None) -> bool:
    """Poll ``condition`` (calling ``step`` between polls) until true or ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        step()
        time.sleep(0.005)
    return condition()
