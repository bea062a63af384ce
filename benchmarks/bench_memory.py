"""Hostile-but-valid ingest against memory: what small gzipped bodies that decode to
millions of attributes do to the server.

    .venv/bin/python -m benchmarks.bench_memory

A fresh SQLite data dir, gunicorn with deploy/gunicorn.conf.py. Sent, each from
--concurrent clients at once: the request of issue #12 (20,000 spans x 256
attributes, ~1 MB gzipped, 63 MB decoded, ~800 MB as rows), a collector-sized
batch (8,192 spans x 20 attributes) and an SDK-sized one (512 x 20). Printed: the
answers, the server's peak RSS (master + workers) before and after each, and its
growth per decoded MB. Target: a hostile request is refused before its rows
exist (a few times its decoded size at most); normal batches are stored.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from benchmarks.bench_ingest import create_project_and_key, manage, peak_rss_kib
from benchmarks.load import Server, django_env, pss_mib, rss_mib


def batch(spans: int, attributes: int) -> bytes:
    request = ExportTraceServiceRequest()
    scope_spans = request.resource_spans.add().scope_spans.add()
    start = time.time_ns()
    for index in range(spans):
        span = scope_spans.spans.add()
        span.trace_id, span.span_id, span.name = os.urandom(16), os.urandom(8), "step"
        span.start_time_unix_nano, span.end_time_unix_nano = start + index, start + index + 1000
        for number in range(attributes):
            span.attributes.add(key=f"attribute.{number}", value=AnyValue(int_value=number))
    return request.SerializeToString()


def send(port: int, key: str, body: bytes) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    connection.request("POST", "/v1/traces", body=body, headers={
        "Content-Type": "application/x-protobuf", "Content-Encoding": "gzip", "Authorization": f"Bearer {key}"})
    response = connection.getresponse()
    response.read()
    connection.close()
    return response.status


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrent", type=int, default=4)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    try:
        env = django_env(workdir)
        manage(env, "migrate", "--noinput")
        key = create_project_and_key(env)
        server = Server(env)
        server.start()
        try:
            print(f"server idle: RSS {rss_mib(server.pids()):.0f} MB, PSS {pss_mib(server.pids()):.0f} MB "
                  "(master + workers)")
            for name, spans, attributes in (("hostile 20,000 x 256", 20_000, 256),
                                            ("collector 8,192 x 20", 8_192, 20), ("SDK 512 x 20", 512, 20)):
                raw = batch(spans, attributes)
                body = gzip.compress(raw, 6)
                before = peak_rss_kib(server.pids()) / 1024
                answers: list[int] = []
                threads = [threading.Thread(target=lambda: answers.append(send(server.port, key, body)))
                           for _ in range(args.concurrent)]
                started = time.monotonic()
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                after = peak_rss_kib(server.pids()) / 1024
                print(f"{name}: {len(body) / 2**20:.2f} MB gzipped, {len(raw) / 2**20:.1f} MB decoded, x{args.concurrent} "
                      f"at once -> answers {sorted(answers)} in {time.monotonic() - started:.1f} s; peak RSS "
                      f"{before:.0f} -> {after:.0f} MB (+{after - before:.0f} MB, "
                      f"{(after - before) / (len(raw) / 2**20 * args.concurrent):.1f}x the decoded bytes)")
        finally:
            server.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("target: the hostile batch refused (413) with growth of a few times its decoded size at most; "
          "normal batches 200; RSS < 400 MB")


if __name__ == "__main__":
    main()
