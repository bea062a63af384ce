"""Ingest skips Django's per-request connection health check (a round trip on
PostgreSQL); its first read, the key's, reconnects once by itself instead. So
connections the database dropped cost the senders nothing: a real gunicorn
(deploy/gunicorn.conf.py) on PostgreSQL whose backends are all terminated keeps
answering 200, and stores every batch."""

from __future__ import annotations

import http.client
import os
import time

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .interop import running_stack

pytestmark = pytest.mark.skipif(not os.environ.get("DATABASE_URL"), reason="PostgreSQL only (DATABASE_URL)")

CONNECTIONS = 6


def spans_body(trace: int, span: int) -> bytes:
    request = ExportTraceServiceRequest()
    item = request.resource_spans.add().scope_spans.add().spans.add()
    item.trace_id, item.span_id = trace.to_bytes(16, "big"), span.to_bytes(8, "big")
    item.name, item.start_time_unix_nano = "reconnect", time.time_ns()
    item.end_time_unix_nano = item.start_time_unix_nano + 1000
    return request.SerializeToString()


def post(connection: http.client.HTTPConnection, key: str, body: bytes) -> tuple[int, str | None]:
    connection.request("POST", "/v1/traces", body=body,
                       headers={"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {key}"})
    response = connection.getresponse()
    response.read()
    return response.status, response.getheader("Retry-After")


def test_it_reconnects_when_the_database_dropped_its_connections(tmp_path_factory):
    import psycopg

    with running_stack(tmp_path_factory.mktemp("reconnect")) as stack:
        connections = [http.client.HTTPConnection("127.0.0.1", stack.web.port, timeout=30) for _ in range(CONNECTIONS)]
        try:
            for number, connection in enumerate(connections):
                assert post(connection, stack.key, spans_body(1, number + 1))[0] == 200
            with psycopg.connect(stack.database_url, autocommit=True) as admin:
                dropped = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                ).fetchone()[0]
            assert dropped >= 1
            for round_ in range(2, 5):  # every thread's connection was dropped: reach them all
                for number, connection in enumerate(connections):
                    assert post(connection, stack.key, spans_body(round_, number + 1)) == (200, None)
        finally:
            for connection in connections:
                connection.close()
        assert stack.rows("SELECT count(*) FROM observatory_span")[0][0] == 4 * CONNECTIONS
