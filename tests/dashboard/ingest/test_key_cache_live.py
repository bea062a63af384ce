"""Known keys are cached per web process; a revocation still holds from the next
request on, in every process: a real gunicorn (deploy/gunicorn.conf.py, several
worker processes), keep-alive connections served by at least two of them, the key
revoked by a third process, then every connection's next request refused."""

from __future__ import annotations

import http.client
import os
import time
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from benchmarks.bench_ingest import manage

from .interop import running_stack

CONNECTIONS = 8
START = time.time_ns()  # recent: the retention purge at a worker's start keeps it


def spans_body(trace: int, span: int) -> bytes:
    request = ExportTraceServiceRequest()
    item = request.resource_spans.add().scope_spans.add().spans.add()
    item.trace_id, item.span_id = trace.to_bytes(16, "big"), span.to_bytes(8, "big")
    item.name, item.start_time_unix_nano, item.end_time_unix_nano = "cached key", START, START + 1000
    return request.SerializeToString()


def post(connection: http.client.HTTPConnection, key: str, body: bytes) -> tuple[int, bytes]:
    connection.request("POST", "/v1/traces", body=body,
                       headers={"Content-Type": "application/json" if body == b"{}" else "application/x-protobuf",
                                "Authorization": f"Bearer {key}"})
    response = connection.getresponse()
    return response.status, response.read()


def serving_pid(connection: http.client.HTTPConnection, server_port: int) -> int:
    """The process holding the server side of this client connection (found by its
    socket inode in /proc/net/tcp and the processes' file descriptors)."""
    client_port = connection.sock.getsockname()[1]
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
            inode = fields[9]
    assert inode, "server side of the connection not found"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return int(pid)
        except OSError:
            continue
    raise AssertionError("no process holds the server side of the connection")


def test_it_refuses_a_revoked_key_in_every_worker_process_at_the_next_request(tmp_path_factory):
    with running_stack(tmp_path_factory.mktemp("key-cache")) as stack:
        connections: list[http.client.HTTPConnection] = []
        try:
            span, pids = 0, set()
            # Whichever worker accepts first gets a new connection: more of them until two
            # processes serve some (once, CI's eight all went to one).
            while len(pids) < 2 and len(connections) < 4 * CONNECTIONS:
                fresh = [http.client.HTTPConnection("127.0.0.1", stack.web.port, timeout=30)
                         for _ in range(CONNECTIONS)]
                connections += fresh
                for _ in range(3):  # each serving process has seen the key (first sight, then cached)
                    for connection in fresh:
                        span += 1
                        body = spans_body(connections.index(connection) + 1, span)
                        assert post(connection, stack.key, body) == (200, b"")
                pids = {serving_pid(connection, stack.web.port) for connection in connections}
            assert len(pids) >= 2, f"every connection went to one worker: {pids}"

            manage(stack.env, "shell", "-c", (
                "from dashboard.accounts.models import ApiKey\n"
                "from dashboard.accounts.services import apikey_revoke\n"
                "for key in ApiKey.objects.all():\n"
                "    apikey_revoke(key=key)\n"
            ))

            for number, connection in enumerate(connections):
                status, _ = post(connection, stack.key, spans_body(number + 1, 10_000 + number))
                assert status == 401
            # the same connections, so the same processes, answered the refusals
            assert {serving_pid(connection, stack.web.port) for connection in connections} == pids
        finally:
            for connection in connections:
                connection.close()
        assert stack.rows("SELECT count(*) FROM observatory_span")[0][0] == 3 * len(connections)
