"""Serve OTLP/gRPC: ``manage.py otlp_grpc [--host 127.0.0.1] [--port 4317] [--processes N]``.

TraceService/Export and LogsService/Export (see dashboard.ingest.grpc_server),
until SIGTERM or SIGINT, which stop it gracefully: exports in progress finish (and
are acknowledged) within ``--grace`` seconds. With ``--processes`` N > 1 (one a
core by default, OBSERVATORY_GRPC_PROCESSES) N forked processes each serve the
port (SO_REUSEPORT: the kernel spreads the connections), as gunicorn's workers and
the OTLP/HTTP receiver's do: one process's Python runs on one core at a time, and
with four senders of 1,000-span batches one process stored 0.32-0.47x what the web
server's /v1/traces stored. The parent only forwards SIGTERM/SIGINT and waits; a
process that dies takes its share of new connections with it (the others take the
port's new connections), so run it under a supervisor (compose's restart, systemd).
"""

from __future__ import annotations

import os
import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from dashboard.ingest.lifetime import end_with_parent


class Command(BaseCommand):
    help = "Serve OTLP/gRPC (traces and logs) on OBSERVATORY_GRPC_HOST:OBSERVATORY_GRPC_PORT."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=None, help="address to listen on (OBSERVATORY_GRPC_HOST, 127.0.0.1)")
        parser.add_argument("--port", type=int, default=None, help="port (OBSERVATORY_GRPC_PORT, 4317; 0 = any free)")
        parser.add_argument("--processes", type=int, default=None,
                            help="processes serving the port (OBSERVATORY_GRPC_PROCESSES, one a core)")
        parser.add_argument("--grace", type=float, default=10.0, help="seconds in-flight exports get at shutdown")

    def handle(self, *args, host, port, processes, grace, **options):
        host = host or settings.OBSERVATORY_GRPC_HOST
        port = settings.OBSERVATORY_GRPC_PORT if port is None else port
        processes = max(1, processes or settings.OBSERVATORY_GRPC_PROCESSES)
        if processes == 1 or port == 0:  # (a port picked by each process would be one port each)
            self._serve(host, port, grace, reuseport=settings.OBSERVATORY_GRPC_REUSEPORT)
            return
        connections.close_all()  # none may cross the fork
        children, parent = [], os.getpid()
        for _ in range(processes):
            pid = os.fork()  # before any gRPC server or channel exists in this process
            if pid == 0:
                code = 1
                try:
                    end_with_parent(parent)  # a parent killed with -9 takes its processes with it
                    self._serve(host, port, grace, reuseport=True)
                    code = 0
                finally:
                    os._exit(code)
            children.append(pid)

        def forward(signum, _frame):
            for child in children:
                try:
                    os.kill(child, signum)
                except ProcessLookupError:
                    pass

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, forward)
        failed = 0
        for child in children:
            while True:
                try:
                    _, status = os.waitpid(child, 0)
                    break
                except InterruptedError:
                    continue
            failed += status != 0
        self.stdout.write("OTLP/gRPC stopped")
        if failed:
            raise CommandError(f"{failed} of {processes} OTLP/gRPC processes failed")

    def _serve(self, host: str, port: int, grace: float, *, reuseport: bool) -> None:
        from dashboard.ingest.grpc_server import grpc_server_build

        server, bound = grpc_server_build(host=host, port=port, reuseport=reuseport)
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        server.start()
        self.stdout.write(f"OTLP/gRPC listening on {host}:{bound} (process {os.getpid()})", ending="\n")
        self.stdout.flush()
        stop.wait()
        server.stop(grace).wait()
        connections.close_all()
        self.stdout.write("OTLP/gRPC stopped")
