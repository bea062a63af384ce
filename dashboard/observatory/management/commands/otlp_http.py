"""Serve OTLP/HTTP on its own port: ``manage.py otlp_http [--host] [--port 4318] [--processes N] [--server S]``.

POST /v1/traces, /v1/logs and /v1/metrics, from N processes sharing the port, until
SIGTERM or SIGINT, which stop it gracefully: the requests read are stored and answered
within ``--grace`` seconds. The app is dashboard.ingest.receiver_app (the group commit,
the limits, the answers); ``--server`` (OBSERVATORY_OTLP_HTTP_SERVER) is the HTTP
server that runs it, its processes and their connections: ``granian`` (the default;
measured beside uvicorn and the hand-built server it replaced in deploy/SCALING.md)
or ``uvicorn`` (installed with the test extra: ``pip install uvicorn httptools``).
"""

from __future__ import annotations

import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from dashboard.env import OTLP_HTTP_SERVERS
from dashboard.ingest.receiver_app import PARENT_VARIABLE

APP = "dashboard.receiver_asgi:application"


class Command(BaseCommand):
    help = "Serve OTLP/HTTP (POST /v1/traces, /v1/logs, /v1/metrics) on OBSERVATORY_OTLP_HTTP_HOST:OBSERVATORY_OTLP_HTTP_PORT."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=None, help="address to listen on (OBSERVATORY_OTLP_HTTP_HOST, 127.0.0.1)")
        parser.add_argument("--port", type=int, default=None,
                            help="port (OBSERVATORY_OTLP_HTTP_PORT, 4318)")
        parser.add_argument("--processes", type=int, default=None,
                            help="processes sharing the port (OBSERVATORY_OTLP_HTTP_PROCESSES, one a core)")
        parser.add_argument("--server", choices=OTLP_HTTP_SERVERS, default=None,
                            help="the HTTP server (OBSERVATORY_OTLP_HTTP_SERVER)")
        parser.add_argument("--grace", type=float, default=10.0, help="seconds the requests read get at shutdown")

    def handle(self, *args, host, port, processes, server, grace, **options):
        host = host or settings.OBSERVATORY_OTLP_HTTP_HOST
        port = settings.OBSERVATORY_OTLP_HTTP_PORT if port is None else port
        processes = max(1, processes or settings.OBSERVATORY_OTLP_HTTP_PROCESSES)
        server = server or settings.OBSERVATORY_OTLP_HTTP_SERVER

        def ready(bound: int) -> None:
            self.stdout.write(f"OTLP/HTTP listening on {host}:{bound} ({processes} processes, {server})")
            self.stdout.flush()

        os.environ[PARENT_VARIABLE] = str(os.getpid())  # its workers stop when this process dies
        if server == "granian":
            _granian(host, port, processes, grace, ready)
        else:
            _uvicorn(host, port, processes, grace, ready)
        self.stdout.write("OTLP/HTTP stopped")


def _granian(host: str, port: int, processes: int, grace: float, ready) -> None:
    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings
    from granian.server import Server

    ready(port)
    Server(
        APP, address=host, port=port, interface=Interfaces.ASGI, workers=processes, http=HTTPModes.http1,
        websockets=False,
        # Requests at once a process: past it, connections wait in the kernel's backlog.
        backpressure=settings.OBSERVATORY_OTLP_HTTP_MAX_CONNECTIONS,
        http1_settings=HTTP1Settings(header_read_timeout=settings.OBSERVATORY_OTLP_HTTP_IDLE_TIMEOUT * 1000),
        respawn_failed_workers=True, workers_kill_timeout=int(grace) or 1, log_access=False,
    ).serve()


def _uvicorn(host: str, port: int, processes: int, grace: float, ready) -> None:
    try:
        import uvicorn
    except ImportError:
        raise CommandError("uvicorn is not installed: pip install uvicorn httptools, or use --server granian") from None

    ready(port)
    uvicorn.run(
        APP, host=host, port=port, workers=processes, http="httptools", loop="asyncio", ws="none",
        lifespan="on", access_log=False, log_level="warning",
        # Connections and requests at once a process: past it, 503.
        limit_concurrency=settings.OBSERVATORY_OTLP_HTTP_MAX_CONNECTIONS,
        timeout_keep_alive=settings.OBSERVATORY_OTLP_HTTP_IDLE_TIMEOUT,
        timeout_graceful_shutdown=int(grace) or 1,
    )
