#!/usr/bin/env bash
# The OTLP/HTTP receiver: POST /v1/traces and /v1/logs on
# OBSERVATORY_OTLP_HTTP_HOST:OBSERVATORY_OTLP_HTTP_PORT (127.0.0.1:4318), from
# OBSERVATORY_OTLP_HTTP_PROCESSES processes (one a core) of Granian
# (OBSERVATORY_OTLP_HTTP_SERVER), storing through the same path as the web server's
# /v1/traces and /v1/logs, many small batches to a transaction. Run migrations
# first (deploy/run-web.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" manage.py otlp_http
