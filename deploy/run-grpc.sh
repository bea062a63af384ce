#!/usr/bin/env bash
# The OTLP/gRPC receiver: TraceService/Export and LogsService/Export on
# OBSERVATORY_GRPC_HOST:OBSERVATORY_GRPC_PORT (127.0.0.1:4317), storing through the same
# path as /v1/traces and /v1/logs, from OBSERVATORY_GRPC_PROCESSES processes (one a core)
# sharing the port. Run migrations first (deploy/run-web.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" manage.py otlp_grpc
