"""The least a WSGI app can do for an OTLP request: read the body, answer the
empty ExportTraceServiceResponse. ``bench_ingest --floor`` runs it under the
deployed gunicorn config to measure what gunicorn and the client cost a request
before any application code (nothing is parsed, authenticated or stored)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

EMPTY_RESPONSE = b""  # an ExportTraceServiceResponse with no field set


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    stream = environ["wsgi.input"]
    while length > 0:
        chunk = stream.read(min(length, 65536))
        if not chunk:
            break
        length -= len(chunk)
    start_response("200 OK", [("Content-Type", "application/x-protobuf"),
                              ("Content-Length", str(len(EMPTY_RESPONSE)))])
    return [EMPTY_RESPONSE]
