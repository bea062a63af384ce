"""Serve OTLP/HTTP on its own port: ``manage.py otlp_http [--host] [--port 4318] [--processes N]``.

POST /v1/traces, /v1/logs and /v1/metrics (see dashboard.ingest.receiver), from N processes
sharing the port, until SIGTERM or SIGINT, which stop it gracefully: the requests
read are stored and answered within ``--grace`` seconds.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand

from dashboard.ingest.receiver import serve


class Command(BaseCommand):
    help = "Serve OTLP/HTTP (POST /v1/traces, /v1/logs, /v1/metrics) on OBSERVATORY_OTLP_HTTP_HOST:OBSERVATORY_OTLP_HTTP_PORT."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=None, help="address to listen on (OBSERVATORY_OTLP_HTTP_HOST, 127.0.0.1)")
        parser.add_argument("--port", type=int, default=None,
                            help="port (OBSERVATORY_OTLP_HTTP_PORT, 4318; 0 = any free)")
        parser.add_argument("--processes", type=int, default=None,
                            help="processes sharing the port (OBSERVATORY_OTLP_HTTP_PROCESSES, one a core)")
        parser.add_argument("--grace", type=float, default=10.0, help="seconds the requests read get at shutdown")

    def handle(self, *args, host, port, processes, grace, **options):
        host = host or settings.OBSERVATORY_OTLP_HTTP_HOST
        port = settings.OBSERVATORY_OTLP_HTTP_PORT if port is None else port
        processes = max(1, processes or settings.OBSERVATORY_OTLP_HTTP_PROCESSES)

        def ready(bound: int) -> None:
            self.stdout.write(f"OTLP/HTTP listening on {host}:{bound} ({processes} processes)")
            self.stdout.flush()

        serve(host, port, processes=processes, grace=grace, ready=ready)
        self.stdout.write("OTLP/HTTP stopped")
