#!/usr/bin/env bash
# Celery beat: schedules the hourly rollups and the daily retention purge. Run exactly one.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${CELERY_BROKER_URL:?set CELERY_BROKER_URL, e.g. redis://127.0.0.1:6379/0}"
exec "${PYTHON:-.venv/bin/python}" -m celery -A dashboard beat --loglevel "${WORKER_LOG_LEVEL:-info}" \
  --schedule "${OBSERVATORY_DATA_DIR:-var}/celerybeat-schedule" "$@"
