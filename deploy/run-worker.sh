#!/usr/bin/env bash
# A Celery worker for the derivation tasks (totals, rollups, linking, retention).
# Needs CELERY_BROKER_URL (Redis). Without a broker the web process runs tasks in-process instead.
# Further arguments go to celery, e.g. a node's worker named apart: deploy/run-worker.sh -n derive-b@%h
set -euo pipefail
cd "$(dirname "$0")/.."
: "${CELERY_BROKER_URL:?set CELERY_BROKER_URL, e.g. redis://127.0.0.1:6379/0}"
exec "${PYTHON:-.venv/bin/python}" -m celery -A dashboard worker \
  --loglevel "${WORKER_LOG_LEVEL:-info}" --concurrency "${WORKER_CONCURRENCY:-2}" --prefetch-multiplier 4 "$@"
