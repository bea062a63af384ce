#!/usr/bin/env bash
# The OTLP/gRPC receiver: TraceService/Export and LogsService/Export on
# OBSERVATORY_GRPC_HOST:OBSERVATORY_GRPC_PORT (127.0.0.1:4317), storing through the same
# path as /v1/traces and /v1/logs, from OBSERVATORY_GRPC_PROCESSES processes (one a core)
# sharing the port. Run migrations first (deploy/run-web.sh does).
#
# At a lower CPU priority than the web server's pages (nice -n OBSERVATORY_INGEST_NICE,
# default 10; 0 leaves it as started): pages stay fast under ingest by process, ingest on
# its own port and niced (deploy/SCALING.md, *Pages under ingest*).
set -euo pipefail
cd "$(dirname "$0")/.."
exec nice -n "${OBSERVATORY_INGEST_NICE:-10}" "${PYTHON:-.venv/bin/python}" manage.py otlp_grpc
