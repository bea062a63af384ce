"""Serve OTLP/gRPC: ``manage.py otlp_grpc [--host 127.0.0.1] [--port 4317]``.

TraceService/Export and LogsService/Export (see dashboard.ingest.grpc_server),
in this process until SIGTERM or SIGINT, which stop it gracefully: exports in
progress finish (and are acknowledged) within ``--grace`` seconds.
"""

from __future__ import annotations

import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand

from dashboard.ingest.grpc_server import grpc_server_build


class Command(BaseCommand):
    help = "Serve OTLP/gRPC (traces and logs) on OBSERVATORY_GRPC_HOST:OBSERVATORY_GRPC_PORT."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=None, help="address to listen on (OBSERVATORY_GRPC_HOST, 127.0.0.1)")
        parser.add_argument("--port", type=int, default=None, help="port (OBSERVATORY_GRPC_PORT, 4317; 0 = any free)")
        parser.add_argument("--grace", type=float, default=10.0, help="seconds in-flight exports get at shutdown")

    def handle(self, *args, host, port, grace, **options):
        host = host or settings.OBSERVATORY_GRPC_HOST
        port = settings.OBSERVATORY_GRPC_PORT if port is None else port
        server, bound = grpc_server_build(host=host, port=port)
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        server.start()
        self.stdout.write(f"OTLP/gRPC listening on {host}:{bound}", ending="\n")
        self.stdout.flush()
        stop.wait()
        server.stop(grace).wait()
        self.stdout.write("OTLP/gRPC stopped")
