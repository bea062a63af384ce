#!/usr/bin/env bash
# The OTLP/HTTP receiver: POST /v1/traces and /v1/logs on
# OBSERVATORY_OTLP_HTTP_HOST:OBSERVATORY_OTLP_HTTP_PORT (127.0.0.1:4318), from
# OBSERVATORY_OTLP_HTTP_PROCESSES processes (one a core) of Granian
# (OBSERVATORY_OTLP_HTTP_SERVER), storing through the same path as the web server's
# /v1/traces and /v1/logs, many small batches to a transaction. Run migrations
# first (deploy/run-web.sh does).
#
# At a lower CPU priority than the web server's pages (nice -n OBSERVATORY_INGEST_NICE,
# default 10; 0 leaves it as started): pages stay fast under ingest by process, ingest on
# its own port and niced (deploy/SCALING.md, *Pages under ingest*).
set -euo pipefail
cd "$(dirname "$0")/.."
exec nice -n "${OBSERVATORY_INGEST_NICE:-10}" "${PYTHON:-.venv/bin/python}" manage.py otlp_http
