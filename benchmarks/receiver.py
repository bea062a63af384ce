"""A dashboard-like receiver for the benchmarks, in its own process (its work does
not share the agent's GIL), on 127.0.0.1.

- ``POST /api/v1/records``: counts records and distinct record_ids, answers the
  dashboard's IngestResponse (duplicates counted by record_id, as the dashboard does);
- ``POST /v1/traces``: decodes OTLP protobuf (gzip or not), counts spans and
  distinct (trace_id, span_id);
- ``POST /v1/metrics``: 404, like the dashboard.

The parent steers it: ``down()`` closes the listening socket (connections are
refused), ``up()`` listens again on the same port, ``unavailable(retry_after)``
answers 503 with Retry-After, ``ok()`` answers normally again, ``counts()``.
"""

from __future__ import annotations

import gzip
import json
import multiprocessing
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

DEFAULT_PORT = 18210  # this project's benchmark range is 18200-18299


def _serve(port: int, commands: Any, replies: Any) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    lock = threading.Lock()
    state: dict[str, Any] = {"mode": "ok", "retry_after": "1"}
    counts = {"records": 0, "spans": 0, "requests": 0, "unavailable": 0}
    record_ids: set[str] = set()
    span_ids: set[bytes] = set()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            with lock:
                counts["requests"] += 1
                if state["mode"] == "unavailable":
                    counts["unavailable"] += 1
                    return self._answer(503, b'{"detail":"unavailable"}', "application/json",
                                        {"Retry-After": state["retry_after"]})
            if self.path == "/v1/traces":
                request = ExportTraceServiceRequest.FromString(body)
                ids = [s.trace_id + s.span_id for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
                with lock:
                    counts["spans"] += len(ids)
                    span_ids.update(ids)
                return self._answer(200, b"", "application/x-protobuf")
            if self.path == "/api/v1/records":
                records = json.loads(body)["records"]
                with lock:
                    duplicates = sum(1 for r in records if r["record_id"] in record_ids)
                    counts["records"] += len(records)
                    record_ids.update(r["record_id"] for r in records)
                answer = {"accepted": len(records) - duplicates, "duplicates": duplicates, "rejected": []}
                return self._answer(200, json.dumps(answer).encode(), "application/json")
            self._answer(404, b'{"detail":"not found"}', "application/json")

        def _answer(self, status: int, body: bytes, content_type: str, headers: Optional[dict[str, str]] = None) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def listen() -> ThreadingHTTPServer:
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return server

    server: Optional[ThreadingHTTPServer] = listen()
    replies.put("ready")
    while True:
        command, argument = commands.get()
        if command == "down" and server is not None:
            server.shutdown()
            server.server_close()
            server = None
        elif command == "up" and server is None:
            server = listen()
        elif command in ("ok", "unavailable"):
            with lock:
                state["mode"] = command
                state["retry_after"] = str(argument or 1)
        elif command == "counts":
            with lock:
                replies.put({**counts, "distinct_records": len(record_ids), "distinct_spans": len(span_ids)})
            continue
        elif command == "stop":
            replies.put("stopped")
            return
        replies.put("done")


class Receiver:
    """The parent's handle on the receiver process (a context manager)."""

    def __init__(self, port: int = DEFAULT_PORT) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._commands: Any = multiprocessing.Queue()
        self._replies: Any = multiprocessing.Queue()
        self._process = multiprocessing.Process(target=_serve, args=(port, self._commands, self._replies), daemon=True)

    def __enter__(self) -> Receiver:
        self._process.start()
        if self._replies.get(timeout=30) != "ready":
            raise RuntimeError("the receiver did not start")
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._ask("stop", None)
        finally:
            self._process.join(5)
            if self._process.is_alive():
                self._process.terminate()
                self._process.join(5)

    def _ask(self, command: str, argument: Any) -> Any:
        self._commands.put((command, argument))
        return self._replies.get(timeout=30)

    def down(self) -> None:
        self._ask("down", None)

    def up(self) -> None:
        self._ask("up", None)

    def unavailable(self, retry_after: float = 1) -> None:
        self._ask("unavailable", retry_after)

    def ok(self) -> None:
        self._ask("ok", None)

    def counts(self) -> dict[str, int]:
        return self._ask("counts", None)
